"""The EventLog contract, as base classes every backend runs (SQLite, PostgreSQL, the memory log).

Subclass :class:`EventLogContract` in a ``Test*`` class and provide a ``log`` fixture that yields a new,
empty log. Invariant numbers refer to ``specs/`` (INV-6 fence, INV-8 replay, INV-9 hash chain).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.errors import InvalidRequestError, LogUnavailableError, RequestFinishedError
from specround.statemachine.events import ROUND_EVENT_KINDS, RequestOpened, RoundVerified, parse_event
from specround.statemachine.ports import (
    EventLog,
    PublishOutcome,
    PublishStatus,
    StoredEvent,
)
from specround.statemachine.state import RequestState
from tests.adapters.synthetic_rounds import (
    build_round,
    make_config,
    open_request,
    replay_state,
    run_rounds,
)

PUBLISHED = PublishStatus.PUBLISHED
ALREADY = PublishStatus.ALREADY_PUBLISHED
STALE = PublishStatus.STALE_GENERATION
DUPLICATE = PublishStatus.DUPLICATE_ROUND


def opened(log: EventLog, request_id: str, **config: Any) -> tuple[Any, RequestState]:
    """Open a synthetic request in ``log``; return its config and initial state."""
    cfg = make_config(request_id, **config)
    event, state = open_request(cfg)
    log.open_request(event, state.digest())
    return cfg, state


def snapshot(log: EventLog) -> tuple[list[StoredEvent], dict[str, Any]]:
    """Every stored event and every head: what "the log is exactly as it was" compares (INV-7)."""
    return list(log.events()), {rid: log.head(rid) for rid in log.request_ids()}


def assert_chains_verify(log: EventLog) -> dict[str, int]:
    """INV-9: every request's events form an unbroken chain ending at its head; returns event counts."""
    counts: dict[str, int] = {}
    previous: StoredEvent | None = None
    for event in log.events():
        if previous is None or previous.request_id != event.request_id:
            assert event.seq == 0 and event.kind == "request_opened", event
            assert event.prev_hash == GENESIS_HASH
            if previous is not None:
                assert previous.request_id < event.request_id, "requests out of order"
        else:
            assert event.seq == previous.seq + 1, f"seq gap after {previous}"
            assert event.prev_hash == previous.hash
        assert event.hash == chain_hash(event.prev_hash, canonical_bytes(event.payload)), event
        if event.payload_bytes is not None:  # a log that keeps the stored bytes hands out exactly those
            assert event.payload_bytes == canonical_bytes(event.payload)
        assert event.payload["request_id"] == event.request_id
        assert event.payload["kind"] == event.kind
        counts[event.request_id] = counts.get(event.request_id, 0) + 1
        previous = event
    for request_id, count in counts.items():
        head = log.head(request_id)
        assert head is not None
        assert head.seq == count - 1
        assert count == 1 + len(ROUND_EVENT_KINDS) * head.generation
        last = list(log.events(request_id))[-1]
        assert head.hash == last.hash
    assert sorted(counts) == log.request_ids()
    return counts


class EventLogContract:
    """Behaviour every :class:`~specround.statemachine.ports.EventLog` implementation must show."""

    @pytest.fixture
    def log(self) -> Iterator[EventLog]:
        raise NotImplementedError("subclasses provide a fresh, empty log")

    # --- opening requests ------------------------------------------------------------------------------

    def test_open_request_appends_the_genesis_event(self, log: EventLog) -> None:
        cfg = make_config("req-a")
        event, state = open_request(cfg)
        log.open_request(event, state.digest())
        head = log.head("req-a")
        expected_hash = chain_hash(GENESIS_HASH, canonical_bytes(event))
        assert head is not None
        assert (head.generation, head.seq, head.hash, head.state_digest, head.finished) == (
            0,
            0,
            expected_hash,
            state.digest(),
            False,
        )
        (stored,) = list(log.events("req-a"))
        assert (stored.seq, stored.kind, stored.round_id, stored.generation) == (0, "request_opened", None, 0)
        assert (stored.prev_hash, stored.hash) == (GENESIS_HASH, expected_hash)
        assert stored.schema_version == event.schema_version
        assert canonical_bytes(stored.payload) == canonical_bytes(event)
        assert parse_event(stored.payload) == event

    def test_opening_the_same_request_again_is_a_no_op(self, log: EventLog) -> None:
        cfg = make_config("req-a")
        event, state = open_request(cfg)
        log.open_request(event, state.digest())
        before = snapshot(log)
        log.open_request(event, state.digest())
        assert snapshot(log) == before

    def test_opening_a_known_request_differently_is_refused(self, log: EventLog) -> None:
        event, state = open_request(make_config("req-a"))
        log.open_request(event, state.digest())
        before = snapshot(log)
        other, other_state = open_request(make_config("req-a", max_new_tokens=99))
        with pytest.raises(InvalidRequestError):
            log.open_request(other, other_state.digest())
        with pytest.raises(InvalidRequestError):
            log.open_request(event, "f" * 64)
        assert snapshot(log) == before

    def test_open_request_refuses_a_config_of_another_request(self, log: EventLog) -> None:
        event, state = open_request(make_config("req-a"))
        forged = RequestOpened(request_id="req-b", config=event.config, initial_state_digest=state.digest())
        with pytest.raises(InvalidRequestError):
            log.open_request(forged, state.digest())
        assert log.request_ids() == []
        assert log.head("req-b") is None

    def test_unknown_request_has_no_head_and_no_events(self, log: EventLog) -> None:
        assert log.head("nobody") is None
        assert list(log.events("nobody")) == []
        assert log.request_ids() == []

    def test_request_ids_sort_like_python(self, log: EventLog) -> None:
        ids = ["b", "B", "a", "é", "Z", "10", "9", "a-1", "a_1", "\u00e9x", "ß"]
        for request_id in ids:
            opened(log, request_id)
        assert log.request_ids() == sorted(ids)
        assert [e.request_id for e in log.events()] == sorted(ids)

    # --- publishing: the fence (INV-6) ------------------------------------------------------------------

    def test_publish_moves_the_fence_and_appends_the_round(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        publication, successor = build_round(cfg, state)
        (outcome,) = log.publish([publication])
        assert outcome == PublishOutcome("req-a", publication.round_id, PUBLISHED, 1)
        head = log.head("req-a")
        stored = list(log.events("req-a"))
        assert head is not None
        assert (head.generation, head.seq, head.state_digest, head.finished) == (
            1,
            5,
            successor.digest(),
            successor.finished,
        )
        assert [e.kind for e in stored[1:]] == list(ROUND_EVENT_KINDS)
        assert all(e.round_id == publication.round_id and e.generation == 1 for e in stored[1:])
        assert [canonical_bytes(e.payload) for e in stored[1:]] == [
            canonical_bytes(e) for e in publication.events()
        ]
        assert [parse_event(e.payload) for e in stored[1:]] == list(publication.events())
        assert head.hash == stored[-1].hash

    def test_publishing_the_same_transaction_again_appends_nothing(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        publication, successor = build_round(cfg, state)
        log.publish([publication])
        before = snapshot(log)
        again = log.publish([publication])
        assert again == [PublishOutcome("req-a", publication.round_id, ALREADY, 1)]
        assert snapshot(log) == before
        # Still idempotent once later rounds have moved the fence on (recovery after F-6).
        follow, _ = build_round(cfg, successor)
        assert log.publish([follow])[0].status is PUBLISHED
        assert log.publish([publication]) == [PublishOutcome("req-a", publication.round_id, ALREADY, 1)]

    def test_a_different_transaction_at_a_stale_generation_is_refused(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        winner, _ = build_round(cfg, state, variant=0)
        loser, _ = build_round(cfg, state, variant=1)
        assert winner.commit_digest != loser.commit_digest
        log.publish([winner])
        before = snapshot(log)
        assert log.publish([loser]) == [PublishOutcome("req-a", loser.round_id, STALE, 1)]
        assert snapshot(log) == before

    def test_a_round_id_reused_for_another_commit_is_a_duplicate_round(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        first, successor = build_round(cfg, state, round_id="the-round")
        log.publish([first])
        before = snapshot(log)
        # Same round id, different transaction, at the stale generation ...
        rival, _ = build_round(cfg, state, variant=1, round_id="the-round")
        assert log.publish([rival]) == [PublishOutcome("req-a", "the-round", DUPLICATE, 1)]
        # ... and at the current generation: the round id is still taken.
        reuse, _ = build_round(cfg, successor, round_id="the-round")
        assert log.publish([reuse]) == [PublishOutcome("req-a", "the-round", DUPLICATE, 1)]
        assert snapshot(log) == before

    def test_group_commit_fences_each_request_on_its_own(self, log: EventLog) -> None:
        states = {rid: opened(log, rid) for rid in ("r0", "r1", "r2", "r3", "r4")}
        first = {rid: build_round(cfg, st) for rid, (cfg, st) in states.items()}
        log.publish([first["r1"][0], first["r2"][0], first["r3"][0]])
        cfg1, _ = states["r1"]
        cfg3, st3 = states["r3"]
        batch = [
            first["r0"][0],  # fresh: published
            build_round(cfg1, first["r1"][1])[0],  # next round of r1: published
            first["r2"][0],  # already published: idempotent
            build_round(cfg3, st3, variant=7)[0],  # rival of r3's round 0: stale
            build_round(cfg3, first["r3"][1], round_id=first["r3"][0].round_id)[0],  # reused id: duplicate
            first["r4"][0],  # fresh: published
        ]
        outcomes = log.publish(batch)
        assert [(o.request_id, o.status, o.generation) for o in outcomes] == [
            ("r0", PUBLISHED, 1),
            ("r1", PUBLISHED, 2),
            ("r2", ALREADY, 1),
            ("r3", STALE, 1),
            ("r3", DUPLICATE, 1),
            ("r4", PUBLISHED, 1),
        ]
        assert [o.round_id for o in outcomes] == [p.round_id for p in batch]
        heads = {rid: log.head(rid) for rid in states}
        assert {rid: h.generation for rid, h in heads.items() if h} == {
            "r0": 1,
            "r1": 2,
            "r2": 1,
            "r3": 1,
            "r4": 1,
        }
        assert assert_chains_verify(log) == {"r0": 6, "r1": 11, "r2": 6, "r3": 6, "r4": 6}

    def test_a_batch_is_decided_in_order(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        (p1, _), (p2, s2) = run_rounds(cfg, state, 2)
        rival, _ = build_round(cfg, state, variant=3)
        outcomes = log.publish([p1, p1, p2, rival])
        assert [(o.status, o.generation) for o in outcomes] == [
            (PUBLISHED, 1),
            (ALREADY, 1),
            (PUBLISHED, 2),
            (STALE, 2),
        ]
        head = log.head("req-a")
        assert head is not None and head.state_digest == s2.digest()
        assert assert_chains_verify(log) == {"req-a": 11}

    def test_a_malformed_publication_refuses_the_whole_call(self, log: EventLog) -> None:
        cfg_a, state_a = opened(log, "req-a")
        cfg_b, state_b = opened(log, "req-b")
        good, _ = build_round(cfg_a, state_a)
        other, _ = build_round(cfg_b, state_b)
        before = snapshot(log)
        bad_generation = replace(good, expected_generation=1)
        mixed = replace(good, verified=other.verified)
        wrong_digest = replace(good, commit_digest="0" * 64)
        wrong_successor = replace(good, successor_digest="0" * 64)
        wrong_finished = replace(good, finished=not good.finished)
        for bad in (bad_generation, mixed, wrong_digest, wrong_successor, wrong_finished):
            with pytest.raises(InvalidRequestError):
                log.publish([good, bad])
        assert snapshot(log) == before

    @pytest.mark.parametrize("digest", ["zz" * 32, "AB" * 32, "ab" * 31, "ab" * 33, ""])
    def test_a_digest_that_is_not_lowercase_sha256_hex_is_refused(self, log: EventLog, digest: str) -> None:
        """Every log refuses a digest it keeps as a fence column unless it is SHA-256 in lowercase hex."""
        cfg, state = opened(log, "req-a")
        good, _ = build_round(cfg, state)
        before = snapshot(log)
        commit = replace(
            good, commit_digest=digest, published=good.published.model_copy(update={"commit_digest": digest})
        )
        successor = replace(
            good, successor_digest=digest, staged=good.staged.model_copy(update={"successor_digest": digest})
        )
        for bad, named in ((commit, "commit digest"), (successor, "successor digest")):
            with pytest.raises(InvalidRequestError, match=named):
                log.publish([good, bad])
        event, _ = open_request(make_config("req-b"))
        with pytest.raises(InvalidRequestError, match="initial state digest"):
            log.open_request(event, digest)
        assert snapshot(log) == before

    def test_a_publication_for_an_unknown_request_refuses_the_whole_call(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a")
        good, _ = build_round(cfg, state)
        stray, _ = build_round(make_config("ghost"), open_request(make_config("ghost"))[1])
        before = snapshot(log)
        with pytest.raises(InvalidRequestError):
            log.publish([good, stray])
        assert snapshot(log) == before

    def test_a_finished_request_refuses_further_rounds(self, log: EventLog) -> None:
        """INV-2: a finished request gets no further round; the log refuses it and appends nothing."""
        cfg, state = opened(log, "req-a", max_new_tokens=2)
        rounds = run_rounds(cfg, state, 5)
        for publication, _ in rounds:
            log.publish([publication])
        final = rounds[-1][1]
        assert final.finished
        # A caller that lost track of the finish (here: a larger budget) builds one more round.
        longer = cfg.model_copy(update={"max_new_tokens": 50})
        extra, _ = build_round(longer, final.model_copy(update={"finished": False}))
        before = snapshot(log)
        with pytest.raises(RequestFinishedError):
            log.publish([extra])
        assert snapshot(log) == before
        # ... while the finishing round itself stays idempotent.
        assert log.publish([rounds[-1][0]])[0].status is ALREADY

    def test_publishing_nothing_returns_nothing(self, log: EventLog) -> None:
        assert log.publish([]) == []

    # --- reading -----------------------------------------------------------------------------------------

    def test_events_stream_in_request_then_seq_order(self, log: EventLog) -> None:
        ids = ["m", "a", "z", "c"]
        for request_id in ids:
            cfg, state = opened(log, request_id, max_new_tokens=40)
            for publication, _ in run_rounds(cfg, state, 3):
                log.publish([publication])
        everything = log.events()
        assert isinstance(everything, Iterator)
        keys = [(e.request_id, e.seq) for e in everything]
        assert keys == sorted(keys)
        assert [k[0] for k in keys][::16] == sorted(ids)
        for request_id in ids:
            own = list(log.events(request_id))
            assert [e.seq for e in own] == list(range(16))
            assert own == [e for e in log.events() if e.request_id == request_id]

    def test_a_reader_sees_whole_rounds_while_writes_continue(self, log: EventLog) -> None:
        cfg, state = opened(log, "req-a", max_new_tokens=60)
        rounds = run_rounds(cfg, state, 4)
        log.publish([rounds[0][0]])
        reader = log.events("req-a")
        first = next(reader)
        log.publish([rounds[1][0]])  # must not deadlock against the open reader
        seen = [first, *reader]
        final = list(log.events("req-a"))
        assert seen == final[: len(seen)]
        assert len(seen) in (6, 11)
        assert len(final) == 11

    def test_hash_chain_links_every_event(self, log: EventLog) -> None:
        """INV-9 with explicit values: hash_i = sha256(hash_{i-1} || canonical_bytes(event_i))."""
        cfg, state = opened(log, "req-a")
        event, _ = open_request(cfg)
        rounds = run_rounds(cfg, state, 2)
        log.publish([p for p, _ in rounds])
        expected = []
        previous = GENESIS_HASH
        for item in [event, *(e for p, _ in rounds for e in p.events())]:
            previous = chain_hash(previous, canonical_bytes(item))
            expected.append(previous)
        assert [e.hash for e in log.events("req-a")] == expected
        assert assert_chains_verify(log) == {"req-a": 11}

    def test_replaying_the_log_reproduces_the_head(self, log: EventLog) -> None:
        """INV-8: a request rebuilt from its events alone has the head's state digest."""
        for request_id in ("a", "b"):
            cfg, state = opened(log, request_id, max_new_tokens=9)
            rounds = run_rounds(cfg, state, 10)
            for publication, _ in rounds:
                log.publish([publication])
            successor = rounds[-1][1]
            config, replayed = replay_state(log.events(request_id))
            head = log.head(request_id)
            assert config == cfg
            assert replayed == successor and head is not None
            assert (replayed.digest(), replayed.generation, replayed.finished) == (
                head.state_digest,
                head.generation,
                head.finished,
            )
            assert head.finished

    def test_an_older_event_schema_version_is_upcast_on_read(
        self, log: EventLog, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        from specround.statemachine import events as events_module

        def from_v0(payload: dict[str, Any]) -> dict[str, Any]:
            return {**payload, "p_rows_digest": "upcast-from-v0"}

        monkeypatch.setitem(events_module.UPCASTERS, ("round_verified", 0), from_v0)
        cfg, state = opened(log, "req-a")
        publication, _ = build_round(cfg, state)
        legacy = RoundVerified.model_validate({**publication.verified.model_dump(), "schema_version": 0})
        log.publish([replace(publication, verified=legacy)])
        stored = [e for e in log.events("req-a") if e.kind == "round_verified"]
        assert [(e.schema_version, e.payload["schema_version"]) for e in stored] == [(0, 0)]
        parsed = parse_event(stored[0].payload)
        assert isinstance(parsed, RoundVerified)
        assert (parsed.schema_version, parsed.p_rows_digest) == (1, "upcast-from-v0")
        assert parsed.p_draft == publication.verified.p_draft
        assert_chains_verify(log)

    def test_a_closed_log_refuses_calls(self, log: EventLog) -> None:
        opened(log, "req-a")
        log.close()
        with pytest.raises(LogUnavailableError):
            log.head("req-a")
        with pytest.raises(LogUnavailableError):
            log.request_ids()
        with pytest.raises(LogUnavailableError):
            list(log.events())
        with pytest.raises(LogUnavailableError):
            log.publish([])
