"""Chi-square distribution functions, cell pooling and power (reference values from standard tables)."""

from __future__ import annotations

import pytest

from specround.model_check.chi_square import (
    MIN_EXPECTED,
    chi2_critical,
    chi2_sf,
    chi_square_test,
    noncentral_chi2_sf,
    pool_cells,
)


@pytest.mark.parametrize(
    ("alpha", "df", "critical"),
    [(0.05, 1, 3.841458820694124), (0.001, 10, 29.58829844507442), (0.01, 26, 45.64168266628052)],
)
def test_central_quantiles(alpha: float, df: int, critical: float) -> None:
    assert chi2_critical(alpha, df) == pytest.approx(critical, rel=1e-9)
    assert chi2_sf(critical, df) == pytest.approx(alpha, rel=1e-9)


def test_noncentral_power_reference() -> None:
    # 80 % power at alpha = 0.05, df = 1 needs lambda = 7.849 (the classical sample-size constant).
    assert noncentral_chi2_sf(3.841458820694124, 1, 7.848879734349) == pytest.approx(0.8, abs=1e-6)
    assert noncentral_chi2_sf(5.0, 4, 0.0) == pytest.approx(chi2_sf(5.0, 4))


def test_pooling_leaves_no_small_cell() -> None:
    expected = [0.5, 1.0, 2.0, 4.0, 9.0, 30.0]
    observed = [1.0, 0.0, 3.0, 4.0, 8.0, 31.0]
    pooled_expected, pooled_observed = pool_cells(expected, observed)
    assert min(pooled_expected) >= MIN_EXPECTED
    assert sum(pooled_expected) == pytest.approx(sum(expected))
    assert sum(pooled_observed) == pytest.approx(sum(observed))
    assert len(pooled_expected) == 3  # {0.5, 1, 2, 4}, {9}, {30}


def test_exact_counts_do_not_reject_and_a_far_law_does() -> None:
    probabilities = [0.5, 0.3, 0.2]
    exact = chi_square_test(probabilities, [5000.0, 3000.0, 2000.0], 0.001, {"far": [0.4, 0.4, 0.2]})
    assert exact.statistic == pytest.approx(0.0)
    assert exact.passed
    assert exact.power["far"] > 0.999
    skewed = chi_square_test(probabilities, [4000.0, 4000.0, 2000.0], 0.001)
    assert not skewed.passed
    assert skewed.p_value < 1e-12
