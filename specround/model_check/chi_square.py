"""Chi-square goodness of fit with pooled cells, and its power against a stated alternative.

The distribution functions use ``torch.special.gammaincc`` (the regularised upper incomplete gamma
function Q) in float64: the central chi-square survival function is ``Q(df / 2, x / 2)``, and the
non-central one is the Poisson mixture ``sum_j Pois(j; lambda / 2) Q(df / 2 + j, x / 2)``.

Cells whose expected count is below 5 are pooled (smallest first) until every cell expects at least 5, the
classical condition under which Pearson's statistic is close to its chi-square limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

__all__ = [
    "MIN_EXPECTED",
    "ChiSquareTest",
    "chi2_critical",
    "chi2_sf",
    "chi_square_test",
    "noncentral_chi2_sf",
    "pool_cells",
]

MIN_EXPECTED = 5.0
"""Smallest expected count of a cell after pooling."""


def chi2_sf(x: float, df: int) -> float:
    """``Pr(X > x)`` for ``X ~ chi-square(df)``."""
    if x <= 0.0:
        return 1.0
    a = torch.tensor(df / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(a, torch.tensor(x / 2.0, dtype=torch.float64)))


def chi2_critical(alpha: float, df: int) -> float:
    """The ``1 - alpha`` quantile of chi-square(df), by bisection on :func:`chi2_sf` (relative 1e-12)."""
    lo, hi = 0.0, max(1.0, float(df))
    while chi2_sf(hi, df) > alpha:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if chi2_sf(mid, df) > alpha:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    return hi


def noncentral_chi2_sf(x: float, df: int, noncentrality: float) -> float:
    """``Pr(X > x)`` for a non-central chi-square(df, lambda): a Poisson(lambda / 2) mixture."""
    if noncentrality <= 0.0:
        return chi2_sf(x, df)
    half = noncentrality / 2.0
    terms = int(half + 12.0 * math.sqrt(half) + 60.0)
    j = torch.arange(terms, dtype=torch.float64)
    log_weights = -half + j * math.log(half) - torch.lgamma(j + 1.0)
    tails = torch.special.gammaincc(df / 2.0 + j, torch.full_like(j, x / 2.0))
    return float(min(1.0, float((log_weights.exp() * tails).sum())))


def pool_cells(expected: Sequence[float], *others: Sequence[float]) -> tuple[list[float], ...]:
    """Pool cells (smallest expected first) until every cell expects at least :data:`MIN_EXPECTED`.

    ``expected`` are expected counts; ``others`` (observed counts, alternative probabilities, ...) are
    pooled along the same cells. Returns the pooled ``expected`` followed by the pooled ``others``.
    """
    order = sorted(range(len(expected)), key=lambda i: expected[i])
    groups: list[list[int]] = []
    pool: list[int] = []
    pooled_mass = 0.0
    for i in order:
        if pooled_mass < MIN_EXPECTED or expected[i] < MIN_EXPECTED:
            pool.append(i)
            pooled_mass += expected[i]
        else:
            groups.append([i])
    if pool:
        if pooled_mass < MIN_EXPECTED and groups:
            pool.extend(groups.pop(0))
        groups.append(pool)
    return tuple([math.fsum(values[i] for i in group) for group in groups] for values in (expected, *others))


@dataclass(frozen=True)
class ChiSquareTest:
    """Pearson's goodness-of-fit test of observed counts against an exact law."""

    samples: int
    cells: int
    """Cells after pooling."""
    df: int
    statistic: float
    p_value: float
    alpha: float
    critical: float
    power: dict[str, float]
    """Probability of rejecting when the data follow each named alternative (non-central chi-square)."""

    @property
    def passed(self) -> bool:
        """Not rejected at level alpha."""
        return self.statistic <= self.critical


def chi_square_test(
    probabilities: Sequence[float],
    observed: Sequence[float],
    alpha: float,
    alternatives: Mapping[str, Sequence[float]] | None = None,
) -> ChiSquareTest:
    """Test ``observed`` counts against cell ``probabilities`` (cells of probability 0 must be empty).

    For each named alternative (cell probabilities of a stated wrong law) the power is
    ``Pr(chi-square(df, lambda) > critical)`` with ``lambda = N sum (p_alt - p)^2 / p`` over the pooled
    cells (the usual local approximation of Pearson's statistic under the alternative).
    """
    samples = round(math.fsum(observed))
    expected = [samples * p for p in probabilities]
    named = dict(alternatives or {})
    pooled = pool_cells(expected, observed, *named.values())
    pooled_expected, pooled_observed = pooled[0], pooled[1]
    df = len(pooled_expected) - 1
    statistic = math.fsum(
        (o - e) ** 2 / e for o, e in zip(pooled_observed, pooled_expected, strict=True) if e > 0
    )
    if df < 1:  # one cell: the law is a point mass and there is nothing to test
        return ChiSquareTest(samples, len(pooled_expected), 0, statistic, 1.0, alpha, math.inf, {})
    critical = chi2_critical(alpha, df)
    power: dict[str, float] = {}
    for name, pooled_alt in zip(named, pooled[2:], strict=True):
        lam = samples * math.fsum(
            (a - e / samples) ** 2 / (e / samples)
            for a, e in zip(pooled_alt, pooled_expected, strict=True)
            if e > 0
        )
        power[name] = noncentral_chi2_sf(critical, df, lam)
    return ChiSquareTest(
        samples=samples,
        cells=len(pooled_expected),
        df=df,
        statistic=statistic,
        p_value=chi2_sf(statistic, df),
        alpha=alpha,
        critical=critical,
        power=power,
    )
