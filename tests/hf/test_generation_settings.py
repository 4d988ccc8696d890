"""GenerationConfig field by field: each mapped processor equals transformers' own on the same scores.

Parity: for every field, the processed row of specround's chain equals ``softmax`` of transformers'
``LogitsProcessor`` output on the same scores and history, within 1e-6. Unsupported fields are refused
with the fields named.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import GenerationConfig

from specround.adapters.memory_log import MemoryEventLog
from specround.errors import InvalidRequestError, UnsupportedGenerationConfigError
from specround.hf import generate
from specround.hf.generation_settings import settings_from_config
from specround.hf.processors import build_chain
from tests.hf._models import tiny_llama

V = 96
HISTORY = [3, 4, 7, 3, 4, 9, 12, 3]
"""Prompt (5 tokens) then 3 generated tokens."""
PROMPT = 5

CASES: list[dict[str, Any]] = [
    {"do_sample": True, "temperature": 0.7},
    {"do_sample": True, "top_k": 7},
    {"do_sample": True, "top_p": 0.8, "top_k": 0},
    {"do_sample": True, "min_p": 0.05, "top_k": 0},
    {"do_sample": True, "repetition_penalty": 1.7, "top_k": 0},
    {"do_sample": True, "no_repeat_ngram_size": 2, "top_k": 0},
    {"do_sample": True, "min_new_tokens": 5, "eos_token_id": [5, 6], "top_k": 0},
    {"do_sample": True, "min_length": 10, "eos_token_id": 5, "top_k": 0},
    {"do_sample": True, "suppress_tokens": [1, 2, 40], "top_k": 0},
    {"do_sample": True, "bad_words_ids": [[8], [3, 4], [12, 3, 50]], "top_k": 0},
    {"do_sample": False, "repetition_penalty": 1.3},
    {"do_sample": True, "temperature": 1.3, "top_k": 20, "top_p": 0.9, "repetition_penalty": 1.2},
]


def _transformers_row(
    model: Any, fields: dict[str, Any], ids: torch.Tensor, scores: torch.Tensor
) -> torch.Tensor:
    config, _ = model._prepare_generation_config(GenerationConfig(**fields))
    config._eos_token_tensor = (
        torch.tensor(config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id])
        if config.eos_token_id is not None
        else None
    )
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=PROMPT, device="cpu", model_kwargs={}
    )
    out = processors(ids, scores.clone())
    if not config.do_sample:
        winner = out.argmax(dim=-1)
        return torch.nn.functional.one_hot(winner, V).to(torch.float64)
    return torch.softmax(out.to(torch.float64), dim=-1)


@pytest.mark.parametrize("fields", CASES, ids=lambda f: ",".join(sorted(f)))
def test_each_field_matches_the_transformers_processor(fields: dict[str, Any]) -> None:
    model = tiny_llama(0)
    config, _ = model._prepare_generation_config(GenerationConfig(**fields))
    settings = settings_from_config(config)
    chain = build_chain(settings, V, input_length=PROMPT, prompt_length=PROMPT)
    chain.advance_many(HISTORY)
    generator = torch.Generator().manual_seed(7)
    scores = torch.randn(1, V, generator=generator) * 3
    ids = torch.tensor([HISTORY])
    expected = _transformers_row(model, fields, ids, scores)
    got = chain.distribution(scores.to(torch.float64))
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)


def test_unsupported_fields_are_refused_by_name() -> None:
    model = tiny_llama(0)
    ids = torch.tensor([[3, 4, 7]])
    with pytest.raises(UnsupportedGenerationConfigError) as caught:
        generate(model, ids, log=MemoryEventLog(), num_beams=2, typical_p=0.5, max_new_tokens=3)
    assert caught.value.fields == ["num_beams", "typical_p"]
    with pytest.raises(UnsupportedGenerationConfigError) as caught:
        generate(model, ids, log=MemoryEventLog(), max_new_tokens=3, not_a_field=1)
    assert caught.value.fields == ["not_a_field"]
    with pytest.raises(UnsupportedGenerationConfigError):
        generate(model, ids, log=MemoryEventLog(), max_new_tokens=3, logits_processor=[object()])
    with pytest.raises(InvalidRequestError, match="left-padded"):
        generate(model, ids, attention_mask=torch.tensor([[1, 1, 0]]), log=MemoryEventLog(), max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match="stop_strings needs the tokenizer"):
        generate(model, ids, log=MemoryEventLog(), max_new_tokens=3, stop_strings=["ab"])


def test_settings_change_the_output_as_transformers_sampling_would() -> None:
    """Greedy with each stateful field set: equal to transformers' greedy with the same field."""
    model = tiny_llama(0)
    ids = torch.tensor([[44, 79, 3, 4, 7, 3, 4, 9]])  # its greedy continuation repeats itself
    plain = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None)
    for fields in (
        {"repetition_penalty": 2.0},
        {"repetition_penalty": 0.3},
        {"no_repeat_ngram_size": 2},
        {"min_new_tokens": 4, "eos_token_id": int(plain[0, 10])},
        {"bad_words_ids": [[int(plain[0, 9])], [63, 86, 63]]},
        {"suppress_tokens": [int(plain[0, 8])]},
    ):
        reference = model.generate(
            ids, max_new_tokens=12, do_sample=False, **({"eos_token_id": None} | fields)
        )
        out = generate(
            model,
            ids,
            log=MemoryEventLog(),
            max_new_tokens=12,
            do_sample=False,
            **({"eos_token_id": None} | fields),
        )
        assert torch.equal(out, reference), fields  # type: ignore[arg-type]
        assert not torch.equal(reference, plain), fields
