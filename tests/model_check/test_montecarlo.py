"""Seeded Monte Carlo through the real `decide` (contract#monte-carlo; INV-3 RNG accounting)."""

from __future__ import annotations

import pytest

from specround.model_check.check_results import single_threaded
from specround.model_check.enumeration import FixtureEnumeration, enumerate_fixtures
from specround.model_check.fixture_tables import build_tables
from specround.model_check.fixtures import named_fixtures
from specround.model_check.montecarlo import ALTERNATIVE, run_monte_carlo
from specround.model_check.mutants import mutation_named
from specround.model_check.mutants.decisions import bonus_from_q as wrong_bonus
from specround.sampling.exact import round_uniforms
from specround.sampling.types import SamplerBatch, SamplerDecision

# N = 20,000 rounds per fixture, alpha = 1e-3 per fixture (5 fixtures: family-wise <= 0.5 %). Every pooled
# cell expects >= 5 samples, so Pearson's statistic is close to chi-square(df). The seed is fixed, so the
# outcome is reproducible; the level and the power below describe the design.
SAMPLES = 20_000
ALPHA = 1e-3


@pytest.fixture(scope="module")
def exact() -> list[FixtureEnumeration]:
    with single_threaded():
        return enumerate_fixtures([build_tables(f) for f in named_fixtures()])


def test_named_fixtures_fit_the_target_joint(exact: list[FixtureEnumeration]) -> None:
    with single_threaded():
        with mutation_named(ALTERNATIVE).applied():
            wrong = enumerate_fixtures([r.tables for r in exact])
        for result, alternative in zip(exact, wrong, strict=True):
            mc = run_monte_carlo(
                result.tables,
                result.tables.target_joint,
                result.emitted_pmf,
                samples=SAMPLES,
                seed=1,
                alpha=ALPHA,
                alternative=alternative.speculative_joint,
            )
            assert [c.check for c in mc.checks if not c.passed] == [], result.name
            assert mc.unexpected == 0
            assert mc.test.samples == SAMPLES
            # The test has real power: the wrong correction law is rejected with probability ~1.
            assert mc.test.power[ALTERNATIVE] > 0.99


def test_monte_carlo_rejects_a_wrong_sampler(exact: list[FixtureEnumeration]) -> None:
    def bonus_from_q(batch: SamplerBatch) -> SamplerDecision:
        accept, terminal = round_uniforms(batch)
        return wrong_bonus(batch, accept, terminal)

    result = next(r for r in exact if "contract#oracle" in r.name)
    with single_threaded():
        mc = run_monte_carlo(
            result.tables,
            result.tables.target_joint,
            result.emitted_pmf,
            samples=SAMPLES,
            seed=1,
            alpha=ALPHA,
            decide_rng=bonus_from_q,
        )
    assert not mc.test.passed
    assert mc.test.p_value < ALPHA
