"""A tiny random transformers Llama (vocabulary 8) and its perturbed copy as assistant, built offline."""

from __future__ import annotations

import copy
from typing import Any

import torch

EOS = 7


def tiny_hf_pair() -> tuple[Any, Any]:
    """(target, assistant): seeded random weights; the assistant is the target plus small noise."""
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=8,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=EOS,
        bos_token_id=None,
        pad_token_id=None,
        tie_word_embeddings=False,
    )
    target = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(40.0)  # peaked rows, like a trained model's
    assistant = copy.deepcopy(target)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in assistant.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=gen))
    return target, assistant
