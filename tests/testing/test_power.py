"""The law test's size and its stated power, checked against planted distortions at fixed seeds.

Setting: the toy target's law of H = 3 tokens at N = 1000 samples (alpha = 0.01), 200 repetitions per
case, each a multinomial sample of N drawn with a fixed torch generator seed (so every count is
deterministic).

* Size: under the target itself the rejection rate estimates alpha; the test asserts <= 0.04
  (alpha + 4.3 Monte Carlo standard errors of sqrt(0.01 * 0.99 / 200) = 0.007).
* Power: at the stated detectable TV (power 0.8 by the non-central chi-square bound), the least-favourable
  distortion is rejected at a rate >= 0.70 (0.8 minus 3.5 standard errors of 0.028) and the shift
  distortion, which is easier, at >= 0.8; at half that TV the least-favourable one goes mostly unseen
  (< 0.5), which is what "cannot see a TV below its stated power" means.
"""

from __future__ import annotations

import math

import pytest

from specround.model_check.chi_square import pool_cells
from specround.testing import detectable_tv, distort, law_test, rejection_rate, target_law, tv_half_width
from specround.testing.engines import ToyLM
from specround.testing.law import CellLaw
from tests.testing.conftest import PROMPT, SETTING

N = 1000
ALPHA = 0.01
REPS = 200


@pytest.fixture(scope="module")
def law(toy_target: ToyLM) -> CellLaw:
    return target_law(toy_target, SETTING, PROMPT, 3, samples=N)


def stated_tv(law: CellLaw) -> float:
    expected, _ = pool_cells([N * law.cells[c] for c in sorted(law.cells)], [0.0] * len(law.cells))
    return detectable_tv(len(expected) - 1, N, ALPHA)


def test_size_is_about_alpha(law: CellLaw) -> None:
    check = rejection_rate(law, N, ALPHA, repetitions=REPS, seed=1)
    assert check.rate <= 0.04, check


def test_stated_power_holds_against_planted_distortions(law: CellLaw) -> None:
    delta = stated_tv(law)
    assert 0.03 < delta < 0.2
    hardest = rejection_rate(
        law, N, ALPHA, distortion="least-favourable", delta=delta, repetitions=REPS, seed=2
    )
    shifted = rejection_rate(law, N, ALPHA, distortion="shift", delta=delta, repetitions=REPS, seed=3)
    assert hardest.rate >= 0.70, hardest
    assert shifted.rate >= 0.80, shifted
    below = rejection_rate(
        law, N, ALPHA, distortion="least-favourable", delta=delta / 2, repetitions=REPS, seed=4
    )
    assert below.rate < 0.5, below


def test_detectable_tv_shrinks_like_one_over_root_n() -> None:
    small, large = detectable_tv(20, 1000, ALPHA), detectable_tv(20, 4000, ALPHA)
    assert math.isclose(small / large, 2.0, rel_tol=1e-3)
    assert detectable_tv(0, 1000, ALPHA) == 1.0


def test_distortions_have_exactly_the_asked_tv() -> None:
    probs = [0.4, 0.25, 0.2, 0.1, 0.05]
    for kind in ("least-favourable", "shift"):
        moved = distort(probs, 0.05, kind)
        assert math.isclose(sum(moved), 1.0)
        assert math.isclose(0.5 * sum(abs(a - b) for a, b in zip(moved, probs, strict=True)), 0.05)


def test_tv_interval_covers_a_planted_tv(law: CellLaw) -> None:
    names = sorted(law.cells)
    planted = distort([law.cells[c] for c in names], 0.15, "shift")
    import torch

    gen = torch.Generator().manual_seed(5)
    idx = torch.multinomial(torch.tensor(planted, dtype=torch.float64), N, replacement=True, generator=gen)
    result = law_test(law, [names[i] for i in idx.tolist()], ALPHA)
    assert not result.passed
    assert result.tv_low <= 0.15 <= result.tv_high
    assert math.isclose(
        result.tv_high - result.tv_low, 2 * tv_half_width(result.cells, N, 0.95), rel_tol=1e-9
    ) or (result.tv_low == 0.0)
