"""A refactoring cannot leave a mutant unarmed: it stays armed, or applying it fails loudly.

A mutant patches the function object its owner binds, found by identity. The tests below play out what a
rename of the patched function's import does to the real code path, on the exact oracle (the lab's
``enumeration`` check) and on the z3 model:

* the owner imports the function under a new name and calls it by that name: the mutant finds the new
  binding, the patched function is called, and the kill is real;
* the owner no longer binds the function (it calls it through its module): applying the mutant raises
  :class:`SeamGoneError`, the lab reports an error, never a kill, and ``specround check`` exits 1;
* the owner still binds the function but the code path goes around that binding: the patched function is
  never called, and the lab (or the z3 proof build) reports the mutant as unreached.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from specround.cli import app
from specround.model_check import enumeration
from specround.model_check.mutants import MODEL_MUTATIONS, SeamGoneError, mutation_named
from specround.model_check.mutants.sampler import CORRECTION_FROM_P
from specround.model_check.mutation_lab import run_lab
from specround.model_check.z3 import rules, transition
from specround.model_check.z3.proof_runner import ProofStatus, run_proof
from specround.model_check.z3.proofs import Proof, ProofKind, all_proofs
from specround.model_check.z3.protocol_state import RoundInputs
from specround.model_check.z3.rules import Emission
from specround.model_check.z3.terms import Int
from specround.sampling import exact
from specround.sampling.types import SamplerBatch, SamplerDecision


def _rename_import(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ``enumeration`` read ``from ...exact import decide_from_uniforms as decide_round``."""
    monkeypatch.delattr(enumeration, "decide_from_uniforms")
    monkeypatch.setattr(enumeration, "decide_round", exact.decide_from_uniforms, raising=False)

    def real_decide(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
        result: SamplerDecision = enumeration.decide_round(batch, accept, terminal)  # type: ignore[attr-defined]
        return result

    monkeypatch.setattr(enumeration, "_real_decide", real_decide)


def _call_through_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if ``enumeration`` read ``from specround.sampling import exact`` and called ``exact.decide_...``."""
    monkeypatch.delattr(enumeration, "decide_from_uniforms")

    def real_decide(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
        return exact.decide_from_uniforms(batch, accept, terminal)

    monkeypatch.setattr(enumeration, "_real_decide", real_decide)


def test_a_renamed_import_keeps_the_mutant_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    _rename_import(monkeypatch)
    seam = next(s for s in CORRECTION_FROM_P.seams if s.owner is enumeration)
    assert seam.attribute() == "decide_round"  # found by identity under its new name
    report = run_lab([CORRECTION_FROM_P], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "killed" and row.killed_by == ("enumeration",)
    assert report.passed


def test_a_binding_that_is_gone_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    _call_through_the_module(monkeypatch)
    with pytest.raises(SeamGoneError, match="no longer binds"), CORRECTION_FROM_P.applied():
        pass
    report = run_lab([CORRECTION_FROM_P], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "error" and not row.killed and row.killed_by == ()
    assert "no longer binds" in str(row.error)
    assert not report.passed and report.score == 0.0
    args = ["--only", "mutations", "--lab-mutation", CORRECTION_FROM_P.name, "--lab-check", "enumeration"]
    result = CliRunner().invoke(app, ["check", *args, "--json"])
    assert result.exit_code == 1, result.output
    payload = json.loads(result.stdout)
    assert payload["mutation_score"] == 0.0
    assert [m["verdict"] for m in payload["mutation_lab"]["mutations"]] == ["error"]


def test_a_binding_the_code_path_goes_around_is_unreached(monkeypatch: pytest.MonkeyPatch) -> None:
    bypass = exact.decide_from_uniforms

    def real_decide(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
        return bypass(batch, accept, terminal)

    monkeypatch.setattr(enumeration, "_real_decide", real_decide)  # the binding stays, nobody calls it
    only_the_oracle = type(CORRECTION_FROM_P)(
        "correction from p, oracle only",
        "sampler",
        CORRECTION_FROM_P.failure_class,
        CORRECTION_FROM_P.violates,
        tuple(s for s in CORRECTION_FROM_P.seams if s.owner is enumeration),
    )
    report = run_lab([only_the_oracle], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "error" and "unreached" in str(row.error)
    assert not report.passed


def _mutant_proof(name: str) -> Proof:
    return next(p for p in all_proofs() if p.name == f"protocol.mutant.{name.replace(' ', '_')}")


def test_every_model_mutant_reaches_its_rule() -> None:
    mutant_proofs = [p for p in all_proofs() if ".mutant." in p.name]
    assert len(mutant_proofs) == len(MODEL_MUTATIONS)
    assert all(p.kind is ProofKind.REFUTABLE for p in mutant_proofs)
    for proof in mutant_proofs:
        obligation = proof.build()  # raises when a rule is unbound or never called
        assert obligation.premises


def test_a_model_rule_that_is_no_longer_bound_fails_the_proof_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    proof = _mutant_proof("extra accept draw")

    def accept_draws(inputs: RoundInputs, emission: Emission) -> Int:
        return rules.accept_draws(inputs, emission)

    monkeypatch.setattr(transition, "accept_draws", accept_draws)  # the rule's binding is gone
    with pytest.raises(SeamGoneError, match="no longer binds"):
        run_proof(proof)


def test_a_model_rule_the_round_goes_around_is_unreached(monkeypatch: pytest.MonkeyPatch) -> None:
    proof = _mutant_proof("continue after stop")
    emission = transition._emission

    def scan(*args: Any) -> Emission:
        with monkeypatch.context() as inner:
            inner.setattr(transition, "ends_emission", rules.ends_emission)
            return emission(*args)

    monkeypatch.setattr(transition, "_emission", scan)  # the scan restores the real rule around itself
    with pytest.raises(SeamGoneError, match="unreached"):
        run_proof(proof)


def test_the_model_mutants_are_refuted() -> None:
    for name in ("extra accept draw", "retained skips frontier row"):
        result = run_proof(_mutant_proof(name))
        assert result.status is ProofStatus.REFUTED and result.ok, name
    assert mutation_named("retained skips frontier row").refuted_by == "protocol.layout_equivalence"
