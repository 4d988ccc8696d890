"""z3 proofs that an audit re-derives the sampler's decisions from logged values (INV-10).

``decision.accepted_run`` shows that the sampler's ``cumprod``-sum of accepted tests is
the index of the first rejection and that ``u < p/q`` re-derives division-free as ``u q < p``;
``decision.inverse_cdf.vV.wW`` shows that the sampler's two-level (block, then in-block) inverse-CDF search
returns the unique token whose logged bracket ``[mass_before, mass_before + token_mass)`` holds ``u Z``,
and that this token has positive mass (exact arithmetic; the float rounding clamp is the sampler's own).
"""

from __future__ import annotations

from collections.abc import Sequence

import z3

from specround.model_check.z3.coupling import Real, real_sum, reals, show_row
from specround.model_check.z3.proofs import Obligation, Proof, ProofRegistry

__all__ = ["DECISION_DRAFTS", "INVERSE_CDF_CASES", "decision_proofs", "inverse_cdf_obligation"]

DECISION_DRAFTS = 8
"""Draft length of the accepted-run proof."""
INVERSE_CDF_CASES = ((2, 1), (2, 2), (3, 2), (4, 2), (4, 4), (5, 2), (6, 2), (6, 3), (6, 6))
"""(V, block width) pairs of the two-level inverse-CDF proof (a width that does not divide V pads)."""


def _pick(items: Sequence[Real], index: z3.ArithRef) -> Real:
    """``items[index]`` for a symbolic 0-based ``index`` in range."""
    result = items[0]
    for position in range(1, len(items)):
        result = z3.If(index == position, items[position], result)
    return result


def _accepted_run() -> Obligation:
    """A = sum(cumprod(accepted & within)) is the first rejection's index, tests re-derive division-free.

    Test i (1-based, i <= k) accepts iff ``u_i < p_i / q_i``; the audit re-derives it as ``u_i q_i < p_i``
    from the logged ``u_i``, ``p_i(d_i)``, ``q_i(d_i) > 0``. ``A`` is the leading run of accepted tests.
    """
    size = DECISION_DRAFTS
    k = z3.Int("k")
    u, p, q = reals("u", size), reals("p", size), reals("q", size)
    premises = [k >= 0, k <= size]
    for i in range(size):
        premises += [u[i] >= 0, u[i] < 1, p[i] >= 0, q[i] > 0]
    accepted = [u[i] < p[i] / q[i] for i in range(size)]
    within = [z3.IntVal(i) < k for i in range(size)]
    # The sampler's vectorised form: cumprod over (accepted & within), summed.
    run: list[z3.ArithRef] = []
    product: z3.ArithRef = z3.IntVal(1)
    for i in range(size):
        product = product * z3.If(z3.And(accepted[i], within[i]), 1, 0)
        run.append(product)
    vectorised = z3.Sum(run)
    # The scan form: index of the first test that rejects, or k.
    scan: z3.ArithRef = k
    for i in reversed(range(size)):
        scan = z3.If(z3.And(within[i], z3.Not(accepted[i])), i, scan)
    rederived = [u[i] * q[i] < p[i] for i in range(size)]
    goal = z3.And(
        vectorised == scan,
        *[accepted[i] == rederived[i] for i in range(size)],
        # The audit's check: every test before A accepts, test A + 1 (when reached) rejects.
        *[z3.Implies(i < vectorised, rederived[i]) for i in range(size)],
        *[z3.Implies(z3.And(vectorised == i, within[i]), z3.Not(rederived[i])) for i in range(size)],
    )
    return Obligation(premises=tuple(premises), goal=goal, show=(("k", k), ("A", vectorised), ("scan", scan)))


def inverse_cdf_obligation(size: int, width: int, *, right: bool = True) -> Obligation:
    """The two-level search's token satisfies the logged bracket, has positive mass, and is the only one.

    Exact arithmetic: ``target = u * total``; block = number of block prefix sums <= target; offset = number
    of in-block prefix sums <= target; token = block * width + offset (the sampler's ``_search`` without
    its rounding clamp, which exact arithmetic never needs). ``right=False`` counts prefix sums ``<
    target`` instead (``searchsorted(..., right=False)``), the off-by-one that can pick a zero-mass token.
    """
    blocks = -(-size // width)
    mass = reals("w", size)
    padded = [*mass, *[z3.RealVal(0)] * (blocks * width - size)]
    u = z3.Real("u")
    total = real_sum(mass)
    premises = [*[w >= 0 for w in mass], total > 0, u >= 0, u < 1]
    target = u * total
    block_sums = [real_sum(padded[b * width : (b + 1) * width]) for b in range(blocks)]
    block_cum = [real_sum(block_sums[: b + 1]) for b in range(blocks)]

    def below(c: Real) -> z3.BoolRef:
        return c <= target if right else c < target

    block = real_sum([z3.If(below(c), z3.IntVal(1), z3.IntVal(0)) for c in block_cum])
    prefix = real_sum([z3.If(b < block, block_sums[b], z3.RealVal(0)) for b in range(blocks)])
    values = [_pick([padded[b * width + j] for b in range(blocks)], block) for j in range(width)]
    inside = [prefix + real_sum(values[: j + 1]) for j in range(width)]
    offset = real_sum([z3.If(below(c), z3.IntVal(1), z3.IntVal(0)) for c in inside])
    token = block * width + offset
    mass_before = prefix + real_sum([z3.If(j < offset, values[j], z3.RealVal(0)) for j in range(width)])
    token_mass = _pick(values, offset)
    cum_before = [real_sum(mass[:x]) for x in range(size)]
    bracket = [z3.And(cum_before[x] <= target, target < cum_before[x] + mass[x]) for x in range(size)]
    goal = z3.And(
        block < blocks,
        offset < width,
        token < size,
        mass_before == _pick(cum_before, token),
        token_mass == _pick(mass, token),
        mass_before <= target,
        target < mass_before + token_mass,
        token_mass > 0,
        *[z3.Implies(bracket[x], token == x) for x in range(size)],
    )
    return Obligation(
        premises=tuple(premises), goal=goal, show=(*show_row("w", mass), ("u", u), ("token", token))
    )


def decision_proofs() -> list[Proof]:
    """The accepted-run proof and the two-level inverse-CDF proofs."""
    registry = ProofRegistry("decision")
    registry.add(
        "accepted_run",
        _accepted_run,
        covers=("INV-10", "INV-3", "contract#first-rejection-stops"),
        description="cumprod-sum A equals the first rejection; u < p/q re-derives as u*q < p",
    )
    for size, width in INVERSE_CDF_CASES:
        registry.add(
            f"inverse_cdf.v{size}.w{width}",
            inverse_cdf_obligation,
            size,
            width,
            covers=("INV-10", "contract#degenerate-cases"),
            description="the two-level inverse-CDF token lies in its logged bracket, has mass, and is unique",
        )
    return registry.proofs
