"""The black-box law test: chi-square with pooled cells, TV with a confidence interval, and the power.

The power statement is the smallest TV the test detects at its level and N.

* **Chi-square.** Pearson's statistic over the cells of the :class:`~specround.testing.law.CellLaw`,
  pooled (smallest expected first) until every cell expects >= 5
  (:func:`specround.model_check.chi_square.chi_square_test`). A sample the target gives probability 0 rejects
  outright (statistic +inf, p-value 0).
* **TV with a confidence interval.** The plug-in estimate ``0.5 * sum |n_c / N - P_c|`` over the pooled
  cells (plus the fraction of impossible samples). The interval is the analytic bound of Weissman et al.
  (2003) for the L1 deviation of an empirical law on m cells:
  ``Pr(||P_hat - Q||_1 >= eps) <= (2^m - 2) exp(-N eps^2 / 2)``, so with probability >= ``confidence``
  the engine's TV on these cells lies within ``eps / 2`` of the estimate. The TV on the cells is a lower
  bound for the TV of the full law (pooling only merges differences).
* **Power.** For any alternative law Q on the pooled cells, Cauchy-Schwarz gives
  ``chi2(Q, P) = sum (Q_c - P_c)^2 / P_c >= (sum |Q_c - P_c|)^2 = 4 TV^2``, so the non-centrality of
  Pearson's statistic is at least ``4 N TV^2``. :func:`detectable_tv` is the smallest TV at which the
  non-central chi-square exceeds the critical value with probability ``power``: every law at least that
  far from the target on the cells is rejected with at least that probability (local approximation;
  checked by :mod:`specround.testing.power` against planted distortions).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from specround.model_check.chi_square import chi2_critical, chi_square_test, noncentral_chi2_sf, pool_cells
from specround.testing.law import CellLaw

__all__ = ["DEFAULT_POWER", "LawTest", "detectable_tv", "law_test", "tv_half_width"]

DEFAULT_POWER = 0.8
"""The rejection probability the power statement is made at."""


def detectable_tv(df: int, samples: int, alpha: float, power: float = DEFAULT_POWER) -> float:
    """Smallest TV (on the pooled cells) rejected with probability >= ``power`` at level ``alpha``.

    Bisection on ``delta`` of ``Pr(chi2(df, 4 N delta^2) > critical(alpha, df)) = power`` (to 1e-6).
    Returns 1.0 when even TV = 1 is not detected (no cells to test, or too few samples).
    """
    if df < 1 or samples < 1:
        return 1.0
    critical = chi2_critical(alpha, df)

    def hit(delta: float) -> bool:
        return noncentral_chi2_sf(critical, df, 4.0 * samples * delta * delta) >= power

    if not hit(1.0):
        return 1.0
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if hit(mid) else (mid, hi)
    return hi


def tv_half_width(cells: int, samples: int, confidence: float) -> float:
    """Half-width of the Weissman TV interval on ``cells`` cells at ``confidence`` (e.g. 0.95)."""
    if samples < 1:
        return 1.0
    log_terms = math.log(max(1.0, 2.0**cells - 2.0)) + math.log(1.0 / (1.0 - confidence))
    return 0.5 * math.sqrt(2.0 * log_terms / samples)


@dataclass(frozen=True)
class LawTest:
    """The verdict of the law test for one prompt and setting."""

    samples: int
    cells: int
    """Cells after pooling."""
    df: int
    statistic: float
    p_value: float
    alpha: float
    impossible: int
    """Samples the target gives probability 0."""
    tv: float
    tv_low: float
    tv_high: float
    confidence: float
    detectable_tv: float
    """Smallest TV on these cells rejected with probability ``power`` (the power statement)."""
    power: float

    @property
    def passed(self) -> bool:
        """No impossible sample and the chi-square test not rejected at ``alpha``."""
        return self.impossible == 0 and self.p_value > self.alpha


def law_test(
    law: CellLaw,
    samples: Sequence[Sequence[int]],
    alpha: float,
    *,
    confidence: float = 0.95,
    power: float = DEFAULT_POWER,
) -> LawTest:
    """Test ``samples`` (first-H outputs of the engine) against ``law``."""
    n = len(samples)
    counts: Counter[tuple[int, ...]] = Counter()
    impossible = 0
    for sample, times in Counter(tuple(s) for s in samples).items():
        cell = law.cell_of(sample)
        if cell is None:
            impossible += times
        else:
            counts[cell] += times
    names = sorted(law.cells)
    probs = [law.cells[c] for c in names]
    observed = [float(counts[c]) for c in names]
    if n == 0:
        return LawTest(0, 0, 0, 0.0, 1.0, alpha, 0, 0.0, 0.0, 1.0, confidence, 1.0, power)
    chi = chi_square_test(probs, observed, alpha) if n > impossible else None
    expected, pooled_obs = pool_cells([n * p for p in probs], observed)
    tv = 0.5 * (math.fsum(abs(o - e) for o, e in zip(pooled_obs, expected, strict=True)) + impossible) / n
    half = tv_half_width(len(expected) + (1 if impossible else 0), n, confidence)
    df = chi.df if chi is not None else max(0, len(expected) - 1)
    if impossible or chi is None:
        statistic, p_value = math.inf, 0.0
    else:
        statistic, p_value = chi.statistic, chi.p_value
    return LawTest(
        samples=n,
        cells=len(expected),
        df=df,
        statistic=statistic,
        p_value=p_value,
        alpha=alpha,
        impossible=impossible,
        tv=tv,
        tv_low=max(0.0, tv - half),
        tv_high=min(1.0, tv + half),
        confidence=confidence,
        detectable_tv=detectable_tv(df, n, alpha, power),
        power=power,
    )
