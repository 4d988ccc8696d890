"""Greedy speculation on SmolLM2 equals plain greedy decoding token for token (every proposer, both layouts).

The reference is computed independently of the K/V machinery: each token is the argmax of a fresh
full-sequence forward (no cache). The speculative runs go through the serving loop, the controller and the
packed verification; INV-1 / INV-5 are checked after every round, and for the n-gram runs the logits the
committed cache produces are compared with a fresh prefill of the same tokens.
"""

from __future__ import annotations

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import NGramProposer, early_exit_proposer, reduced_precision_proposer
from specround.audit import audit_log
from specround.sampling.processors import sampling_chain
from specround.sampling.types import Layout
from specround.serving import FixedDraftLength, GenerationRequest, RoundOutcome, ServingLoop
from specround.statemachine.controller import RoundController
from specround.statemachine.model_ports import Proposer, VerifyRequest

pytestmark = pytest.mark.real_model

TOKENS = 24
MESSAGE = "Repeat after me, twice: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def prompt(smollm: LlamaBundle) -> tuple[int, ...]:
    assert smollm.tokenizer is not None and smollm.chat is not None
    text = smollm.chat.render([{"role": "user", "content": MESSAGE}])
    return tuple(smollm.tokenizer.encode(text, add_bos=False))


@pytest.fixture(scope="module")
def reference(smollm: LlamaBundle, prompt: tuple[int, ...]) -> tuple[int, ...]:
    """Plain greedy decoding by full-sequence forwards (no K/V cache at all)."""
    assert smollm.tokenizer is not None
    stops = set(smollm.tokenizer.stop_ids)
    out: list[int] = []
    while len(out) < TOKENS:
        logits = smollm.model.logits(torch.tensor(prompt + tuple(out)))[-1]  # [V]
        out.append(int(logits.argmax()))
        if out[-1] in stops:
            break
    return tuple(out)


def make(name: str, target: LlamaTarget) -> Proposer:
    if name == "ngram":
        return NGramProposer(target.vocab_size)
    if name == "early_exit":
        return early_exit_proposer(target, 24)  # shallower exits of SmolLM2 rarely agree
    return reduced_precision_proposer(target, torch.bfloat16)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER])
@pytest.mark.parametrize("name", ["ngram", "early_exit", "draft_model"])
def test_greedy_speculation_equals_plain_greedy(
    smollm: LlamaBundle, prompt: tuple[int, ...], reference: tuple[int, ...], name: str, layout: Layout
) -> None:
    assert smollm.tokenizer is not None
    target = LlamaTarget(smollm.model, model_id=smollm.model_id)
    log = MemoryEventLog()
    loop = ServingLoop(
        RoundController(log), target, make(name, target), policy=FixedDraftLength(4), layout=layout
    )
    rounds: list[RoundOutcome] = []

    def on_round(outcome: RoundOutcome) -> None:
        rounds.append(outcome)
        state = loop.state(outcome.request_id)
        if not state.finished:  # INV-1, INV-5 after every round
            assert target.committed_token_ids(outcome.request_id) == state.output[:-1]
            if name == "ngram":
                fresh = smollm.model.logits(torch.tensor(state.output))[-1]  # [V]
                rid = outcome.request_id
                if layout is Layout.RETAINED_FRONTIER:
                    target.materialize_frontier({rid: state.output[-1]})
                    cached = target.materialize_frontier({rid: state.output[-1]})[rid]
                else:
                    (res,) = target.verify([VerifyRequest(rid, layout, state.output[-1], ())])
                    cached = res.logits[0]
                    target.discard(rid, res.branch)
                torch.testing.assert_close(cached, fresh, rtol=1e-3, atol=1e-3)

    loop.on_round = on_round
    rid = loop.submit(
        GenerationRequest(
            prompt,
            TOKENS,
            seed=0,
            processors=sampling_chain(target.vocab_size, temperature=0),
            stop_token_ids=smollm.tokenizer.stop_ids,
        )
    )
    loop.run()
    assert loop.state(rid).generated == reference
    assert sum(r.accepted for r in rounds) > 0, "no draft was ever accepted: the comparison proves little"
    assert len(rounds) < len(reference)
    assert audit_log(log).ok
