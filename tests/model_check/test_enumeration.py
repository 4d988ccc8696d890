"""Exact enumeration oracle through the real sampler (INV-2, INV-3, INV-10).

Contract: contract#prefix-induction, contract#exact-enumeration.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from specround.model_check.check_results import single_threaded
from specround.model_check.enumeration import (
    GRID,
    JOINT_TOLERANCE,
    FixtureEnumeration,
    _bisect,
    enumerate_fixtures,
)
from specround.model_check.fixture_tables import STOPPED, build_tables
from specround.model_check.fixtures import named_fixtures, random_fixture, random_fixtures
from specround.model_check.worked_examples import summary_checks, three_symbol_checks


@pytest.fixture(scope="module")
def named() -> Iterator[list[FixtureEnumeration]]:
    with single_threaded():
        yield enumerate_fixtures([build_tables(f) for f in named_fixtures()])


def _failures(results: list[FixtureEnumeration]) -> list[str]:
    return [f"{r.name}: {c.check} ({c.error})" for r in results for c in r.checks if not c.passed]


def test_named_fixtures_pass_every_check(named: list[FixtureEnumeration]) -> None:
    assert _failures(named) == []
    required = {
        "speculative joint = target joint",
        "acceptance = min(1, p/q)",
        "acceptance = 1 - TV(p, q)",
        "INV-2 progress = min(A + 1, H)",
        "INV-3 draws = reached tests + terminal",
        "INV-10 emitted = accepted drafts + terminal",
        "INV-10 bracket = located interval",
        "unreached uniforms and interval ends leave the outcome unchanged",
        "rows_along = per-prefix rows",
        "softmax parity (max-shift vs online)",
    }
    for result in named:
        assert result.joint_error <= JOINT_TOLERANCE
        assert required <= {c.check for c in result.checks}


def test_two_token_k3_joint_covers_all_sixteen_sequences(named: list[FixtureEnumeration]) -> None:
    result = next(r for r in named if "contract#bonus-token" in r.name)
    assert len(result.tables.target_joint) == 16  # V ** horizon, no stops
    assert set(result.speculative_joint) == set(result.tables.target_joint)
    # Every first rejection and the bonus occur: A takes every value 0..3 with positive probability.
    assert sorted(result.accepted_pmf) == [0, 1, 2, 3]
    assert all(mass > 0.0 for mass in result.accepted_pmf.values())


def test_stop_fixture_pads_stopped_sequences_in_both_joints(named: list[FixtureEnumeration]) -> None:
    result = next(r for r in named if r.name == "stops and budget")
    stopped = [s for s in result.tables.target_joint if STOPPED in s]
    assert stopped, "the fixture must exercise stops"
    # The budget of 3 ends every sequence by its third token (INV-2: nothing is emitted after a stop).
    assert all(s[3] == STOPPED for s in result.tables.target_joint)
    assert result.joint_error <= JOINT_TOLERANCE
    assert result.emitted_pmf.keys() <= {1, 2, 3}


def test_worked_examples(named: list[FixtureEnumeration]) -> None:
    three = next(r for r in named if "contract#worked-coupling" in r.name)
    summary = next(r for r in named if "contract#worked-round" in r.name)
    checks = three_symbol_checks(three) + summary_checks(summary)
    assert [c.check for c in checks if not c.passed] == []
    assert summary.emitted_pmf == pytest.approx({1: 0.4, 2: 0.24, 3: 0.36}, abs=1e-12)


def test_random_fixtures_sample() -> None:
    with single_threaded():
        results = enumerate_fixtures([build_tables(f) for f in random_fixtures(120, seed=7)])
    assert _failures(results) == []
    assert max(r.joint_error for r in results) <= JOINT_TOLERANCE
    # Self-drafting fixtures feed p == q rows: the sampler must accept every such test.
    self_draft = [r for r in results if "self_draft" in r.tables.fixture.tags]
    assert self_draft
    assert any(c.check == "p == q never corrects" for r in self_draft for c in r.checks)
    # Some fixtures stop inside the horizon (stop sequences or budgets).
    assert any(STOPPED in key for r in results for key in r.tables.target_joint)


@pytest.mark.slow
def test_one_thousand_random_fixtures() -> None:
    # The full family of `specround check` (seed 0): 1,000 fixtures, V <= 4, K <= 3, random processors.
    with single_threaded():
        results = enumerate_fixtures([build_tables(f) for f in random_fixtures(1000, seed=0)])
    assert len(results) == 1000
    assert _failures(results) == []
    kinds = {p["kind"] for r in results for p in r.tables.fixture.target_processors}
    assert {"top_k", "top_p", "min_p", "grammar", "stop_sequences", "repetition_penalty"} <= kinds
    assert any(r.tables.fixture.remaining is not None for r in results)


def test_random_fixtures_are_deterministic() -> None:
    assert random_fixture(3, 17) == random_fixture(3, 17)
    assert random_fixture(3, 17) != random_fixture(3, 18)


def test_bisection_finds_grid_thresholds_exactly() -> None:
    thresholds = torch.tensor([0, 1, 12345, GRID // 3, GRID - 1, GRID], dtype=torch.int64)
    calls = 0

    def predicate(points: torch.Tensor) -> torch.Tensor:
        nonlocal calls
        calls += 1
        return points >= thresholds

    assert torch.equal(_bisect(predicate, 6), thresholds)
    assert calls <= 54
