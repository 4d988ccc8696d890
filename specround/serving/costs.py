"""Online cost models for the draft-length policy: linear fits with forgetting and a declared prior.

Each term of the round-time ledger (contract#time-ledger) is modelled as a line in one shape variable, fitted
online by weighted least squares over the observations seen so far:

* draft seconds ``T_D = a + b * K`` per proposer call (K: the largest draft length asked of the call);
* verification seconds ``T_V = a + b * rows`` per target call (rows: input rows the call computed), kept
  per exact row count once measured (:class:`TabulatedCost`);
* state seconds ``T_S = a + b * K`` per round (processed p rows, controller share, K/V execution).

Slopes are constrained to be non-negative (more rows or drafts never cost less; a noisy fit must not make
a longer draft look cheaper). Older observations are forgotten geometrically (factor :data:`FORGETTING`),
so a fit follows a machine whose speed drifts (other load, longer contexts). Until the data pin the slope
down, a *prior line* holds the fit in place: it is set from the first observation ``(x1, y1)`` and a
declared slope ratio ``rho`` (``b0 = rho * a0`` and ``a0 + b0 * x1 = y1``; ``rho = inf`` means a line
through the origin), and enters as two pseudo-observations at ``x = 0`` and ``x = PRIOR_SPAN`` of total
weight :data:`PRIOR_WEIGHT`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specround.errors import NegativeCostError

__all__ = ["FORGETTING", "PRIOR_SPAN", "PRIOR_WEIGHT", "TABLE_SMOOTHING", "LinearCost", "TabulatedCost"]

FORGETTING = 0.95
"""Weight kept by every earlier observation when a new one arrives (memory of about 20 observations)."""
PRIOR_WEIGHT = 0.5
"""Total weight of the prior line, in observations (it is never forgotten, and soon outweighed)."""
PRIOR_SPAN = 8.0
"""The prior line's second anchor (the largest draft length the policy considers)."""
TABLE_SMOOTHING = 0.25
"""Weight of a new observation in a :class:`TabulatedCost` entry (exponential smoothing)."""


@dataclass(slots=True)
class _Sums:
    """Weighted sufficient statistics of a line fit: sum w, w x, w x^2, w y, w x y."""

    w: float = 0.0
    x: float = 0.0
    xx: float = 0.0
    y: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float, weight: float) -> None:
        self.w += weight
        self.x += weight * x
        self.xx += weight * x * x
        self.y += weight * y
        self.xy += weight * x * y

    def scale(self, factor: float) -> None:
        self.w *= factor
        self.x *= factor
        self.xx *= factor
        self.y *= factor
        self.xy *= factor


class LinearCost:
    """``seconds = a + b * x`` fitted online (see the module docstring); never predicts below zero."""

    def __init__(self, name: str, *, slope_ratio: float, forgetting: float = FORGETTING) -> None:
        if not (slope_ratio >= 0.0) or not 0.0 < forgetting <= 1.0:
            raise NegativeCostError(
                f"{name}: need slope_ratio >= 0 and forgetting in (0, 1], got {slope_ratio}, {forgetting}"
            )
        self.name = name
        """What the line models (for messages and reports)."""
        self.slope_ratio = slope_ratio
        """``rho`` of the prior line: its slope per unit of x relative to its intercept."""
        self.forgetting = forgetting
        self._data = _Sums()
        self._prior: tuple[float, float] | None = None
        self.observations = 0
        """Observations received."""

    @property
    def ready(self) -> bool:
        """Whether at least one observation arrived (before that, :meth:`predict` refuses)."""
        return self._prior is not None

    def observe(self, x: float, seconds: float) -> None:
        """Record one observation; a negative or non-finite duration is refused."""
        if not math.isfinite(seconds) or seconds < 0.0 or not math.isfinite(x) or x < 0.0:
            raise NegativeCostError(f"{self.name}: observation ({x}, {seconds}) must be finite and >= 0")
        if self._prior is None:
            if math.isinf(self.slope_ratio):
                self._prior = (0.0, seconds / x if x > 0 else seconds)
            else:
                a0 = seconds / (1.0 + self.slope_ratio * x)
                self._prior = (a0, self.slope_ratio * a0)
        self._data.scale(self.forgetting)
        self._data.add(float(x), float(seconds), 1.0)
        self.observations += 1

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)`` of the current fit (data plus the prior line's pseudo-observations)."""
        if self._prior is None:
            raise NegativeCostError(f"{self.name}: no observation yet")
        a0, b0 = self._prior
        sums = _Sums(self._data.w, self._data.x, self._data.xx, self._data.y, self._data.xy)
        half = PRIOR_WEIGHT / 2.0
        sums.add(0.0, a0, half)
        sums.add(PRIOR_SPAN, a0 + b0 * PRIOR_SPAN, half)
        det = sums.w * sums.xx - sums.x * sums.x
        b = (sums.w * sums.xy - sums.x * sums.y) / det  # det > 0: the two anchors differ in x
        if b < 0.0:  # more rows or drafts never cost less: the best line with b = 0 is the weighted mean
            return sums.y / sums.w, 0.0
        a = (sums.y - b * sums.x) / sums.w
        return a, b

    def predict(self, x: float) -> float:
        """Predicted seconds at ``x`` (clamped at zero: a fitted line may dip below it far from the data)."""
        a, b = self.coefficients()
        return max(0.0, a + b * x)


class TabulatedCost:
    """Seconds per exact shape (smoothed per ``x``), with a :class:`LinearCost` for shapes not seen yet.

    Small matrix products are not linear in their row count on a CPU (a two-row product can take longer
    than a five-row one when the BLAS switches kernels), so a verification's cost is remembered per row
    count once measured; the line only fills the gaps.
    """

    def __init__(self, name: str, *, slope_ratio: float) -> None:
        self.line = LinearCost(name, slope_ratio=slope_ratio)
        """The fit used for shapes that have no entry yet."""
        self.table: dict[int, float] = {}
        """Smoothed seconds per observed shape."""

    @property
    def ready(self) -> bool:
        """Whether at least one observation arrived."""
        return self.line.ready

    @property
    def observations(self) -> int:
        """Observations received."""
        return self.line.observations

    def observe(self, x: int, seconds: float) -> None:
        """Record one observation of shape ``x``."""
        self.line.observe(x, seconds)
        known = self.table.get(x)
        self.table[x] = seconds if known is None else known + TABLE_SMOOTHING * (seconds - known)

    def predict(self, x: int) -> float:
        """The smoothed measurement at ``x``, else the line's prediction."""
        known = self.table.get(x)
        return known if known is not None else self.line.predict(x)
