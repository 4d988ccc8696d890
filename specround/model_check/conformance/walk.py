"""The state-machine walk: seeded random rules over a real controller with every invariant checked.

:class:`MachineWalk` makes seeded random rounds on a few requests at a time (both layouts, some with a
stateful penalty, a new one admitted as others finish), batched steps, faults at F-1..F-6, retries, stale
publishers, crash-and-replay, rounds offered to finished requests and pipelined steps
(:meth:`MachineWalk.pipelined`). Every synchronous attempt is a conformance pair (inputs read back from the
logged decision), and the invariants of :mod:`specround.statemachine.invariants` are checked after every
rule, so ``specround check`` and the mutation lab run them without pytest. Hypothesis drives the same walk
in the tests through :class:`Chooser`.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar, Protocol

import torch

from specround.audit.pipelined_faults import GatedLog, submit_rounds
from specround.model_check.conformance.pairs import Attempt, ConformancePair, Harness
from specround.model_check.conformance.request_model import LogFactory, memory_log
from specround.model_check.random_rounds import seeded_random_input
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.types import Layout
from specround.statemachine import invariants
from specround.statemachine.controller import PendingStep, RoundController, StepResult
from specround.statemachine.faults import FaultPlan, FaultPoint, FaultRule
from specround.statemachine.forwarding_log import ForwardingLog
from specround.statemachine.invariants import Breach, LogFingerprint, log_fingerprint
from specround.statemachine.ports import PublishOutcome, PublishStatus, RoundPublication
from specround.statemachine.rounds import RoundInput, RoundResult, RoundStatus
from specround.statemachine.state import RequestState
from specround.statemachine.step_result import RowDecision

__all__ = [
    "PIPELINE_ENDINGS",
    "UNEXPLORED",
    "WALK_EOS",
    "WALK_MAX_NEW",
    "WALK_VOCAB",
    "Chooser",
    "MachineWalk",
    "RandomChooser",
    "Violation",
]


class Chooser(Protocol):
    """Where a walk's choices come from: a seeded ``random.Random`` or Hypothesis' ``data.draw``."""

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        ...


class RandomChooser:
    """Choices from a seeded :class:`random.Random` (what ``specround check`` uses)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(f"specround-walk:{seed}")

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        return self._rng.randint(low, high)


@dataclass(frozen=True)
class Violation:
    """A state-machine invariant that failed after a rule of the walk."""

    rule: str
    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant} after {self.rule}: {self.message}"


WALK_VOCAB = 12
WALK_EOS = 11
WALK_MAX_NEW = 16
WALK_OPEN_REQUESTS = 3
"""Requests the walk opens at the start; it opens another whenever fewer stay unfinished."""
WALK_MAX_REQUESTS = 9
"""Requests a walk opens at most."""


UNEXPLORED = 8
"""Weight factor of a walk rule (or fault point, or pipeline ending) that has not been run yet."""

PIPELINE_ENDINGS = ("durable", "write fails", "write conflicts", "F-5 on t + 1")
"""How the pipelined rule's step t ends: its held write becomes durable, fails, or loses the fence to
another writer; or it becomes durable while step t + 1 is aborted at F-5 before its write is handed over."""
PIPELINE_SHAPE_TRIES = 3
"""Shapes the pipelined rule draws at most to find a round t that does not finish its request."""

Shape = tuple[int, int]
"""A walk round's (draft count, row seed)."""


@dataclass(frozen=True)
class _PipelinedRow:
    """One request's row of a submitted step, with the step's durable outcome."""

    step: PendingStep
    outcome: StepResult
    row: int

    @property
    def decision(self) -> RowDecision | None:
        """The decision the engine was handed for the row."""
        return self.step.decisions[self.row]

    @property
    def result(self) -> RoundResult:
        """The row's durable result."""
        return self.outcome[self.row]

    @property
    def rollback_to(self) -> int:
        """The row's K/V rollback (-1: nothing to undo)."""
        return int(self.outcome.rollback_to[self.row])


class _UnwrittenLog(ForwardingLog):
    """Reads the walk's log; a publish writes nothing and reports every round published.

    A controller over it steps a request synchronously from its durable state without touching the log:
    the reference of the pipelined rule.
    """

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Nothing is written; each round is reported published at the generation after its fence."""
        return [
            PublishOutcome(p.request_id, p.round_id, PublishStatus.PUBLISHED, p.expected_generation + 1)
            for p in publications
        ]

    def close(self) -> None:
        """Does not close the walk's log."""


def _weighted(chooser: Chooser, weights: Sequence[int]) -> int:
    """An index drawn with the given positive integer weights."""
    ticket = chooser.integer(0, sum(weights) - 1)
    for index, weight in enumerate(weights):
        ticket -= weight
        if ticket < 0:
            return index
    return len(weights) - 1


class MachineWalk:
    """Seeded random rules over a controller and a log with every state-machine invariant checked.

    The rules are those of ``tests/statemachine/test_state_machine.py`` and the invariants the same checks
    of :mod:`specround.statemachine.invariants`: a breach is recorded as a :class:`Violation` (with its INV
    number) instead of raising, so a walk under a mutation reports everything it breaks. A rule that
    crashes ends the walk.
    """

    RULES: ClassVar[dict[str, int]] = {
        "open_request": 2,
        "step": 4,
        "fault": 3,
        "retry": 3,
        "stale_publisher": 2,
        "crash_and_replay": 1,
        "finished_refused": 1,
        "pipelined": 2,
    }
    """Each rule with its weight when enabled."""

    def __init__(self, log_factory: LogFactory = memory_log) -> None:
        self.log = log_factory()
        self.gated = GatedLog(self.log)
        """The walk's log as the controller sees it: the pipelined rule holds (or fails) a write here."""
        self.plan = FaultPlan()
        self.controller = RoundController(self.gated, faults=self.plan)
        self.harness = Harness(self.log)
        self.known: dict[str, RequestState] = {}
        self.unacknowledged: dict[str, tuple[RoundInput, RequestState]] = {}
        self.violations: list[Violation] = []
        self.rules_run: list[str] = []
        self.points_run: set[FaultPoint] = set()
        self.endings_run: set[str] = set()
        """The :data:`PIPELINE_ENDINGS` the pipelined rule has run."""
        self._rule = "open"
        for _ in range(WALK_OPEN_REQUESTS):
            self._open()

    def _open(self) -> None:
        """Open the next request: layouts alternate, every third carries a stateful presence penalty."""
        index = len(self.known)
        rid = f"walk-{index}"
        penalty = ProcessorChain.from_spec(
            [{"kind": "presence_penalty", "params": {"penalty": 0.3}, "state": {}}], vocab_size=WALK_VOCAB
        )
        self.known[rid] = self.controller.open_request(
            (1, 2, 3),
            seed=100 + index,
            processors=penalty if index % 3 == 2 else None,
            vocab_size=WALK_VOCAB,
            layout=Layout.RETAINED_FRONTIER if index % 2 else Layout.REPLAY_FRONTIER,
            request_id=rid,
            max_new_tokens=WALK_MAX_NEW,
            stop_token_ids=[WALK_EOS],
        )

    @property
    def pairs(self) -> list[ConformancePair]:
        """Every attempt of the walk as a conformance pair."""
        return self.harness.pairs

    # --- running ----------------------------------------------------------------------------------------

    def enabled(self) -> list[str]:
        """Rules whose preconditions hold."""
        unfinished = bool(self._unfinished())
        ready = {
            "open_request": len(self._unfinished()) < WALK_OPEN_REQUESTS
            and len(self.known) < WALK_MAX_REQUESTS,
            "step": unfinished,
            "fault": unfinished,
            "retry": bool(self.unacknowledged),
            "stale_publisher": unfinished,
            "crash_and_replay": True,
            "finished_refused": any(s.finished for s in self.known.values()),
            "pipelined": unfinished,
        }
        return [rule for rule in self.RULES if ready[rule]]

    def run(self, chooser: Chooser, rules: int) -> None:
        """Apply ``rules`` rules picked by ``chooser``, checking every invariant after each."""
        for _ in range(rules):
            if not self.apply(chooser):
                return

    def apply(self, chooser: Chooser) -> bool:
        """One rule and the invariant checks; False when the rule crashed (the walk cannot go on).

        Rules are drawn by weight; a rule the walk has not run yet weighs :data:`UNEXPLORED` times more, so
        that a short walk still reaches every rule (and every fault point) whose precondition comes true.
        """
        enabled = self.enabled()
        weights = [self.RULES[r] * (UNEXPLORED if r not in self.rules_run else 1) for r in enabled]
        rule = enabled[_weighted(chooser, weights)]
        self._rule = rule
        self.rules_run.append(rule)
        try:
            getattr(self, f"rule_{rule}")(chooser)
        except Exception as error:  # the code under test crashed: a finding, and the end of the walk
            self._violate("crash", f"{type(error).__name__}: {error}")
            return False
        self.check_invariants()
        return True

    def _violate(self, invariant: str, message: str) -> None:
        self.violations.append(Violation(self._rule, invariant, message))

    def _record(self, breaches: list[Breach]) -> bool:
        """Record every breach as a violation of the current rule; True when there was none."""
        for breach in breaches:
            self._violate(breach.invariant, breach.message)
        return not breaches

    def _unfinished(self) -> list[str]:
        return [rid for rid, state in self.known.items() if not state.finished]

    def _pick(self, chooser: Chooser, options: Sequence[str]) -> str:
        return options[chooser.integer(0, len(options) - 1)]

    def _input(self, controller: RoundController, rid: str, k: int, seed: int) -> RoundInput:
        dtype = torch.float32 if seed % 2 else torch.float64
        return seeded_random_input(controller, rid, k, seed, dtype=dtype)

    def _published(self, rid: str, before: RequestState, result: RoundResult, who: str) -> bool:
        """Check a round that must have published (INV-6) and its effects; adopt its successor if it did."""
        if result.status is not RoundStatus.PUBLISHED or result.state is None:
            self._violate("INV-6", f"{who}: {result.status} {result.error!r}")
            return False
        self._record(invariants.published_round(self.controller.config(rid), before, result))
        self.known[rid] = result.state
        self.unacknowledged.pop(rid, None)
        return True

    def _log_unchanged(self, fingerprint: LogFingerprint) -> bool:
        return log_fingerprint(self.log) == fingerprint

    # --- rules ------------------------------------------------------------------------------------------

    def rule_open_request(self, chooser: Chooser) -> None:
        """Admit another request (its generation-0 state is checked by the invariants)."""
        self._open()

    def rule_step(self, chooser: Chooser) -> None:
        """A batched step of 1..3 unfinished requests with random rows."""
        unfinished = self._unfinished()
        rids = [rid for rid in unfinished if chooser.integer(0, 1)] or [self._pick(chooser, unfinished)]
        attempts = [
            Attempt(
                self._input(self.controller, rid, chooser.integer(0, 4), chooser.integer(0, 2**20)),
                self.known[rid].generation,
            )
            for rid in rids
        ]
        before = {rid: self.known[rid] for rid in rids}
        results = self.harness.run("walk: step", self.controller, attempts)
        for rid, result in zip(rids, results, strict=True):
            self._published(rid, before[rid], result, rid)

    def rule_fault(self, chooser: Chooser) -> None:
        """A round failing at a random fault point F-1..F-6."""
        rid = self._pick(chooser, self._unfinished())
        points = list(FaultPoint)
        point = points[_weighted(chooser, [1 if p in self.points_run else UNEXPLORED for p in points])]
        self.points_run.add(point)
        item = self._input(self.controller, rid, chooser.integer(0, 4), chooser.integer(0, 2**20))
        before = self.known[rid]
        self.plan.add(
            FaultRule(point, request_ids=frozenset({rid}), generations=frozenset({before.generation + 1}))
        )
        fingerprint = log_fingerprint(self.log)
        [result] = self.harness.run(
            "walk: fault", self.controller, [Attempt(item, before.generation, fault=point.value)]
        )
        authoritative = self.controller.state(rid)
        self._record(
            invariants.fault_effect(
                point, result, before, authoritative, log_unchanged=self._log_unchanged(fingerprint)
            )
        )
        if not point.before_publication and authoritative.generation == before.generation + 1:
            self.unacknowledged[rid] = (item, before)
            self.known[rid] = authoritative

    def rule_retry(self, chooser: Chooser) -> None:
        """Re-submit a round whose acknowledgement was lost at F-6: acknowledged, nothing appended."""
        rid = self._pick(chooser, sorted(self.unacknowledged))
        item, before = self.unacknowledged.pop(rid)
        fingerprint = log_fingerprint(self.log)
        [result] = self.harness.run("walk: retry", self.controller, [Attempt(item, before.generation)])
        unchanged = self._log_unchanged(fingerprint)
        self._record(invariants.retry_acknowledged(result, self.known[rid], log_unchanged=unchanged))
        if result.state is not None:
            self._record(invariants.published_round(self.controller.config(rid), before, result))

    def rule_stale_publisher(self, chooser: Chooser) -> None:
        """A second controller loaded before a publication tries to publish a different round."""
        rid = self._pick(chooser, self._unfinished())
        stale = RoundController(self.log)
        stale_generation = stale.state(rid).generation
        stale_item = self._input(stale, rid, 3, chooser.integer(0, 999))
        winner = Attempt(
            self._input(self.controller, rid, 2, chooser.integer(1000, 2**20)), self.known[rid].generation
        )
        [won] = self.harness.run("walk: winner", self.controller, [winner])
        if not self._published(rid, self.known[rid], won, "winner") or self.known[rid].finished:
            return
        fingerprint = log_fingerprint(self.log)
        [lost] = self.harness.run("walk: stale writer", stale, [Attempt(stale_item, stale_generation)])
        unchanged = self._log_unchanged(fingerprint)
        self._record(invariants.stale_writer_refused(lost, log_unchanged=unchanged))

    def rule_crash_and_replay(self, chooser: Chooser) -> None:
        """Drop the controller; a new one rebuilds every request from the log (INV-8)."""
        self.controller.close()  # nothing is pending between rules: this only stops its writer thread
        self.controller = RoundController(self.gated, faults=self.plan)
        self._record(invariants.reload_agrees(self.controller.load_all(), self.known))

    def rule_finished_refused(self, chooser: Chooser) -> None:
        """A round offered to a finished request is refused and appends nothing (INV-2)."""
        rid = self._pick(chooser, sorted(r for r, s in self.known.items() if s.finished))
        fingerprint = log_fingerprint(self.log)
        generator = torch.Generator().manual_seed(0)
        item = RoundInput(
            rid,
            self.controller.coordinate_digest(rid),
            (),
            None,
            torch.softmax(torch.randn(1, WALK_VOCAB, generator=generator, dtype=torch.float64), -1),
        )
        [result] = self.harness.run(
            "walk: finished", self.controller, [Attempt(item, self.known[rid].generation)]
        )
        unchanged = self._log_unchanged(fingerprint)
        self._record(invariants.finished_request_refused(result, log_unchanged=unchanged))

    def rule_pipelined(self, chooser: Chooser) -> None:
        """Two pipelined steps of one or two random requests, t's write ending in a random way.

        See :meth:`pipelined`. The first request is the subject of the ending; a second one, when another
        request is unfinished, rides along in the same steps. F-5 is drawn only when there is a second one
        (which then always rides along), so that the aborted row shares its step with a row that is handed
        over. For each request, up to :data:`PIPELINE_SHAPE_TRIES` random shapes are drawn until its round
        t, stepped synchronously, leaves it unfinished (so that a round t + 1 can be built on it).
        """
        unfinished = self._unfinished()
        subject = self._pick(chooser, unfinished)
        others = [rid for rid in unfinished if rid != subject]
        endings = [e for e in PIPELINE_ENDINGS if others or e != "F-5 on t + 1"]
        ending = endings[_weighted(chooser, [1 if e in self.endings_run else UNEXPLORED for e in endings])]
        rids = [subject]
        if others and (ending == "F-5 on t + 1" or chooser.integer(0, 1)):
            rids.append(self._pick(chooser, others))
        dtype = torch.float32 if chooser.integer(0, 1) else torch.float64
        shapes = []
        for rid in rids:
            for _ in range(PIPELINE_SHAPE_TRIES):
                first = (chooser.integer(0, 4), chooser.integer(0, 2**20))
                if not self._synchronous([rid], [[first]], dtype)[rid][0].finished:
                    break
            shapes.append((first, (chooser.integer(0, 4), chooser.integer(0, 2**20))))
        self.pipelined(rids, ending, shapes, rival_seed=chooser.integer(0, 2**20), dtype=dtype)

    def pipelined(
        self,
        rids: Sequence[str],
        ending: str,
        shapes: Sequence[tuple[Shape, Shape]],
        *,
        rival_seed: int = 0,
        dtype: torch.dtype = torch.float64,
    ) -> int:
        """Step t submitted with its write held, t + 1 submitted on t's staged successors, then t ends.

        ``rids`` are the step's requests, ``shapes`` the (drafts, seed) of each one's rounds t and t + 1, and
        ``ending`` one of :data:`PIPELINE_ENDINGS`: the write of the whole step fails, or another writer
        (its round seeded by ``rival_seed``) publishes a round of the first request first, or F-5 hits the
        first request's round t + 1. Every round is checked against the same rounds stepped synchronously
        from the durable state (:meth:`_synchronous`). While t's write is held the engine holds every
        decision and nothing is settled or in the log (INV-5, INV-7). A durable round publishes the
        synchronous successor (INV-2, INV-3, INV-5, INV-6). A failed or fenced-out round and the round built
        on it are aborted, release nothing, crop the K/V back to the durable cache and leave the request's
        log as it was (INV-7; the fenced-out t is a stale writer, INV-6). A round t + 1 aborted at F-5 gets
        no decision and changes nothing (INV-7). The state invariants after the rule then check the durable
        states: unchanged after a failure, the other writer's after a conflict (once the controller has
        refreshed the request).

        Returns the steps submitted: 2, or 1 when every round t finishes its request.
        """
        self.endings_run.add(ending)
        subject = rids[0]
        before = {rid: self.known[rid] for rid in rids}
        synchronous = self._synchronous(rids, shapes, dtype)
        rival: tuple[RoundController, RoundInput] | None = None
        if ending == "write conflicts":
            other = RoundController(self.log)  # another writer, at the durable state
            item = self._input(other, subject, 2, rival_seed)
            rival = (other, replace(item, round_id=f"walk-rival-g{before[subject].generation + 1}"))
        fingerprint = log_fingerprint(self.log)
        marks = {rid: self._request_events(rid) for rid in rids}  # as lost rounds must leave them
        won: RoundResult | None = None
        steps: list[PendingStep] = []
        self.gated.hold(fail=ending == "write fails")
        try:
            items = [
                seeded_random_input(self.controller, r, *shape[0], dtype=dtype)
                for r, shape in zip(rids, shapes, strict=True)
            ]
            steps.append(submit_rounds(self.controller, items))
            second = [
                (rid, shape[1])
                for rid, shape, decision in zip(rids, shapes, steps[0].decisions, strict=True)
                if decision is not None and not decision.finished and len(synchronous[rid]) > 1
            ]
            if second:
                if ending == "F-5 on t + 1" and second[0][0] == subject:
                    generation = frozenset({before[subject].generation + 2})
                    self.plan.add(
                        FaultRule(
                            FaultPoint.BEFORE_PUBLICATION,
                            request_ids=frozenset({subject}),
                            generations=generation,
                        )
                    )
                items = [
                    seeded_random_input(self.controller, rid, *shape, dtype=dtype) for rid, shape in second
                ]
                steps.append(submit_rounds(self.controller, items))
            unchanged = self._log_unchanged(fingerprint)
            for n, step in enumerate(steps):
                for rid, decision in zip(step.request_ids, step.decisions, strict=True):
                    if n == 1 and rid == subject and ending == "F-5 on t + 1":
                        continue  # aborted before its write: checked once settled
                    if len(synchronous[rid]) <= n:
                        self._violate(
                            "INV-6", f"{rid}: the synchronous reference of round t + {n} did not publish"
                        )
                        continue
                    self._record(
                        invariants.pipelined_in_flight(
                            rid, decision, synchronous[rid][n], settled=step.done, log_unchanged=unchanged
                        )
                    )
            if rival is not None:
                other, item = rival
                [won] = other.step([item])  # publishes first, while t's write is held
                marks[subject] = self._request_events(subject)
        finally:
            self.gated.release()
        outcomes = [step.wait() for step in steps]
        self.gated.disarm()  # a step that never wrote leaves its hold unreached
        for rid in rids:
            rows = [
                _PipelinedRow(step, outcome, step.request_ids.index(rid))
                for step, outcome in zip(steps, outcomes, strict=True)
                if rid in step.request_ids
            ]
            if ending == "write fails" or (ending == "write conflicts" and rid == subject):
                self._pipelined_lost(rid, before[rid], rows, won if rid == subject else None, marks[rid])
            else:
                f5 = ending == "F-5 on t + 1" and rid == subject
                self._pipelined_durable(rid, before[rid], rows, synchronous[rid], f5=f5)
        return len(steps)

    def _pipelined_durable(
        self,
        rid: str,
        before: RequestState,
        rows: Sequence[_PipelinedRow],
        synchronous: Sequence[RoundResult],
        *,
        f5: bool,
    ) -> None:
        """Round t published the synchronous successor, and so did t + 1, unless ``f5`` aborted it."""
        start = before
        for n, (row, reference) in enumerate(zip(rows[:1] if f5 else rows, synchronous, strict=False)):
            self._record(invariants.pipelined_matches_synchronous(row.result, reference))
            if not self._published(rid, start, row.result, "round t" + (" + 1" if n else "")):
                return
            start = self.known[rid]
        if f5 and len(rows) > 1:
            aborted = rows[1]
            self._record(
                invariants.pipelined_aborted_before_write(rid, aborted.decision, aborted.rollback_to)
            )
            written = any(e.round_id == aborted.result.round_id for e in self.log.events(rid))
            authoritative = self.controller.state(rid)
            self._record(
                invariants.fault_effect(
                    FaultPoint.BEFORE_PUBLICATION,
                    aborted.result,
                    start,
                    authoritative,
                    log_unchanged=not written,
                )
            )

    def _pipelined_lost(
        self,
        rid: str,
        before: RequestState,
        rows: Sequence[_PipelinedRow],
        won: RoundResult | None,
        mark: LogFingerprint,
    ) -> None:
        """Round t's write failed or lost the fence to ``won``: t and t + 1 are lost; ``won`` is adopted.

        ``mark`` is the request's events as the lost rounds must leave them.
        """
        if won is not None:
            self._published(rid, before, won, "the other writer")
        unchanged = self._request_events(rid) == mark
        if won is not None:
            self._record(invariants.stale_writer_refused(rows[0].result, log_unchanged=unchanged))
        for row in rows:
            self._record(
                invariants.pipelined_round_lost(row.result, row.rollback_to, before, log_unchanged=unchanged)
            )
        if won is not None:
            self.controller.refresh(rid)

    def _request_events(self, rid: str) -> LogFingerprint:
        """The fingerprint of one request's events."""
        return [(e.request_id, e.seq, e.hash) for e in self.log.events(rid)]

    def _synchronous(
        self, rids: Sequence[str], shapes: Sequence[Sequence[Shape]], dtype: torch.dtype
    ) -> dict[str, list[RoundResult]]:
        """The rounds of ``shapes`` stepped synchronously from the durable states, one batched step a round.

        ``shapes[i]`` are the (drafts, seed) of ``rids[i]``'s rounds. They run on a controller over
        :class:`_UnwrittenLog`, so the log is untouched; a request's rounds stop at one that finishes it (or
        does not publish).
        """
        twin = RoundController(_UnwrittenLog(self.log))
        results: dict[str, list[RoundResult]] = {rid: [] for rid in rids}
        for n in range(max(len(s) for s in shapes)):
            going = [
                (rid, shape[n])
                for rid, shape in zip(rids, shapes, strict=True)
                if len(shape) > n and len(results[rid]) == n and not twin.state(rid).finished
            ]
            if not going:
                break
            items = [seeded_random_input(twin, rid, *shape, dtype=dtype) for rid, shape in going]
            for (rid, _), result in zip(going, twin.step(items), strict=True):
                if result.state is not None:
                    results[rid].append(result)
        return results

    # --- invariants -------------------------------------------------------------------------------------

    def check_invariants(self) -> None:
        """Every state invariant of the published states: INV-1, INV-8 (live, head, replay), INV-9, INV-4.

        The checks are :func:`~specround.statemachine.invariants.state_invariants`.
        """
        self._record(invariants.state_invariants(self.controller, self.log, self.known))
