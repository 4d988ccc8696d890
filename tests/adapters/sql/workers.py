"""Child-process bodies for the concurrency and crash tests (importable, so the fork server preloads them).

Children start from a ``forkserver`` context that has already imported this module: every child is a
clean process (no inherited connections or threads, like ``spawn``) that does not pay the interpreter
and torch import again, which keeps eight racing workers within seconds on a two-core machine.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkServerContext
from multiprocessing.synchronize import Barrier
from typing import Any

from sqlalchemy import event

from specround.adapters.sql import SqlEventLog
from specround.statemachine.ports import PublishStatus
from tests.adapters.synthetic_rounds import build_round, make_config, open_request, replay_state

BARRIER_TIMEOUT_S = 60.0


def context() -> ForkServerContext:
    """The multiprocessing context of these tests (a fork server that preloads this module)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


# --- concurrency: N workers race for the same generations --------------------------------------------------


@dataclass(frozen=True)
class RaceRecord:
    """One publication attempt of one worker."""

    worker: int
    step: int
    request_id: str
    expected_generation: int
    round_id: str
    commit_digest: str
    emitted: tuple[int, ...]
    status: str
    generation: int


def race_worker(
    url: str,
    worker: int,
    variant: int,
    budgets: dict[str, int],
    steps: int,
    barrier: Barrier,
    results: Any,
) -> None:
    """Open the log and the requests together with everyone else, then race ``steps`` group commits.

    In each step every worker rebuilds each request's state from the log and builds its own round
    (``variant`` decides which transaction); once all have read, they publish, each all its rounds in one
    group commit.
    """
    records: list[RaceRecord] = []
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        log = SqlEventLog.open(url)  # racing migrations on a fresh database
        try:
            for request_id, budget in budgets.items():
                opened, state = open_request(make_config(request_id, max_new_tokens=budget))
                log.open_request(opened, state.digest())  # racing identical opens
            for step in range(steps):
                barrier.wait(BARRIER_TIMEOUT_S)
                publications = []
                for request_id in budgets:
                    config, state = replay_state(log.events(request_id))
                    if not state.finished:
                        publications.append(build_round(config, state, variant=variant)[0])
                barrier.wait(BARRIER_TIMEOUT_S)  # everyone has read the same generation: race
                outcomes = log.publish(publications)
                for publication, outcome in zip(publications, outcomes, strict=True):
                    records.append(
                        RaceRecord(
                            worker=worker,
                            step=step,
                            request_id=outcome.request_id,
                            expected_generation=publication.expected_generation,
                            round_id=publication.round_id,
                            commit_digest=publication.commit_digest,
                            emitted=publication.decided.emitted_ids,
                            status=outcome.status.value,
                            generation=outcome.generation,
                        )
                    )
        finally:
            log.close()
        results.put((worker, records, None))
    except BaseException:
        barrier.abort()
        results.put((worker, records, traceback.format_exc()))


# --- crash: a writer killed with SIGKILL at seeded points --------------------------------------------------


@dataclass(frozen=True)
class KillPlan:
    """Where this incarnation of the crash worker dies (at most one of the three is set)."""

    at_statement: int | None = None
    """SIGKILL itself just before its n-th database statement or commit (mid-transaction)."""
    after_publish: int | None = None
    """SIGKILL itself after its n-th publish returned, before acknowledging it (F-6)."""
    parent_after_acks: int | None = None
    """The parent sends SIGKILL after receiving this many acknowledgements (wherever the child is)."""


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_worker(
    url: str, budgets: dict[str, int], acknowledged: dict[str, int], plan: KillPlan, acks: Connection
) -> None:
    """Resume every request from its last acknowledged generation and publish rounds until all finish.

    After each publish the child sends ``[(request, round id, generation, commit digest, status), ...]``
    through ``acks`` before it continues; ``"done"`` when every request finished. A round it publishes
    again because the previous incarnation died after the commit but before the acknowledgement must come
    back ``ALREADY_PUBLISHED`` (idempotent recovery, INV-7/F-6).
    """
    log = SqlEventLog.open(url, create=False)
    if plan.at_statement is not None:
        counter = itertools.count(1)
        target = plan.at_statement

        def maybe_die(*_args: object) -> None:
            if next(counter) == target:
                _die()

        event.listen(log.engine, "before_cursor_execute", maybe_die)
        event.listen(log.engine, "commit", maybe_die)
    states = {}
    for request_id in budgets:
        cut = acknowledged.get(request_id, 0)
        states[request_id] = replay_state(e for e in log.events(request_id) if e.generation <= cut)
    publishes = 0
    while True:
        batch = [build_round(config, state) for config, state in states.values() if not state.finished]
        if not batch:
            break
        outcomes = log.publish([publication for publication, _ in batch])
        publishes += 1
        if plan.after_publish == publishes:
            _die()
        message = []
        for (publication, successor), outcome in zip(batch, outcomes, strict=True):
            if outcome.status not in (PublishStatus.PUBLISHED, PublishStatus.ALREADY_PUBLISHED):
                raise AssertionError(f"single writer got {outcome}")
            states[outcome.request_id] = (states[outcome.request_id][0], successor)
            message.append(
                (
                    outcome.request_id,
                    publication.round_id,
                    outcome.generation,
                    publication.commit_digest,
                    outcome.status.value,
                )
            )
        acks.send(message)
    acks.send("done")
    log.close()
