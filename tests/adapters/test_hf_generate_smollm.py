"""specround.hf.generate: greedy equality with transformers' plain ``generate`` on SmolLM2, B = 1 and B = 3.

Shares the session's transformers load of the GGUF (``hf_smollm``) with the parity module.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.hf import SpecroundGenerateOutput, generate
from specround.hf.cli_run import rounded_copy

PROMPTS = [
    "Hi!",
    "Write the numbers from one to twenty, separated by commas.",
    "What is 2+2? Answer with a number only.",
]


@pytest.mark.real_model
def test_greedy_equals_transformers_generate_on_smollm(hf_smollm: Any, hf_tokenizer: Any) -> None:
    model, tokenizer = hf_smollm.model, hf_tokenizer
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
        )
        for p in PROMPTS
    ]
    rows = [tokenizer(t)["input_ids"] for t in texts]
    width = max(len(r) for r in rows)
    eos = tokenizer.eos_token_id
    ids = torch.tensor([[eos] * (width - len(r)) + r for r in rows])  # left padding
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    assert len(set(mask.sum(dim=1).tolist())) == 3  # three prompt lengths, left-padded
    reference = model.generate(ids, attention_mask=mask, max_new_tokens=16, do_sample=False, pad_token_id=eos)
    ended = [row.index(eos) for row in reference[:, ids.shape[1] :].tolist() if eos in row]
    assert ended and min(ended) < 15  # some row hits EOS early ("Hi!" and "2+2" end within 10 tokens)
    out = generate(
        model,
        ids,
        attention_mask=mask,
        prompt_lookup_num_tokens=4,
        log=MemoryEventLog(),
        max_new_tokens=16,
        do_sample=False,
        pad_token_id=eos,
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert torch.equal(out.sequences, reference)
    # B = 1 with the bfloat16-rounded copy as a separate assistant model.
    row = ids[1:2, ids.shape[1] - int(mask[1].sum()) :]
    single = model.generate(row, max_new_tokens=16, do_sample=False, pad_token_id=eos)
    alone = generate(
        model,
        row,
        assistant_model=rounded_copy(model, torch.bfloat16),
        k=4,
        log=MemoryEventLog(),
        max_new_tokens=16,
        do_sample=False,
        return_dict_in_generate=True,
    )
    assert isinstance(alone, SpecroundGenerateOutput)
    assert torch.equal(alone.sequences, single)
    assert alone.totals.accepted > 0
