"""The contract's worked numbers, checked through the real sampler.

Contract: contract#worked-coupling, contract#worked-round.

Each number is read from the exact enumeration of a named fixture, i.e. from measures of the real decision
function, and compared with the value the text states (to the digits it prints where it rounds).
"""

from __future__ import annotations

import math

from specround.ledger import accepted_pmf, expected_progress, survival_from_pmf, tokens_per_second
from specround.model_check.check_results import CheckResult, within
from specround.model_check.enumeration import FixtureEnumeration
from specround.model_check.fixtures import SUMMARY_P, THREE_SYMBOL_P, THREE_SYMBOL_Q

__all__ = ["EXAMPLE_TOLERANCE", "coupling_matrix", "summary_checks", "three_symbol_checks"]

EXAMPLE_TOLERANCE = 1e-12
"""Exact values (0.5, 0.3, 0.7, 1.96, ...) are compared to this absolute tolerance."""


def _printed(value: float, stated: float, digits: int) -> bool:
    """Whether ``value`` prints as ``stated`` when rounded to ``digits`` decimals, as the text does."""
    return round(value, digits) == round(stated, digits)


def coupling_matrix(result: FixtureEnumeration) -> list[list[float]]:
    """Joint law of (proposed X ~ q, emitted Y) at the first position, from measured acceptances.

    ``M[x][y] = q(x) * (a(x) [x == y] + (1 - a(x)) * r(y))`` with ``a(x)`` the measured acceptance of a
    drafted x and ``r`` the measured correction law at the root.
    """
    q_row = result.tables.draft.rows[()].tolist()
    correction = result.correction_laws.get((), {})
    size = len(q_row)
    matrix = [[0.0] * size for _ in range(size)]
    for x in range(size):
        if q_row[x] <= 0.0:
            continue
        accept = result.thresholds[(x,)]
        for y in range(size):
            matrix[x][y] = q_row[x] * ((accept if x == y else 0.0) + (1.0 - accept) * correction.get(y, 0.0))
    return matrix


def three_symbol_checks(result: FixtureEnumeration) -> list[CheckResult]:
    """contract#worked-coupling: a(A) = 0.50, Z = 0.30, p'(B) = 0.833, p'(C) = 0.167, diagonal 0.70."""
    name = result.name
    law = result.correction_laws.get((), {})
    z = result.correction_mass.get((), math.nan)
    matrix = coupling_matrix(result)
    diagonal = math.fsum(matrix[x][x] for x in range(3))
    rows = [math.fsum(r) for r in matrix]
    columns = [math.fsum(matrix[x][y] for x in range(3)) for y in range(3)]
    b, c = law.get(1, math.nan), law.get(2, math.nan)
    return [
        within(
            name,
            "contract#worked-coupling: acceptance of drafted A = 0.50",
            abs(result.thresholds[(0,)] - 0.5),
            EXAMPLE_TOLERANCE,
        ),
        within(
            name,
            "contract#worked-coupling: residual mass Z = 0.25 + 0.05 = 0.30",
            abs(z - 0.30),
            EXAMPLE_TOLERANCE,
        ),
        CheckResult(
            name,
            "contract#worked-coupling: p'(B) = 0.833, p'(C) = 0.167",
            _printed(b, 0.833, 3) and _printed(c, 0.167, 3) and abs(b - 0.25 / 0.30) <= EXAMPLE_TOLERANCE,
            abs(b - 0.25 / 0.30),
            EXAMPLE_TOLERANCE,
            f"measured p'(B) = {b:.6f}, p'(C) = {c:.6f}",
        ),
        within(
            name,
            "contract#worked-coupling: coupling diagonal = 0.70 = 1 - TV",
            abs(diagonal - 0.70),
            EXAMPLE_TOLERANCE,
        ),
        within(
            name,
            "contract#worked-coupling: coupling rows sum to q, columns to p",
            max(
                max(abs(r - e) for r, e in zip(rows, THREE_SYMBOL_Q, strict=True)),
                max(abs(col - e) for col, e in zip(columns, THREE_SYMBOL_P, strict=True)),
            ),
            EXAMPLE_TOLERANCE,
            "matrix " + "; ".join(" ".join(f"{v:.4f}" for v in r) for r in matrix),
        ),
    ]


def summary_checks(result: FixtureEnumeration) -> list[CheckResult]:
    """contract#worked-round: acceptance [1, 1, 0.2], correction [1, 0, 0], E = 1.96, rates."""
    name = result.name
    conditional = [result.thresholds[(x,)] for x in range(3)]
    q_row = result.tables.draft.rows[()].tolist()
    alpha = math.fsum(q * a for q, a in zip(q_row, conditional, strict=True))
    law = result.correction_laws.get((), {})
    counts = [result.emitted_pmf.get(g, 0.0) for g in (1, 2, 3)]
    progress = expected_progress(survival_from_pmf([result.accepted_pmf.get(a, 0.0) for a in range(3)]))
    first_token = [0.0, 0.0, 0.0]
    for sequence, mass in result.speculative_joint.items():
        first_token[sequence[0]] += mass
    fast = tokens_per_second(progress, 0.002 + 0.006 + 0.001)
    slow = tokens_per_second(progress, 0.002 + 0.012 + 0.001)
    baseline = tokens_per_second(1.0, 0.006)
    pmf = accepted_pmf(survival_from_pmf([result.accepted_pmf.get(a, 0.0) for a in range(3)]))
    return [
        within(
            name,
            "contract#worked-round: conditional acceptance [1, 1, 0.2]",
            max(abs(a - e) for a, e in zip(conditional, (1.0, 1.0, 0.2), strict=True)),
            EXAMPLE_TOLERANCE,
        ),
        within(name, "contract#worked-round: acceptance alpha = 0.6", abs(alpha - 0.6), EXAMPLE_TOLERANCE),
        within(
            name,
            "contract#worked-round: correction distribution [1, 0, 0]",
            max(abs(law.get(x, 0.0) - e) for x, e in enumerate((1.0, 0.0, 0.0))),
            EXAMPLE_TOLERANCE,
        ),
        within(
            name,
            "contract#worked-round: output counts 1/2/3 = 0.4/0.24/0.36",
            max(abs(c - e) for c, e in zip(counts, (0.4, 0.24, 0.36), strict=True)),
            EXAMPLE_TOLERANCE,
            f"Pr(A = a) = {[round(x, 12) for x in pmf]}",
        ),
        within(name, "contract#worked-round: E[K] = 1.96", abs(progress - 1.96), EXAMPLE_TOLERANCE),
        within(
            name,
            "contract#worked-round: first emitted token ~ p = [0.6, 0.3, 0.1]",
            max(abs(f - e) for f, e in zip(first_token, SUMMARY_P, strict=True)),
            EXAMPLE_TOLERANCE,
        ),
        CheckResult(
            name,
            "contract#worked-round: rates 217.8 / 130.7 / baseline 166.7 tokens/s",
            _printed(fast, 217.8, 1) and _printed(slow, 130.7, 1) and _printed(baseline, 166.7, 1),
            abs(fast - 217.77777777777777),
            1e-9,
            f"{fast:.4f} / {slow:.4f} / {baseline:.4f} tokens/s",
        ),
    ]
