"""Speculation through the serving loop samples the target's law, on the tiny model.

Contract: contract#sampler-law, contract#exact-enumeration, contract#monte-carlo.

For every proposer (n-gram lookup, early exit, a separate draft model) and both layouts, the first K + 2
generated tokens of many requests are compared with the exact target joint, computed by enumerating the
tiny model's processed conditionals (top-k, top-p, temperature, a stateful repetition penalty and a stop
token all on). K = 2, so every sequence spans at least two rounds.

Statistics (stated per the contributing rules):

* N = 600 requests per configuration (seeds fixed, so each outcome is deterministic), run in batched
  steps of 300 requests over the memory log.
* Pearson's chi-square over the joint's cells, pooled (smallest first) until every cell expects >= 5.
* Level 1e-3 per configuration; six configurations, so a correct sampler passes all of them with
  probability >= 0.994 over the choice of seeds.
* Power: against the stated alternative "the same chain at temperature 1.25 x 0.9" (a mismatched
  processor), computed from the non-central chi-square with lambda = N sum (p_alt - p)^2 / p over the
  pooled cells (about 0.99 here); the test asserts power >= 0.95, so it would catch that mistake.
"""

from __future__ import annotations

from collections import Counter

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget, tiny_llama
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import ModelProposer, NGramProposer, early_exit_proposer
from specround.model_check.chi_square import chi_square_test
from specround.model_check.sequence_law import exact_sequence_law
from specround.sampling.processors import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.serving import FixedDraftLength, GenerationRequest, ServingLoop
from specround.statemachine.controller import RoundController
from specround.statemachine.model_ports import Proposer

V = 8
K = 2
HORIZON = K + 2
PROMPT = (1, 2, 3, 1, 2)
STOP = 7
N = 600
BATCH = 300
LEVEL = 1e-3
TEMPERATURE = 0.9


def policy_chain(temperature: float = TEMPERATURE) -> ProcessorChain:
    return sampling_chain(V, temperature=temperature, top_k=5, top_p=0.9, repetition_penalty=1.3)


def exact_joint(model: LlamaBundle, chain: ProcessorChain) -> dict[tuple[int, ...], float]:
    """P(first HORIZON tokens) under the target alone; a sequence ends early at the stop token."""
    return exact_sequence_law(model.model.logits, chain, PROMPT, HORIZON, STOP)


@pytest.fixture(scope="module")
def laws(tiny: LlamaBundle) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]]:
    return exact_joint(tiny, policy_chain()), exact_joint(tiny, policy_chain(1.25 * TEMPERATURE))


@pytest.fixture(scope="module")
def draft_bundle() -> LlamaBundle:
    return tiny_llama(seed=1)


def proposer_for(name: str, target: LlamaTarget, draft_bundle: LlamaBundle) -> Proposer:
    if name == "ngram":
        return NGramProposer(V, max_ngram=2)
    if name == "early_exit":
        return early_exit_proposer(target, 1)
    return ModelProposer(LlamaTarget(draft_bundle.model, model_id=draft_bundle.model_id))


@pytest.mark.slow
@pytest.mark.parametrize("layout", [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER])
@pytest.mark.parametrize("name", ["ngram", "early_exit", "draft_model"])
def test_speculative_joint_matches_the_target_joint(
    tiny: LlamaBundle,
    draft_bundle: LlamaBundle,
    laws: tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]],
    name: str,
    layout: Layout,
) -> None:
    law, alternative = laws
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = proposer_for(name, target, draft_bundle)
    counts: Counter[tuple[int, ...]] = Counter()
    drafted = 0
    base_seed = 1_000_000 * (1 + ["ngram", "early_exit", "draft_model"].index(name))
    for start in range(0, N, BATCH):
        loop = ServingLoop(
            RoundController(MemoryEventLog()), target, proposer, policy=FixedDraftLength(K), layout=layout
        )
        ids = [
            loop.submit(
                GenerationRequest(
                    PROMPT, HORIZON, seed=base_seed + i, processors=policy_chain(), stop_token_ids=(STOP,)
                )
            )
            for i in range(start, start + BATCH)
        ]
        finished = loop.run()
        drafted += loop.stats.proposed
        counts.update(finished[rid].generated for rid in ids)
    assert drafted > N // 2, "the proposer must actually draft for the test to mean anything"
    assert set(counts) <= set(law), f"sequences outside the target's support: {set(counts) - set(law)}"
    cells = sorted(law)
    test = chi_square_test(
        [law[c] for c in cells],
        [counts[c] for c in cells],
        LEVEL,
        {"temperature x1.25": [alternative.get(c, 0.0) for c in cells]},
    )
    detail = f"chi2 = {test.statistic:.1f}, df = {test.df}, p = {test.p_value:.3g}, power = {test.power}"
    assert test.df >= 10, detail
    assert test.power["temperature x1.25"] >= 0.95, detail
    assert test.passed, detail
