"""The proof runner's verdicts, and the whole registered proof set (INV-1..INV-10, F-1..F-6)."""

from __future__ import annotations

import json

import pytest
import z3

from specround.errors import InputError
from specround.model_check.z3.proof_runner import (
    ProofStatus,
    format_results,
    main,
    run_all_proofs,
    run_proof,
    term_size,
)
from specround.model_check.z3.proofs import Obligation, Proof, ProofKind, all_proofs
from specround.model_check.z3.protocol_state import FAULT_POINTS

X = z3.Int("x")


def proof(kind: ProofKind, premises: tuple[z3.BoolRef, ...], goal: z3.BoolRef) -> Proof:
    return Proof("t", ("INV-0",), kind, lambda: Obligation(premises, goal, (("x", X),)), "test")


def test_runner_verdicts() -> None:
    proved = run_proof(proof(ProofKind.VALID, (X > 1,), X > 0))
    assert proved.status is ProofStatus.PROVED and proved.ok and proved.assertions == 2
    refuted = run_proof(proof(ProofKind.VALID, (X > 1,), X > 5))
    assert refuted.status is ProofStatus.REFUTED and not refuted.ok
    assert int(refuted.model["x"]) in range(2, 6)
    vacuous = run_proof(proof(ProofKind.VALID, (X > 1, X < 0), X == 7))
    assert vacuous.status is ProofStatus.VACUOUS and not vacuous.ok
    reachable = run_proof(proof(ProofKind.REACHABLE, (X > 1,), X == 3))
    assert reachable.status is ProofStatus.REACHABLE and reachable.model == {"x": "3"}
    unreachable = run_proof(proof(ProofKind.REACHABLE, (X > 1,), X == 0))
    assert unreachable.status is ProofStatus.UNREACHABLE and not unreachable.ok
    mutant = run_proof(proof(ProofKind.REFUTABLE, (X > 1,), X > 5))
    assert mutant.status is ProofStatus.REFUTED and mutant.ok
    assert json.loads(json.dumps(mutant.as_dict()))["ok"] is True


def test_term_size_counts_shared_nodes_once() -> None:
    shared = X + 1
    assert term_size([shared * shared]) == 4  # *, +, x, 1
    assert term_size([z3.ForAll([X], X >= X)]) == 3  # quantifier, >=, bound variable


def test_registry_names_are_unique_and_dependencies_exist() -> None:
    proofs = all_proofs()
    names = [p.name for p in proofs]
    assert len(names) == len(set(names))
    for p in proofs:
        assert set(p.uses) <= set(names), p.name


def test_every_invariant_and_fault_point_has_a_valid_proof_per_layout() -> None:
    covered: dict[str, set[str]] = {}
    for p in all_proofs():
        if p.kind is ProofKind.VALID and p.name.startswith("protocol."):
            layout = next((tag for tag in ("replay_frontier", "retained_frontier") if tag in p.name), "both")
            for item in p.covers:
                covered.setdefault(item, set()).add(layout)
    for item in [f"INV-{n}" for n in (1, 2, 3, 4, 5, 6, 7, 8, 10)] + list(FAULT_POINTS):
        assert {"replay_frontier", "retained_frontier"} <= covered[item], item
    assert covered["INV-9"]  # the hash chain is layout-independent


def test_unknown_name_is_refused_before_running() -> None:
    with pytest.raises(InputError):
        run_all_proofs(["no-such-proof"])


def test_main_runs_a_subset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["protocol.init", "protocol.layout_equivalence"]) == 0
    out = capsys.readouterr().out
    assert "protocol.init.INV-1" in out and "6 proofs, 0 failed" in out


@pytest.mark.slow
def test_all_proofs_hold() -> None:
    # The whole set: coupling lemmas, inductive steps per INV and layout, fault points, fencing, bounded
    # runs, sat-trace regressions and mutants. Each query has the default time limit; none may hit it.
    results = run_all_proofs()
    print(format_results(results))
    failed = [r for r in results if not r.ok]
    assert not failed, format_results(failed)
    assert all(r.size > 0 and r.assertions > 0 and r.wall_s >= 0 for r in results)
    statuses = {r.status for r in results}
    assert statuses == {ProofStatus.PROVED, ProofStatus.REACHABLE, ProofStatus.REFUTED}


class _ScriptedSolver:
    """A solver stand-in answering from a script: (verdict, reason) per fresh solver, in order."""

    def __init__(self, answers: list[tuple[object, str]], seeds: list[int], seed: int) -> None:
        self._answer = answers.pop(0)
        seeds.append(seed)

    def add(self, *terms: object) -> None:
        del terms

    def check(self) -> object:
        return self._answer[0]

    def reason_unknown(self) -> str:
        return self._answer[1]


def test_an_unknown_verdict_is_retried_with_other_seeds_but_a_timeout_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from specround.model_check.z3 import proof_runner

    seeds: list[int] = []
    answers = [(z3.unknown, "incomplete quantifiers"), (z3.unknown, "incomplete quantifiers"), (z3.sat, "")]
    monkeypatch.setattr(
        proof_runner, "_solver", lambda timeout_s, seed=0: _ScriptedSolver(answers, seeds, seed)
    )
    verdict, _ = proof_runner._decide([], 1.0)
    assert verdict == z3.sat and seeds == [0, 1, 2]
    seeds.clear()
    answers[:] = [(z3.unknown, "timeout"), (z3.sat, "")]
    verdict, _ = proof_runner._decide([], 1.0)
    assert verdict == z3.unknown and seeds == [0]  # a query past its time limit is not run again
