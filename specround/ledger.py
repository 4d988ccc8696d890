"""The speedup ledger's formulas: accepted-prefix law, round progress, time per token.

Contract: contract#speedup-ledger.

A leaf module (it imports only :mod:`specround.errors`): the serving loop's draft-length policy uses these
formulas in production, and the checkers of :mod:`specround.model_check` import them from here (one
implementation).

The accepted count ``A`` of a round with ``K`` drafts is a random variable, described completely by its
survival tail ``s_j = Pr(A >= j)`` (``s_0 = 1``). Nothing here assumes independent acceptance: the
reach-conditioned rate ``alpha_j^reach = Pr(draft j accepted | A >= j - 1)`` averages only over rounds that
actually reach position ``j``, and the chain rule gives ``s_j = prod_{i<=j} alpha_i^reach`` exactly.

Round progress counts the correction or bonus token: ``G = min(A + 1, H)`` with ``H`` the stop distance
(first emitted stop token or the remaining budget), so ``E[G] = 1 + sum_j s_j`` without stops. Time per
committed token is the renewal-reward ratio ``E[T_round] / E[G]``, which is not ``E[T_round / G]``.

All functions take and return plain floats (float64); they validate their inputs and refuse a declaration
that breaks the ledger's contract with a :class:`~specround.errors.LedgerDeclarationError` subclass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from specround.errors import LedgerDeclarationError, NegativeCostError, UnreachableRateError

__all__ = [
    "PROBABILITY_TOLERANCE",
    "ReachCount",
    "accepted_pmf",
    "expected_accepted",
    "expected_discarded_rows",
    "expected_progress",
    "expected_progress_with_stops",
    "iid_survival",
    "leviathan_expected_progress",
    "leviathan_speedup",
    "progress_pmf",
    "reach_rates_from_survival",
    "survival_from_pmf",
    "survival_from_reach",
    "time_per_token",
    "tokens_per_second",
]

PROBABILITY_TOLERANCE = 1e-12
"""Slack allowed when checking that declared probabilities are monotone and sum to one (float64 sums)."""


@dataclass(frozen=True, slots=True)
class ReachCount:
    """Evidence behind ``alpha_j^reach``: rounds that reached test j, and those whose draft j was accepted."""

    position: int
    reached: int
    accepted: int

    @property
    def rate(self) -> float | None:
        """``accepted / reached``; ``None`` when no round reached position j (never 0 or NaN)."""
        return self.accepted / self.reached if self.reached else None


def _check_rate(value: float, what: str) -> float:
    """A probability in [0, 1]; float64 rounding of at most :data:`PROBABILITY_TOLERANCE` is clamped."""
    rate = float(value)
    if not (-PROBABILITY_TOLERANCE <= rate <= 1.0 + PROBABILITY_TOLERANCE):
        raise LedgerDeclarationError(f"{what} must be a probability in [0, 1], got {value!r}")
    return min(1.0, max(0.0, rate))


def survival_from_reach(reach_rates: Sequence[float]) -> tuple[float, ...]:
    """Survival tail ``(s_0, ..., s_K)`` from reach-conditioned rates ``alpha_1..alpha_K`` (chain rule).

    A rate declared after a position whose survival is already zero belongs to a position no round can
    reach; a positive such rate is refused with :class:`UnreachableRateError` (it was necessarily measured
    over rows that are not reach-conditioned).
    """
    survival = [1.0]
    reachable = True
    for position, value in enumerate(reach_rates, start=1):
        rate = _check_rate(value, f"alpha_{position}^reach")
        if not reachable and rate > 0.0:
            raise UnreachableRateError(
                f"alpha_{position}^reach = {rate} is declared for a position that no round reaches "
                f"(s_{position - 1} = 0): a rate over unreachable rows is not reach-conditioned"
            )
        survival.append(survival[-1] * rate)
        reachable = reachable and rate > 0.0
    return tuple(survival)


def _check_survival(survival: Sequence[float]) -> tuple[float, ...]:
    tail = tuple(float(s) for s in survival)
    if not tail or abs(tail[0] - 1.0) > PROBABILITY_TOLERANCE:
        raise LedgerDeclarationError(f"a survival tail starts with s_0 = 1, got {tail[:1]}")
    for j, s in enumerate(tail):
        if not (-PROBABILITY_TOLERANCE <= s <= 1.0 + PROBABILITY_TOLERANCE):
            raise LedgerDeclarationError(f"s_{j} must be a probability, got {s!r}")
        if j > 0 and s > tail[j - 1] + PROBABILITY_TOLERANCE:
            raise LedgerDeclarationError(
                f"survival must be non-increasing: s_{j} = {s} > s_{j - 1} = {tail[j - 1]}"
            )
    return tuple(min(1.0, max(0.0, s)) for s in tail)


def reach_rates_from_survival(survival: Sequence[float]) -> tuple[float | None, ...]:
    """Reach-conditioned rates ``alpha_j^reach = s_j / s_{j-1}``; ``None`` where position j is unreachable.

    Returning ``None`` (not 0, not NaN) keeps an unreachable position from ever being averaged into a rate.
    """
    tail = _check_survival(survival)
    rates: list[float | None] = []
    for j in range(1, len(tail)):
        rates.append(None if tail[j - 1] <= 0.0 else min(1.0, max(0.0, tail[j] / tail[j - 1])))
    return tuple(rates)


def accepted_pmf(survival: Sequence[float]) -> tuple[float, ...]:
    """``Pr(A = a)`` for ``a = 0..K``: ``s_a - s_{a+1}`` below K and ``s_K`` at K (adjacent tails)."""
    tail = _check_survival(survival)
    k = len(tail) - 1
    return (*(max(0.0, tail[a] - tail[a + 1]) for a in range(k)), tail[k])


def survival_from_pmf(pmf: Sequence[float]) -> tuple[float, ...]:
    """Survival tail ``s_j = sum_{a >= j} Pr(A = a)`` of an accepted-count law over ``a = 0..K``."""
    masses = [_check_rate(m, f"Pr(A = {a})") for a, m in enumerate(pmf)]
    total = math.fsum(masses)
    if abs(total - 1.0) > PROBABILITY_TOLERANCE * max(1, len(masses)):
        raise LedgerDeclarationError(f"Pr(A = a) must sum to one, got {total!r}")
    return tuple(min(1.0, math.fsum(masses[j:])) for j in range(len(masses)))


def expected_accepted(survival: Sequence[float]) -> float:
    """``E[A] = sum_{j=1..K} s_j``."""
    return math.fsum(_check_survival(survival)[1:])


def expected_progress(survival: Sequence[float]) -> float:
    """``E[G] = 1 + sum_{j=1..K} s_j`` for a round without stops: the correction or bonus always counts."""
    return 1.0 + expected_accepted(survival)


def expected_discarded_rows(k: int, survival: Sequence[float]) -> float:
    """Expected draft K/V rows the round discards: ``K - E[A]`` (contract#temporary-rows)."""
    tail = _check_survival(survival)
    if k != len(tail) - 1:
        raise LedgerDeclarationError(f"K = {k} does not match a survival tail over {len(tail) - 1} drafts")
    return float(k) - expected_accepted(tail)


def progress_pmf(
    acc_pmf: Sequence[float], stop_distance_pmf: Mapping[float, float] | None = None
) -> dict[int, float]:
    """Law of round progress ``G = min(A + 1, H)``.

    ``stop_distance_pmf`` maps each stop distance ``h >= 1`` (``math.inf`` for "no stop this round") to its
    probability and is taken independent of ``A``; ``None`` means ``H = inf``. Use the estimators of
    :mod:`specround.model_check.ledger_estimate` when ``H`` and ``A`` are dependent (observed rounds).
    """
    masses = [_check_rate(m, f"Pr(A = {a})") for a, m in enumerate(acc_pmf)]
    stops = {math.inf: 1.0} if stop_distance_pmf is None else dict(stop_distance_pmf)
    for h, mass in stops.items():
        if not (h == math.inf or (float(h).is_integer() and h >= 1)):
            raise LedgerDeclarationError(f"a stop distance is a positive integer or inf, got {h!r}")
        _check_rate(mass, f"Pr(H = {h})")
    if abs(math.fsum(stops.values()) - 1.0) > PROBABILITY_TOLERANCE * max(1, len(stops)):
        raise LedgerDeclarationError("the stop-distance law must sum to one")
    law: dict[int, float] = {}
    for a, a_mass in enumerate(masses):
        for h, h_mass in stops.items():
            g = int(min(a + 1, h))
            law[g] = law.get(g, 0.0) + a_mass * h_mass
    return dict(sorted(law.items()))


def expected_progress_with_stops(
    acc_pmf: Sequence[float], stop_distance_pmf: Mapping[float, float] | None = None
) -> float:
    """``E[G] = E[min(A + 1, H)]`` with ``H`` independent of ``A`` (see :func:`progress_pmf`)."""
    return math.fsum(g * mass for g, mass in progress_pmf(acc_pmf, stop_distance_pmf).items())


def iid_survival(alpha: float, k: int) -> tuple[float, ...]:
    """Survival tail of the synthetic iid scenario: ``s_j = alpha ** j`` for ``j = 0..K``."""
    rate = _check_rate(alpha, "alpha")
    if k < 0:
        raise LedgerDeclarationError(f"K must be >= 0, got {k}")
    return tuple(rate**j for j in range(k + 1))


def leviathan_expected_progress(alpha: float, k: int) -> float:
    """Closed form ``E[G] = (1 - alpha^(K+1)) / (1 - alpha)``, with the ``alpha = 1`` limit ``K + 1``."""
    rate = _check_rate(alpha, "alpha")
    if k < 0:
        raise LedgerDeclarationError(f"K must be >= 0, got {k}")
    if rate == 1.0:
        return float(k + 1)
    return (1.0 - rate ** (k + 1)) / (1.0 - rate)


def leviathan_speedup(alpha: float, k: int, c: float) -> float:
    """Idealised speedup ``S = (1 - alpha^(K+1)) / ((1 - alpha)(1 + K c))`` (contract#closed-form).

    ``c`` is the cost of one draft call as a fraction of one target call; a negative ``c`` is refused.
    """
    cost = float(c)
    if not math.isfinite(cost) or cost < 0.0:
        raise NegativeCostError(f"the draft cost fraction c must be finite and >= 0, got {c!r}")
    return leviathan_expected_progress(alpha, k) / (1.0 + k * cost)


def time_per_token(expected_round_time: float, expected_progress_tokens: float) -> float:
    """Renewal-reward time per committed token ``E[T_round] / E[G]`` (not ``E[T_round / G]``)."""
    if not math.isfinite(expected_round_time) or expected_round_time < 0.0:
        raise NegativeCostError(f"expected round time must be finite and >= 0, got {expected_round_time!r}")
    if not expected_progress_tokens >= 1.0:
        raise LedgerDeclarationError(
            f"E[G] >= 1 for every round (the correction/bonus token counts), got {expected_progress_tokens!r}"
        )
    return expected_round_time / expected_progress_tokens


def tokens_per_second(expected_progress_tokens: float, expected_round_seconds: float) -> float:
    """Committed tokens per second ``E[G] / E[T_round]``."""
    return 1.0 / time_per_token(expected_round_seconds, expected_progress_tokens)
