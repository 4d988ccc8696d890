"""One conformance run: every scenario and the seeded state-machine walk, with what they observed."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from specround.model_check.conformance.pairs import ConformancePair
from specround.model_check.conformance.request_model import LogFactory, memory_log
from specround.model_check.conformance.scenarios import batch_independence, run_refusals, run_witnesses
from specround.model_check.conformance.walk import MachineWalk, RandomChooser, Violation
from specround.model_check.conformance.witness import BranchKind, Witness, witness
from specround.sampling.types import Layout
from specround.statemachine.invariants import log_fingerprint
from specround.statemachine.ports import EventLog

__all__ = ["ConformanceRun", "run_conformance"]


@dataclass
class ConformanceRun:
    """One run of every conformance scenario and the state-machine walk."""

    pairs: list[ConformancePair] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """Scenarios that crashed and batch-dependent outcomes."""
    violations: list[Violation] = field(default_factory=list)
    """State-machine invariants that failed during the walk."""
    logs: list[EventLog] = field(default_factory=list)
    """Every log the run wrote (for the audit)."""
    witnesses: list[Witness] = field(default_factory=list)
    walk_rules: list[str] = field(default_factory=list)
    walk_events: list[tuple[str, int, str]] = field(default_factory=list)
    """(request, seq, hash) of every event the walk stored."""

    @property
    def nonconforming(self) -> list[ConformancePair]:
        """Pairs the relation does not allow."""
        return [p for p in self.pairs if not p.conforms]

    @property
    def conforming(self) -> bool:
        """Every pair conforms and no scenario failed."""
        return bool(self.pairs) and not self.nonconforming and not self.failures

    def observation(self) -> str:
        """A digest of everything observable: each pair's status and state, and every stored event."""
        h = hashlib.sha256()
        for pair in self.pairs:
            h.update(repr((pair.scenario, pair.status, pair.acknowledged, pair.observed)).encode())
        h.update(repr(self.events()).encode())
        return h.hexdigest()

    def events(self) -> list[list[tuple[str, int, str]]]:
        """(request, seq, hash) of every stored event, log by log."""
        return [log_fingerprint(log) for log in self.logs]


def run_conformance(
    *,
    layouts: Sequence[Layout] = tuple(Layout),
    walk_seed: int = 0,
    walk_rules: int = 40,
    log_factory: LogFactory = memory_log,
) -> ConformanceRun:
    """Witnesses, refusals, batch independence and a seeded walk; see the module docstring."""
    run = ConformanceRun()
    for scenarios in (run_witnesses, run_refusals):
        pairs, logs, failures = scenarios(layouts, log_factory)
        run.pairs += pairs
        run.logs += logs
        run.failures += failures
    run.witnesses = [witness(kind, Layout(layout)) for layout in layouts for kind in BranchKind]
    try:
        findings, logs = batch_independence(walk_seed, log_factory=log_factory)
    except Exception as error:
        run.failures.append(f"batch independence: {type(error).__name__}: {error}")
    else:
        run.failures += [f"batch independence: {f}" for f in findings]
        run.logs += logs
    walk = MachineWalk(log_factory)
    walk.run(RandomChooser(walk_seed), walk_rules)
    run.pairs += walk.pairs
    run.violations = list(walk.violations)
    run.logs.append(walk.log)
    run.walk_rules = list(walk.rules_run)
    run.walk_events = log_fingerprint(walk.log)
    return run
