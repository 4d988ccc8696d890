"""The law of generated tokens at T > 0 is the target's processed law, and a row ignores its batch.

Law test: 160 rows of one prompt, seeds 0..159, one batched call with a random assistant and K = 2; the
first two generated tokens (joint law, 8 x 8 cells) are tested by Pearson's chi-square at level 1e-3
against the exact law computed from the target with transformers' own logits processors (temperature,
top-k, top-p, repetition penalty, no-repeat n-grams). The test's power against the assistant's own law
(what a sampler that returned drafts unchecked would produce) is computed and required to be >= 0.99.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import GenerationConfig

from specround.adapters.memory_log import MemoryEventLog
from specround.hf import generate
from specround.model_check.chi_square import chi_square_test
from tests.hf._models import sharpen, tiny_llama

V = 8
PROMPT = [1, 2, 3, 1, 2]
FIELDS: dict[str, Any] = {
    "do_sample": True,
    "temperature": 0.8,
    "top_k": 6,
    "top_p": 0.95,
    "repetition_penalty": 1.3,
    "no_repeat_ngram_size": 2,
}
ROWS = 160


def _joint_law(model: Any) -> torch.Tensor:
    """[V * V] exact law of the first two tokens under FIELDS, by transformers' processors."""
    config, _ = model._prepare_generation_config(GenerationConfig(**FIELDS, eos_token_id=None))
    config._eos_token_tensor = None
    processors = model._get_logits_processor(
        generation_config=config, input_ids_seq_length=len(PROMPT), device="cpu", model_kwargs={}
    )

    def row(prefix: list[int]) -> torch.Tensor:
        ids = torch.tensor([prefix])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1].to(torch.float64)
        return torch.softmax(processors(ids, logits), dim=-1)[0]

    first = row(PROMPT)
    law = torch.zeros(V, V, dtype=torch.float64)
    for t1 in range(V):
        if first[t1] > 0:
            law[t1] = first[t1] * row([*PROMPT, t1])
    return law.flatten()


def test_first_tokens_follow_the_target_law() -> None:
    target = sharpen(tiny_llama(0, vocab=V, eos=V - 1), 20.0)
    assistant = sharpen(tiny_llama(3, vocab=V, eos=V - 1), 20.0)
    exact, wrong = _joint_law(target), _joint_law(assistant)
    ids = torch.tensor([PROMPT] * ROWS)
    out = generate(
        target,
        ids,
        assistant_model=assistant,
        k=2,
        seed=list(range(ROWS)),
        log=MemoryEventLog(),
        max_new_tokens=3,
        eos_token_id=None,
        **FIELDS,
    )
    assert isinstance(out, torch.Tensor)
    pairs = out[:, len(PROMPT)] * V + out[:, len(PROMPT) + 1]
    observed = torch.bincount(pairs, minlength=V * V).to(torch.float64)
    assert float(observed[exact == 0].sum()) == 0.0  # nothing outside the processed support
    test = chi_square_test(exact.tolist(), observed.tolist(), alpha=1e-3, alternatives={"q": wrong.tolist()})
    assert test.power["q"] >= 0.99
    assert test.passed, test


def test_a_row_gives_the_same_tokens_alone_and_in_a_batch() -> None:
    target, assistant = tiny_llama(0), tiny_llama(1)
    prompts = torch.tensor(
        [[0, 0, 3, 4, 7, 9], [11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 20, 21], [0, 5, 6, 7, 8, 9]]
    )
    mask = (prompts != 0).long()
    common: dict[str, Any] = {
        "assistant_model": assistant,
        "k": 3,
        "max_new_tokens": 8,
        "do_sample": True,
        "temperature": 1.2,
        "top_p": 0.9,
        "eos_token_id": None,
    }
    batch = generate(target, prompts, attention_mask=mask, seed=[4, 5, 6, 7], log=MemoryEventLog(), **common)
    alone = generate(target, prompts[2:3, 4:], seed=6, log=MemoryEventLog(), **common)
    assert isinstance(batch, torch.Tensor) and isinstance(alone, torch.Tensor)
    assert batch[2, 6:].tolist() == alone[0, 2:].tolist()
