"""Ledger estimators from observed rounds: reach conditioning, renewal-reward time, refused records."""

from __future__ import annotations

import random

import pytest

from specround.errors import LedgerDeclarationError, MissingProgressTokenError, NegativeCostError
from specround.ledger import iid_survival
from specround.model_check.ledger_estimate import RoundRecord, estimate_ledger


def test_hand_counted_records() -> None:
    records = [
        RoundRecord(accepted=0, drafted=2, emitted=1, stopped=False, t_verify=1.0),  # rejected at 1
        RoundRecord(accepted=2, drafted=2, emitted=3, stopped=False, t_verify=2.0),  # bonus
        RoundRecord(accepted=1, drafted=2, emitted=2, stopped=False, t_verify=1.5),  # rejected at 2
        RoundRecord(accepted=1, drafted=2, emitted=1, stopped=True, t_verify=1.0),  # stop at d_1
    ]
    assert [r.reached_tests for r in records] == [1, 2, 2, 1]
    est = estimate_ledger(records)
    assert [(c.reached, c.accepted) for c in est.reach] == [(4, 3), (2, 1)]
    assert est.survival == pytest.approx((1.0, 0.75, 0.375))
    assert est.accepted_pmf == pytest.approx((0.25, 0.375, 0.375))
    # The empirical tail over all rounds (0.25 at j = 2) is not the reach-conditioned product (0.375):
    # the stopped round never reached test 2 and must not count as a rejection there.
    assert est.empirical_survival == pytest.approx((1.0, 0.75, 0.25))
    assert est.mean_progress == pytest.approx(7 / 4)
    assert est.time_per_token == pytest.approx(5.5 / 7)
    assert est.mean_time_per_token_ratio == pytest.approx((1.0 + 2 / 3 + 0.75 + 1.0) / 4)
    assert est.time_per_token != pytest.approx(est.mean_time_per_token_ratio, rel=1e-3)
    assert est.discarded_rows == pytest.approx((2 + 0 + 1 + 1) / 4)


def test_unreached_position_has_no_rate() -> None:
    est = estimate_ledger([RoundRecord(accepted=0, drafted=3, emitted=1, stopped=False)])
    assert est.reach[0].rate == 0.0
    assert est.reach[1].rate is None
    assert est.survival == (1.0, 0.0)


def test_iid_estimates_converge() -> None:
    # 20,000 synthetic rounds, K = 3, iid acceptance 0.6, seed fixed. Each alpha_j^reach estimate is a
    # binomial proportion over >= 0.36 * 20,000 = 7,200 reached tests: its standard deviation is at most
    # sqrt(0.24 / 7200) = 0.0058, so the 0.03 tolerance is > 5 sigma (false-failure odds < 1e-6).
    rng = random.Random(20240611)
    records = []
    for _ in range(20_000):
        a = 0
        while a < 3 and rng.random() < 0.6:
            a += 1
        records.append(RoundRecord(accepted=a, drafted=3, emitted=a + 1, stopped=False, t_verify=1.0))
    est = estimate_ledger(records)
    for count in est.reach:
        assert count.rate == pytest.approx(0.6, abs=0.03)
    assert est.survival == pytest.approx(iid_survival(0.6, 3), abs=0.03)
    assert est.mean_progress == pytest.approx(1 + 0.6 + 0.36 + 0.216, abs=0.05)


def test_records_that_break_the_round_contract_are_refused() -> None:
    with pytest.raises(MissingProgressTokenError):
        RoundRecord(accepted=2, drafted=3, emitted=2, stopped=False)
    with pytest.raises(LedgerDeclarationError):
        RoundRecord(accepted=4, drafted=3, emitted=5, stopped=False)
    with pytest.raises(LedgerDeclarationError):
        RoundRecord(accepted=1, drafted=3, emitted=3, stopped=True)
    with pytest.raises(NegativeCostError):
        RoundRecord(accepted=1, drafted=3, emitted=2, stopped=False, t_state=-1e-3)
    with pytest.raises(LedgerDeclarationError):
        estimate_ledger([])
