"""Tiny random transformers models built in-process (no download)."""

from __future__ import annotations

from typing import Any

import torch


def tiny_llama(seed: int, *, vocab: int = 96, eos: int = 5) -> Any:
    """A 2-layer random Llama (fp32, sdpa)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=eos,
        pad_token_id=0,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


def tiny_qwen2(seed: int, *, vocab: int = 96, eos: int = 5) -> Any:
    """A 2-layer random Qwen2 (fp32, sdpa, full attention)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=eos,
        pad_token_id=0,
        bos_token_id=1,
        use_sliding_window=False,
    )
    return Qwen2ForCausalLM(config).eval()


def sharpen(model: Any, factor: float) -> Any:
    """Scale the output head so the random model's rows are peaked (more draft acceptance, real EOS hits)."""
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(factor)
    return model
