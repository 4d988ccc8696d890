"""The transformers bridge on a tiny Llama built from the compact model's random weights (no download, no
GGUF): architecture parity with :class:`LlamaModel` and the bridge's K/V contract, in a few seconds.

Tolerance as in ``test_llama_cache``: the same fp32 sums in different kernels; ``ATOL = 1e-4`` on logits
below 10 against observed differences of ~1e-6.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.errors import CacheProtocolError, DraftIdOutOfVocabError
from specround.sampling.types import Layout
from specround.statemachine.model_ports import TargetModel, VerifyRequest

transformers = pytest.importorskip("transformers")

ATOL = 1e-4


@pytest.fixture(scope="module")
def hf_tiny(tiny: LlamaBundle) -> Any:
    from specround.adapters.hf import HFTarget

    cfg = tiny.config
    hf_config = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rope_theta=cfg.rope_theta,
        rms_norm_eps=cfg.rms_eps,
        max_position_embeddings=cfg.context_length,
        tie_word_embeddings=True,
    )
    model = transformers.LlamaForCausalLM(hf_config).to(torch.float32)
    w = tiny.model.weights
    state = {"model.embed_tokens.weight": w.embed, "model.norm.weight": w.norm, "lm_head.weight": w.lm_head}
    names = {
        "attn_norm": "input_layernorm",
        "wq": "self_attn.q_proj",
        "wk": "self_attn.k_proj",
        "wv": "self_attn.v_proj",
        "wo": "self_attn.o_proj",
        "ffn_norm": "post_attention_layernorm",
        "w_gate": "mlp.gate_proj",
        "w_up": "mlp.up_proj",
        "w_down": "mlp.down_proj",
    }
    for i, layer in enumerate(w.layers):
        for ours, theirs in names.items():
            state[f"model.layers.{i}.{theirs}.weight"] = layer.tensors()[ours]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in m for m in missing)
    return HFTarget(model, model_id="hf:tiny")


def test_architecture_parity(tiny: LlamaBundle, hf_tiny: Any) -> None:
    tokens = [1, 7, 3, 3, 0, 5, 2, 6, 4]
    with torch.no_grad():
        theirs = hf_tiny.model(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(tiny.model.logits(torch.tensor(tokens)), theirs, atol=ATOL, rtol=0)


@pytest.mark.parametrize("layout", [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER])
def test_bridge_matches_the_compact_target_round_by_round(
    tiny: LlamaBundle, hf_tiny: Any, layout: Layout
) -> None:
    ours = LlamaTarget(tiny.model, model_id=tiny.model_id)
    hf: TargetModel = hf_tiny
    rid = f"tiny-{layout.value}"
    output = [4]  # a one-token prompt: nothing to prefill
    for target in (ours, hf):
        target.prefill({rid: output[:-1]})
    for drafts, keep, abort in (((1, 2, 3), 2, False), ((5,), 0, True), ((6, 6), 1, False), ((), 1, False)):
        results = []
        for target in (ours, hf):
            if layout is Layout.RETAINED_FRONTIER:
                target.materialize_frontier({rid: output[-1]})
            (res,) = target.verify([VerifyRequest(rid, layout, output[-1], drafts)])
            results.append(res)
        torch.testing.assert_close(results[0].logits, results[1].logits, atol=ATOL, rtol=0)
        assert results[0].computed_rows == results[1].computed_rows
        for target, res in zip((ours, hf), results, strict=True):
            if abort:
                target.discard(rid, res.branch)
            else:
                target.commit(rid, res.branch, keep)
        if not abort:
            output = output + list(drafts[: keep - 1]) + [7]
        assert hf.committed_token_ids(rid) == ours.committed_token_ids(rid) == tuple(output[:-1])
        assert hf.retained_frontier(rid) == ours.retained_frontier(rid)
    hf.release(rid)


def test_bridge_refusals(hf_tiny: Any) -> None:
    hf: TargetModel = hf_tiny
    hf.prefill({"x": [1, 2]})
    with pytest.raises(CacheProtocolError):
        hf.prefill({"x": [1]})
    with pytest.raises(DraftIdOutOfVocabError):
        hf.verify([VerifyRequest("x", Layout.REPLAY_FRONTIER, 3, (9,))])
    with pytest.raises(CacheProtocolError):
        hf.verify([VerifyRequest("x", Layout.RETAINED_FRONTIER, 3, ())])
    (res,) = hf.verify([VerifyRequest("x", Layout.REPLAY_FRONTIER, 3, (1,))])
    hf.commit("x", res.branch, 2)
    with pytest.raises(CacheProtocolError):
        hf.commit("x", res.branch, 2)
    assert hf.committed_token_ids("x") == (1, 2, 3, 1)
    hf_tiny.truncate("x", 1)
    assert hf.committed_token_ids("x") == (1,)
    hf.release("x")
