"""Replay: rebuild every request's state from its events alone (INV-8).

Pure functions over :class:`~specround.statemachine.ports.StoredEvent` streams. ``request_opened`` gives the
generation-0 state (:func:`~specround.statemachine.staging.open_snapshot`); each round's five events give
the successor through the same staging functions the controller uses
(:func:`~specround.statemachine.staging.stage_kv`, :func:`~specround.statemachine.staging.stage_successor`),
and the result must match the logged successor digest, processor digest, RNG counters and commit digest.
Any event sequence replay cannot accept raises :class:`~specround.errors.LogIntegrityError` naming the
request, the seq and what is wrong.

Speed: events are streamed, never loaded all at once; the hash link of every event is checked (and, with
``verify_hashes``, recomputed from the canonical payload). A log that stores a round's events together
streams each well-formed round as one :class:`~specround.statemachine.ports.StoredRound`
(:class:`~specround.statemachine.ports.RoundStreamingLog`): replay recomputes its chain once over the five
payloads and, when every per-event check holds for all of them, folds it without building five event
objects; any other round is fed event by event, so a refusal names the same event either way. Because the
chain vouches for the payloads, current-version payloads are read as plain dicts instead of being
re-validated by pydantic (older versions go through :func:`~specround.statemachine.events.parse_event` and
its upcasters). The state digest is extended from token folds in O(emitted) per round.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from specround.canonical import GENESIS_HASH, canonical_bytes
from specround.errors import LogIntegrityError, SpecroundError
from specround.statemachine.commit_record import commit_values
from specround.statemachine.events import EVENT_SCHEMA_VERSION, ROUND_EVENT_KINDS, RequestOpened, parse_event
from specround.statemachine.ports import EventLog, StoredEvent, StoredRound, stored_items
from specround.statemachine.records import assemble, record_digest_of
from specround.statemachine.staging import RequestSnapshot, open_snapshot, stage_kv, stage_successor
from specround.statemachine.state import RequestConfig, RequestState, RngCounters, SpeculativeCommit

__all__ = [
    "HashCheck",
    "ReplayedRequest",
    "ReplayedRound",
    "RoundObserver",
    "replay_events",
    "replay_log",
    "replay_request",
    "replay_states",
]

_OPENED = "request_opened"
_sha256 = hashlib.sha256
_LAST_EVENT = len(ROUND_EVENT_KINDS) - 1
_PUBLISHED = ROUND_EVENT_KINDS[_LAST_EVENT]
_TERMINALS = ("correction", "bonus", "stop")
_REASONS = (None, "stop", "length")


@dataclass(frozen=True, slots=True)
class ReplayedRequest:
    """One request rebuilt from its events."""

    config: RequestConfig
    snapshot: RequestSnapshot
    """The state after the last published round."""
    previous: RequestSnapshot | None
    """S_0 of the last published round (None before the first round)."""
    last_round_id: str | None
    last_coordinate_digest: str | None
    rounds: int
    events: int
    head_seq: int
    head_hash: str

    @property
    def state(self) -> RequestState:
        """The replayed state."""
        return self.snapshot.state


@dataclass(frozen=True, slots=True)
class ReplayedRound:
    """One replayed round, handed to a :data:`RoundObserver` after it was accepted."""

    config: RequestConfig
    start: RequestSnapshot
    """S_0 (with its processor chain)."""
    successor: RequestSnapshot
    """S_1 as replay staged it."""
    round_id: str
    seq: int
    """Seq of the round's ``round_published`` event."""
    ready: dict[str, Any]
    verified: dict[str, Any]
    decided: dict[str, Any]
    staged: dict[str, Any]
    published: dict[str, Any]


RoundObserver = Callable[[ReplayedRound], None]
"""Called for every round replay accepts (the audit re-derives decisions there)."""

HashCheck = Callable[[StoredEvent | StoredRound], bool]
"""Says whether an event's stored hash (every stored hash of a whole round) matches its bytes, in place of
replay's own recomputation (the audit passes
:meth:`~specround.statemachine.chain_verification.ChainCheck.hash_matches`, which has judged the event or
round already)."""


class _Fold:
    """Folds the events of one request, in seq order, into its state."""

    def __init__(
        self,
        first: StoredEvent,
        verify_hashes: bool,
        observer: RoundObserver | None = None,
        hash_check: HashCheck | None = None,
    ) -> None:
        self.request_id = first.request_id
        self.verify_hashes = verify_hashes
        self.hash_check = hash_check
        self.observer = observer
        self.expected_seq = 0
        self.prev_hash = GENESIS_HASH
        self.round: list[dict[str, Any]] = []
        self.round_id: str | None = None
        self.rounds = 0
        self.events = 0
        self.previous: RequestSnapshot | None = None
        self.last_round_id: str | None = None
        self.last_coordinate: str | None = None
        if first.kind != _OPENED:
            raise self._error(first, f"the first event is {first.kind!r}, not {_OPENED!r}")
        payload = self._accept(first)
        try:
            opened = parse_event(payload)
        except SpecroundError as exc:
            raise self._error(first, str(exc)) from exc
        if not isinstance(opened, RequestOpened):
            raise self._error(first, f"the payload is a {opened.kind} event")
        if opened.config.request_id != self.request_id:
            raise self._error(first, f"configuration names request {opened.config.request_id!r}")
        if first.generation != 0:
            raise self._error(first, f"request_opened carries generation {first.generation}, not 0")
        self.config = opened.config
        try:
            self.snapshot = open_snapshot(opened.config)
        except Exception as exc:  # a configuration the chain vouches for but no controller could open
            raise self._error(first, f"the configuration cannot be opened: {exc}") from exc
        if self.snapshot.digest != opened.initial_state_digest:
            raise self._error(first, "the initial state digest does not match the configuration")

    # --- per event --------------------------------------------------------------------------------------

    def _error(self, event: StoredEvent, message: str) -> LogIntegrityError:
        return LogIntegrityError(f"request {self.request_id!r} seq {event.seq} ({event.kind}): {message}")

    def _accept(self, event: StoredEvent) -> dict[str, Any]:
        """Envelope, sequence and hash-link checks; returns the current-version payload."""
        if event.defect is not None:
            raise self._error(event, f"malformed row: {event.defect}")
        if event.seq != self.expected_seq:
            raise self._error(event, f"expected seq {self.expected_seq} (an event is missing or reordered)")
        prev_hash = event.prev_hash
        if prev_hash != self.prev_hash:
            raise self._error(event, "prev_hash does not link to the previous event (dropped or reordered)")
        payload = event.payload
        if not isinstance(payload, dict):
            raise self._error(event, f"the payload is a {type(payload).__name__}, not an object")
        link = event.hash
        if self.verify_hashes:
            check = self.hash_check
            if check is not None:
                matches = check(event)
            else:
                data = event.payload_bytes
                if data is None:
                    data = canonical_bytes(payload)
                matches = _sha256(prev_hash.encode("ascii") + data).hexdigest() == link  # chain_hash, inlined
            if not matches:
                raise self._error(event, "hash does not match the payload (edited event)")
        get = payload.get
        if get("kind") != event.kind or get("request_id") != self.request_id:
            raise self._error(event, "the envelope disagrees with the payload's kind or request id")
        if get("schema_version") != EVENT_SCHEMA_VERSION:
            try:
                payload = parse_event(payload).model_dump(mode="json")
            except SpecroundError as exc:
                raise self._error(event, str(exc)) from exc
        self.expected_seq += 1
        self.prev_hash = link
        self.events += 1
        return payload

    def feed(self, event: StoredEvent) -> None:
        """Take the next stored event of this request (after the checks of :meth:`_accept`)."""
        payload = self._accept(event)
        pending = self.round
        at = len(pending)
        if event.kind != ROUND_EVENT_KINDS[at]:
            raise self._error(event, f"expected a {ROUND_EVENT_KINDS[at]} event")
        state = self.snapshot.state
        if event.generation != state.generation + 1:
            raise self._error(
                event, f"envelope generation {event.generation}, expected {state.generation + 1}"
            )
        if not at:
            if state.finished:
                raise self._error(event, "a round after the request finished (INV-2)")
            self.round_id = event.round_id
        round_id = self.round_id
        if event.round_id != round_id or payload.get("round_id") != round_id:
            raise self._error(event, f"round id {event.round_id!r} inside round {round_id!r}")
        pending.append(payload)
        if at == _LAST_EVENT:
            self._end_round(event.seq)

    def feed_round(self, stored: StoredRound) -> None:
        """Take the next round of this request whole: the same checks as its five events fed one by one.

        When everything :meth:`feed` checks per event holds for all five (they link from this request's
        last event, the recomputed chain over their bytes reaches the stored hash, their envelopes and
        payloads agree), the round is folded at once; otherwise its events are fed one by one, which
        raises the finding :meth:`feed` names.
        """
        state = self.snapshot.state
        payloads = stored.payloads
        if (
            self.round
            or state.finished
            or stored.generation != state.generation + 1
            or stored.first_seq != self.expected_seq
            or stored.prev_hash != self.prev_hash
            or not stored.envelopes_match(EVENT_SCHEMA_VERSION)
            or (self.verify_hashes and not self._round_hashes_match(stored))
        ):
            for event in stored.events():
                self.feed(event)
            return
        self.round_id = stored.round_id
        self.round = list(payloads)
        self.expected_seq += len(payloads)
        self.prev_hash = stored.hash
        self.events += len(payloads)
        self._end_round(self.expected_seq - 1)

    def _round_hashes_match(self, stored: StoredRound) -> bool:
        """Whether every stored hash of the round matches its bytes (judged by ``hash_check`` when given)."""
        check = self.hash_check
        return check(stored) if check is not None else stored.hash_matches()

    # --- per round --------------------------------------------------------------------------------------

    def _end_round(self, seq: int) -> None:
        """Fold the pending round, whose ``round_published`` event has ``seq``, and tell the observer."""
        try:
            replayed = self._fold_round(seq)
        except LogIntegrityError:
            raise
        except Exception as exc:  # any value the round's checks cannot even read is a malformed payload
            raise self._round_error(seq, f"malformed round payload: {exc!r}"[:500]) from exc
        self.round = []
        if replayed is not None:
            assert self.observer is not None
            self.observer(replayed)

    def _round_error(self, seq: int, message: str) -> LogIntegrityError:
        """:meth:`_error` for the round's ``round_published`` event at ``seq``."""
        return LogIntegrityError(f"request {self.request_id!r} seq {seq} ({_PUBLISHED}): {message}")

    def _fold_round(self, seq: int) -> ReplayedRound | None:
        """Check and fold the pending round; the round for the observer (None without one)."""
        ready, verified, decided, staged, published = self.round
        start = self.snapshot
        s0 = start.state
        rng = s0.rng
        rng_before = (rng.proposal, rng.accept, rng.terminal)

        def fail(message: str) -> LogIntegrityError:
            return self._round_error(seq, f"round {self.round_id!r}: {message}")

        if ready["expected_generation"] != s0.generation:
            raise fail(f"expects generation {ready['expected_generation']}, the state is at {s0.generation}")
        draft_ids = tuple(ready["draft_ids"])
        emitted = tuple(decided["emitted_ids"])
        terminal = decided["terminal"]
        accepted = decided["accepted"]
        accept_draws, terminal_draws = decided["accept_draws"], decided["terminal_draws"]
        finished, reason = decided["finished"], decided["finish_reason"]
        if terminal not in _TERMINALS or reason not in _REASONS or bool(reason) != bool(finished):
            raise fail(f"terminal {terminal!r} / finish {finished!r} {reason!r} is not a valid outcome")
        vocab = self.config.vocab_size
        if (emitted and (min(emitted) < 0 or max(emitted) >= vocab)) or (
            draft_ids and (min(draft_ids) < 0 or max(draft_ids) >= vocab)
        ):
            raise fail("a token outside the vocabulary")
        # INV-2: growth = accepted drafts plus one correction/bonus unless a stop ended the prefix.
        if len(emitted) != accepted + (0 if terminal == "stop" else 1):
            raise fail(f"{len(emitted)} emitted tokens for A = {accepted} and terminal {terminal}")
        if terminal == "stop" and not finished:
            raise fail("a stop terminal for an unfinished request")
        # INV-3: counters and draws.
        if (
            ready["proposal_before"],
            decided["accept_counter"],
            decided["terminal_counter"],
        ) != rng_before:
            raise fail("RNG counters at round start disagree with the state")
        reached = accepted + (1 if terminal == "correction" else 0)
        if accept_draws != reached or len(decided["accept_uniforms"]) != accept_draws:
            raise fail(f"{accept_draws} ACCEPT draws for {reached} reached acceptance tests")
        if terminal_draws != (0 if terminal == "stop" else 1):
            raise fail(f"{terminal_draws} TERMINAL draws for terminal {terminal}")
        proposal_draws = ready["proposal_after"] - ready["proposal_before"]
        if proposal_draws < 0:
            raise fail("PROPOSAL counter moved backwards")
        if min(accept_draws, terminal_draws) < 0:
            raise fail("negative draw counts")
        rng_after = assemble(
            RngCounters,
            {
                "proposal": rng.proposal + proposal_draws,
                "accept": rng.accept + accept_draws,
                "terminal": rng.terminal + terminal_draws,
            },
        )
        rng_after_tuple = (rng_after.proposal, rng_after.accept, rng_after.terminal)
        if tuple(staged["rng_before"]) != rng_before or tuple(staged["rng_after"]) != rng_after_tuple:
            raise fail("staged RNG counters are not before + draws (INV-3)")
        # INV-5: committed and discarded rows.
        try:
            kv = stage_kv(s0, draft_ids, emitted)
        except SpecroundError as exc:
            raise fail(str(exc)) from exc
        if tuple(staged["committed_kv_ids"]) != kv.committed_token_ids:
            raise fail(
                f"committed K/V {staged['committed_kv_ids']} != {list(kv.committed_token_ids)} (INV-5)"
            )
        if tuple(staged["discarded_kv_ids"]) != kv.discarded_token_ids:
            raise fail(
                f"discarded K/V {staged['discarded_kv_ids']} != {list(kv.discarded_token_ids)} (INV-5)"
            )
        if staged["processor_before"] != s0.processors_digest:
            raise fail("processor digest at round start disagrees with the state")
        # INV-1 and INV-4: the successor, staged exactly as the controller stages it.
        try:
            successor = stage_successor(
                start, emitted, kv.committed_token_ids, rng_after, finished=finished, finish_reason=reason
            )
        except SpecroundError as exc:
            raise fail(str(exc)) from exc
        if staged["processor_after"] != successor.state.processors_digest:
            raise fail("processor state after the round is not G_0 advanced over the emitted tokens (INV-4)")
        if staged["successor_digest"] != successor.digest:
            raise fail("the replayed successor's digest differs from the logged one (INV-8)")
        if published["generation"] != s0.generation + 1:
            raise fail(
                f"publishes generation {published['generation']}, expected {s0.generation + 1} (INV-6)"
            )
        assert self.round_id is not None
        commit_digest = record_digest_of(
            SpeculativeCommit,
            commit_values(
                request_id=self.request_id,
                round_id=self.round_id,
                expected_generation=s0.generation,
                layout=self.config.layout,
                accepted=accepted,
                terminal=terminal,
                emitted=emitted,
                committed_kv=kv.committed_token_ids,
                discarded_kv=kv.discarded_token_ids,
                rng_before=rng_before,
                rng_after=rng_after_tuple,
                processor_before=s0.processors_digest,
                processor_after=successor.state.processors_digest,
                finished=finished,
                finish_reason=reason,
                coordinate_digest=ready["coordinate_digest"],
                successor_digest=successor.digest,
            ),
        )
        if published["commit_digest"] != commit_digest:
            raise fail("the commit digest does not match the round's events")
        self.previous = start
        self.snapshot = successor
        self.last_round_id = self.round_id
        self.last_coordinate = ready["coordinate_digest"]
        self.rounds += 1
        if self.observer is None:
            return None
        return ReplayedRound(
            config=self.config,
            start=start,
            successor=successor,
            round_id=self.round_id,
            seq=seq,
            ready=ready,
            verified=verified,
            decided=decided,
            staged=staged,
            published=published,
        )

    def finish(self) -> ReplayedRequest:
        """The replayed request; refuses a round that was cut off."""
        if self.round:
            raise LogIntegrityError(
                f"request {self.request_id!r}: round {self.round_id!r} ends after {len(self.round)} of "
                f"{len(ROUND_EVENT_KINDS)} events (dropped events)"
            )
        return ReplayedRequest(
            config=self.config,
            snapshot=self.snapshot,
            previous=self.previous,
            last_round_id=self.last_round_id,
            last_coordinate_digest=self.last_coordinate,
            rounds=self.rounds,
            events=self.events,
            head_seq=self.expected_seq - 1,
            head_hash=self.prev_hash,
        )


def replay_events(
    events: Iterable[StoredEvent | StoredRound],
    *,
    verify_hashes: bool = True,
    on_round: RoundObserver | None = None,
    hash_check: HashCheck | None = None,
) -> Iterator[ReplayedRequest]:
    """Replay a stream ordered by (request, seq), yielding each request as soon as its events end.

    ``on_round`` is called with every round replay accepted, in order. ``hash_check`` (with
    ``verify_hashes``) judges each event's hash instead of replay recomputing it. A
    :class:`~specround.statemachine.ports.StoredRound` in the stream stands for its five events.
    """
    fold: _Fold | None = None
    seen: set[str] = set()
    for item in events:
        if fold is not None and item.request_id == fold.request_id:
            if isinstance(item, StoredRound):
                fold.feed_round(item)
            else:
                fold.feed(item)
            continue
        if fold is not None:
            yield fold.finish()
        if item.request_id in seen:
            raise LogIntegrityError(f"events of request {item.request_id!r} are not contiguous in the stream")
        seen.add(item.request_id)
        if isinstance(item, StoredRound):  # a request whose first stored event is a round's
            first, *rest = item.events()
            fold = _Fold(first, verify_hashes, on_round, hash_check)
            for event in rest:
                fold.feed(event)
        else:
            fold = _Fold(item, verify_hashes, on_round, hash_check)
    if fold is not None:
        yield fold.finish()


def replay_request(
    events: Iterable[StoredEvent | StoredRound],
    *,
    verify_hashes: bool = True,
    on_round: RoundObserver | None = None,
    hash_check: HashCheck | None = None,
) -> ReplayedRequest:
    """Replay the events of exactly one request (``hash_check``: see :func:`replay_events`)."""
    replayed = list(
        replay_events(events, verify_hashes=verify_hashes, on_round=on_round, hash_check=hash_check)
    )
    if len(replayed) != 1:
        raise LogIntegrityError(f"expected the events of one request, got {len(replayed)} requests")
    return replayed[0]


def replay_log(
    log: EventLog, *, request_id: str | None = None, verify_hashes: bool = True
) -> Iterator[ReplayedRequest]:
    """Replay a whole log (or one request of it), streaming (whole rounds where the log can stream them)."""
    return replay_events(stored_items(log, request_id), verify_hashes=verify_hashes)


def replay_states(log: EventLog, *, verify_hashes: bool = True) -> dict[str, RequestState]:
    """Every request's replayed state, by request id."""
    return {r.config.request_id: r.state for r in replay_log(log, verify_hashes=verify_hashes)}
