"""What the exact enumeration oracle reports per fixture, and the grid and tolerances it measures against.

Contract: contract#exact-enumeration.

:mod:`specround.model_check.enumeration` fills these records; :mod:`specround.model_check.enumeration_checks`
turns them into :class:`~specround.model_check.check_results.CheckResult` rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from specround.model_check.check_results import CheckResult
from specround.model_check.fixture_tables import FixtureTables, Joint

__all__ = [
    "GRID",
    "IDENTITY_TOLERANCE",
    "JOINT_TOLERANCE",
    "PARITY_TOLERANCE",
    "THRESHOLD_TOLERANCE",
    "FixtureEnumeration",
    "LeafTally",
]

GRID = 1 << 53
"""Uniforms from the counter-based RNG are ``k / GRID`` for integer ``0 <= k < GRID``."""

JOINT_TOLERANCE = 1e-12
"""Max |speculative - target| over all sequences of the horizon (float64 rows; errors are ~1e-16)."""
IDENTITY_TOLERANCE = 1e-12
"""Tolerance of the per-position identities and of the bracket cross-check."""
THRESHOLD_TOLERANCE = 1e-15
"""|measured acceptance - min(1, p/q)|: the grid count is within 2**-53 of the real threshold."""
PARITY_TOLERANCE = 1e-12
"""Max |max-shift row - online row| and |rows_along row - per-prefix row| (float64 softmax, V <= 4)."""


@dataclass
class FixtureEnumeration:
    """What the oracle found for one fixture."""

    tables: FixtureTables
    speculative_joint: Joint = field(default_factory=dict)
    joint_error: float = math.nan
    accepted_pmf: dict[int, float] = field(default_factory=dict)
    """Law of the decision's accepted count (A; the stop distance when a stop ends the prefix)."""
    emitted_pmf: dict[int, float] = field(default_factory=dict)
    """Law of round progress G = emitted tokens."""
    thresholds: dict[tuple[int, ...], float] = field(default_factory=dict)
    """Measured acceptance of test i keyed by ``d_1..d_i`` (reached tests only)."""
    correction_laws: dict[tuple[int, ...], dict[int, float]] = field(default_factory=dict)
    """Measured correction law after a rejection at the node ``d_1..d_a`` (non-degenerate only)."""
    correction_mass: dict[tuple[int, ...], float] = field(default_factory=dict)
    """The decision's reported residual mass Z at that node."""
    bonus_laws: dict[tuple[int, ...], dict[int, float]] = field(default_factory=dict)
    """Measured bonus law after the full path."""
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The fixture's name."""
        return self.tables.fixture.name

    @property
    def passed(self) -> bool:
        """Whether every check of the fixture passed."""
        return all(c.passed for c in self.checks)


@dataclass
class LeafTally:
    """Counts of failed leaf-level checks of one fixture, with their largest deviations."""

    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    errors: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    leaves: int = 0
    brackets: int = 0

    def fail(self, name: str) -> None:
        """Count one failing leaf of check ``name``."""
        self.failures[name] += 1

    def error(self, name: str, value: float) -> None:
        """Keep the largest deviation of check ``name`` (a non-finite value counts as infinite)."""
        if not value <= self.errors[name]:
            self.errors[name] = value if math.isfinite(value) else math.inf
