"""Draft-length policies and their cost models: fixed K, the adaptive ledger-driven K, online cost fits."""

from __future__ import annotations

import math

import pytest

from specround.errors import InvalidRequestError, NegativeCostError
from specround.ledger import expected_progress, survival_from_reach
from specround.serving.costs import PRIOR_WEIGHT as COST_PRIOR_WEIGHT
from specround.serving.costs import LinearCost, TabulatedCost
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    PRIOR_ACCEPTANCE,
    PRIOR_WEIGHT,
    PROBE_INTERVAL,
    REACH_DECAY,
    SPECULATION_MARGIN,
    WARMUP_DRAFT_LENGTH,
    AdaptiveDraftLength,
    DraftSlot,
    FixedDraftLength,
    StepCosts,
)
from specround.serving.run_stats import AcceptanceStats, RoundOutcome
from specround.statemachine.events import RoundTimings


def outcome(rid: str, k: int, accepted: int, reached: int, terminal: str = "correction") -> RoundOutcome:
    emitted = tuple(range(accepted + (0 if terminal == "stop" else 1)))
    return RoundOutcome(
        request_id=rid,
        generation=1,
        requested_k=k,
        drafted=k,
        accepted=accepted,
        reached=reached,
        emitted_ids=emitted,
        terminal=terminal,  # type: ignore[arg-type]
        finished=terminal == "stop",
        finish_reason="stop" if terminal == "stop" else None,
        timings=RoundTimings(draft_s=0.001, verify_s=0.01, state_s=0.002, queue_s=0.0),
    )


# --- cost lines ----------------------------------------------------------------------------------------


def test_linear_cost_recovers_a_line_and_holds_its_prior_before() -> None:
    cost = LinearCost("verify", slope_ratio=0.1)
    assert not cost.ready
    with pytest.raises(NegativeCostError):
        cost.predict(1)
    cost.observe(5, 0.015)  # prior line: a0 + 5 * 0.1 * a0 = 0.015 -> a0 = 0.01, b0 = 0.001
    assert cost.coefficients() == pytest.approx((0.01, 0.001))
    for _ in range(200):
        for x in (1, 3, 9):
            cost.observe(x, 0.02 + 0.005 * x)
    a, b = cost.coefficients()
    # The data weigh 1 / (1 - FORGETTING) = 20 observations, the never-forgotten prior 0.5: the prior pulls
    # the fit by about 0.5 / 20.5 of its distance from the truth, a few per cent here.
    assert a == pytest.approx(0.02, rel=0.05) and b == pytest.approx(0.005, rel=0.05)


def test_linear_cost_slope_is_never_negative_and_durations_are_checked() -> None:
    cost = LinearCost("state", slope_ratio=0.1)
    for x, y in [(0, 0.03), (8, 0.01), (0, 0.03), (8, 0.01)]:
        cost.observe(x, y)
    a, b = cost.coefficients()
    assert b == 0.0 and 0.01 < a < 0.03
    assert cost.predict(8) == pytest.approx(a)
    with pytest.raises(NegativeCostError):
        cost.observe(1, -0.1)
    with pytest.raises(NegativeCostError):
        cost.observe(1, math.nan)
    with pytest.raises(NegativeCostError):
        LinearCost("x", slope_ratio=-1.0)


def test_draft_prior_is_a_line_through_the_origin() -> None:
    cost = LinearCost("draft", slope_ratio=math.inf)
    cost.observe(4, 0.2)
    assert cost.coefficients() == pytest.approx((0.0, 0.05))
    assert COST_PRIOR_WEIGHT > 0


def test_tabulated_cost_remembers_measured_shapes() -> None:
    cost = TabulatedCost("verify", slope_ratio=0.1)
    cost.observe(1, 0.05)
    cost.observe(2, 0.09)  # a two-row product slower than the line would say
    cost.observe(5, 0.08)
    assert cost.predict(2) == pytest.approx(0.09)
    assert cost.predict(5) == pytest.approx(0.08)
    assert cost.predict(3) == pytest.approx(cost.line.predict(3))
    cost.observe(2, 0.05)
    assert cost.predict(2) == pytest.approx(0.09 + 0.25 * (0.05 - 0.09))


# --- fixed K -------------------------------------------------------------------------------------------


def test_fixed_policy_caps_and_refuses_bad_k() -> None:
    policy = FixedDraftLength(4)
    slots = [DraftSlot("a", 8), DraftSlot("b", 2), DraftSlot("c", 0)]
    assert policy.choose(slots) == [4, 2, 0]
    assert policy.trim([DraftSlot("a", 3), DraftSlot("b", 6)]) == [3, 4]
    assert policy.description == "fixed:4"
    for bad in (-1, MAX_DRAFT_LENGTH + 1, True):
        with pytest.raises(InvalidRequestError):
            FixedDraftLength(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        policy.choose([DraftSlot("a", -1)])


# --- adaptive K ----------------------------------------------------------------------------------------


def feed_costs(policy: AdaptiveDraftLength, *, draft_per_token: float, verify: dict[int, float]) -> None:
    for rows, seconds in verify.items():
        policy.observe([], StepCosts(verify_calls=((rows, seconds),), states=((0, 0.001),)))
    for k in range(1, MAX_DRAFT_LENGTH + 1):
        policy.observe([], StepCosts(draft=(k, draft_per_token * k)))


def test_adaptive_warm_up_asks_for_the_warm_up_length() -> None:
    policy = AdaptiveDraftLength()
    assert policy.warming_up
    assert policy.choose([DraftSlot("a", 8), DraftSlot("b", 2)]) == [WARMUP_DRAFT_LENGTH, 2]
    with pytest.raises(InvalidRequestError):
        AdaptiveDraftLength(draft_cost_hint=-1.0)
    assert policy.trim([DraftSlot("a", 3)]) == [3]
    assert policy.last_prediction is None


def chained(reached: list[float], accepted: list[float]) -> list[float]:
    """Posterior means with each position's prior the previous position's estimate."""
    out, prior = [], PRIOR_ACCEPTANCE
    for r, a in zip(reached, accepted, strict=True):
        prior = (a + prior * PRIOR_WEIGHT) / (r + PRIOR_WEIGHT)
        out.append(prior)
    return out


def test_reach_counts_follow_reached_tests_only() -> None:
    policy = AdaptiveDraftLength()
    zeros = [0.0] * MAX_DRAFT_LENGTH
    assert policy.alpha_reach("r") == pytest.approx([PRIOR_ACCEPTANCE] * MAX_DRAFT_LENGTH)
    # K = 4, rejected at draft 2: tests 1 and 2 reached (2 ACCEPT draws), test 1 accepted.
    policy.observe([outcome("r", 4, accepted=1, reached=2)], StepCosts())
    reached, accepted = [1.0, 1.0, *zeros[2:]], [1.0, *zeros[1:]]
    assert policy.alpha_reach("r") == pytest.approx(chained(reached, accepted))
    # A stop on accepted draft 3: tests 1..3 reached and accepted, nothing counted at 4 (never reached).
    policy.observe([outcome("r", 4, accepted=3, reached=3, terminal="stop")], StepCosts())
    d = REACH_DECAY
    reached = [d + 1, d + 1, 1.0, *zeros[3:]]
    accepted = [d + 1, 1.0, 1.0, *zeros[3:]]
    got = policy.alpha_reach("r")
    assert got == pytest.approx(chained(reached, accepted))
    assert got[4:] == pytest.approx([got[3]] * (MAX_DRAFT_LENGTH - 4))  # unmeasured: the last estimate
    # A round that verified nothing changes nothing.
    policy.observe([outcome("r", 0, accepted=0, reached=0)], StepCosts())
    assert policy.alpha_reach("r") == pytest.approx(got)
    policy.forget("r")
    assert policy.alpha_reach("r") == pytest.approx([PRIOR_ACCEPTANCE] * MAX_DRAFT_LENGTH)


def test_expected_progress_is_the_ledger_formula() -> None:
    policy = AdaptiveDraftLength()
    for _ in range(30):
        policy.observe([outcome("r", 3, accepted=2, reached=3)], StepCosts())
    rates = policy.alpha_reach("r")[:3]
    assert policy.expected_progress("r", 3) == pytest.approx(expected_progress(survival_from_reach(rates)))
    assert policy.expected_progress("r", 0) == 1.0


def test_free_drafts_with_high_acceptance_use_the_longest_draft() -> None:
    policy = AdaptiveDraftLength()
    feed_costs(policy, draft_per_token=0.0, verify={rows: 0.05 + 0.001 * rows for rows in range(1, 10)})
    for _ in range(20):
        policy.observe([outcome("r", 8, accepted=8, reached=8, terminal="bonus")], StepCosts())
    assert policy.choose([DraftSlot("r", 8)]) == [8]
    assert policy.trim([DraftSlot("r", 5)]) == [5]
    tokens, seconds = policy.last_prediction or (0.0, 0.0)
    assert tokens == pytest.approx(policy.expected_progress("r", 5))
    assert seconds == pytest.approx(policy.step_seconds([5], drafting=False))


def run_rounds(policy: AdaptiveDraftLength, rounds: int, accept: bool) -> list[tuple[int, int]]:
    """Drive one request through ``rounds`` choose/trim/observe cycles (a model proposer: offers = asks)."""
    chosen = []
    for _ in range(rounds):
        [k] = policy.choose([DraftSlot("r", 8)])
        [v] = policy.trim([DraftSlot("r", k)]) if k else [0]
        chosen.append((k, v))
        policy.observe([outcome("r", v, accepted=v if accept else 0, reached=v)], StepCosts())
    return chosen


def test_expensive_drafts_fall_back_to_plain_decoding_and_probe_with_backoff() -> None:
    # A draft token costs half a one-row target step and acceptance is low: K = 0 pays best, yet certain
    # acceptance would pay, so the policy probes, waiting twice as long after each probe.
    policy = AdaptiveDraftLength()
    feed_costs(policy, draft_per_token=0.025, verify={rows: 0.05 + 0.005 * rows for rows in range(1, 10)})
    for _ in range(30):
        policy.observe([outcome("r", 2, accepted=0, reached=1)], StepCosts())
    chosen = run_rounds(policy, 3 * PROBE_INTERVAL + 2, accept=False)
    probes = [i for i, (k, v) in enumerate(chosen) if k]
    assert all(chosen[i] == (1, 1) for i in probes)
    assert probes == [PROBE_INTERVAL, 3 * PROBE_INTERVAL + 1]  # after 16, then after 32 more rounds


def test_a_probe_uses_the_cheapest_non_empty_draft() -> None:
    # Two- and three-row verifications cost more than four rows (as small CPU matrix products can).
    verify = {1: 0.050, 2: 0.090, 3: 0.100, 4: 0.070, 5: 0.080, 6: 0.085, 7: 0.090, 8: 0.095, 9: 0.100}
    policy = AdaptiveDraftLength()
    feed_costs(policy, draft_per_token=0.0, verify=verify)
    for _ in range(30):
        policy.observe([outcome("r", 4, accepted=0, reached=1)], StepCosts())
    chosen = run_rounds(policy, PROBE_INTERVAL + 1, accept=False)
    assert chosen[:PROBE_INTERVAL] == [(0, 0)] * PROBE_INTERVAL
    assert chosen[PROBE_INTERVAL] == (3, 3)  # four rows: the cheapest step that verifies anything


def test_no_probe_when_even_certain_acceptance_cannot_pay() -> None:
    # The draft model costs as much as the target (the bf16 copy): speculation never pays, so no probing.
    policy = AdaptiveDraftLength(draft_cost_hint=1.0)
    assert policy.choose([DraftSlot("r", 8)]) == [0]  # warm-up with a hint: plain decoding first
    policy.observe([], StepCosts(verify_calls=((1, 0.05),), states=((0, 0.001),)))
    assert not policy.warming_up
    assert policy.draft_seconds(4) == pytest.approx(4 * 0.05)
    chosen = run_rounds(policy, 3 * PROBE_INTERVAL, accept=True)
    assert chosen == [(0, 0)] * (3 * PROBE_INTERVAL)


def test_a_free_draft_hint_speculates_from_the_second_step() -> None:
    policy = AdaptiveDraftLength(draft_cost_hint=0.0)
    assert policy.choose([DraftSlot("r", 8)]) == [0]
    policy.observe([], StepCosts(verify_calls=((1, 0.05),), states=((0, 0.001),)))
    [k] = policy.choose([DraftSlot("r", 8)])
    assert k > 0


def test_speculation_must_beat_plain_decoding_by_the_margin() -> None:
    verify = {rows: 0.05 * (1 + 0.12 * (rows - 1)) for rows in range(1, 10)}
    low = AdaptiveDraftLength()
    feed_costs(low, draft_per_token=0.0, verify=verify)
    for _ in range(30):
        low.observe([outcome("r", 1, accepted=0, reached=1)], StepCosts())
    plain = low.step_seconds([0], drafting=False)
    gains = [low.expected_progress("r", k) * plain / low.step_seconds([k], drafting=False) for k in range(9)]
    assert 1.0 < max(gains) < 1.0 + SPECULATION_MARGIN  # K = 1 would pay a little, within the noise
    assert low.trim([DraftSlot("r", 8)]) == [0]

    high = AdaptiveDraftLength()
    feed_costs(high, draft_per_token=0.0, verify=verify)
    for index in range(30):
        high.observe([outcome("r", 1, accepted=index % 2, reached=1)], StepCosts())
    plain = high.step_seconds([0], drafting=False)
    gains = [
        high.expected_progress("r", k) * plain / high.step_seconds([k], drafting=False) for k in range(9)
    ]
    assert max(gains) > 1.0 + SPECULATION_MARGIN
    assert high.trim([DraftSlot("r", 8)]) == [max(range(9), key=lambda k: gains[k])]


def test_trim_ignores_sunk_draft_cost() -> None:
    # Drafting is expensive, so nothing is asked; but drafts already offered are worth verifying.
    policy = AdaptiveDraftLength()
    feed_costs(policy, draft_per_token=0.2, verify={rows: 0.05 + 0.002 * rows for rows in range(1, 10)})
    for _ in range(20):
        policy.observe([outcome("r", 4, accepted=4, reached=4, terminal="bonus")], StepCosts())
    assert policy.choose([DraftSlot("r", 8)]) == [0]
    assert policy.trim([DraftSlot("r", 4)]) == [4]


def test_batch_search_lets_each_request_choose() -> None:
    policy = AdaptiveDraftLength()
    feed_costs(policy, draft_per_token=0.0, verify={rows: 0.05 + 0.004 * rows for rows in range(1, 30)})
    for _ in range(30):
        policy.observe([outcome("good", 8, 8, 8, terminal="bonus"), outcome("bad", 4, 0, 1)], StepCosts())
    ks = policy.trim([DraftSlot("good", 8), DraftSlot("bad", 8)])
    assert ks[0] == 8 and ks[1] == 0


def test_acceptance_stats_count_reached_positions() -> None:
    stats = AcceptanceStats()
    stats.extend(
        [
            outcome("r", 4, accepted=1, reached=2),
            outcome("r", 4, accepted=4, reached=4, terminal="bonus"),
            outcome("r", 0, accepted=0, reached=0),
        ]
    )
    assert [(c.position, c.reached, c.accepted) for c in stats.reach] == [
        (1, 2, 2),
        (2, 2, 1),
        (3, 1, 1),
        (4, 1, 1),
    ]
    assert stats.alpha_reach == (1.0, 0.5, 1.0, 1.0)
    assert stats.acceptance_rate == pytest.approx(5 / 8)
    assert stats.mean_accepted == pytest.approx(2.5)
    assert stats.rounds == 3 and stats.generated == 2 + 5 + 1
