"""The speedup ledger's formulas (contract#speedup-ledger), re-exported for the checkers.

The formulas live in the leaf module :mod:`specround.ledger` because production code (the serving loop's
draft-length policy) uses them too and must not import :mod:`specround.model_check`. This module keeps the
checkers' import path; it holds no second implementation.
"""

from __future__ import annotations

from specround.ledger import (
    PROBABILITY_TOLERANCE,
    accepted_pmf,
    expected_accepted,
    expected_discarded_rows,
    expected_progress,
    expected_progress_with_stops,
    iid_survival,
    leviathan_expected_progress,
    leviathan_speedup,
    progress_pmf,
    reach_rates_from_survival,
    survival_from_pmf,
    survival_from_reach,
    time_per_token,
    tokens_per_second,
)

__all__ = [
    "PROBABILITY_TOLERANCE",
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
