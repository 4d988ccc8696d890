"""Deciding the registered z3 proofs (:mod:`.proofs`): statuses, results, a table, a command line.

The runner decides each proof's obligation and returns a :class:`ProofResult` with the status, the
solver's statistics, the size of the query and the wall time; what each status means for each kind is in
:mod:`.proofs`.

Run ``python -m specround.model_check.z3.proof_runner`` for a table of every proof with its time and size.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import z3

from specround.errors import InputError
from specround.model_check.z3.proofs import Proof, ProofKind, Shown, all_proofs

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ProofResult",
    "ProofStatus",
    "format_results",
    "main",
    "run_all_proofs",
    "run_proof",
    "term_size",
]

DEFAULT_TIMEOUT_S = 120.0
"""Solver time limit of one query; a query that hits it is reported ``UNKNOWN`` (a failure)."""


class ProofStatus(StrEnum):
    """The runner's verdict on one obligation."""

    PROVED = "proved"
    """VALID and REFUTABLE: ``premises and not goal`` is unsat."""
    REFUTED = "refuted"
    """``premises and not goal`` has a model (a counterexample)."""
    VACUOUS = "vacuous"
    """The premises alone are unsat: nothing was proved."""
    REACHABLE = "reachable"
    """REACHABLE: ``premises and goal`` has a model (the witness)."""
    UNREACHABLE = "unreachable"
    """REACHABLE: ``premises and goal`` is unsat."""
    UNKNOWN = "unknown"
    """The solver gave up (time limit or incompleteness)."""


_EXPECTED = {
    ProofKind.VALID: ProofStatus.PROVED,
    ProofKind.REACHABLE: ProofStatus.REACHABLE,
    ProofKind.REFUTABLE: ProofStatus.REFUTED,
}


@dataclass(frozen=True)
class ProofResult:
    """The outcome of running one :class:`Proof`."""

    name: str
    covers: tuple[str, ...]
    kind: ProofKind
    status: ProofStatus
    assertions: int
    """Top-level assertions of the deciding query (premises plus the goal or its negation)."""
    size: int
    """Distinct z3 AST nodes of the deciding query (a DAG count)."""
    wall_s: float
    """Seconds to build the obligation and run every solver call."""
    statistics: dict[str, float] = field(default_factory=dict)
    """z3's statistics of the deciding query (conflicts, decisions, memory, ...)."""
    model: dict[str, str] = field(default_factory=dict)
    """The counterexample (REFUTED) or witness (REACHABLE): each ``show`` term's value."""
    uses: tuple[str, ...] = ()
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the status is the one the proof's kind expects."""
        return self.status == _EXPECTED[self.kind]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return {
            "name": self.name,
            "covers": list(self.covers),
            "kind": self.kind.value,
            "status": self.status.value,
            "ok": self.ok,
            "assertions": self.assertions,
            "size": self.size,
            "wall_s": round(self.wall_s, 4),
            "statistics": self.statistics,
            "model": self.model,
            "uses": list(self.uses),
            "detail": self.detail,
        }


def term_size(terms: Iterable[z3.ExprRef]) -> int:
    """Number of distinct AST nodes reachable from ``terms`` (shared subterms counted once)."""
    seen: set[int] = set()
    stack = list(terms)
    while stack:
        term = stack.pop()
        ident = term.get_id()
        if ident in seen:
            continue
        seen.add(ident)
        if z3.is_quantifier(term):
            stack.append(term.body())
        else:
            stack.extend(term.children())
    return len(seen)


RETRY_SEEDS = (1, 2, 3)
"""Solver seeds a query is run again with when z3 answers ``unknown`` for a reason other than its time limit.

Quantified queries can end ``unknown`` ("incomplete quantifiers") on one search path and be decided on
another; the path depends on the seed and on the terms built earlier in the process. ``sat`` and ``unsat``
are sound whatever the seed, so a later seed's verdict is as good as the first's.
"""


def _solver(timeout_s: float, seed: int = 0) -> z3.Solver:
    solver = z3.Solver()
    solver.set("timeout", max(1, int(timeout_s * 1000)))
    if seed:
        solver.set("random_seed", seed)
    return solver


def _decide(query: Sequence[Any], timeout_s: float) -> tuple[Any, z3.Solver]:
    """``check()`` of ``query`` on a fresh solver, again with :data:`RETRY_SEEDS` while it is unknown."""
    solver = _solver(timeout_s)
    solver.add(*query)
    verdict = solver.check()
    for seed in RETRY_SEEDS:
        if verdict != z3.unknown or solver.reason_unknown() in ("timeout", "canceled"):
            break
        solver = _solver(timeout_s, seed)
        solver.add(*query)
        verdict = solver.check()
    return verdict, solver


def _statistics(solver: z3.Solver) -> dict[str, float]:
    stats = solver.statistics()
    out: dict[str, float] = {}
    for key in stats.keys():  # noqa: SIM118 - z3 Statistics is not a dict and has no __iter__ over keys
        value = stats.get_key_value(key)
        if isinstance(value, (int, float)):
            out[str(key)] = float(value)
    return out


def _model_values(model: z3.ModelRef, show: Sequence[tuple[str, Shown]]) -> dict[str, str]:
    def render(shown: Shown) -> str:
        if isinstance(shown, tuple):
            return "(" + ", ".join(render(term) for term in shown) + ")"
        return str(model.eval(shown, model_completion=True))

    return {label: render(shown) for label, shown in show}


def run_proof(proof: Proof, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> ProofResult:
    """Build and decide one proof."""
    start = time.perf_counter()
    obligation = proof.build()
    premises = list(obligation.premises)
    model: dict[str, str] = {}
    detail = ""

    if proof.kind == ProofKind.REACHABLE:
        query = [*premises, obligation.goal]
        verdict, solver = _decide(query, timeout_s)
        if verdict == z3.sat:
            status = ProofStatus.REACHABLE
            model = _model_values(solver.model(), obligation.show)
        elif verdict == z3.unsat:
            status = ProofStatus.UNREACHABLE
        else:
            status = ProofStatus.UNKNOWN
            detail = solver.reason_unknown()
    else:
        status = ProofStatus.UNKNOWN
        premise_verdict, vacuity = _decide(premises, timeout_s)
        query = [*premises, z3.Not(obligation.goal)]
        solver = _solver(timeout_s)
        if premise_verdict == z3.unsat:
            status = ProofStatus.VACUOUS
            detail = "the premises are contradictory"
        elif premise_verdict == z3.unknown:
            detail = f"premise satisfiability unknown: {vacuity.reason_unknown()}"
        else:
            verdict, solver = _decide(query, timeout_s)
            if verdict == z3.unsat:
                status = ProofStatus.PROVED
            elif verdict == z3.sat:
                status = ProofStatus.REFUTED
                model = _model_values(solver.model(), obligation.show)
            else:
                detail = solver.reason_unknown()

    return ProofResult(
        name=proof.name,
        covers=proof.covers,
        kind=proof.kind,
        status=status,
        assertions=len(query),
        size=term_size(query),
        wall_s=time.perf_counter() - start,
        statistics=_statistics(solver),
        model=model,
        uses=proof.uses,
        detail=detail,
    )


def run_all_proofs(
    names: Iterable[str] | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    on_result: Callable[[ProofResult], None] | None = None,
) -> list[ProofResult]:
    """Run every registered proof (or those whose name starts with one of ``names``), in order.

    ``on_result`` is called after each proof (for progress output). Unknown name prefixes are refused
    with :class:`~specround.errors.InputError` before anything runs.
    """
    proofs = all_proofs()
    if names is not None:
        prefixes = tuple(names)
        unknown = [p for p in prefixes if not any(proof.name.startswith(p) for proof in proofs)]
        if unknown:
            raise InputError(f"no proof name starts with {unknown}")
        proofs = tuple(proof for proof in proofs if proof.name.startswith(prefixes))
    results = []
    for proof in proofs:
        result = run_proof(proof, timeout_s=timeout_s)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def format_results(results: Sequence[ProofResult]) -> str:
    """A plain-text table: name, status, time, assertion count, AST size and what each proof covers."""
    header = f"{'proof':<52} {'status':<11} {'ok':<3} {'wall_s':>8} {'asserts':>7} {'size':>7}  covers"
    lines = [header, "-" * len(header)]
    for r in results:
        lines.append(
            f"{r.name:<52} {r.status.value:<11} {'yes' if r.ok else 'NO':<3} {r.wall_s:>8.3f} "
            f"{r.assertions:>7} {r.size:>7}  {', '.join(r.covers)}"
        )
        if not r.ok:
            if r.detail:
                lines.append(f"    detail: {r.detail}")
            for label, value in r.model.items():
                lines.append(f"    {label} = {value}")
    failed = sum(not r.ok for r in results)
    total = sum(r.wall_s for r in results)
    lines.append(f"{len(results)} proofs, {failed} failed, {total:.2f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry: run the proofs, print a table (or JSON), exit 1 when any proof failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", help="run only proofs whose name starts with one of these")
    parser.add_argument("--json", action="store_true", help="print one JSON list instead of a table")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per query")
    args = parser.parse_args(argv)
    results = run_all_proofs(args.names or None, timeout_s=args.timeout)
    if args.json:
        print(json.dumps([r.as_dict() for r in results], indent=2))
    else:
        print(format_results(results))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":  # pragma: no cover - exercised through main()
    # Run the package module's main: under ``python -m`` this file is also loaded as ``__main__``, whose
    # classes are distinct from the ones the proof modules import.
    from specround.model_check.z3.proof_runner import main as _package_main

    sys.exit(_package_main())
