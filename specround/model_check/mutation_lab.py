"""The mutation lab: every failure class is a mutation of the real code path that a check must kill.

Contract: contract#failure-lab.

Each :class:`~specround.model_check.mutants.Mutation` patches wrong variants of real functions in for the
duration of a ``with`` block (:mod:`specround.model_check.mutants`). The lab runs every check first on the
unmutated code (the **baseline**, which must pass) and then under each mutation, and records for each
mutation:

* **killed by**: the checks that fail under it;
* **active**: whether it changed anything observable. Every check reports an *observation* (a digest of
  what it saw: joints, sampled counts, published states and stored events, generated tokens, cache rows and
  logits); a mutation whose observations all equal the baseline's is inactive, and its "kills" would be
  vacuous;
* **verdict**: ``killed`` when it is active and at least one check fails; ``survived`` otherwise (a failure
  of ``specround check``); ``error`` when it could not be applied (a seam is gone: its owner no longer
  binds the function by identity) or when none of its seams was called while the checks ran (unreached).

The checks (:data:`CHECKS`), each run as a plain function (:mod:`.lab_checks`, :mod:`.lab_model_checks`):

``enumeration``
    The exact oracle (:mod:`.enumeration`) on the named fixtures and
    :data:`~.lab_checks.LAB_RANDOM_FIXTURES` random ones, tables built under the mutation (rows,
    ``rows_along``, the target joint).
``monte carlo``
    Seeded Monte Carlo through the real ``decide`` (:mod:`.montecarlo`) on the Monte Carlo fixtures.
``z3 conformance``
    Every pair of :func:`~specround.model_check.conformance.run_conformance` (witnesses, refusals, batch
    independence, the walk) against the z3 round relation.
``state-machine invariants``
    INV-1..INV-9 after every rule of the seeded walk (:class:`~.conformance.MachineWalk`), pipelined steps
    and their lost, fenced-out and F-5 endings included.
``audit``
    :func:`~specround.audit.audit_log` of every log the conformance run wrote under the mutation.
``pipelined faults``
    The pipelined write-fault cells of :mod:`specround.audit.pipelined_faults` (a write that fails or loses
    the fence while the next step is in flight, F-5 and F-6 beside it) on a memory log: every cell must
    hold and audit clean.
``model K/V``
    The serving loop on the tiny Llama (both layouts, a draft model proposer): after every step the target's
    committed token ids equal ``C`` (INV-1, INV-5) and the logits its cache gives for the frontier equal a
    fresh forward over ``O`` (within 1e-4: float32 logits of the same weights, computed in another order).
``model q rows``
    From the same runs: every logged q(d_i) equals the request's chain at ``O_0 + d_1..d_{i-1}`` applied to
    a fresh forward of the draft model (the row that actually sampled the draft, contract#degenerate-cases,
    contract#processed-rows).
``model law``
    Monte Carlo through the whole serving path on the tiny Llama: the first
    :data:`~.lab_model_checks.MODEL_HORIZON` tokens of :data:`~.lab_model_checks.MODEL_LAW_SAMPLES` requests
    against the exact target law.

Statistics. Every check is seeded, so on a given code path its outcome is deterministic; the baseline run
shows that the unmutated code passes. The model-law test is Pearson's chi-square at level
:data:`~.lab_model_checks.MODEL_LAW_LEVEL` over the law's cells pooled to >= 5 expected samples (one test,
so a correct serving path fails it with probability 1e-3 over the choice of seeds); its power against the
stated alternative "the same chain at temperature x1.25" is printed in its detail. The fixture Monte Carlo
uses :func:`~.montecarlo.run_monte_carlo` at its documented level with :data:`~.lab_checks.LAB_MC_SAMPLES`
rounds per fixture.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specround.errors import SpecroundError
from specround.model_check.check_results import single_threaded
from specround.model_check.lab_checks import CheckOutcome, controller_checks, fixture_checks, pipelined_check
from specround.model_check.lab_model_checks import model_checks, model_law_check, prepare_model_references
from specround.model_check.mutants import MUTATIONS, Mutation, SeamGoneError

__all__ = [
    "CHECKS",
    "LabReport",
    "MutationRow",
    "prepare",
    "run_checks_once",
    "run_lab",
]

Progress = Callable[[str, int, int], None]

_GROUPS: dict[str, Callable[[], list[CheckOutcome]]] = {
    "fixtures": fixture_checks,
    "controller": controller_checks,
    "pipelined": lambda: [pipelined_check()],
    "model": model_checks,
    "model law": lambda: [model_law_check()],
}
_GROUP_OF = {
    "enumeration": "fixtures",
    "monte carlo": "fixtures",
    "z3 conformance": "controller",
    "state-machine invariants": "controller",
    "audit": "controller",
    "pipelined faults": "pipelined",
    "model K/V": "model",
    "model q rows": "model",
    "model law": "model law",
}
CHECKS: tuple[str, ...] = tuple(_GROUP_OF)
"""Every check of the lab, in report order."""


def prepare() -> None:
    """Compute what the checks take as given, on the code as it is now.

    That is the tiny models, the exact law of the model-law check and the z3 witnesses. :func:`run_lab`
    calls it before applying any mutation, so that no reference is ever computed by mutated code.
    """
    from specround.model_check.conformance import BranchKind, witness
    from specround.sampling.types import Layout

    with single_threaded():
        prepare_model_references()
        for layout in Layout:
            for kind in BranchKind:
                witness(kind, layout)


def run_checks_once(checks: Iterable[str] = CHECKS) -> dict[str, CheckOutcome]:
    """Run the named checks once on the code as it is now (patched or not)."""
    wanted = list(checks)
    unknown = [c for c in wanted if c not in _GROUP_OF]
    if unknown:
        raise KeyError(f"unknown lab checks {unknown}; known: {list(CHECKS)}")
    groups = dict.fromkeys(_GROUP_OF[c] for c in wanted)
    outcomes: dict[str, CheckOutcome] = {}
    with single_threaded():
        for group in groups:
            for outcome in _GROUPS[group]():
                outcomes[outcome.check] = outcome
    return {c: outcomes[c] for c in wanted}


@dataclass(frozen=True)
class MutationRow:
    """What the lab found for one mutation."""

    name: str
    family: str
    failure_class: str
    violates: tuple[str, ...]
    seams: tuple[str, ...]
    killed_by: tuple[str, ...]
    """Checks that failed under the mutation."""
    changed: tuple[str, ...]
    """Checks whose observation differs from the baseline's (non-empty: the mutation is active)."""
    details: dict[str, str]
    """Each failing check's detail."""
    seconds: float
    error: str | None = None
    """Why the mutation could not be applied (a seam is gone)."""

    @property
    def active(self) -> bool:
        """Whether the mutation changed something observable."""
        return bool(self.changed)

    @property
    def killed(self) -> bool:
        """Active, applied, and caught by at least one check."""
        return self.error is None and self.active and bool(self.killed_by)

    @property
    def verdict(self) -> str:
        """``killed``, ``survived`` (inactive or uncaught) or ``error``."""
        if self.error is not None:
            return "error"
        return "killed" if self.killed else "survived"

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "name": self.name,
            "family": self.family,
            "failure_class": self.failure_class,
            "violates": list(self.violates),
            "seams": list(self.seams),
            "verdict": self.verdict,
            "active": self.active,
            "killed_by": list(self.killed_by),
            "changed": list(self.changed),
            "details": self.details,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


@dataclass
class LabReport:
    """The baseline and one row per mutation."""

    checks: tuple[str, ...]
    baseline: dict[str, CheckOutcome] = field(default_factory=dict)
    rows: list[MutationRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def baseline_passed(self) -> bool:
        """Every check passes on the unmutated code (else no kill means anything)."""
        return all(o.passed for o in self.baseline.values())

    @property
    def killed(self) -> int:
        """Mutations killed."""
        return sum(1 for row in self.rows if row.killed)

    @property
    def score(self) -> float:
        """Mutation score: killed / total (1.0 when there is nothing to kill)."""
        return self.killed / len(self.rows) if self.rows else 1.0

    @property
    def passed(self) -> bool:
        """The baseline passes and every mutation is killed."""
        return self.baseline_passed and self.killed == len(self.rows)

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "passed": self.passed,
            "score": self.score,
            "killed": self.killed,
            "total": len(self.rows),
            "checks": list(self.checks),
            "baseline": {name: o.as_json() for name, o in self.baseline.items()},
            "mutations": [row.as_json() for row in self.rows],
            "seconds": round(self.seconds, 3),
        }


def _evaluate(mutation: Mutation, checks: Sequence[str], baseline: dict[str, CheckOutcome]) -> MutationRow:
    started = time.perf_counter()
    seams = tuple(seam.name for seam in mutation.seams)
    try:
        with mutation.applied() as reach:
            outcomes = run_checks_once(checks)
        if not reach.reached:
            raise SeamGoneError(f"unreached: no seam of {mutation.name!r} was called while the checks ran")
    except (AttributeError, ImportError, SpecroundError) as error:
        return MutationRow(
            mutation.name,
            mutation.family,
            mutation.failure_class,
            mutation.violates,
            seams,
            (),
            (),
            {},
            time.perf_counter() - started,
            error=f"{type(error).__name__}: {error}",
        )
    killed_by = tuple(c for c in checks if not outcomes[c].passed)
    changed = tuple(c for c in checks if outcomes[c].observation != baseline[c].observation)
    return MutationRow(
        name=mutation.name,
        family=mutation.family,
        failure_class=mutation.failure_class,
        violates=mutation.violates,
        seams=seams,
        killed_by=killed_by,
        changed=changed,
        details={c: outcomes[c].detail for c in killed_by},
        seconds=time.perf_counter() - started,
    )


def run_lab(
    mutations: Sequence[Mutation] = MUTATIONS,
    checks: Sequence[str] = CHECKS,
    progress: Progress | None = None,
) -> LabReport:
    """Run the baseline and every mutation through every check (see the module docstring)."""
    tick = progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    report = LabReport(checks=tuple(checks))
    tick("mutation lab", 0, len(mutations) + 1)
    prepare()
    report.baseline = run_checks_once(checks)
    for n, mutation in enumerate(mutations, start=1):
        tick("mutation lab", n, len(mutations) + 1)
        report.rows.append(_evaluate(mutation, checks, report.baseline))
    tick("mutation lab", len(mutations) + 1, len(mutations) + 1)
    report.seconds = time.perf_counter() - started
    return report
