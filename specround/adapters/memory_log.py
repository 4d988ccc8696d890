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
from dataclasses import dataclass, field

from specround.adapters.fence import Head, PublishedRound, check_digest, plan_publish, prepare_round
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash, load
from specround.errors import InvalidRequestError, LogUnavailableError
from specround.statemachine.events import ROUND_EVENT_KINDS, RequestOpened
from specround.statemachine.ports import LogHead, PublishOutcome, RoundPublication, StoredEvent

__all__ = ["MemoryEventLog"]


@dataclass(slots=True)
class _StoredRow:
    """An event as the memory log keeps it: the envelope plus the canonical payload bytes."""

    seq: int
    kind: str
    round_id: str | None
    generation: int
    schema_version: int
    payload: bytes
    prev_hash: str
    hash: str
    recorded_at: float


@dataclass(slots=True)
class _RequestLog:
    """One request's chain, head and publication fence."""

    rows: list[_StoredRow]
    head: LogHead
    opened_digest: str
    """The state digest given to ``open_request`` (the generation-0 state)."""
    rounds: dict[str, PublishedRound] = field(default_factory=dict)
    """round id -> its published generation and commit digest."""


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
                if existing.rows[0].payload == payload and existing.opened_digest == state_digest:
                    return
                raise InvalidRequestError(
                    f"request {event.request_id!r} is already open with a different configuration"
                )
            row = _StoredRow(
                seq=0,
                kind=event.kind,
                round_id=None,
                generation=0,
                schema_version=event.schema_version,
                payload=payload,
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
            self._requests[event.request_id] = _RequestLog(rows=[row], head=head, opened_digest=state_digest)

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
                earlier = entry.rounds.get(pub.round_id)
                if earlier is not None:
                    known[(pub.request_id, pub.round_id)] = earlier
            # The fence decides everything before anything is stored (the call is atomic).
            plan = plan_publish(prepared, heads, known)
            now = self._clock()
            for appended in plan.appended:
                pub = appended.prepared.publication
                entry = self._requests[pub.request_id]
                prev_hash, seq = appended.prev_hash, appended.first_seq
                round_id, generation, rows = pub.round_id, appended.generation, entry.rows
                for kind, event, payload, link in zip(
                    ROUND_EVENT_KINDS, pub.events(), appended.prepared.payloads, appended.hashes, strict=True
                ):
                    # Positional, in field order: seq, kind, round_id, generation, schema_version,
                    # payload, prev_hash, hash, recorded_at (by keyword it costs about three times as much).
                    rows.append(
                        _StoredRow(
                            seq,
                            kind,
                            round_id,
                            generation,
                            event.schema_version,
                            payload,
                            prev_hash,
                            link,
                            now,
                        )
                    )
                    prev_hash, seq = link, seq + 1
                entry.rounds[pub.round_id] = PublishedRound(appended.generation, pub.commit_digest)
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
                snapshot = [(rid, list(self._requests[rid].rows)) for rid in sorted(self._requests)]
            elif request_id in self._requests:
                snapshot = [(request_id, list(self._requests[request_id].rows))]
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

    def _require_open(self) -> None:
        if self._closed:
            raise LogUnavailableError("the event log is closed")


def _stream(snapshot: list[tuple[str, list[_StoredRow]]]) -> Iterator[StoredEvent]:
    for request_id, rows in snapshot:
        for row in rows:
            yield StoredEvent(
                request_id=request_id,
                seq=row.seq,
                kind=row.kind,
                round_id=row.round_id,
                generation=row.generation,
                schema_version=row.schema_version,
                payload=load(row.payload),
                payload_bytes=row.payload,
                prev_hash=row.prev_hash,
                hash=row.hash,
                recorded_at=row.recorded_at,
            )
