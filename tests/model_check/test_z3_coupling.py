"""The z3 coupling definitions on the contract's worked examples, the quick lemma proofs, and wrong
couplings that the same proof shapes must refute (contract#sampler-law, contract#failure-lab)."""

from __future__ import annotations

from fractions import Fraction
from functools import partial

import pytest
import z3

from specround.model_check.z3.coupling import (
    PrefixRows,
    accept_probability,
    coupling_proofs,
    distribution,
    marginal_facts,
    one_token_coupling,
    speculative_joint,
    target_joint,
)
from specround.model_check.z3.decision_proofs import inverse_cdf_obligation
from specround.model_check.z3.proof_runner import ProofStatus, run_proof
from specround.model_check.z3.proofs import Obligation, Proof, ProofKind


def value(term: z3.ExprRef) -> Fraction:
    simplified = z3.simplify(term)
    assert z3.is_rational_value(simplified), simplified
    return Fraction(simplified.numerator_as_long(), simplified.denominator_as_long())


def rows(values: list[str]) -> tuple[z3.ArithRef, ...]:
    return tuple(z3.RealVal(v) for v in values)


def test_three_symbol_summary_example() -> None:
    # p = [0.6, 0.3, 0.1], q = [0.2, 0.3, 0.5]: acceptance [1, 1, 0.2], accepted mass [0.2, 0.3, 0.1],
    # rejection 0.4, residual [1, 0, 0]; the output law is p again.
    c = one_token_coupling(rows(["0.6", "0.3", "0.1"]), rows(["0.2", "0.3", "0.5"]))
    assert [value(a) for a in c.accept] == [1, 1, Fraction(1, 5)]
    assert [value(m) for m in c.accepted_mass] == [Fraction(1, 5), Fraction(3, 10), Fraction(1, 10)]
    assert value(c.rejection) == Fraction(2, 5)
    assert [value(r) for r in c.residual] == [1, 0, 0]
    output = [value(m + c.rejection * r) for m, r in zip(c.accepted_mass, c.residual, strict=True)]
    assert output == [Fraction(3, 5), Fraction(3, 10), Fraction(1, 10)]


def test_tiny_vocabulary_coupling_matrix() -> None:
    # contract#worked-coupling: p(A) = 0.30, q(A) = 0.60 -> accept A with 0.5; residual excess B 0.25, C 0.05
    # -> Z = 0.30, p'(B) = 0.833.., p'(C) = 0.166..; the diagonal of the coupling matrix sums to 0.70.
    c = one_token_coupling(rows(["0.30", "0.45", "0.25"]), rows(["0.60", "0.20", "0.20"]))
    assert value(c.accept[0]) == Fraction(1, 2)
    assert value(c.rejection) == Fraction(3, 10)
    assert [value(r) for r in c.residual] == [0, Fraction(5, 6), Fraction(1, 6)]
    diagonal = sum(value(m) for m in c.accepted_mass)
    assert diagonal == Fraction(7, 10) == 1 - value(c.rejection)


def test_unproposed_event_never_evaluates_its_ratio() -> None:
    # contract#degenerate-cases: q(x) = 0 -> acceptance 0 by definition (never used), no division by zero.
    assert value(accept_probability(z3.RealVal("0.4"), z3.RealVal(0))) == 0


QUICK = [
    proof
    for proof in coupling_proofs()
    if proof.name == "coupling.accept_rule"
    or proof.name.endswith((".v2", ".v3"))
    or proof.name.startswith(("coupling.prefix.v2", "coupling.prefix_direct.v2.k1"))
]


@pytest.mark.parametrize("proof", QUICK, ids=lambda p: p.name)
def test_quick_coupling_proofs(proof: Proof) -> None:
    result = run_proof(proof)
    assert result.status is ProofStatus.PROVED, result


def test_lemma_dependencies_are_registered() -> None:
    names = {proof.name for proof in coupling_proofs()}
    for proof in coupling_proofs():
        assert set(proof.uses) <= names, proof.name


def _wrong_one_token(size: int, variant: str) -> Obligation:
    p = tuple(z3.Real(f"p{i}") for i in range(size))
    q = tuple(z3.Real(f"q{i}") for i in range(size))
    c = one_token_coupling(p, q)
    if variant == "correction_from_p":
        residual = p
        accepted = c.accepted_mass
    else:  # swapped ratio min(1, q/p)
        residual = c.residual
        accepted = tuple(
            qx * z3.If(px > 0, z3.If(qx <= px, z3.RealVal(1), qx / px), z3.RealVal(0))
            for px, qx in zip(p, q, strict=True)
        )
    rejection = 1 - z3.Sum(list(accepted))
    return Obligation(
        premises=(distribution(p), distribution(q)),
        goal=marginal_facts(p, accepted, residual, rejection),
    )


@pytest.mark.parametrize("variant", ["correction_from_p", "swapped_ratio"])
def test_wrong_one_token_couplings_are_refuted(variant: str) -> None:
    # contract#positive-residual: sampling the correction from p, or accepting with min(1, q/p), breaks Y ~ p.
    result = run_proof(
        Proof(variant, (), ProofKind.REFUTABLE, partial(_wrong_one_token, 3, variant), "wrong coupling")
    )
    assert result.status is ProofStatus.REFUTED and result.ok


def _prefix_with_correction_from_p(drafts: int) -> Obligation:
    size = 2
    p = PrefixRows("p", size)
    q = PrefixRows("q", size)
    masses = {}
    for length in range(drafts):
        for bits in range(size**length):
            prefix = tuple((bits >> (length - 1 - b)) & 1 for b in range(length))
            c = one_token_coupling(p(prefix), q(prefix))
            masses[prefix] = (c.accepted_mass, c.rejected_mass, p(prefix))
    joint = speculative_joint(p, masses, drafts, size)
    premises = [distribution(row) for row in (*p.rows.values(), *q.rows.values())]
    goal = z3.And(*[joint[y] == target_joint(p, y) for y in joint])
    return Obligation(premises=tuple(premises), goal=goal)


def test_prefix_joint_with_correction_from_p_is_refuted() -> None:
    # contract#failure-lab "correction from p": the round no longer reproduces the target joint over the
    # horizon.
    result = run_proof(
        Proof("p-correction", (), ProofKind.REFUTABLE, partial(_prefix_with_correction_from_p, 1), "")
    )
    assert result.status is ProofStatus.REFUTED


@pytest.mark.parametrize(("size", "width"), [(3, 1), (4, 2), (6, 3)])
def test_inverse_cdf_left_search_is_refuted(size: int, width: int) -> None:
    # INV-10: counting prefix sums < u*Z (searchsorted left) can land on a zero-mass token.
    good = run_proof(Proof("right", (), ProofKind.VALID, partial(inverse_cdf_obligation, size, width), ""))
    assert good.status is ProofStatus.PROVED
    bad = run_proof(
        Proof("left", (), ProofKind.REFUTABLE, partial(inverse_cdf_obligation, size, width, right=False), "")
    )
    assert bad.status is ProofStatus.REFUTED
