"""The speedup ledger's checks for ``specround check`` (contract#speedup-ledger).

Each check compares the ledger against an independent computation (a closed form, a hand-derived value, a
brute-force sum) or asserts that a declaration the specification calls invalid is refused by name.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from specround.errors import (
    LedgerDeclarationError,
    MissingProgressTokenError,
    NegativeCostError,
    UnreachableRateError,
)
from specround.ledger import (
    expected_progress,
    iid_survival,
    leviathan_expected_progress,
    leviathan_speedup,
    survival_from_pmf,
    survival_from_reach,
    time_per_token,
)
from specround.model_check.check_results import CheckResult, within
from specround.model_check.enumeration import FixtureEnumeration
from specround.model_check.goodput import (
    AcceptanceProfile,
    CostTerms,
    GoodputFixture,
    best_k,
    declared_mean_matches,
    goodput_table,
)
from specround.model_check.ledger_estimate import RoundRecord, estimate_ledger

__all__ = [
    "DECLARED_COSTS",
    "LEDGER_TOLERANCE",
    "PROFILES",
    "enumeration_ledger_checks",
    "ledger_checks",
]

LEDGER_TOLERANCE = 1e-12
"""Float64 agreement between the ledger and an independent computation."""

GROUP = "speedup ledger"

PROFILES = {
    "front-loaded": AcceptanceProfile("front-loaded", (0.95, 0.90, 0.60, 0.40)),
    "back-loaded": AcceptanceProfile("back-loaded", (0.40, 0.60, 0.90, 0.95)),
    "aligned drafter, 8 positions": AcceptanceProfile("aligned drafter, 8 positions", (0.9,) * 8),
    "decaying drafter, 8 positions": AcceptanceProfile(
        "decaying drafter, 8 positions", (0.95, 0.9, 0.85, 0.8, 0.7, 0.6, 0.5, 0.4)
    ),
}
"""Declared reach-conditioned profiles: the pair of contract#acceptance-profiles, two more over K = 1..8."""

DECLARED_COSTS = CostTerms(
    draft_per_token=0.05, verify_fixed=1.0, verify_per_row=0.02, state_fixed=0.02, queue_per_row_squared=0.01
)
"""Declared cost terms in units of one target decode step: drafting 0.05 per token, a verification pass of
1 + 0.02 per row, 0.02 of state work, and batch pressure 0.01 K^2 from the temporary rows."""


def _fixture(profile: AcceptanceProfile, **changes: object) -> GoodputFixture:
    base = GoodputFixture(name=profile.name, profile=profile, costs=DECLARED_COSTS, baseline_step=1.0)
    if not changes:
        return base
    fields = {
        "name": base.name,
        "profile": base.profile,
        "costs": base.costs,
        "baseline_step": base.baseline_step,
        **changes,
    }
    return GoodputFixture(**fields)  # type: ignore[arg-type]


def _refused(name: str, error: type[LedgerDeclarationError], attempt: Callable[[], object]) -> CheckResult:
    try:
        attempt()
    except error as exc:
        return CheckResult(GROUP, name, True, detail=f"{type(exc).__name__}: {exc}")
    except LedgerDeclarationError as exc:
        return CheckResult(GROUP, name, False, detail=f"refused with the wrong error {type(exc).__name__}")
    return CheckResult(GROUP, name, False, detail="accepted")


def _closed_form_checks() -> list[CheckResult]:
    gap = 0.0
    for alpha in (0.0, 0.1, 0.3, 0.5, 0.6, 0.8, 0.9, 0.99, 1.0):
        for k in range(1, 9):
            direct = expected_progress(iid_survival(alpha, k))
            gap = max(gap, abs(leviathan_expected_progress(alpha, k) - direct) / direct)
            speedup = leviathan_speedup(alpha, k, 0.05)
            gap = max(gap, abs(speedup * (1 + 0.05 * k) - direct) / direct)
    limit = abs(leviathan_expected_progress(1.0, 8) - 9.0)
    return [
        within(
            GROUP, "closed form (1 - a^(K+1)) / (1 - a) = 1 + sum s_j", gap, 1e-9, "relative, a in [0, 1]"
        ),
        within(GROUP, "a = 1 limit E[G] = K + 1", limit, 0.0),
    ]


def _sensitivity_checks() -> list[CheckResult]:
    front, back = PROFILES["front-loaded"], PROFILES["back-loaded"]
    front_progress = expected_progress(survival_from_reach(front.rates))
    back_progress = expected_progress(survival_from_reach(back.rates))
    hand_front = 1 + 0.95 + 0.95 * 0.9 + 0.95 * 0.9 * 0.6 + 0.95 * 0.9 * 0.6 * 0.4
    hand_back = 1 + 0.4 + 0.4 * 0.6 + 0.4 * 0.6 * 0.9 + 0.4 * 0.6 * 0.9 * 0.95
    return [
        CheckResult(
            GROUP,
            "same mean rate, different E[G] (contract#acceptance-profiles)",
            declared_mean_matches([front, back]) and front_progress - back_progress > 1.0,
            max(abs(front_progress - hand_front), abs(back_progress - hand_back)),
            LEDGER_TOLERANCE,
            f"mean {front.mean_rate:.4f}; E[G] {front_progress:.4f} vs {back_progress:.4f}",
        )
    ]


def _optimiser_checks() -> list[CheckResult]:
    out: list[CheckResult] = []
    for profile in PROFILES.values():
        fixture = _fixture(profile)
        choice = best_k(fixture)
        # Independent evaluation: E[G] as the sum of survival products, E[T] from the declared terms.
        gap = 0.0
        brute: list[float] = []
        for row in choice.rows:
            survival = [math.prod(profile.rates[:j]) for j in range(row.k + 1)]
            progress = 1.0 + math.fsum(survival[1:])
            k = row.k
            round_time = 0.05 * k + 1.0 + 0.02 * (k + 1) + 0.02 + 0.01 * k * k  # DECLARED_COSTS by hand
            brute.append(progress / round_time)
            gap = max(gap, abs(row.goodput - brute[-1]))
        argmax = 1 + max(range(len(brute)), key=lambda i: (brute[i], -i))
        out.append(
            CheckResult(
                GROUP,
                f"best K for {profile.name}",
                choice.best_k == argmax and gap <= LEDGER_TOLERANCE,
                gap,
                LEDGER_TOLERANCE,
                f"K* = {choice.best_k} ({'interior' if choice.interior else 'boundary'}) of "
                f"1..{choice.rows[-1].k}, goodput {choice.best.goodput:.4f} tokens/step, "
                f"speedup {choice.best.speedup:.3f}",
            )
        )
    front = best_k(_fixture(PROFILES["front-loaded"]))
    out.append(
        CheckResult(
            GROUP,
            "interior optimum found when one exists",
            front.interior and front.best_k == 3,
            detail="front-loaded profile under the declared costs: K* = 3 of 1..4",
        )
    )
    return out


def _refusal_checks() -> list[CheckResult]:
    front = PROFILES["front-loaded"]
    honest = tuple(row.expected_progress for row in goodput_table(_fixture(front)))
    without_token = tuple(value - 1.0 for value in honest)
    return [
        _refused(
            "refuses rates over unreachable suffix rows",
            UnreachableRateError,
            lambda: best_k(_fixture(AcceptanceProfile("per-row", front.rates, "all_proposed_rows"))),
        ),
        _refused(
            "refuses a rate declared after an unreachable position",
            UnreachableRateError,
            lambda: best_k(_fixture(AcceptanceProfile("dead-then-alive", (0.9, 0.0, 0.8)))),
        ),
        _refused(
            "refuses progress without the correction/bonus token",
            MissingProgressTokenError,
            lambda: best_k(_fixture(front, claimed_progress=without_token)),
        ),
        _refused(
            "refuses a hidden negative cost",
            NegativeCostError,
            lambda: CostTerms(verify_fixed=1.2, verify_per_row=-0.05),
        ),
        _refused(
            "refuses observed rounds without the terminal token",
            MissingProgressTokenError,
            lambda: RoundRecord(accepted=2, drafted=4, emitted=2, stopped=False),
        ),
    ]


def _time_per_token_checks() -> list[CheckResult]:
    # contract#worked-round: G = 1, 2, 3 with 0.40 / 0.24 / 0.36 and a declared 9 ms round.
    records = [
        RoundRecord(
            accepted=g - 1,
            drafted=2,
            emitted=g,
            stopped=False,
            t_draft=0.002,
            t_verify=0.006,
            t_state=0.001,
            count=count,
        )
        for g, count in ((1, 40), (2, 24), (3, 36))
    ]
    estimate = estimate_ledger(records)
    renewal = 0.009 / 1.96
    naive = 0.009 * (0.40 / 1 + 0.24 / 2 + 0.36 / 3)
    gap = max(
        abs(estimate.time_per_token - renewal),
        abs(estimate.mean_time_per_token_ratio - naive),
        abs(time_per_token(0.009, 1.96) - renewal),
    )
    return [
        CheckResult(
            GROUP,
            "time per token E[T]/E[G] differs from E[T/G]",
            gap <= LEDGER_TOLERANCE and abs(renewal - naive) > 1e-4,
            gap,
            LEDGER_TOLERANCE,
            f"E[T]/E[G] = {renewal * 1e3:.4f} ms, E[T/G] = {naive * 1e3:.4f} ms (contract#worked-round)",
        )
    ]


def ledger_checks() -> list[CheckResult]:
    """Every ledger check that needs no enumeration."""
    return (
        _closed_form_checks()
        + _sensitivity_checks()
        + _optimiser_checks()
        + _refusal_checks()
        + _time_per_token_checks()
    )


def enumeration_ledger_checks(results: Sequence[FixtureEnumeration]) -> list[CheckResult]:
    """E[G] of the enumerated decisions equals the ledger's ``1 + sum s_j`` on fixtures without stops."""
    gap = 0.0
    used = 0
    for result in results:
        fixture = result.tables.fixture
        if fixture.remaining is not None or any(s for p in result.tables.paths for s in p.stop_sets):
            continue
        pmf = [result.accepted_pmf.get(a, 0.0) for a in range(fixture.draft_len + 1)]
        measured = math.fsum(g * m for g, m in result.emitted_pmf.items())
        try:
            gap = max(gap, abs(measured - expected_progress(survival_from_pmf(pmf))))
        except LedgerDeclarationError as exc:
            return [
                CheckResult(GROUP, "enumerated E[G] = 1 + sum s_j", False, detail=f"{result.name}: {exc}")
            ]
        used += 1
    return [
        within(
            GROUP,
            "enumerated E[G] = 1 + sum s_j",
            gap,
            LEDGER_TOLERANCE,
            f"{used} fixtures without stops",
        )
    ]
