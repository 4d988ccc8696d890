"""Choosing K under declared profiles and costs, and the refused declarations.

Contract: contract#time-ledger, contract#acceptance-profiles, contract#temporary-rows.
"""

from __future__ import annotations

import dataclasses

import pytest

from specround.errors import MissingProgressTokenError, NegativeCostError, UnreachableRateError
from specround.model_check.goodput import (
    AcceptanceProfile,
    CostTerms,
    GoodputFixture,
    best_k,
    declared_mean_matches,
    goodput_table,
)

FRONT = AcceptanceProfile("front-loaded", (0.95, 0.90, 0.60, 0.40))
BACK = AcceptanceProfile("back-loaded", (0.40, 0.60, 0.90, 0.95))
# One target decode step costs 1; drafting 0.05 per token; verification grows with rows; batch pressure
# grows quadratically with the temporary rows.
COSTS = CostTerms(
    draft_per_token=0.05, verify_fixed=1.0, verify_per_row=0.02, state_fixed=0.02, queue_per_row_squared=0.01
)


def _fixture(profile: AcceptanceProfile, **changes: object) -> GoodputFixture:
    base = GoodputFixture(name=profile.name, profile=profile, costs=COSTS, baseline_step=1.0)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_front_loaded_profile_has_an_interior_optimum() -> None:
    choice = best_k(_fixture(FRONT))
    assert [row.k for row in choice.rows] == [1, 2, 3, 4]
    # Hand computation: E[G] / E[T] = 1.95/1.12, 2.805/1.22, 3.318/1.34, 3.5232/1.48.
    expected = [1.95 / 1.12, 2.805 / 1.22, 3.318 / 1.34, 3.5232 / 1.48]
    assert [row.goodput for row in choice.rows] == pytest.approx(expected, abs=1e-12)
    assert choice.best_k == 3
    assert choice.interior


def test_back_loaded_profile_with_the_same_mean_prefers_the_boundary() -> None:
    assert declared_mean_matches([FRONT, BACK])
    choice = best_k(_fixture(BACK))
    expected = [1.4 / 1.12, 1.64 / 1.22, 1.856 / 1.34, 2.0612 / 1.48]
    assert [row.goodput for row in choice.rows] == pytest.approx(expected, abs=1e-12)
    assert choice.best_k == 4
    assert not choice.interior
    assert best_k(_fixture(FRONT)).best.goodput > choice.best.goodput


def test_rows_carry_the_ledger_quantities() -> None:
    row = goodput_table(_fixture(FRONT))[1]
    assert row.survival == pytest.approx((1.0, 0.95, 0.855))
    assert row.accepted_pmf == pytest.approx((0.05, 0.095, 0.855))
    assert row.expected_accepted == pytest.approx(1.805)
    assert row.discarded_rows == pytest.approx(0.195)
    assert row.speedup == pytest.approx(row.goodput)


def test_stop_distance_caps_progress() -> None:
    rows = goodput_table(_fixture(FRONT, stop_distance=2.0))
    assert [r.expected_progress for r in rows] == pytest.approx([1.95, 1.95, 1.95, 1.95])


def test_optimiser_searches_at_most_eight_positions() -> None:
    long = AcceptanceProfile("aligned", (0.9,) * 12)
    assert list(_fixture(long).lookaheads()) == list(range(1, 9))


def test_rates_over_all_proposed_rows_are_refused() -> None:
    profile = AcceptanceProfile("per-row", FRONT.rates, conditioning="all_proposed_rows")
    with pytest.raises(UnreachableRateError):
        best_k(_fixture(profile))


def test_rate_after_an_unreachable_position_is_refused() -> None:
    with pytest.raises(UnreachableRateError):
        best_k(_fixture(AcceptanceProfile("dead-then-alive", (0.9, 0.0, 0.8, 0.7))))


def test_progress_claim_without_the_terminal_token_is_refused() -> None:
    rows = goodput_table(_fixture(FRONT))
    honest = tuple(r.expected_progress for r in rows)
    assert best_k(_fixture(FRONT, claimed_progress=honest)).best_k == 3
    omitted = tuple(r.expected_accepted for r in rows)
    with pytest.raises(MissingProgressTokenError):
        best_k(_fixture(FRONT, claimed_progress=omitted))


def test_negative_cost_terms_are_refused() -> None:
    with pytest.raises(NegativeCostError):
        CostTerms(verify_fixed=1.0, verify_per_row=-0.01)
    with pytest.raises(NegativeCostError):
        goodput_table(_fixture(FRONT, costs=CostTerms()))  # a free round hides its cost
    with pytest.raises(NegativeCostError):
        goodput_table(_fixture(FRONT, baseline_step=-1.0))
