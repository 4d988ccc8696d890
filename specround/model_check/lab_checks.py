"""The mutation lab's checks on fixtures and on the controller (see :mod:`.mutation_lab` for each check).

Every check returns a :class:`CheckOutcome`: its verdict and a digest of everything it observed, so that a
mutation that changes nothing observable can be told from one that a check catches.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "LAB_MC_SAMPLES",
    "LAB_RANDOM_FIXTURES",
    "WALK_RULES",
    "CheckOutcome",
    "controller_checks",
    "digest",
    "failed_outcome",
    "fixture_checks",
    "pipelined_check",
]

LAB_RANDOM_FIXTURES = 12
"""Random fixtures (seed 0) the lab's exact oracle runs beside the named ones."""
LAB_MC_SAMPLES = 20_000
"""Monte Carlo rounds per Monte Carlo fixture in the lab."""
WALK_RULES = 40
"""Rules of the seeded state-machine walk."""


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict, what it saw, and how long it took."""

    check: str
    passed: bool
    detail: str
    observation: str
    """Digest of everything the check observed (for the activity test)."""
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "check": self.check,
            "passed": self.passed,
            "detail": self.detail,
            "observation": self.observation[:16],
            "seconds": round(self.seconds, 3),
        }


def digest(*parts: object) -> str:
    """SHA-256 of the parts' reprs: what a check observed, for the activity test."""
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()


def failed_outcome(check: str, error: BaseException, started: float) -> CheckOutcome:
    """A check whose run crashed: it fails, and what it observed is the crash."""
    return CheckOutcome(
        check,
        False,
        f"crashed: {type(error).__name__}: {error}",
        digest("crash", type(error).__name__, str(error)),
        time.perf_counter() - started,
    )


def fixture_checks() -> list[CheckOutcome]:
    """``enumeration`` and ``monte carlo`` (one tables build serves both)."""
    from specround.model_check.enumeration import enumerate_fixtures
    from specround.model_check.fixture_tables import build_tables
    from specround.model_check.fixtures import named_fixtures, random_fixtures
    from specround.model_check.montecarlo import run_monte_carlo

    started = time.perf_counter()
    try:
        fixtures = named_fixtures() + random_fixtures(LAB_RANDOM_FIXTURES, 0)
        tables = [build_tables(f) for f in fixtures]
        results = enumerate_fixtures(tables)
    except Exception as error:
        crashed = failed_outcome("enumeration", error, started)
        return [
            crashed,
            CheckOutcome("monte carlo", False, "no tables: " + crashed.detail, crashed.observation),
        ]
    failed = [f"{r.name}: {c.check}" for r in results for c in r.checks if not c.passed]
    joints = [sorted((k, round(v, 12)) for k, v in r.speculative_joint.items()) for r in results]
    enumeration = CheckOutcome(
        "enumeration",
        not failed,
        f"{len(results) - len({f.split(':')[0] for f in failed})}/{len(results)} fixtures pass"
        + (f"; failed: {', '.join(failed[:4])}" if failed else ""),
        digest(joints),
        time.perf_counter() - started,
    )
    started = time.perf_counter()
    chosen = [i for i, f in enumerate(fixtures) if "monte_carlo" in f.tags][:3]
    try:
        runs = [
            run_monte_carlo(
                results[i].tables,
                results[i].tables.target_joint,
                results[i].emitted_pmf,
                samples=LAB_MC_SAMPLES,
                seed=1,
            )
            for i in chosen
        ]
    except Exception as error:
        return [enumeration, failed_outcome("monte carlo", error, started)]
    mc_failed = [f"{r.fixture}: {c.check}" for r in runs for c in r.checks if not c.passed]
    monte_carlo = CheckOutcome(
        "monte carlo",
        not mc_failed,
        f"{len(runs)} fixtures x {LAB_MC_SAMPLES} rounds"
        + (f"; failed: {', '.join(mc_failed[:4])}" if mc_failed else ""),
        digest([(r.fixture, r.test.statistic, r.unexpected) for r in runs]),
        time.perf_counter() - started,
    )
    return [enumeration, monte_carlo]


# --- the controller: conformance, the walk's invariants, the audit --------------------------------------


def controller_checks() -> list[CheckOutcome]:
    """``z3 conformance``, ``state-machine invariants`` and ``audit`` (one conformance run serves all)."""
    from specround.audit import audit_log
    from specround.model_check.conformance import run_conformance

    started = time.perf_counter()
    try:
        run = run_conformance(walk_rules=WALK_RULES)
    except Exception as error:
        crashed = failed_outcome("z3 conformance", error, started)
        return [
            crashed,
            CheckOutcome("state-machine invariants", False, crashed.detail, crashed.observation),
            CheckOutcome("audit", False, crashed.detail, crashed.observation),
        ]
    seconds = time.perf_counter() - started
    bad = run.nonconforming
    detail = f"{len(run.pairs) - len(bad)}/{len(run.pairs)} pairs conform"
    if bad:
        detail += f"; first: [{bad[0].scenario}] {bad[0].attempt}: {bad[0].detail}"
    if run.failures:
        detail += f"; {len(run.failures)} scenario failures, first: {run.failures[0]}"
    observation = run.observation()
    conformance = CheckOutcome("z3 conformance", run.conforming, detail, observation, seconds)
    invariants = CheckOutcome(
        "state-machine invariants",
        not run.violations,
        f"{len(run.walk_rules)} rules ({run.walk_rules.count('pipelined')} pipelined)"
        + (f"; {len(run.violations)} violations, first: {run.violations[0]}" if run.violations else ""),
        digest(run.walk_events, [str(v) for v in run.violations]),
    )
    started = time.perf_counter()
    findings: list[str] = []
    try:
        for log in run.logs:
            report = audit_log(log)
            findings += [f"{f.invariant} {f.kind} ({f.request_id}): {f.message}" for f in report.findings]
    except Exception as error:
        return [conformance, invariants, failed_outcome("audit", error, started)]
    audit = CheckOutcome(
        "audit",
        not findings,
        f"{len(run.logs)} logs" + (f"; {len(findings)} findings, first: {findings[0]}" if findings else ""),
        digest(run.events(), findings),
        time.perf_counter() - started,
    )
    return [conformance, invariants, audit]


def pipelined_check() -> CheckOutcome:
    """``pipelined faults``: the pipelined write-fault cells on one layout and two shapes (memory log)."""
    from specround.adapters.memory_log import MemoryEventLog
    from specround.audit.fault_matrix import FAULT_MATRIX_SHAPES
    from specround.audit.pipelined_faults import run_pipelined_faults
    from specround.sampling.types import Layout

    started = time.perf_counter()
    log = MemoryEventLog(clock=lambda: 0.0)
    try:
        cells = run_pipelined_faults(log, layouts=(Layout.REPLAY_FRONTIER,), shapes=FAULT_MATRIX_SHAPES[1:3])
    except Exception as error:
        return failed_outcome("pipelined faults", error, started)
    bad = [c for c in cells if not c.ok]
    detail = f"{len(cells) - len(bad)}/{len(cells)} cells held"
    if bad:
        detail += f"; first: {bad[0].point} {bad[0].shape}: {bad[0].detail}"
    observation = digest(
        [(c.point, c.shape, c.verdict, c.detail) for c in cells],
        [(e.request_id.split("/", 2)[-1], e.seq, e.kind) for e in log.events()],
    )
    return CheckOutcome("pipelined faults", not bad, detail, observation, time.perf_counter() - started)
