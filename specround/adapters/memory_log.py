"""An in-memory :class:`~specround.statemachine.ports.EventLog` with exactly the SQL log's semantics.

For fast tests and for embedding the controller without a database. Nothing survives the process; every
other behaviour is the contract of :mod:`specround.statemachine.ports`, stated here precisely because the
EventLog contract suite runs the same tests against this log and the SQL one:

* ``open_request`` appends the ``request_opened`` event at seq 0, generation 0, with
  ``prev_hash = GENESIS_HASH``. Opening again with byte-identical canonical event bytes and the same state
  digest is a no-op; anything else for a known request id raises
  :class:`~specround.errors.InvalidRequestError` and appends nothing.
* ``publish`` is a group commit: every publication is checked for internal consistency first (its five
  events name its request and round, ``ready.expected_generation == expected_generation``,
  ``published.generation == expected_generation + 1``, the commit and successor digests agree, the request
  was opened); any malformed publication refuses the whole call with
  :class:`~specround.errors.InvalidRequestError` before anything is appended. Then each publication is
  fenced on its own, in the order given (a later publication of the same request sees the effect of an
  earlier one in the same call):

  1. round id already published for the request with the same commit digest -> ``ALREADY_PUBLISHED``,
     outcome generation = the generation that round published; nothing appended;
  2. round id already published with a different commit digest -> ``DUPLICATE_ROUND``, outcome
     generation = the request's current generation; nothing appended;
  3. current generation != ``expected_generation`` -> ``STALE_GENERATION``, outcome generation = the
     current generation (the one that won); nothing appended;
  3a. the request finished at the expected generation -> :class:`~specround.errors.RequestFinishedError`
     for the whole call (a caller bug), nothing appended;
  4. otherwise the five events are appended with consecutive seqs and chained hashes, all with the
     envelope generation ``expected_generation + 1``; the head moves to that generation, the last event's
     seq and hash, the publication's successor digest and finished flag -> ``PUBLISHED``.

  The whole call is atomic: canonical bytes and hashes are computed before anything is stored. The fence
  (points 1-4) is :func:`specround.adapters.fence.plan_publish`, the same function the SQL log runs inside
  its transaction.
* ``events`` yields in (request, seq) order from a snapshot taken at the call; payloads are fresh dicts
  decoded from the stored canonical bytes, so a caller cannot alter the log through them.
* After ``close`` every call raises :class:`~specround.errors.LogUnavailableError`.

The log is safe to share between threads (one lock around every operation).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace

from specround.adapters.fence import (
    AppendedRound,
    Head,
    PublishedRound,
    check_digest,
    plan_publish,
    prepare_round,
)
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash, load
from specround.errors import InvalidRequestError, LogUnavailableError
from specround.statemachine.events import ROUND_EVENT_KINDS, RequestOpened
from specround.statemachine.ports import (
    LogHead,
    PublishOutcome,
    RoundPublication,
    StoredEvent,
    new_stored_event,
)

__all__ = ["MemoryEventLog"]


# fmt: off
_StoredRound = tuple[
    str, int, int, float, str,  # round id, generation, seq of its first event, recorded_at, hash it extends
    bytes, bytes, bytes, bytes, bytes,  # the five events' canonical bytes
    str, str, str, str, str,  # their hashes
    int, int, int, int, int,  # their schema versions
]
# fmt: on
"""A published round as the memory log keeps it, one flat tuple: round id, generation, the seq of its first
event, ``recorded_at``, the hash it extends, the five events' canonical bytes, their five hashes and their
five schema versions (the events' kinds are :data:`~specround.statemachine.events.ROUND_EVENT_KINDS`).

One plain tuple of strings, numbers and bytes per round, so that the cyclic collector stops tracking it
after its first collection: a long run keeps millions of them, and each full collection would otherwise
traverse every one (``bench controller`` at B = 1024, after 24k rounds: 85 ms per full collection with five
row objects per round, 10 ms with tuples), and each round adds one object, not six, to the young
generation's count that decides how often the collector runs.
"""


@dataclass(slots=True)
class _RequestLog:
    """One request's chain, head and publication fence."""

    opened: StoredEvent
    """Its ``request_opened`` event, seq 0 (``payload`` is never handed out: :func:`_stream` copies it)."""
    head: LogHead
    opened_digest: str
    """The state digest given to ``open_request`` (the generation-0 state)."""
    rounds: list[_StoredRound] = field(default_factory=list)
    """Its published rounds in generation order."""
    round_generation: dict[str, int] = field(default_factory=dict)
    """round id -> the generation it published (ints and strings: a dict the collector does not track)."""
    round_commit: dict[str, str] = field(default_factory=dict)
    """round id -> its commit digest."""


class MemoryEventLog:
    """Append-only, hash-chained, generation-fenced event storage held in process memory."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        """Create an empty log; ``clock`` supplies ``recorded_at`` (Unix seconds)."""
        self._clock = clock
        self._requests: dict[str, _RequestLog] = {}
        self._lock = threading.Lock()
        self._closed = False

    # --- writing ----------------------------------------------------------------------------------------

    def open_request(self, event: RequestOpened, state_digest: str) -> None:
        """Append a request's ``request_opened`` event at generation 0 (idempotent for identical input)."""
        check_digest(f"the initial state digest of {event.request_id!r}", state_digest)
        if event.config.request_id != event.request_id:
            raise InvalidRequestError(
                f"request_opened for {event.request_id!r} carries the configuration of "
                f"{event.config.request_id!r}"
            )
        payload = canonical_bytes(event)
        event_hash = chain_hash(GENESIS_HASH, payload)
        with self._lock:
            self._require_open()
            existing = self._requests.get(event.request_id)
            if existing is not None:
                if existing.opened.payload_bytes == payload and existing.opened_digest == state_digest:
                    return
                raise InvalidRequestError(
                    f"request {event.request_id!r} is already open with a different configuration"
                )
            opened = StoredEvent(
                request_id=event.request_id,
                seq=0,
                kind=event.kind,
                round_id=None,
                generation=0,
                schema_version=event.schema_version,
                payload={},
                payload_bytes=payload,
                prev_hash=GENESIS_HASH,
                hash=event_hash,
                recorded_at=self._clock(),
            )
            head = LogHead(
                request_id=event.request_id,
                generation=0,
                seq=0,
                hash=event_hash,
                state_digest=state_digest,
                finished=False,
            )
            self._requests[event.request_id] = _RequestLog(opened, head, state_digest)

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Group-commit rounds atomically, fencing each request on its own generation (see module doc)."""
        prepared = [prepare_round(publication) for publication in publications]
        with self._lock:
            self._require_open()
            heads: dict[str, Head] = {}
            known: dict[tuple[str, str], PublishedRound] = {}
            for item in prepared:
                pub = item.publication
                entry = self._requests.get(pub.request_id)
                if entry is None:
                    raise InvalidRequestError(f"publish for unknown request {pub.request_id!r}")
                current = entry.head
                heads[pub.request_id] = Head(current.generation, current.seq, current.hash, current.finished)
                earlier = entry.round_generation.get(pub.round_id)
                if earlier is not None:
                    commit = entry.round_commit[pub.round_id]
                    known[(pub.request_id, pub.round_id)] = PublishedRound(earlier, commit)
            # The fence decides everything before anything is stored (the call is atomic).
            plan = plan_publish(prepared, heads, known)
            now = self._clock()
            for appended in plan.appended:
                pub = appended.prepared.publication
                entry = self._requests[pub.request_id]
                entry.rounds.append(_stored_round(appended, now))
                entry.round_generation[pub.round_id] = appended.generation
                entry.round_commit[pub.round_id] = pub.commit_digest
            for update in plan.head_updates:
                moved = update.head
                self._requests[update.request_id].head = LogHead(  # positional, in field order
                    update.request_id,  # request_id
                    moved.generation,  # generation
                    moved.seq,  # seq
                    moved.hash,  # hash
                    update.state_digest,  # state_digest
                    moved.finished,  # finished
                )
            return plan.outcomes

    # --- reading ----------------------------------------------------------------------------------------

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        """Stream stored events ordered by (request, seq), from a snapshot taken now."""
        with self._lock:
            self._require_open()
            if request_id is None:
                snapshot = [self._snapshot(rid) for rid in sorted(self._requests)]
            elif request_id in self._requests:
                snapshot = [self._snapshot(request_id)]
            else:
                snapshot = []
        return _stream(snapshot)

    def request_ids(self) -> list[str]:
        """Every request id in the log, sorted."""
        with self._lock:
            self._require_open()
            return sorted(self._requests)

    def head(self, request_id: str) -> LogHead | None:
        """The newest published point of a request, or None if the log has never seen it."""
        with self._lock:
            self._require_open()
            entry = self._requests.get(request_id)
            return None if entry is None else entry.head

    def close(self) -> None:
        """Mark the log closed; later calls raise :class:`~specround.errors.LogUnavailableError`."""
        with self._lock:
            self._closed = True

    # --- internals --------------------------------------------------------------------------------------

    def _snapshot(self, request_id: str) -> tuple[StoredEvent, list[_StoredRound]]:
        entry = self._requests[request_id]
        return entry.opened, list(entry.rounds)

    def _require_open(self) -> None:
        if self._closed:
            raise LogUnavailableError("the event log is closed")


def _stored_round(appended: AppendedRound, recorded_at: float) -> _StoredRound:
    """The stored tuple of a round the fence appended."""
    pub = appended.prepared.publication
    p, h = appended.prepared.payloads, appended.hashes
    ready, verified, decided, staged, published = pub.events()
    return (
        pub.round_id,
        appended.generation,
        appended.first_seq,
        recorded_at,
        appended.prev_hash,
        *(p[0], p[1], p[2], p[3], p[4]),
        *(h[0], h[1], h[2], h[3], h[4]),
        ready.schema_version,
        verified.schema_version,
        decided.schema_version,
        staged.schema_version,
        published.schema_version,
    )


def _stream(snapshot: list[tuple[StoredEvent, list[_StoredRound]]]) -> Iterator[StoredEvent]:
    for opened, rounds in snapshot:
        request_id = opened.request_id
        assert opened.payload_bytes is not None
        yield replace(opened, payload=load(opened.payload_bytes))
        for stored in rounds:
            round_id, generation, seq, recorded_at, link = stored[:5]
            for kind, payload, event_hash, schema_version in zip(
                ROUND_EVENT_KINDS, stored[5:10], stored[10:15], stored[15:20], strict=True
            ):
                yield new_stored_event(
                    request_id,
                    seq,
                    kind,
                    round_id,
                    generation,
                    schema_version,
                    load(payload),
                    link,
                    event_hash,
                    recorded_at,
                    payload,
                    None,
                )
                seq, link = seq + 1, event_hash
