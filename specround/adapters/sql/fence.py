"""The generation fence as a pure function: which publications win, and the rows the winners append.

:func:`plan_publish` takes what the publishing transaction read (each request's head, and the rounds
already published under the batch's round ids) and decides every publication in order, exactly as a
sequence of compare-and-swaps on the generation would (INV-6):

1. a round id already published with the **same** commit digest -> ``ALREADY_PUBLISHED`` (append nothing);
2. a round id already published with a **different** commit digest -> ``DUPLICATE_ROUND``;
3. a head whose generation is not the expected one -> ``STALE_GENERATION``;
4. otherwise -> ``PUBLISHED``: the round's five events are chained onto the head
   (``hash = chain_hash(prev_hash, canonical bytes)``, INV-9) and the head moves to ``generation + 1``.

Each request is decided on its own, so a conflict for one never touches another. A publication for a
request the log has never seen, or one that tries to extend a finished request, is a caller bug and raises
before anything is written. No I/O happens here; :mod:`specround.adapters.sql.log` runs the SQL.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from specround.canonical import chain_hash
from specround.errors import InvalidRequestError, RequestFinishedError
from specround.statemachine.ports import PublishOutcome, PublishStatus, RoundPublication
from specround.statemachine.records import record_bytes

__all__ = [
    "EVENT_COLUMNS",
    "HEAD_UPDATE_COLUMNS",
    "PUBLICATION_COLUMNS",
    "EventRow",
    "Head",
    "PreparedRound",
    "PublishPlan",
    "PublishedRound",
    "plan_publish",
    "prepare_round",
]

EVENT_COLUMNS = (
    "request_id",
    "seq",
    "kind",
    "round_id",
    "generation",
    "schema_version",
    "prev_hash",
    "hash",
    "recorded_at",
    "payload",
)
"""Column order of :attr:`PublishPlan.event_rows`."""

PUBLICATION_COLUMNS = (
    "request_id",
    "generation",
    "round_id",
    "commit_digest",
    "successor_digest",
    "event_seq",
    "recorded_at",
)
"""Column order of :attr:`PublishPlan.publication_rows`."""

HEAD_UPDATE_COLUMNS = ("generation", "head_seq", "head_hash", "state_digest", "finished", "updated_at")
"""New values of :attr:`PublishPlan.head_updates`, followed by ``request_id`` and the expected generation."""

EventRow = tuple[str, int, str, str | None, int, int, str, str, float, str]
"""One ``events`` row in :data:`EVENT_COLUMNS` order."""


@dataclass(slots=True)
class Head:
    """A request's fence row as read inside the publishing transaction."""

    generation: int
    seq: int
    hash: str
    finished: bool


@dataclass(frozen=True, slots=True)
class PublishedRound:
    """A round already in ``publications``."""

    generation: int
    commit_digest: str


@dataclass(frozen=True, slots=True)
class PreparedRound:
    """A validated publication with its events' canonical bytes (computed outside the transaction)."""

    publication: RoundPublication
    kinds: tuple[str, ...]
    schema_versions: tuple[int, ...]
    payloads: tuple[bytes, ...]
    """``canonical_bytes(event)`` of each event, in append order: what is hashed and stored (computed with
    :func:`~specround.statemachine.records.record_bytes`, the same bytes without a ``model_dump`` pass)."""


@dataclass(slots=True)
class PublishPlan:
    """The outcome of every publication and the rows the winners append."""

    outcomes: list[PublishOutcome] = field(default_factory=list)
    event_rows: list[EventRow] = field(default_factory=list)
    publication_rows: list[tuple[str, int, str, str, str, int, float]] = field(default_factory=list)
    head_updates: list[tuple[int, int, str, str, bool, float, str, int]] = field(default_factory=list)
    """One compare-and-swap per touched request: :data:`HEAD_UPDATE_COLUMNS`, request id, expected gen."""


def prepare_round(publication: RoundPublication) -> PreparedRound:
    """Check that a publication is internally consistent and serialise its events.

    Raises :class:`InvalidRequestError` (nothing has been written) when the five events disagree with the
    envelope: another request or round id, a generation other than ``expected + 1``, or digests and
    finished flag that differ from the staged and published events.
    """
    pub = publication
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
    return PreparedRound(
        publication=pub,
        kinds=tuple(event.kind for event in events),
        schema_versions=tuple(event.schema_version for event in events),
        payloads=tuple(record_bytes(event) for event in events),
    )


def plan_publish(
    rounds: Sequence[PreparedRound],
    heads: Mapping[str, Head],
    published: Mapping[tuple[str, str], PublishedRound],
    recorded_at: float,
) -> PublishPlan:
    """Decide each publication in order against ``heads`` and ``published`` (see the module docstring)."""
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
            if earlier.commit_digest == pub.commit_digest:
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
            _append_round(plan, prepared, head, generation, recorded_at)
            known[(pub.request_id, pub.round_id)] = PublishedRound(generation, pub.commit_digest)
            state_digests[pub.request_id] = pub.successor_digest
        plan.outcomes.append(PublishOutcome(pub.request_id, pub.round_id, status, generation))
    for request_id, state_digest in state_digests.items():
        head = live[request_id]
        plan.head_updates.append(
            (
                head.generation,
                head.seq,
                head.hash,
                state_digest,
                head.finished,
                recorded_at,
                request_id,
                start_generation[request_id],
            )
        )
    return plan


def _append_round(
    plan: PublishPlan, prepared: PreparedRound, head: Head, generation: int, recorded_at: float
) -> None:
    pub = prepared.publication
    seq, prev_hash = head.seq, head.hash
    for kind, version, payload in zip(
        prepared.kinds, prepared.schema_versions, prepared.payloads, strict=True
    ):
        seq += 1
        link = chain_hash(prev_hash, payload)
        plan.event_rows.append(
            (
                pub.request_id,
                seq,
                kind,
                pub.round_id,
                generation,
                version,
                prev_hash,
                link,
                recorded_at,
                payload.decode("utf-8"),
            )
        )
        prev_hash = link
    plan.publication_rows.append(
        (pub.request_id, generation, pub.round_id, pub.commit_digest, pub.successor_digest, seq, recorded_at)
    )
    head.generation, head.seq, head.hash, head.finished = generation, seq, prev_hash, pub.finished
