"""``specround check``: run the exact oracle, the mutation smoke tests, Monte Carlo and the ledger.

:func:`run_checks` returns a :class:`CheckReport` of named results. Named fixtures get one row per check;
the random family is summarised per check (how many fixtures passed, the largest error). The report
passes only when every row passes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specround.model_check.enumeration import FixtureEnumeration, enumerate_fixtures
from specround.model_check.fixtures import named_fixtures, random_fixtures
from specround.model_check.ledger_checks import enumeration_ledger_checks, ledger_checks
from specround.model_check.montecarlo import ALTERNATIVE, DEFAULT_ALPHA, run_monte_carlo
from specround.model_check.mutations import MUTATIONS
from specround.model_check.results import CheckResult, single_threaded
from specround.model_check.tables import FixtureTables, build_tables
from specround.model_check.worked_examples import summary_checks, three_symbol_checks

__all__ = ["CheckOptions", "CheckReport", "Progress", "run_checks"]

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: called as work advances (for a progress bar)."""

MUTATION_RANDOM_FIXTURES = 20
"""Random fixtures (besides the named ones) each mutation is run against."""
MC_MIN_SEQUENCES = 8
"""A random fixture gets Monte Carlo only if its target joint has at least this many sequences."""


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


@dataclass
class CheckReport:
    """Every check row plus timings."""

    results: list[CheckResult] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    options: CheckOptions = field(default_factory=CheckOptions)

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(r.passed for r in self.results)

    def as_json(self) -> dict[str, Any]:
        """JSON-able report."""
        return {
            "passed": self.passed,
            "checks": len(self.results),
            "failed": sum(1 for r in self.results if not r.passed),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "options": {
                "random_fixtures": self.options.random_fixtures,
                "fixture_seed": self.options.fixture_seed,
                "mc_samples": self.options.mc_samples,
                "mc_random_fixtures": self.options.mc_random_fixtures,
                "mc_seed": self.options.mc_seed,
                "mc_alpha": self.options.mc_alpha,
            },
            "results": [r.as_json() for r in self.results],
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
    for name, mutation in MUTATIONS.items():
        results = enumerate_fixtures(tables, mutation)
        caught = [r for r in results if not r.passed]
        broken = [r.name for r in results if r.joint_error > 1e-12]
        tripped = sorted({c.check for r in caught for c in r.checks if not c.passed})
        rows.append(
            CheckResult(
                f"mutation: {name}",
                "the oracle rejects it",
                bool(broken),
                float(len(broken)),
                None,
                f"joint broken on {len(broken)}/{len(results)} fixtures; tripped: {', '.join(tripped)}",
            )
        )
    return rows


def run_checks(options: CheckOptions | None = None, progress: Progress | None = None) -> CheckReport:
    """Run everything ``specround check`` reports."""
    opts = options or CheckOptions()
    report = CheckReport(options=opts)
    tick = progress or (lambda _stage, _done, _total: None)
    with single_threaded():
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
        for result in enumerated[:n_named]:
            report.results.extend(result.checks)
        for result in enumerated[:n_named]:
            if "0x03E" in result.name:
                report.results.extend(three_symbol_checks(result))
            if "003" in result.name:
                report.results.extend(summary_checks(result))
        if opts.random_fixtures:
            report.results.extend(
                _summarise(f"random fixtures ({opts.random_fixtures})", enumerated[n_named:])
            )
        report.seconds["enumeration"] = time.perf_counter() - started

        if opts.mutations:
            started = time.perf_counter()
            tick("mutation smoke tests", 0, 1)
            mutation_tables = tables[: n_named + min(MUTATION_RANDOM_FIXTURES, opts.random_fixtures)]
            report.results.extend(_mutation_rows(mutation_tables))
            tick("mutation smoke tests", 1, 1)
            report.seconds["mutations"] = time.perf_counter() - started

        if opts.mc_samples > 0:
            started = time.perf_counter()
            # Random fixtures with a non-trivial joint (a one-cell joint leaves nothing to test).
            rich = [
                i
                for i in range(n_named, len(tables))
                if sum(1 for p in tables[i].target_joint.values() if p > 0) >= MC_MIN_SEQUENCES
            ]
            chosen = list(range(n_named)) + rich[: opts.mc_random_fixtures]
            alternative = enumerate_fixtures([tables[i] for i in chosen], MUTATIONS[ALTERNATIVE])
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

        started = time.perf_counter()
        report.results.extend(ledger_checks())
        report.results.extend(enumeration_ledger_checks(enumerated))
        report.seconds["ledger"] = time.perf_counter() - started
    return report
