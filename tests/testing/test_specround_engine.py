"""specround's own serving loop under the kit: the compact Llama with a draft model and with n-gram lookup.

N = 150 samples of H = 4 tokens (K = 2, so most samples span two rounds) at alpha = 0.01, fixed seeds;
the ``audit`` row is specround's own audit of every log the runs wrote (INV-9, INV-8, INV-10).
"""

from __future__ import annotations

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget, tiny_llama
from specround.adapters.proposers import ModelProposer, NGramProposer
from specround.statemachine.model_ports import Proposer
from specround.testing import CompactLlamaLogits, SamplingSettings, conform
from specround.testing.specround_engine import SpecroundEngine

SETTING = SamplingSettings(temperature=0.9, top_k=5, top_p=0.9, repetition_penalty=1.3, eos_token_id=7)


@pytest.mark.parametrize("proposer", ["model", "ngram"])
def test_specround_passes_every_check(tiny: LlamaBundle, proposer: str) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    draft = tiny_llama(seed=1)

    def make() -> Proposer:
        if proposer == "ngram":
            return NGramProposer(8, max_ngram=2)
        return ModelProposer(LlamaTarget(draft.model, model_id=draft.model_id))

    engine = SpecroundEngine(target, make, k=2, name=f"specround:{proposer}")
    report = conform(
        engine,
        CompactLlamaLogits(tiny.model),
        settings=[SETTING],
        prompts=[(1, 2, 3, 1, 2)],
        samples=150,
        horizon=4,
        batch_size=150,
    )
    assert report.passed, [(r.check, r.detail) for r in report.results if not r.passed]
    assert report.result("audit").passed
