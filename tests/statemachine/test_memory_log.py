"""The in-memory event log: fence, idempotence, group commit, chain values, snapshot reads (INV-6, INV-9)."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.errors import InvalidRequestError, LogUnavailableError
from specround.statemachine.ports import PublishStatus
from tests.statemachine._builders import opened_event, publication


def _opened_log(*request_ids: str) -> MemoryEventLog:
    log = MemoryEventLog(clock=lambda: 1.5)
    for request_id in request_ids:
        log.open_request(opened_event(request_id), "5" * 64)
    return log


def test_open_is_idempotent_and_refuses_a_different_configuration() -> None:
    log = _opened_log("a")
    log.open_request(opened_event("a"), "5" * 64)  # identical: no-op
    assert [e.seq for e in log.events("a")] == [0]
    with pytest.raises(InvalidRequestError):
        log.open_request(opened_event("a", prompt=(9,)), "5" * 64)
    with pytest.raises(InvalidRequestError):
        log.open_request(opened_event("a"), "6" * 64)
    assert [e.seq for e in log.events("a")] == [0]
    head = log.head("a")
    assert head is not None and head.generation == 0 and head.state_digest == "5" * 64


def test_publish_moves_the_fence_and_chains_hashes() -> None:
    log = _opened_log("a")
    [outcome] = log.publish([publication("a", "r1", 0)])
    assert outcome.status is PublishStatus.PUBLISHED and outcome.generation == 1
    events = list(log.events("a"))
    assert [e.kind for e in events] == [
        "request_opened",
        "round_ready",
        "round_verified",
        "round_decided",
        "round_staged",
        "round_published",
    ]
    assert [e.seq for e in events] == list(range(6))
    prev = GENESIS_HASH
    for event in events:  # INV-9: each hash links the previous one over the canonical payload
        assert event.prev_hash == prev
        assert event.hash == chain_hash(prev, canonical_bytes(event.payload))
        prev = event.hash
    assert all(e.generation == 1 and e.round_id == "r1" for e in events[1:])
    head = log.head("a")
    assert head is not None
    assert (head.generation, head.seq, head.hash) == (1, 5, events[-1].hash)


def test_same_transaction_again_appends_nothing_and_stale_or_duplicate_is_refused() -> None:
    log = _opened_log("a")
    log.publish([publication("a", "r1", 0)])
    before = list(log.events("a"))
    # INV-6: the same transaction again is acknowledged with the generation it published.
    [again] = log.publish([publication("a", "r1", 0)])
    assert again.status is PublishStatus.ALREADY_PUBLISHED and again.generation == 1
    # A different transaction at the stale generation is refused.
    [stale] = log.publish([publication("a", "r2", 0, token=5)])
    assert stale.status is PublishStatus.STALE_GENERATION and stale.generation == 1
    # The same round id with a different commit is a duplicate round.
    [dup] = log.publish([publication("a", "r1", 1, token=6)])
    assert dup.status is PublishStatus.DUPLICATE_ROUND
    assert list(log.events("a")) == before


def test_group_commit_fences_each_request_on_its_own() -> None:
    log = _opened_log("a", "b", "c")
    log.publish([publication("b", "b1", 0)])
    outcomes = log.publish([publication("a", "a1", 0), publication("b", "b2", 0), publication("c", "c1", 0)])
    assert [o.status for o in outcomes] == [
        PublishStatus.PUBLISHED,
        PublishStatus.STALE_GENERATION,
        PublishStatus.PUBLISHED,
    ]
    assert len(list(log.events("a"))) == 6 and len(list(log.events("b"))) == 6


def test_later_publication_in_the_same_call_sees_the_earlier_one() -> None:
    log = _opened_log("a")
    outcomes = log.publish([publication("a", "r1", 0), publication("a", "r2", 1, token=5)])
    assert [o.generation for o in outcomes] == [1, 2]
    head = log.head("a")
    assert head is not None and head.seq == 10


def test_malformed_publication_refuses_the_whole_call() -> None:
    log = _opened_log("a", "b")
    good = publication("a", "r1", 0)
    bad = publication("b", "r1", 0)
    bad = dataclasses.replace(bad, expected_generation=3)
    with pytest.raises(InvalidRequestError):
        log.publish([good, bad])
    with pytest.raises(InvalidRequestError):
        log.publish([publication("unknown", "r1", 0)])
    assert len(list(log.events())) == 2


def test_events_stream_in_request_then_seq_order_and_payloads_are_copies() -> None:
    log = _opened_log("b", "a")
    log.publish([publication("b", "r1", 0), publication("a", "r1", 0)])
    keys = [(e.request_id, e.seq) for e in log.events()]
    assert keys == sorted(keys)
    assert log.request_ids() == ["a", "b"]
    first = next(log.events("a"))
    first.payload["request_id"] = "tampered"
    assert next(log.events("a")).payload["request_id"] == "a"
    assert list(log.events("nobody")) == [] and log.head("nobody") is None


def test_concurrent_publishers_have_exactly_one_winner_per_generation() -> None:
    log = _opened_log("a")
    barrier = threading.Barrier(8)
    results: list[PublishStatus] = []
    lock = threading.Lock()

    def racer(index: int) -> None:
        barrier.wait()
        [outcome] = log.publish([publication("a", f"r-{index}", 0, token=index)])
        with lock:
            results.append(outcome.status)

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(PublishStatus.PUBLISHED) == 1
    assert results.count(PublishStatus.STALE_GENERATION) == 7
    assert len(list(log.events("a"))) == 6


def test_closed_log_refuses_every_call() -> None:
    log = _opened_log("a")
    log.close()
    with pytest.raises(LogUnavailableError):
        log.head("a")
    with pytest.raises(LogUnavailableError):
        list(log.events())
    with pytest.raises(LogUnavailableError):
        log.publish([])


def test_a_finished_request_cannot_be_extended() -> None:
    from specround.errors import RequestFinishedError

    log = _opened_log("a", "b")
    log.publish([publication("a", "r1", 0, finished=True)])
    before = list(log.events())
    with pytest.raises(RequestFinishedError):
        log.publish([publication("b", "b1", 0), publication("a", "r2", 1, token=5)])
    assert list(log.events()) == before
    [stale] = log.publish([publication("a", "r3", 0, token=6)])
    assert stale.status is PublishStatus.STALE_GENERATION
