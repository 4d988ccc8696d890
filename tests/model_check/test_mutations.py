"""Oracle smoke tests: every decision mutation of the registry (a real-function wrapper) fails the oracle."""

from __future__ import annotations

import pytest

from specround.model_check.check_results import single_threaded
from specround.model_check.enumeration import FixtureEnumeration, enumerate_fixtures
from specround.model_check.fixture_tables import FixtureTables, build_tables
from specround.model_check.fixtures import named_fixtures, random_fixtures
from specround.model_check.mutants import ORACLE_MUTATIONS, Mutation, mutation_named

# The check each mutation must trip besides the joint (the one that names the failure class).
NAMED_CHECK = {
    "correction from p": "correction = normalised max(p - q, 0)",
    "bonus from q": "bonus = p_{K+1}",
    "continue after rejection": "unreached uniforms and interval ends leave the outcome unchanged",
    "shifted logit row": "acceptance = min(1, p/q)",
    "stop inside the prefix ignored": "INV-2 progress = min(A + 1, H)",
}


@pytest.fixture(scope="module")
def tables() -> list[FixtureTables]:
    with single_threaded():
        return [build_tables(f) for f in named_fixtures() + random_fixtures(20, seed=11)]


def _failed(results: list[FixtureEnumeration], check: str) -> list[str]:
    return [r.name for r in results for c in r.checks if c.check == check and not c.passed]


def test_every_mutation_is_named() -> None:
    assert set(NAMED_CHECK) == {m.name for m in ORACLE_MUTATIONS}


@pytest.mark.parametrize("mutation", ORACLE_MUTATIONS, ids=lambda m: m.name)
def test_mutation_breaks_the_joint(mutation: Mutation, tables: list[FixtureTables]) -> None:
    with single_threaded(), mutation.applied() as reach:
        results = enumerate_fixtures(tables)
    assert reach.reached, f"{mutation.name} was never called by the oracle"
    assert _failed(results, "speculative joint = target joint"), f"{mutation.name} went unnoticed"
    check = NAMED_CHECK[mutation.name]
    assert _failed(results, check), f"{mutation.name} did not trip {check!r}"


def test_stop_mutation_is_caught_on_the_stop_fixture(tables: list[FixtureTables]) -> None:
    stop_fixture = [t for t in tables if t.fixture.name == "stops and budget"]
    with single_threaded(), mutation_named("stop inside the prefix ignored").applied():
        results = enumerate_fixtures(stop_fixture)
    assert results[0].joint_error > 1e-3
