"""The ledger section of `specround check`: closed forms, K choice, refusals, E[T]/E[G].

Contract: contract#speedup-ledger.
"""

from __future__ import annotations

from specround.model_check.check_results import single_threaded
from specround.model_check.enumeration import enumerate_fixtures
from specround.model_check.fixture_tables import build_tables
from specround.model_check.fixtures import named_fixtures
from specround.model_check.ledger_checks import enumeration_ledger_checks, ledger_checks


def test_every_ledger_check_passes() -> None:
    results = ledger_checks()
    assert [r.check for r in results if not r.passed] == []
    refusals = [r for r in results if r.check.startswith("refuses")]
    assert len(refusals) == 5
    assert all("Error" in r.detail for r in refusals)
    best = {r.check: r.detail for r in results if r.check.startswith("best K")}
    assert "K* = 3 (interior)" in best["best K for front-loaded"]
    assert "K* = 4 (boundary)" in best["best K for back-loaded"]


def test_enumerated_progress_matches_the_ledger() -> None:
    with single_threaded():
        results = enumerate_fixtures([build_tables(f) for f in named_fixtures()])
    (check,) = enumeration_ledger_checks(results)
    assert check.passed
    assert check.detail == "4 fixtures without stops"
