"""transformers' assisted generation under the kit, on a tiny random Llama (no download, no GGUF).

N = 120 samples of H = 3 tokens per engine at alpha = 0.01 with 12 traced requests (fixed seeds: each
verdict is deterministic; a correct engine passes the law test with probability 0.99 over the seeds).
The detectable TV at this N is large (about 0.2): this is a smoke test of the adapter and its traces,
not the real measurement, which is a CLI run (``specround conform transformers``).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.testing import SamplingSettings, TransformersLogits, conform
from specround.testing.engine_contract import EngineRequest
from tests.testing.hf_models import EOS, tiny_hf_pair

pytest.importorskip("transformers")

PROMPT = (1, 2, 3, 1, 2)
TOP_K = SamplingSettings(temperature=1.0, top_k=5, eos_token_id=EOS)
NUCLEUS = SamplingSettings(temperature=0.8, top_p=0.9, repetition_penalty=1.3, eos_token_id=EOS)


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    return tiny_hf_pair()


@pytest.mark.parametrize(
    ("mode", "setting"), [("assistant", NUCLEUS), ("prompt-lookup", TOP_K)], ids=["assistant", "lookup"]
)
def test_transformers_passes_the_contract_checks(
    pair: tuple[Any, Any], mode: str, setting: SamplingSettings
) -> None:
    from specround.testing.hf_engine import TransformersEngine

    target, assistant = pair
    engine = (
        TransformersEngine(target, assistant=assistant)
        if mode == "assistant"
        else TransformersEngine(target, prompt_lookup=3)
    )
    draft = TransformersLogits(assistant) if mode == "assistant" else None
    report = conform(
        engine,
        TransformersLogits(target),
        settings=[setting],
        prompts=[PROMPT],
        samples=120,
        horizon=3,
        draft=draft,
        trace_requests=12,
    )
    assert report.passed, [(r.check, r.detail) for r in report.results if not r.passed]
    checks = {r.check: r for r in report.results}
    assert checks["decisions"].checked >= 12 and checks["processor-state"].checked >= 12
    if mode == "assistant":
        assert checks["q-sampled"].checked > 0  # q compared with the rows the assistant sampled from


def test_tracing_restores_the_model_and_torch(pair: tuple[Any, Any]) -> None:
    from specround.testing.hf_engine import TransformersEngine

    target, assistant = pair
    multinomial = torch.multinomial
    engine = TransformersEngine(target, assistant=assistant)
    request = EngineRequest(PROMPT, NUCLEUS, 3, 3)
    out, rounds = engine.trace(request)
    assert "_get_candidate_generator" not in vars(target)
    assert torch.multinomial is multinomial
    assert out == engine.generate([request])[0]  # tracing does not change the output
    assert sum(len(r.emitted) for r in rounds) == len(out)
    assert all(r.p_rows.shape[0] == len(r.draft_ids) + 1 for r in rounds)


def test_num_assistant_tokens_reaches_the_assistant(pair: tuple[Any, Any]) -> None:
    """transformers reads the draft length from the assistant's config: the engine sets it there."""
    import copy

    from specround.errors import InvalidRequestError
    from specround.testing.hf_engine import TransformersEngine

    target, shared = pair
    assistant = copy.deepcopy(shared)  # the engine writes the assistant's generation_config
    engine = TransformersEngine(target, assistant=assistant, num_assistant_tokens=2)
    calls: list[str] = []
    hooks = [
        target.register_forward_pre_hook(lambda *_: calls.append("T")),
        assistant.register_forward_pre_hook(lambda *_: calls.append("A")),
    ]
    try:
        engine.generate([EngineRequest(prompt=PROMPT, settings=TOP_K, seed=0, horizon=12)])
    finally:
        for hook in hooks:
            hook.remove()
    drafts_per_round = [len(run) for run in "".join(calls).split("T") if run]
    assert drafts_per_round and max(drafts_per_round) == 2  # transformers' default would draft 20
    with pytest.raises(InvalidRequestError, match="needs an assistant"):
        TransformersEngine(target, prompt_lookup=3, num_assistant_tokens=2)
