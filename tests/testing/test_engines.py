"""The reference engine passes every check; every planted-bug engine fails with the right check named.

Statistics: the reference engine runs N = 400 samples of H = 4 tokens at alpha = 0.01 (the stated
detectable TV is printed in the failure message and asserted below 0.18); seeds are fixed, so each
verdict is deterministic, and a correct engine passes the law test with probability 0.99 over the choice
of seeds. The planted bugs run N = 100 with 16 traced requests (the white-box and RNG checks name them;
the black-box law test catches the distribution bugs too once N is large enough, asserted for
correction-from-p at N = 300, whose TV of about 0.2 exceeds the detectable TV there).
"""

from __future__ import annotations

import pytest

from specround.testing import ConformanceReport, conform
from specround.testing.engines import EXPECTED_FAILURE, PlantedBug, PlantedBugEngine, ReferenceEngine, ToyLM
from tests.testing.conftest import PROMPT, SETTING

ALPHA = 0.01


def run(
    engine: ReferenceEngine, target: ToyLM, draft: ToyLM, samples: int, traced: int = 24
) -> ConformanceReport:
    return conform(
        engine,
        target,
        settings=[SETTING],
        prompts=[PROMPT],
        samples=samples,
        horizon=4,
        alpha=ALPHA,
        draft=draft,
        trace_requests=traced,
    )


def test_the_reference_engine_passes_every_check(toy_target: ToyLM, toy_draft: ToyLM) -> None:
    report = run(ReferenceEngine(toy_target, toy_draft, k=3), toy_target, toy_draft, 400)
    law = report.result("law")
    assert report.passed, [r.detail for r in report.results if not r.passed]
    assert {r.check for r in report.results} >= {
        "law",
        "stop",
        "seed-reproducible",
        "batch-invariance",
        "q-sampled",
        "q-declared",
        "decisions",
        "processor-state",
    }
    assert law.detectable_tv is not None and law.detectable_tv < 0.18, law.detail
    assert law.tv_low == 0.0
    assert report.result("decisions").checked >= 24  # every traced round was re-derived


@pytest.mark.parametrize("bug", list(PlantedBug))
def test_each_planted_bug_fails_its_named_check(toy_target: ToyLM, toy_draft: ToyLM, bug: PlantedBug) -> None:
    report = run(PlantedBugEngine(bug, toy_target, toy_draft, k=3), toy_target, toy_draft, 100, traced=16)
    named = EXPECTED_FAILURE[bug]
    assert named in report.failed(), (bug, report.failed())
    assert not report.passed


def test_the_law_test_alone_catches_a_correction_from_p(toy_target: ToyLM, toy_draft: ToyLM) -> None:
    engine = PlantedBugEngine(PlantedBug.CORRECTION_FROM_P, toy_target, toy_draft, k=3)
    law = run(engine, toy_target, toy_draft, 300, traced=0).result("law")
    assert not law.passed
    assert law.tv_low is not None and law.tv_low > 0.0, law  # the TV interval excludes exactness
