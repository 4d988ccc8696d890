"""The speedup ledger's formulas (contract#speedup-ledger) and the worked numbers of contract#worked-round."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specround.errors import LedgerDeclarationError, NegativeCostError, UnreachableRateError
from specround.ledger import (
    accepted_pmf,
    expected_accepted,
    expected_discarded_rows,
    expected_progress,
    expected_progress_with_stops,
    iid_survival,
    leviathan_expected_progress,
    leviathan_speedup,
    progress_pmf,
    reach_rates_from_survival,
    survival_from_pmf,
    survival_from_reach,
    time_per_token,
    tokens_per_second,
)

rates = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
# Rates that are zero or not tiny: survival products of positive rates then stay far from underflow.
profile_rates = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1.0))


def test_summary_003_iid_output_counts() -> None:
    # gamma = 2, iid acceptance 0.6: output counts 1/2/3 with 0.4/0.24/0.36, E = 1.96.
    survival = iid_survival(0.6, 2)
    assert survival == pytest.approx((1.0, 0.6, 0.36), abs=1e-15)
    assert accepted_pmf(survival) == pytest.approx((0.4, 0.24, 0.36), abs=1e-15)
    assert expected_progress(survival) == pytest.approx(1.96, abs=1e-15)
    assert leviathan_expected_progress(0.6, 2) == pytest.approx(1.96, abs=1e-15)


def test_summary_003_throughput() -> None:
    progress = expected_progress(iid_survival(0.6, 2))
    # Draft 2 ms + verification 6 ms + overhead 1 ms; 12 ms verification; 6 ms baseline step.
    assert round(tokens_per_second(progress, 0.002 + 0.006 + 0.001), 1) == 217.8
    assert tokens_per_second(progress, 0.009) == pytest.approx(217.77777777777777, rel=1e-15)
    assert round(tokens_per_second(progress, 0.002 + 0.012 + 0.001), 1) == 130.7
    assert round(tokens_per_second(1.0, 0.006), 1) == 166.7


def test_front_and_back_loaded_profiles_share_a_mean_but_not_progress() -> None:
    front = survival_from_reach([0.95, 0.90, 0.60, 0.40])
    back = survival_from_reach([0.40, 0.60, 0.90, 0.95])
    assert front[-1] == pytest.approx(back[-1], abs=1e-15)  # same product, same s_4
    assert expected_progress(front) == pytest.approx(1 + 0.95 + 0.855 + 0.513 + 0.2052, abs=1e-12)
    assert expected_progress(back) == pytest.approx(1 + 0.40 + 0.24 + 0.216 + 0.2052, abs=1e-12)
    assert expected_progress(front) > expected_progress(back) + 1.4


@given(st.lists(profile_rates, min_size=1, max_size=8))
def test_reach_rates_round_trip_through_survival(reach: list[float]) -> None:
    if any(r == 0.0 for r in reach[:-1]):
        cut = reach.index(0.0) + 1
        reach = reach[:cut] + [0.0] * (len(reach) - cut)
    survival = survival_from_reach(reach)
    recovered = reach_rates_from_survival(survival)
    for j, (declared, found) in enumerate(zip(reach, recovered, strict=True), start=1):
        if survival[j - 1] > 0.0:
            assert found is not None
            assert found == pytest.approx(declared, abs=1e-9 / survival[j - 1])
        else:
            assert found is None  # unreachable: no rate at all, never 0 or NaN
    pmf = accepted_pmf(survival)
    assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
    assert survival_from_pmf(pmf) == pytest.approx(survival, abs=1e-12)
    assert expected_accepted(survival) == pytest.approx(sum(a * m for a, m in enumerate(pmf)), abs=1e-12)


def test_unreachable_rate_is_refused() -> None:
    with pytest.raises(UnreachableRateError, match="alpha_3"):
        survival_from_reach([0.5, 0.0, 0.7])
    assert survival_from_reach([0.5, 0.0, 0.0]) == (1.0, 0.5, 0.0, 0.0)


def test_rounding_above_one_is_clamped() -> None:
    assert survival_from_pmf([0.0, 1.0000000000000002]) == (1.0, 1.0)
    assert survival_from_reach([1.0000000000000002]) == (1.0, 1.0)


@pytest.mark.parametrize("bad", [[1.2], [-0.1], [math.nan], [1.0 + 1e-9]])
def test_rates_must_be_probabilities(bad: list[float]) -> None:
    with pytest.raises(LedgerDeclarationError):
        survival_from_reach(bad)


def test_survival_must_start_at_one_and_not_increase() -> None:
    with pytest.raises(LedgerDeclarationError):
        accepted_pmf([0.9, 0.5])
    with pytest.raises(LedgerDeclarationError, match="non-increasing"):
        accepted_pmf([1.0, 0.5, 0.6])


@given(rates, st.integers(min_value=0, max_value=8))
def test_leviathan_closed_form_equals_the_geometric_sum(alpha: float, k: int) -> None:
    direct = math.fsum(alpha**j for j in range(k + 1))
    assert leviathan_expected_progress(alpha, k) == pytest.approx(direct, rel=1e-9, abs=1e-12)
    assert expected_progress(iid_survival(alpha, k)) == pytest.approx(direct, rel=1e-12, abs=1e-12)


def test_leviathan_alpha_one_limit_and_speedup() -> None:
    assert leviathan_expected_progress(1.0, 4) == 5.0
    assert leviathan_expected_progress(1.0 - 1e-9, 4) == pytest.approx(5.0, abs=1e-7)
    assert leviathan_speedup(1.0, 4, 0.25) == pytest.approx(5.0 / 2.0)
    assert leviathan_speedup(0.6, 2, 0.05) == pytest.approx(1.96 / 1.1)
    with pytest.raises(NegativeCostError):
        leviathan_speedup(0.6, 2, -0.05)


def test_progress_with_stops_is_min_of_a_plus_one_and_h() -> None:
    pmf = accepted_pmf(iid_survival(0.6, 2))  # A = 0, 1, 2 with 0.4, 0.24, 0.36
    assert progress_pmf(pmf) == pytest.approx({1: 0.4, 2: 0.24, 3: 0.36})
    assert progress_pmf(pmf, {2: 1.0}) == pytest.approx({1: 0.4, 2: 0.6})
    assert expected_progress_with_stops(pmf, {2: 1.0}) == pytest.approx(1.6)
    # H = 1 with probability 0.5 (an EOS next), no stop otherwise.
    mixed = expected_progress_with_stops(pmf, {1: 0.5, math.inf: 0.5})
    assert mixed == pytest.approx(0.5 * 1.0 + 0.5 * 1.96)
    with pytest.raises(LedgerDeclarationError):
        progress_pmf(pmf, {0: 1.0})


def test_time_per_token_and_discarded_rows() -> None:
    survival = iid_survival(0.6, 2)
    assert time_per_token(0.009, expected_progress(survival)) == pytest.approx(0.009 / 1.96)
    assert expected_discarded_rows(2, survival) == pytest.approx(2 - 0.96)
    with pytest.raises(LedgerDeclarationError):
        time_per_token(0.009, 0.96)  # E[A] alone: the correction/bonus token is missing
    with pytest.raises(NegativeCostError):
        time_per_token(-0.001, 1.96)
