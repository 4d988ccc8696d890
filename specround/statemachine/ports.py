"""The event-log port: what the round controller needs from durable storage.

``specround.adapters`` implements it over SQL (SQLite by default, PostgreSQL for many workers); tests may
use any implementation that honours the same contract:

* The log assigns each request's sequence numbers and computes its hash chain
  (``hash = chain_hash(prev_hash, canonical_bytes(event))``, the first ``prev_hash`` being
  :data:`~specround.canonical.GENESIS_HASH`).
* :meth:`EventLog.publish` writes many rounds in **one** database transaction (group commit) while fencing
  each request on its own: a conflict for one request never blocks or aborts another.
* The fence lives in the database: unique keys on (request, generation) and (request, round id).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from specround.statemachine.events import (
    EVENT_SCHEMA_VERSION,
    ROUND_EVENT_KINDS,
    RequestOpened,
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundVerified,
)

__all__ = [
    "EventLog",
    "LogHead",
    "PublishOutcome",
    "PublishStatus",
    "RoundPublication",
    "RoundStreamingLog",
    "StoredEvent",
    "StoredRound",
    "new_stored_event",
    "round_events",
    "stored_events_of",
    "stored_items",
]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """One event as stored: the envelope the log adds around the event payload."""

    request_id: str
    seq: int
    """Per-request sequence number, from 0 (the ``request_opened`` event)."""
    kind: str
    round_id: str | None
    generation: int
    """The request's generation this event belongs to (the published generation for round events)."""
    schema_version: int
    payload: dict[str, Any]
    """The event's canonical JSON object (parse with :func:`~specround.statemachine.events.parse_event`)."""
    prev_hash: str
    hash: str
    recorded_at: float
    """Unix time at which the log stored the event."""
    payload_bytes: bytes | None = None
    """The canonical bytes exactly as stored and hashed, when the log has them (``payload`` is decoded from
    them). Readers then verify the chain over these bytes instead of re-serialising ``payload``; a log that
    does not keep them leaves None."""
    defect: str | None = None
    """What was wrong with the stored row when the log could not read it as written (a payload that is
    not a JSON object, a column of the wrong type, ...); None for a well-formed row. The chain check and
    replay refuse an event with a defect by name."""


_FIELDS = tuple(field.name for field in dataclasses.fields(StoredEvent))
if StoredEvent.__slots__ != _FIELDS or hasattr(StoredEvent, "__post_init__"):  # pragma: no cover
    raise ImportError("StoredEvent no longer has exactly the slots new_stored_event fills")
_SLOTS = tuple(getattr(StoredEvent, name).__set__ for name in _FIELDS)
_new = object.__new__


def new_stored_event(
    request_id: str,
    seq: int,
    kind: str,
    round_id: str | None,
    generation: int,
    schema_version: int,
    payload: dict[str, Any],
    prev_hash: str,
    link: str,
    recorded_at: float,
    payload_bytes: bytes | None,
    defect: str | None,
) -> StoredEvent:
    """``StoredEvent(...)`` with the same values (in field order), its slots filled directly.

    The frozen dataclass's ``__init__`` goes through ``object.__setattr__`` field by field, about twice
    the time; log readers spell out five events per stored round.
    """
    event = _new(StoredEvent)
    a, b, c, d, e, f, g, h, i, j, k, m = _SLOTS
    a(event, request_id)
    b(event, seq)
    c(event, kind)
    d(event, round_id)
    e(event, generation)
    f(event, schema_version)
    g(event, payload)
    h(event, prev_hash)
    i(event, link)
    j(event, recorded_at)
    k(event, payload_bytes)
    m(event, defect)
    return event


@dataclass(frozen=True, slots=True)
class StoredRound:
    """One well-formed stored round: its five events' envelope, payloads and bytes, not yet spelled out.

    A log that stores a round's events together (one row per round) can hand them to replay in this form:
    the events are then the ones :meth:`events` returns, at seqs ``5 * generation - 4 .. 5 * generation``,
    each linking to the one before over its canonical bytes. Only the last event's hash is stored; the
    inner ones follow from the bytes, so a reader that recomputes the chain over ``payload_bytes`` from
    ``prev_hash`` and reaches ``hash`` has verified all five links.
    """

    request_id: str
    round_id: str
    generation: int
    """The generation the round published (every one of its events carries it)."""
    recorded_at: float
    prev_hash: str
    """The hash the round's first event links to (the request's previous event)."""
    hash: str
    """The stored hash of the round's last event (``round_published``)."""
    payloads: tuple[dict[str, Any], ...]
    """The five canonical JSON objects, in :data:`~specround.statemachine.events.ROUND_EVENT_KINDS` order."""
    payload_bytes: tuple[bytes, ...]
    """Their canonical bytes, as hashed."""
    envelopes_built: bool = dataclasses.field(default=False, compare=False)
    """True when the reader built each payload's envelope itself (its kind, this request and round id and
    the current schema version, as a compact stored body is decoded), so that they match by construction;
    :meth:`envelopes_match` then checks nothing."""

    @property
    def first_seq(self) -> int:
        """The seq of the round's first event (``round_ready``)."""
        return 5 * self.generation - 4

    def envelopes_match(self, schema_version: int | None = None) -> bool:
        """Whether each payload is an object naming its event's kind, the request and the round.

        With ``schema_version``, each must also carry that version (replay reads only the current one as
        it is).
        """
        if self.envelopes_built:
            return schema_version is None or schema_version == EVENT_SCHEMA_VERSION
        request_id, round_id = self.request_id, self.round_id
        if len(self.payloads) != len(ROUND_EVENT_KINDS):
            return False
        for payload, kind in zip(self.payloads, ROUND_EVENT_KINDS, strict=True):
            if not isinstance(payload, dict):
                return False
            get = payload.get
            if get("kind") != kind or get("request_id") != request_id or get("round_id") != round_id:
                return False
            if schema_version is not None and get("schema_version") != schema_version:
                return False
        return True

    def chained_hashes(self) -> list[str]:
        """The five hashes recomputed from ``prev_hash`` over ``payload_bytes``.

        The round's chain is intact when the last one equals the stored :attr:`hash`.
        """
        out: list[str] = []
        link = self.prev_hash
        for data in self.payload_bytes:
            link = hashlib.sha256(link.encode("ascii") + data).hexdigest()  # chain_hash, inlined
            out.append(link)
        return out

    def hash_matches(self) -> bool:
        """Whether the chain recomputed over the bytes reaches the stored hash (every link holds)."""
        return self.chained_hashes()[-1] == self.hash

    def events(self) -> list[StoredEvent]:
        """The round's five events as a log streams them (inner hashes derived from the bytes)."""
        return round_events(
            self.request_id,
            self.round_id,
            self.generation,
            self.recorded_at,
            self.prev_hash,
            self.hash,
            self.payloads,
            self.payload_bytes,
        )


_NO_DEFECTS: tuple[str | None, ...] = (None,) * len(ROUND_EVENT_KINDS)


def round_events(
    request_id: str,
    round_id: str,
    generation: int,
    recorded_at: float,
    prev_hash: str,
    last_hash: str,
    payloads: Sequence[dict[str, Any]],
    payload_bytes: Sequence[bytes],
    defects: Sequence[str | None] = _NO_DEFECTS,
) -> list[StoredEvent]:
    """The five events of one stored round, at seqs ``5 * generation - 4 ..``, each with its ``defect``.

    The first links to ``prev_hash``, the last carries the stored ``last_hash``, and each inner hash is
    derived from the bytes (``chain_hash(prev_hash, payload_bytes)``, inlined).
    """
    out: list[StoredEvent] = []
    seq = 5 * generation - 4
    link = prev_hash
    last = len(ROUND_EVENT_KINDS) - 1
    sha256 = hashlib.sha256
    for index, kind in enumerate(ROUND_EVENT_KINDS):
        payload, data = payloads[index], payload_bytes[index]
        version = payload.get("schema_version", 1)
        following = last_hash if index == last else sha256(link.encode("ascii") + data).hexdigest()
        out.append(
            new_stored_event(
                request_id,
                seq + index,
                kind,
                round_id,
                generation,
                version if type(version) is int else 1,
                payload,
                link,
                following,
                recorded_at,
                data,
                defects[index],
            )
        )
        link = following
    return out


@dataclass(frozen=True, slots=True)
class LogHead:
    """The newest published point of one request's chain."""

    request_id: str
    generation: int
    seq: int
    hash: str
    state_digest: str
    """Digest of the request state this head publishes (the live projection)."""
    finished: bool


@dataclass(frozen=True, slots=True)
class RoundPublication:
    """Everything one round appends: its five events, fenced on ``expected_generation``."""

    request_id: str
    round_id: str
    expected_generation: int
    commit_digest: str
    successor_digest: str
    finished: bool
    ready: RoundReady
    verified: RoundVerified
    decided: RoundDecided
    staged: RoundStaged
    published: RoundPublished

    def events(self) -> tuple[RoundReady, RoundVerified, RoundDecided, RoundStaged, RoundPublished]:
        """The round's events in append order."""
        return (self.ready, self.verified, self.decided, self.staged, self.published)


class PublishStatus(StrEnum):
    """Per-request result of a group-committed publish."""

    PUBLISHED = "published"
    """The fence moved; the round's events were appended."""
    ALREADY_PUBLISHED = "already_published"
    """The same round (same commit digest) was published before; nothing was appended (idempotent)."""
    STALE_GENERATION = "stale_generation"
    """Another transaction already published at this generation; nothing was appended."""
    DUPLICATE_ROUND = "duplicate_round"
    """This round id was published with a *different* commit; nothing was appended."""


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """What happened to one publication of a group commit."""

    request_id: str
    round_id: str
    status: PublishStatus
    generation: int
    """The request's generation after the call (the published one, or the one that won)."""


class EventLog(Protocol):
    """Durable, append-only, hash-chained event storage with a per-request generation fence."""

    def open_request(self, event: RequestOpened, state_digest: str) -> None:
        """Append a request's first event at generation 0.

        Opening the same request again with an identical event is a no-op; with a different one it raises
        :class:`~specround.errors.InvalidRequestError`, as it does for a ``state_digest`` that is not a
        SHA-256 digest in lowercase hex.
        """
        ...

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Group-commit rounds: one database transaction, one fence check per request.

        Returns one outcome per publication, in order. Raises
        :class:`~specround.errors.LogUnavailableError` if the transaction itself failed (nothing appended),
        and :class:`~specround.errors.InvalidRequestError` before anything is written for a publication that
        is inconsistent or whose commit or successor digest is not a SHA-256 digest in lowercase hex.
        """
        ...

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        """Stream stored events ordered by (request, seq); all requests when ``request_id`` is None."""
        ...

    def request_ids(self) -> list[str]:
        """Every request id in the log, sorted."""
        ...

    def head(self, request_id: str) -> LogHead | None:
        """The newest published point of a request, or None if the log has never seen it."""
        ...

    def close(self) -> None:
        """Release connections; further calls are errors."""
        ...


@runtime_checkable
class RoundStreamingLog(Protocol):
    """A log that can stream its well-formed rounds whole (replay then skips spelling out their events)."""

    def event_items(self, request_id: str | None = None) -> Iterator[StoredEvent | StoredRound]:
        """:meth:`EventLog.events`, with each well-formed stored round as one :class:`StoredRound`."""
        ...


def stored_items(log: EventLog, request_id: str | None = None) -> Iterator[StoredEvent | StoredRound]:
    """A log's stored events (of one request or all), with whole rounds where the log can stream them."""
    if isinstance(log, RoundStreamingLog):
        return iter(log.event_items(request_id))
    return iter(log.events(request_id))


def stored_events_of(item: StoredEvent | StoredRound) -> int:
    """How many stored events ``item`` stands for (five for a whole round)."""
    return len(item.payloads) if isinstance(item, StoredRound) else 1
