"""Eight processes race to publish the same rounds of the same requests against one log (INV-6).

Two races: one publishes synthetic rounds straight to the log (the fence's statuses as the log reports
them), one drives a RoundController in every worker (the statuses as a caller sees them).

Every worker opens the log (migrating a fresh database concurrently) and the same requests (identical
opens), then, step by step behind a barrier, rebuilds each request's state from the log and publishes its
own next round of every request in one group commit. Workers come in pairs that build identical
transactions (same variant), so a lost race is either ``ALREADY_PUBLISHED`` (the twin won) or
``STALE_GENERATION`` (someone else won). Checked afterwards: exactly one winner per (request, generation),
losers told the winning generation, no duplicated or missing token, chains and replay intact (INV-8, 9).
"""

from __future__ import annotations

import queue
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pytest

from specround.adapters.sql import SqlEventLog
from specround.statemachine.events import RoundDecided, RoundPublished, parse_event
from specround.statemachine.ports import PublishStatus
from specround.statemachine.replay import replay_log
from specround.statemachine.rounds import RoundStatus
from tests.adapters.eventlog_contract import assert_chains_verify
from tests.adapters.sql.workers import (
    BARRIER_TIMEOUT_S,
    ControllerRecord,
    RaceRecord,
    context,
    controller_race_worker,
    race_worker,
)
from tests.adapters.synthetic_rounds import replay_state

WORKERS = 8
STEPS = 6
BUDGETS = {"alpha": 200, "beta": 200, "gamma": 7}  # gamma finishes part-way through the race


def _race(url: str, target: Callable[..., None] = race_worker) -> list[Any]:
    ctx = context()
    barrier = ctx.Barrier(WORKERS)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=target, args=(url, w, w // 2, BUDGETS, STEPS, barrier, results))
        for w in range(WORKERS)
    ]
    for process in workers:
        process.start()
    records: list[Any] = []
    errors = []
    try:
        for _ in workers:
            worker, worker_records, error = results.get(timeout=BARRIER_TIMEOUT_S * 2)
            records.extend(worker_records)
            if error:
                errors.append(f"worker {worker}:\n{error}")
    except queue.Empty:
        errors.append("a worker never reported")
    finally:
        for process in workers:
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    assert not errors, "\n".join(errors)
    assert [p.exitcode for p in workers] == [0] * WORKERS
    return records


def _check(url: str, records: list[RaceRecord]) -> None:
    by_round: dict[tuple[str, int], list[RaceRecord]] = defaultdict(list)
    for record in records:
        by_round[(record.request_id, record.expected_generation)].append(record)
    statuses = {record.status for record in records}
    assert {PublishStatus.ALREADY_PUBLISHED.value, PublishStatus.STALE_GENERATION.value} <= statuses

    log = SqlEventLog.open(url, create=False)
    published: dict[tuple[str, int], tuple[str, tuple[int, ...]]] = {}
    decided: dict[tuple[str, str], tuple[int, ...]] = {}
    for stored in log.events():
        parsed = parse_event(stored.payload)
        if isinstance(parsed, RoundDecided):
            decided[(stored.request_id, parsed.round_id)] = parsed.emitted_ids
        if isinstance(parsed, RoundPublished):
            published[(stored.request_id, parsed.generation)] = (
                parsed.commit_digest,
                decided[(stored.request_id, parsed.round_id)],
            )

    for (request_id, expected), attempts in by_round.items():
        assert len(attempts) == WORKERS, "every worker raced for every round"
        winners = [a for a in attempts if a.status == PublishStatus.PUBLISHED.value]
        assert len(winners) == 1, f"{request_id} generation {expected}: {winners}"
        (winner,) = winners
        assert published[(request_id, expected + 1)] == (winner.commit_digest, winner.emitted)
        for loser in attempts:
            assert loser.generation == expected + 1  # everyone learns the generation that won
            if loser is winner:
                continue
            same = loser.commit_digest == winner.commit_digest
            expected_status = PublishStatus.ALREADY_PUBLISHED if same else PublishStatus.STALE_GENERATION
            assert loser.status == expected_status.value

    counts = assert_chains_verify(log)
    for request_id in BUDGETS:
        head = log.head(request_id)
        assert head is not None
        generations = sorted(g for (rid, g) in published if rid == request_id)
        assert generations == list(range(1, head.generation + 1))  # no gap, no duplicate
        assert counts[request_id] == 1 + 5 * head.generation
        _, state = replay_state(log.events(request_id))
        assert state.digest() == head.state_digest  # INV-8
        tokens = [t for g in generations for t in published[(request_id, g)][1]]
        assert state.generated == tuple(tokens)  # every winner's tokens, once, in order
        if BUDGETS[request_id] > 100:
            assert head.generation == STEPS
        else:
            assert head.finished and len(state.generated) == BUDGETS[request_id]
    log.close()


def _check_controllers(url: str, records: list[ControllerRecord]) -> None:
    by_round: dict[tuple[str, int], list[ControllerRecord]] = defaultdict(list)
    for record in records:
        by_round[(record.request_id, record.expected_generation)].append(record)
    log = SqlEventLog.open(url, create=False)
    published = {}
    for stored in log.events():
        if stored.kind == "round_published":
            published[(stored.request_id, stored.generation)] = stored.payload["commit_digest"]
    for (request_id, expected), attempts in by_round.items():
        assert len(attempts) == WORKERS
        winners = [a for a in attempts if a.status == RoundStatus.PUBLISHED.value]
        assert len(winners) == 1, f"{request_id} generation {expected}: {winners}"
        (winner,) = winners
        assert winner.generation == expected + 1
        assert published[(request_id, expected + 1)] == winner.commit_digest
        for loser in attempts:
            if loser is winner:
                continue
            if loser.commit_digest == winner.commit_digest:  # the twin built the same transaction
                assert (loser.status, loser.generation) == (RoundStatus.ACKNOWLEDGED.value, expected + 1)
            else:
                assert loser.status == RoundStatus.ABORTED.value
                assert loser.generation == expected  # S_0 stays the caller's state (INV-7)
                same_id = loser.round_id == winner.round_id
                assert loser.error == ("DuplicateRoundError" if same_id else "StaleGenerationError")
    assert {a.status for a in records} == {s.value for s in RoundStatus} - {RoundStatus.UNACKNOWLEDGED.value}
    counts = assert_chains_verify(log)
    for replayed in replay_log(log):  # INV-8 through the controller's own replay
        request_id = replayed.config.request_id
        head = log.head(request_id)
        assert head is not None
        assert (replayed.snapshot.digest, replayed.state.generation) == (head.state_digest, head.generation)
        assert counts[request_id] == 1 + 5 * head.generation
        assert sorted(g for (rid, g) in published if rid == request_id) == list(range(1, head.generation + 1))
        if BUDGETS[request_id] > 100:
            assert head.generation == STEPS
        else:
            assert head.finished
    log.close()


@pytest.mark.slow
def test_racing_writers_on_sqlite(sqlite_path: str) -> None:
    _check(sqlite_path, _race(sqlite_path))


@pytest.mark.slow
@pytest.mark.postgres
def test_racing_writers_on_postgres(postgres_url: str) -> None:
    _check(postgres_url, _race(postgres_url))


@pytest.mark.slow
def test_racing_controllers_on_sqlite(sqlite_path: str) -> None:
    _check_controllers(sqlite_path, _race(sqlite_path, controller_race_worker))


@pytest.mark.slow
@pytest.mark.postgres
def test_racing_controllers_on_postgres(postgres_url: str) -> None:
    _check_controllers(postgres_url, _race(postgres_url, controller_race_worker))
