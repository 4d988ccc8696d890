"""Interval estimates for the report: Wilson intervals for rates, Kaplan-Meier bands for the survival tail.

**Why Kaplan-Meier.** A round with ``k`` drafts reaches acceptance test ``j`` only if it drafted at least
``j`` tokens and accepted ``d_1..d_{j-1}`` without a stop in between (contract#accepted-prefix). Rounds that
drafted fewer tokens or stopped inside their accepted prefix leave the experiment *censored*, not failed. The
tail ``s_j = Pr(A >= j) = prod_{i<=j} alpha_i^reach`` with ``alpha_i^reach = accepted_i / reached_i`` is
exactly the Kaplan-Meier product-limit estimator with ``reached_i`` rounds at risk and ``reached_i -
accepted_i`` rejections at position ``i``.

**Bands.** Pointwise 95% intervals (``z = 1.959964``):

* ``alpha_j^reach``: the Wilson score interval of ``accepted_j`` successes in ``reached_j`` trials.
* ``s_j``: Greenwood's variance ``Var(log s_j) = sum_{i<=j} d_i / (n_i (n_i - d_i))`` on the
  complementary log-log scale (Kalbfleisch-Prentice), which keeps the band inside ``[0, 1]``. Where the
  product is still exactly 1 (no rejection yet) the log-log scale is undefined; the band is then
  ``[wilson_low(n_min, n_min), 1]`` with ``n_min`` the smallest risk set so far (the Wilson bound of "no
  rejection in n_min trials"). Where the product is 0 the band is ``[0, wilson_high(0, n)]`` of the position
  that rejected every round.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Z95", "SurvivalPoint", "kaplan_meier", "wilson_interval"]

Z95 = 1.959963984540054
"""Two-sided 95% normal quantile."""


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion; ``(0, 1)`` when there are no trials."""
    if trials <= 0:
        return (0.0, 1.0)
    if not 0 <= successes <= trials:
        raise ValueError(f"need 0 <= successes <= trials, got {successes} of {trials}")
    n = float(trials)
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass(frozen=True, slots=True)
class SurvivalPoint:
    """``s_j`` with its pointwise 95% band, and the evidence at position ``j``."""

    position: int
    survival: float
    low: float
    high: float
    at_risk: int
    """Rounds that reached test ``j`` (``n_j``)."""
    rejected: int
    """Rounds rejected at test ``j`` (``d_j``)."""


def kaplan_meier(at_risk: Sequence[int], accepted: Sequence[int], z: float = Z95) -> list[SurvivalPoint]:
    """The survival tail ``s_1..s_J`` with bands from per-position reached and accepted counts.

    ``at_risk[j-1]`` and ``accepted[j-1]`` are the counts of position ``j``. The tail stops before the
    first position no round reached (its rate is undefined, never 0).
    """
    points: list[SurvivalPoint] = []
    survival = 1.0
    greenwood = 0.0
    smallest = 0
    for index, (n, a) in enumerate(zip(at_risk, accepted, strict=True)):
        if n <= 0:
            break
        if not 0 <= a <= n:
            raise ValueError(f"position {index + 1}: {a} accepted of {n} reached")
        d = n - a
        survival *= a / n
        smallest = n if smallest == 0 else min(smallest, n)
        if d and a:
            greenwood += d / (n * a)
        if survival <= 0.0:
            low, high = 0.0, wilson_interval(0, n, z)[1]
            high = min(high, points[-1].high) if points else high
        elif survival >= 1.0:
            low, high = wilson_interval(smallest, smallest, z)[0], 1.0
        else:
            log_s = math.log(survival)
            spread = z * math.sqrt(greenwood) / abs(log_s)
            low = survival ** math.exp(spread)
            high = survival ** math.exp(-spread)
        points.append(SurvivalPoint(index + 1, survival, low, high, n, d))
    return points
