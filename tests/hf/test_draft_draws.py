"""The batched PROPOSAL draws equal one uniform and one inverse-CDF draw per draft."""

from __future__ import annotations

import torch

from specround.adapters.proposers.draws import draw_proposals, seed_tensor
from specround.hf.draft_draws import draw_tokens, proposal_uniforms
from specround.sampling.exact import inverse_cdf
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream


def test_uniforms_of_a_call_equal_one_per_counter() -> None:
    seeds, counters = [0, 7, -3, 1 << 63], [0, 5, 11, 2]
    batched = proposal_uniforms(seeds, counters, 4)  # [4, 4]
    assert batched.shape == (4, 4) and batched.dtype == torch.float64
    for b, (seed, counter) in enumerate(zip(seeds, counters, strict=True)):
        for i in range(4):
            one = uniforms(seed_tensor([seed]), Stream.PROPOSAL, torch.tensor([counter + i]))
            assert float(batched[b, i]) == float(one[0])


def test_point_masses_draw_the_inverse_cdf_token() -> None:
    torch.manual_seed(0)
    q = torch.zeros(3, 50)
    q[0, 7] = 1.0
    q[1, 0] = 1.0
    q[2, 49] = 0.75  # one positive entry, not normalised
    for u in (0.0, 0.5, 1.0 - 2.0**-53):
        uu = torch.full((3,), u, dtype=torch.float64)
        assert draw_tokens(q, uu).tolist() == inverse_cdf(q, uu).tokens.tolist() == [7, 0, 49]


def test_spread_rows_draw_as_draw_proposals() -> None:
    torch.manual_seed(1)
    q = torch.softmax(torch.randn(4, 64), dim=-1)
    seeds, counters = [3, 3, 9, 12], [0, 4, 1, 30]
    u = proposal_uniforms(seeds, counters, 1)[:, 0]
    assert draw_tokens(q, u).tolist() == draw_proposals(q, seeds, counters).tolist()
    mixed = q.clone()
    mixed[0] = 0.0
    mixed[0, 3] = 1.0  # one point mass among spread rows still goes through the inverse CDF
    assert draw_tokens(mixed, u).tolist() == inverse_cdf(mixed, u).tokens.tolist()


def test_point_mass_detection_refuses_what_the_inverse_cdf_must_judge() -> None:
    """Negative, NaN, +inf or two positive entries go to the inverse CDF; float64 and bfloat16 rows too."""
    u = torch.full((2,), 0.25, dtype=torch.float64)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        q = torch.zeros(2, 40, dtype=dtype)
        q[0, 5], q[1, 39] = 1.0, 0.5
        assert draw_tokens(q, u).tolist() == [5, 39]
    spread = torch.zeros(2, 40)
    spread[0, 5], spread[1, 2], spread[1, 3] = 1.0, 0.5, 0.5  # row 1: two positive entries
    assert draw_tokens(spread, u).tolist() == inverse_cdf(spread, u).tokens.tolist()
    for bad in (-0.5, float("nan"), float("inf")):
        q = torch.zeros(2, 40)
        q[0, 5], q[1, 39], q[1, 0] = 1.0, 1.0, bad
        try:
            expected: object = inverse_cdf(q, u).tokens.tolist()
        except Exception as exc:  # the inverse CDF refuses the row by name
            expected = type(exc)
        try:
            got: object = draw_tokens(q, u).tolist()
        except Exception as exc:
            got = type(exc)
        assert got == expected, bad
