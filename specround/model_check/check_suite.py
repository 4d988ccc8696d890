"""``specround check``: the exact oracle, Monte Carlo, the ledger, the z3 proofs, conformance and the lab.

:func:`run_checks` returns a :class:`CheckReport` of named rows (:class:`~.check_results.CheckResult`)
plus the details of each part that ran. Parts (:data:`PARTS`, selected with :attr:`CheckOptions.parts`):

``oracle``
    The exact enumeration oracle on the named and random fixtures (one row per check for named fixtures,
    one summary row per check for the random family) and the oracle's decision smoke tests
    (:data:`.mutants.ORACLE_MUTATIONS`).
``monte_carlo``
    Seeded Monte Carlo through the real ``decide`` on the named and a few random fixtures.
``ledger``
    The speedup ledger's closed forms, refusals and its agreement with the enumerated progress law.
``proofs``
    Every registered z3 proof (:mod:`.z3.proofs`), with its status and wall time.
``conformance``
    The real controller against the z3 round relation and the state-machine walk's invariants
    (:mod:`.conformance`), and an audit of every log it wrote.
``mutations``
    The mutation lab (:mod:`.mutation_lab`): every failure class of contract#failure-lab must be killed; the
    mutation score is killed / total and must be 100 %.

The coverage table (:mod:`.coverage`) of INV-n, F-n and the pipelined cells is always built. The report
passes only when every row passes: every proof holds, every conformance pair conforms, every mutation is
killed, every check of the other parts passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specround.model_check.check_results import CheckResult, single_threaded
from specround.model_check.coverage import CoverageRow, build_coverage, default_tests_directory
from specround.model_check.enumeration import FixtureEnumeration, enumerate_fixtures
from specround.model_check.fixture_tables import FixtureTables, build_tables
from specround.model_check.fixtures import named_fixtures, random_fixtures
from specround.model_check.ledger_checks import enumeration_ledger_checks, ledger_checks
from specround.model_check.montecarlo import ALTERNATIVE, DEFAULT_ALPHA, run_monte_carlo
from specround.model_check.mutants import ORACLE_MUTATIONS, mutation_named
from specround.model_check.worked_examples import summary_checks, three_symbol_checks
from specround.model_check.z3.proof_runner import DEFAULT_TIMEOUT_S, ProofResult

__all__ = ["PARTS", "CheckOptions", "CheckReport", "Progress", "run_checks"]

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as work advances (for a progress bar)."""

PARTS = ("oracle", "monte_carlo", "ledger", "proofs", "conformance", "mutations")
"""The parts of ``specround check``, in the order they run."""
MUTATION_RANDOM_FIXTURES = 20
"""Random fixtures (besides the named ones) each oracle smoke-test mutation is run against."""
MC_MIN_SEQUENCES = 8
"""A random fixture gets Monte Carlo only if its target joint has at least this many sequences."""
CONFORMANCE_WALK_RULES = 60
"""Rules of the state-machine walk of the ``conformance`` part."""


@dataclass(frozen=True)
class CheckOptions:
    """What ``specround check`` runs."""

    random_fixtures: int = 1000
    fixture_seed: int = 0
    mc_samples: int = 100_000
    mc_random_fixtures: int = 5
    """Random fixtures that also get a Monte Carlo run (beside every named fixture)."""
    mc_seed: int = 1
    mc_alpha: float = DEFAULT_ALPHA
    mutations: bool = True
    """Run the oracle's decision smoke tests (part ``oracle``)."""
    parts: frozenset[str] = frozenset(PARTS)
    proof_timeout_s: float = DEFAULT_TIMEOUT_S
    walk_seed: int = 0
    walk_rules: int = CONFORMANCE_WALK_RULES
    lab_mutations: tuple[str, ...] = ()
    """Names of the lab mutations to run (empty: every one)."""
    lab_checks: tuple[str, ...] = ()
    """Names of the lab checks to run for each mutation (empty: every one)."""


@dataclass
class CheckReport:
    """Every check row, the details of each part, and timings."""

    results: list[CheckResult] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    options: CheckOptions = field(default_factory=CheckOptions)
    proofs: list[ProofResult] = field(default_factory=list)
    conformance: dict[str, Any] | None = None
    """Summary of the conformance part: pair counts, the pairs that do not conform, witnesses, findings."""
    lab: Any = None
    """The :class:`~specround.model_check.mutation_lab.LabReport` when the lab ran."""
    coverage: list[CoverageRow] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(r.passed for r in self.results)

    @property
    def mutation_score(self) -> float | None:
        """Killed / total of the mutation lab (None when the lab did not run)."""
        return None if self.lab is None else float(self.lab.score)

    def as_json(self) -> dict[str, Any]:
        """JSON-able report."""
        return {
            "passed": self.passed,
            "checks": len(self.results),
            "failed": sum(1 for r in self.results if not r.passed),
            "parts": [p for p in PARTS if p in self.options.parts],
            "wall_s": round(self.wall_s, 3),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "mutation_score": self.mutation_score,
            "options": {
                "random_fixtures": self.options.random_fixtures,
                "fixture_seed": self.options.fixture_seed,
                "mc_samples": self.options.mc_samples,
                "mc_random_fixtures": self.options.mc_random_fixtures,
                "mc_seed": self.options.mc_seed,
                "mc_alpha": self.options.mc_alpha,
                "proof_timeout_s": self.options.proof_timeout_s,
                "walk_seed": self.options.walk_seed,
                "walk_rules": self.options.walk_rules,
                "lab_mutations": list(self.options.lab_mutations),
                "lab_checks": list(self.options.lab_checks),
            },
            "results": [r.as_json() for r in self.results],
            "proofs": [p.as_dict() for p in self.proofs],
            "conformance": self.conformance,
            "mutation_lab": None if self.lab is None else self.lab.as_json(),
            "coverage": [row.as_json() for row in self.coverage],
        }


def _summarise(group: str, results: Sequence[FixtureEnumeration]) -> list[CheckResult]:
    """One row per check name over a family of fixtures."""
    rows: dict[str, list[CheckResult]] = {}
    for result in results:
        for check in result.checks:
            rows.setdefault(check.check, []).append(check)
    out: list[CheckResult] = []
    for name, checks in rows.items():
        errors = [c.error for c in checks if c.error is not None]
        failed = [c for c in checks if not c.passed]
        out.append(
            CheckResult(
                group,
                name,
                not failed,
                max(errors) if errors else None,
                checks[0].tolerance,
                f"{len(checks) - len(failed)}/{len(checks)} fixtures pass"
                + (f"; first failure: {failed[0].fixture}" if failed else ""),
            )
        )
    return out


def _mutation_rows(tables: list[FixtureTables]) -> list[CheckResult]:
    """Each wrong decision function must break the speculative joint on at least one fixture."""
    rows = []
    for mutation in ORACLE_MUTATIONS:
        with mutation.applied():
            results = enumerate_fixtures(tables)
        caught = [r for r in results if not r.passed]
        broken = [r.name for r in results if r.joint_error > 1e-12]
        tripped = sorted({c.check for r in caught for c in r.checks if not c.passed})
        rows.append(
            CheckResult(
                f"mutation: {mutation.name}",
                "the oracle rejects it",
                bool(broken),
                float(len(broken)),
                None,
                f"joint broken on {len(broken)}/{len(results)} fixtures; tripped: {', '.join(tripped)}",
            )
        )
    return rows


def _fixture_parts(opts: CheckOptions, report: CheckReport, tick: Progress) -> None:
    """Parts ``oracle``, ``monte_carlo`` and ``ledger`` (they share the fixtures' tables)."""
    parts = opts.parts
    started = time.perf_counter()
    fixtures = named_fixtures() + random_fixtures(opts.random_fixtures, opts.fixture_seed)
    tables: list[FixtureTables] = []
    for n, fixture in enumerate(fixtures, start=1):
        tables.append(build_tables(fixture))
        if n % 25 == 0 or n == len(fixtures):
            tick("processed rows (both softmax backends)", n, len(fixtures))
    report.seconds["tables"] = time.perf_counter() - started

    started = time.perf_counter()
    tick("exact enumeration", 0, 1)
    enumerated = enumerate_fixtures(tables)
    tick("exact enumeration", 1, 1)
    n_named = len(named_fixtures())
    if "oracle" in parts:
        for result in enumerated[:n_named]:
            report.results.extend(result.checks)
        for result in enumerated[:n_named]:
            if "contract#worked-coupling" in result.name:
                report.results.extend(three_symbol_checks(result))
            if "contract#worked-round" in result.name:
                report.results.extend(summary_checks(result))
        if opts.random_fixtures:
            report.results.extend(
                _summarise(f"random fixtures ({opts.random_fixtures})", enumerated[n_named:])
            )
    report.seconds["enumeration"] = time.perf_counter() - started

    if "oracle" in parts and opts.mutations:
        started = time.perf_counter()
        tick("mutation smoke tests", 0, 1)
        mutation_tables = tables[: n_named + min(MUTATION_RANDOM_FIXTURES, opts.random_fixtures)]
        report.results.extend(_mutation_rows(mutation_tables))
        tick("mutation smoke tests", 1, 1)
        report.seconds["mutations"] = time.perf_counter() - started

    if "monte_carlo" in parts and opts.mc_samples > 0:
        started = time.perf_counter()
        # Random fixtures with a non-trivial joint (a one-cell joint leaves nothing to test).
        rich = [
            i
            for i in range(n_named, len(tables))
            if sum(1 for p in tables[i].target_joint.values() if p > 0) >= MC_MIN_SEQUENCES
        ]
        chosen = list(range(n_named)) + rich[: opts.mc_random_fixtures]
        with mutation_named(ALTERNATIVE).applied():
            alternative = enumerate_fixtures([tables[i] for i in chosen])
        for n, (index, wrong) in enumerate(zip(chosen, alternative, strict=True), start=1):
            exact = enumerated[index]
            mc = run_monte_carlo(
                exact.tables,
                exact.tables.target_joint,
                exact.emitted_pmf,
                samples=opts.mc_samples,
                seed=opts.mc_seed,
                alpha=opts.mc_alpha,
                alternative=wrong.speculative_joint,
            )
            report.results.extend(mc.checks)
            tick("Monte Carlo", n, len(chosen))
        report.seconds["monte_carlo"] = time.perf_counter() - started

    if "ledger" in parts:
        started = time.perf_counter()
        report.results.extend(ledger_checks())
        report.results.extend(enumeration_ledger_checks(enumerated))
        report.seconds["ledger"] = time.perf_counter() - started


def _proof_part(opts: CheckOptions, report: CheckReport, tick: Progress) -> None:
    """Part ``proofs``: every registered proof, one summary row and a row per failing proof."""
    from specround.model_check.z3.proof_runner import run_all_proofs
    from specround.model_check.z3.proofs import all_proofs

    started = time.perf_counter()
    total = len(all_proofs())
    done = 0

    def on_result(_result: ProofResult) -> None:
        nonlocal done
        done += 1
        tick("z3 proofs", done, total)

    tick("z3 proofs", 0, total)
    report.proofs = run_all_proofs(timeout_s=opts.proof_timeout_s, on_result=on_result)
    failed = [p for p in report.proofs if not p.ok]
    slowest = max(report.proofs, key=lambda p: p.wall_s)
    report.results.append(
        CheckResult(
            "z3 proofs",
            "every proof has the status its kind expects",
            not failed,
            float(len(failed)),
            0.0,
            f"{len(report.proofs) - len(failed)}/{len(report.proofs)} ok; slowest {slowest.name} "
            f"{slowest.wall_s:.2f} s",
        )
    )
    for proof in failed:
        counterexample = ", ".join(f"{k} = {v}" for k, v in list(proof.model.items())[:6])
        report.results.append(
            CheckResult(
                "z3 proofs",
                proof.name,
                False,
                None,
                None,
                f"{proof.kind.value}: {proof.status.value}; {proof.detail} {counterexample}".strip(),
            )
        )
    report.seconds["proofs"] = time.perf_counter() - started


def _conformance_part(opts: CheckOptions, report: CheckReport, tick: Progress) -> None:
    """Part ``conformance``: the controller against the z3 relation, the walk, and an audit of the logs."""
    from specround.audit import audit_log
    from specround.model_check.conformance import run_conformance

    started = time.perf_counter()
    tick("conformance", 0, 1)
    run = run_conformance(walk_seed=opts.walk_seed, walk_rules=opts.walk_rules)
    findings = [f for log in run.logs for f in audit_log(log).findings]
    tick("conformance", 1, 1)
    bad = run.nonconforming
    kinds = sorted({w.kind.value for w in run.witnesses})
    conforming_kinds = sorted(
        {p.scenario for p in run.pairs if p.scenario in kinds} - {p.scenario for p in bad}
    )
    report.conformance = {
        "pairs": len(run.pairs),
        "conforming": len(run.pairs) - len(bad),
        "nonconforming": [p.as_json() for p in bad],
        "failures": list(run.failures),
        "violations": [str(v) for v in run.violations],
        "audit_findings": [f"{f.invariant} {f.kind} ({f.request_id}): {f.message}" for f in findings],
        "walk_rules": list(run.walk_rules),
        "witness_kinds": conforming_kinds,
        "witnesses": [w.as_json() for w in run.witnesses],
    }
    first = f"; first: [{bad[0].scenario}] {bad[0].attempt}: {bad[0].detail}" if bad else ""
    report.results += [
        CheckResult(
            "conformance",
            "every observed (pre, post) pair satisfies the z3 round relation",
            bool(run.pairs) and not bad,
            float(len(bad)),
            0.0,
            f"{len(run.pairs) - len(bad)}/{len(run.pairs)} pairs conform{first}",
        ),
        CheckResult(
            "conformance",
            "a z3 witness of every branch kind replays and conforms, on both layouts",
            len(conforming_kinds) == len(kinds) and not run.failures,
            float(len(kinds) - len(conforming_kinds)),
            0.0,
            f"{len(conforming_kinds)}/{len(kinds)} kinds"
            + (f"; {len(run.failures)} scenario failures, first: {run.failures[0]}" if run.failures else ""),
        ),
        CheckResult(
            "conformance",
            "state-machine invariants INV-1..INV-9 after every rule of the walk",
            not run.violations,
            float(len(run.violations)),
            0.0,
            f"{len(run.walk_rules)} rules ({run.walk_rules.count('pipelined')} pipelined)"
            + (f"; first violation: {run.violations[0]}" if run.violations else ""),
        ),
        CheckResult(
            "conformance",
            "the audit finds nothing in the logs written",
            not findings,
            float(len(findings)),
            0.0,
            f"{len(run.logs)} logs"
            + (f"; first: {report.conformance['audit_findings'][0]}" if findings else ""),
        ),
    ]
    report.seconds["conformance"] = time.perf_counter() - started


def _lab_part(opts: CheckOptions, report: CheckReport, tick: Progress) -> None:
    """Part ``mutations``: the baseline must pass and every mutation must be killed."""
    from specround.model_check.mutants import MUTATIONS as LAB_MUTATIONS
    from specround.model_check.mutation_lab import CHECKS, run_lab

    started = time.perf_counter()
    chosen = [mutation_named(n) for n in opts.lab_mutations] if opts.lab_mutations else list(LAB_MUTATIONS)
    lab = run_lab(chosen, opts.lab_checks or CHECKS, progress=tick)
    report.lab = lab
    for name, outcome in lab.baseline.items():
        report.results.append(
            CheckResult("mutation lab baseline", name, outcome.passed, None, None, outcome.detail)
        )
    for row in lab.rows:
        if row.killed:
            detail = f"killed by {', '.join(row.killed_by)}"
        elif row.error is not None:
            detail = f"could not be applied: {row.error}"
        elif not row.active:
            detail = "inactive: no check observed any change"
        else:
            detail = f"survived; changed {', '.join(row.changed)}"
        report.results.append(
            CheckResult(f"mutation lab: {row.name}", "killed by a check", row.killed, None, None, detail)
        )
    report.results.append(
        CheckResult(
            "mutation lab",
            "mutation score = killed / total = 100 %",
            lab.killed == len(lab.rows),
            lab.score,
            1.0,
            f"{lab.killed}/{len(lab.rows)} killed ({lab.score:.0%})",
        )
    )
    report.seconds["mutation_lab"] = time.perf_counter() - started


def _coverage(report: CheckReport) -> None:
    """The INV-n / F-n table and its two rows."""
    statuses = {p.name: p.ok for p in report.proofs} if report.proofs else None
    mutations = (
        [(row.name, row.violates, row.verdict) for row in report.lab.rows] if report.lab is not None else []
    )
    conformance = report.conformance or {}
    tests_directory = default_tests_directory()
    report.coverage = build_coverage(
        proof_statuses=statuses,
        mutations=mutations,
        conformance_kinds=conformance.get("witness_kinds", ()),
        conforming_pairs=0 if conformance.get("nonconforming") else conformance.get("conforming", 0),
        walk_ran=bool(conformance.get("walk_rules")),
        walk_rules=list(conformance.get("walk_rules", ())),
        tests_directory=tests_directory,
    )
    unproved = [row.item for row in report.coverage if not row.proved]
    report.results.append(
        CheckResult(
            "coverage",
            "every INV-n, F-n and pipelined cell is covered by a registered proof that holds",
            not unproved,
            float(len(unproved)),
            0.0,
            ", ".join(unproved) or f"{len(report.coverage)} items",
        )
    )
    if tests_directory is not None:
        idle = [row.item for row in report.coverage if not row.exercised]
        report.results.append(
            CheckResult(
                "coverage",
                "every INV-n, F-n and pipelined cell is exercised by a test, the lab or conformance",
                not idle,
                float(len(idle)),
                0.0,
                ", ".join(idle) or f"{len(report.coverage)} items",
            )
        )


def run_checks(options: CheckOptions | None = None, progress: Progress | None = None) -> CheckReport:
    """Run the parts of ``specround check`` that ``options`` selects."""
    opts = options or CheckOptions()
    report = CheckReport(options=opts)
    tick = progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    with single_threaded():
        if opts.parts & {"oracle", "monte_carlo", "ledger"}:
            _fixture_parts(opts, report, tick)
        if "proofs" in opts.parts:
            _proof_part(opts, report, tick)
        if "conformance" in opts.parts:
            _conformance_part(opts, report, tick)
        if "mutations" in opts.parts:
            _lab_part(opts, report, tick)
        _coverage(report)
    report.wall_s = time.perf_counter() - started
    return report
