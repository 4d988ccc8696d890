"""Child-process bodies for the concurrency and crash tests (importable, so the fork server preloads them).

Two families: ``race_worker``/``crash_worker`` publish rounds built directly (``synthetic_rounds``) and so
test the log's fence alone; the ``controller_*`` functions drive the real
:class:`~specround.statemachine.controller.RoundController` with seeded synthetic rows (no model).

Children start from a ``forkserver`` context that has already imported this module: every child is a
clean process (no inherited connections or threads, like ``spawn``) that does not pay the interpreter
and torch import again, which keeps eight racing workers within seconds on a two-core machine.
"""

from __future__ import annotations

import hashlib
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

import torch
from sqlalchemy import event

from specround.adapters.sql import SqlEventLog
from specround.statemachine.binding import coordinate_digest
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import EventLog, PublishStatus
from specround.statemachine.replay import replay_request
from specround.statemachine.rounds import RoundInput, RoundStatus
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


# --- the same, driven through the round controller ------------------------------------------------------

CTL_VOCAB = 16
CTL_DRAFTS = 3
CTL_PROMPT = (1, 2, 3)


def _seed(*parts: object) -> int:
    text = "/".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little") >> 1


def controller_rows(request_id: str, generation: int, variant: int) -> tuple[torch.Tensor, ...]:
    """Seeded drafts [k], q rows [k, V] and p rows [k+1, V] for the round that starts at ``generation``."""
    gen = torch.Generator().manual_seed(_seed(request_id, generation, variant))
    logits = 2.0 * torch.randn(CTL_DRAFTS + 1, CTL_VOCAB, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, dim=-1)  # [k+1, V]
    noise = 0.7 * torch.randn(CTL_DRAFTS, CTL_VOCAB, generator=gen, dtype=torch.float64)
    q = torch.softmax(logits[:CTL_DRAFTS] + noise, dim=-1)  # [k, V]
    drafts = torch.multinomial(q, 1, generator=gen).squeeze(1)  # [k]
    return drafts, q, p


def open_controller(log: EventLog, budgets: dict[str, int]) -> RoundController:
    """A controller over ``log`` with every request of ``budgets`` open (identical opens are no-ops)."""
    torch.set_num_threads(1)
    controller = RoundController(log)
    for request_id, budget in budgets.items():
        controller.open_request(
            CTL_PROMPT,
            seed=_seed("seed", request_id),
            max_new_tokens=budget,
            vocab_size=CTL_VOCAB,
            request_id=request_id,
        )
    return controller


def controller_input(controller: RoundController, request_id: str, variant: int = 0) -> RoundInput | None:
    """The next round of a request bound to its current coordinate, or None once it finished."""
    state = controller.state(request_id)
    if state.finished:
        return None
    drafts, q, p = controller_rows(request_id, state.generation, variant)
    return RoundInput(request_id, controller.coordinate_digest(request_id), drafts, q, p)


@dataclass(frozen=True)
class ControllerRecord:
    """One round a racing controller ran, as its caller saw it."""

    worker: int
    step: int
    request_id: str
    expected_generation: int
    round_id: str | None
    status: str
    generation: int
    commit_digest: str | None
    error: str | None


def controller_race_worker(
    url: str,
    worker: int,
    variant: int,
    budgets: dict[str, int],
    steps: int,
    barrier: Barrier,
    results: Any,
) -> None:
    """:func:`race_worker` through a RoundController: refresh from the log, build, then race ``step``."""
    records: list[ControllerRecord] = []
    try:
        barrier.wait(BARRIER_TIMEOUT_S)
        log = SqlEventLog.open(url)
        try:
            controller = open_controller(log, budgets)
            for step in range(steps):
                barrier.wait(BARRIER_TIMEOUT_S)
                inputs = []
                for request_id in budgets:
                    controller.refresh(request_id)  # whoever won the last step, continue from the log
                    item = controller_input(controller, request_id, variant)
                    if item is not None:
                        inputs.append(item)
                starts = {item.request_id: controller.state(item.request_id).generation for item in inputs}
                barrier.wait(BARRIER_TIMEOUT_S)
                for result in controller.step(inputs):
                    records.append(
                        ControllerRecord(
                            worker=worker,
                            step=step,
                            request_id=result.request_id,
                            expected_generation=starts[result.request_id],
                            round_id=result.round_id,
                            status=result.status.value,
                            generation=result.generation,
                            commit_digest=None if result.commit is None else result.commit.digest(),
                            error=None if result.error is None else type(result.error).__name__,
                        )
                    )
        finally:
            log.close()
        results.put((worker, records, None))
    except BaseException:
        barrier.abort()
        results.put((worker, records, traceback.format_exc()))


def controller_crash_worker(
    url: str, budgets: dict[str, int], acknowledged: dict[str, int], plan: KillPlan, acks: Connection
) -> None:
    """:func:`crash_worker` through a RoundController.

    A request whose log head is one generation past its last acknowledgement had its round committed but
    never acknowledged: the worker re-submits that round, bound to the coordinate it was proposed for
    (rebuilt by replaying the log up to the acknowledged generation), and the controller must answer
    ``ACKNOWLEDGED`` with the already-published successor (F-6 recovery).
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
    controller = open_controller(log, budgets)
    retries: dict[str, RoundInput] = {}
    for request_id in budgets:
        cut = acknowledged.get(request_id, 0)
        if controller.state(request_id).generation > cut:
            start = replay_request(e for e in log.events(request_id) if e.generation <= cut)
            drafts, q, p = controller_rows(request_id, cut, 0)
            bound = coordinate_digest(start.config, start.snapshot)
            retries[request_id] = RoundInput(request_id, bound, drafts, q, p)
    publishes = 0
    while True:
        inputs = []
        for request_id in budgets:
            item = retries.pop(request_id, None) or controller_input(controller, request_id)
            if item is not None:
                inputs.append(item)
        if not inputs:
            break
        results = controller.step(inputs)
        publishes += 1
        if plan.after_publish == publishes:
            _die()
        message = []
        for result in results:
            if (
                result.status not in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)
                or result.commit is None
            ):
                raise AssertionError(f"single writer got {result}")
            message.append(
                (
                    result.request_id,
                    result.round_id,
                    result.generation,
                    result.commit.digest(),
                    result.status.value,
                )
            )
        acks.send(message)
    acks.send("done")
    log.close()
