"""The generation fence as a pure function, shared by every event log: which publications win, and how.

:func:`plan_publish` takes what a log read under its lock or transaction (each request's head, and the
rounds already published under the batch's round ids) and decides every publication in order, exactly as
a sequence of compare-and-swaps on the generation would (INV-6):

1. a round id already published with the **same** commit digest -> ``ALREADY_PUBLISHED`` (append nothing);
2. a round id already published with a **different** commit digest -> ``DUPLICATE_ROUND``;
3. a head whose generation is not the expected one -> ``STALE_GENERATION``;
4. otherwise -> ``PUBLISHED``: the round's five events are chained onto the head
   (``hash = chain_hash(prev_hash, canonical bytes)``, INV-9) and the head moves to ``generation + 1``.

Each request is decided on its own, so a conflict for one never touches another; a later publication of
the same request in the same call sees the effect of an earlier one. A publication for a request the log
has never seen, or one that tries to extend a finished request, is a caller bug and raises before anything
is written. No I/O happens here: :class:`~specround.adapters.memory_log.MemoryEventLog` applies the plan to
its dictionaries, :class:`~specround.adapters.sql.SqlEventLog` turns it into one ``executemany`` per table.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specround.canonical import chain_hash
from specround.errors import InvalidRequestError, RequestFinishedError
from specround.statemachine.ports import PublishOutcome, PublishStatus, RoundPublication
from specround.statemachine.records import record_bytes
from specround.statemachine.round_ids import check_round_id

__all__ = [
    "AppendedRound",
    "Head",
    "HeadUpdate",
    "PreparedRound",
    "PublishPlan",
    "PublishedRound",
    "check_digest",
    "plan_publish",
    "prepare_round",
]

ROUND_EVENTS = 5
"""Events appended by one published round."""

_HEX_DIGEST = re.compile(r"[0-9a-f]{64}")


def check_digest(what: str, value: object) -> None:
    """Refuse a digest a log keeps as a fence column unless it is a SHA-256 digest in lowercase hex.

    Raises :class:`InvalidRequestError` naming ``what``. Every log refuses the same values (the SQL log
    keeps a commit digest as its 32 bytes, which no other text has).
    """
    if not (isinstance(value, str) and _HEX_DIGEST.fullmatch(value)):
        text = repr(value)
        shown = text if len(text) <= 72 else text[:69] + "..."
        raise InvalidRequestError(f"{what} must be a SHA-256 digest in lowercase hex, got {shown}")


@dataclass(slots=True)
class Head:
    """A request's fence row as read under the log's lock or inside the publishing transaction."""

    generation: int
    seq: int
    hash: str
    finished: bool


@dataclass(frozen=True, slots=True)
class PublishedRound:
    """A round already published for its request."""

    generation: int
    commit_digest: str
    """Its commit digest (hex), or the first bytes of it where the log keeps only those (a SQL row)."""

    def commits(self, digest: str) -> bool:
        """Whether ``digest`` is this round's commit digest (a retry of the same transaction)."""
        return digest.startswith(self.commit_digest)


@dataclass(frozen=True, slots=True)
class PreparedRound:
    """A validated publication with its events' canonical bytes (computed before any lock is taken)."""

    publication: RoundPublication
    payloads: tuple[bytes, ...]
    """``canonical_bytes(event)`` of each event, in append order: what is hashed (computed with
    :func:`~specround.statemachine.records.record_bytes`, the same bytes without a ``model_dump`` pass)."""
    derived_id: bool = False
    """Whether the round id is the one derived from the round (:mod:`specround.statemachine.round_ids`)."""


@dataclass(frozen=True, slots=True)
class AppendedRound:
    """A winning publication: where its five events go and their hash links."""

    prepared: PreparedRound
    generation: int
    first_seq: int
    """Seq of its ``round_ready`` event (the others follow consecutively)."""
    prev_hash: str
    """The head hash the round extends."""
    hashes: tuple[str, ...]
    """The link of each of its events; the last is the request's new head hash."""


@dataclass(frozen=True, slots=True)
class HeadUpdate:
    """One request's new head after the call, with the generation it must still be at (compare-and-swap)."""

    request_id: str
    expected_generation: int
    head: Head
    state_digest: str


@dataclass(slots=True)
class PublishPlan:
    """The outcome of every publication, the rounds the winners append and the heads they move."""

    outcomes: list[PublishOutcome] = field(default_factory=list)
    appended: list[AppendedRound] = field(default_factory=list)
    head_updates: list[HeadUpdate] = field(default_factory=list)


def prepare_round(publication: RoundPublication) -> PreparedRound:
    """Check that a publication is internally consistent and serialise its events.

    Raises :class:`InvalidRequestError` (nothing has been written) when the five events disagree with the
    envelope: another request or round id, a generation other than ``expected + 1``, or digests and
    finished flag that differ from the staged and published events; when its commit or successor digest is
    not a SHA-256 digest in lowercase hex (:func:`check_digest`); or when the round id has the form
    reserved for derived ids without being the round's own
    (:func:`~specround.statemachine.round_ids.check_round_id`).
    """
    pub = publication
    check_digest(f"publication {pub.request_id}/{pub.round_id}: the commit digest", pub.commit_digest)
    check_digest(f"publication {pub.request_id}/{pub.round_id}: the successor digest", pub.successor_digest)
    events = pub.events()
    for event in events:
        if event.request_id != pub.request_id or event.round_id != pub.round_id:
            raise InvalidRequestError(
                f"publication {pub.request_id}/{pub.round_id} carries a {event.kind} event of "
                f"{event.request_id}/{event.round_id}"
            )
    problems = []
    if pub.ready.expected_generation != pub.expected_generation:
        problems.append(f"round_ready expects generation {pub.ready.expected_generation}")
    if pub.published.generation != pub.expected_generation + 1:
        problems.append(f"round_published is generation {pub.published.generation}")
    if pub.published.commit_digest != pub.commit_digest:
        problems.append("round_published carries another commit digest")
    if pub.staged.successor_digest != pub.successor_digest:
        problems.append("round_staged carries another successor digest")
    if pub.decided.finished != pub.finished:
        problems.append("round_decided disagrees on finished")
    if problems:
        raise InvalidRequestError(
            f"publication {pub.request_id}/{pub.round_id} (expected generation {pub.expected_generation}) "
            f"is inconsistent: {'; '.join(problems)}"
        )
    ready = pub.ready
    derived = check_round_id(pub.round_id, pub.expected_generation, ready.coordinate_digest, ready.draft_ids)
    return PreparedRound(pub, tuple(record_bytes(event) for event in events), derived)


def plan_publish(
    rounds: Sequence[PreparedRound],
    heads: Mapping[str, Head],
    published: Mapping[tuple[str, str], PublishedRound],
) -> PublishPlan:
    """Decide each publication in order against ``heads`` and ``published`` (see the module docstring).

    ``published`` needs to hold only the batch's (request, round id) pairs that are already published.
    """
    live = {request_id: Head(h.generation, h.seq, h.hash, h.finished) for request_id, h in heads.items()}
    start_generation = {request_id: h.generation for request_id, h in heads.items()}
    known = dict(published)
    state_digests: dict[str, str] = {}
    plan = PublishPlan()
    for prepared in rounds:
        pub = prepared.publication
        head = live.get(pub.request_id)
        if head is None:
            raise InvalidRequestError(f"request {pub.request_id!r} was never opened in this log")
        earlier = known.get((pub.request_id, pub.round_id))
        if earlier is not None:
            if earlier.commits(pub.commit_digest):
                status, generation = PublishStatus.ALREADY_PUBLISHED, earlier.generation
            else:
                status, generation = PublishStatus.DUPLICATE_ROUND, head.generation
        elif head.generation != pub.expected_generation:
            status, generation = PublishStatus.STALE_GENERATION, head.generation
        elif head.finished:
            raise RequestFinishedError(
                f"request {pub.request_id!r} finished at generation {head.generation}; round "
                f"{pub.round_id!r} cannot extend it"
            )
        else:
            status, generation = PublishStatus.PUBLISHED, pub.expected_generation + 1
            plan.appended.append(_append(prepared, head, generation))
            known[(pub.request_id, pub.round_id)] = PublishedRound(generation, pub.commit_digest)
            state_digests[pub.request_id] = pub.successor_digest
        plan.outcomes.append(PublishOutcome(pub.request_id, pub.round_id, status, generation))
    for request_id, state_digest in state_digests.items():
        plan.head_updates.append(
            HeadUpdate(request_id, start_generation[request_id], live[request_id], state_digest)
        )
    return plan


def _append(prepared: PreparedRound, head: Head, generation: int) -> AppendedRound:
    """Chain a winning round onto ``head`` and move the head past it."""
    prev_hash = link = head.hash
    hashes = []
    for payload in prepared.payloads:
        link = chain_hash(link, payload)
        hashes.append(link)
    appended = AppendedRound(prepared, generation, head.seq + 1, prev_hash, tuple(hashes))
    head.generation, head.seq, head.hash = generation, head.seq + len(hashes), link
    head.finished = prepared.publication.finished
    return appended
