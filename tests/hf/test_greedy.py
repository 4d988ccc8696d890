"""Greedy equality with transformers' own ``generate`` per row of a left-padded batch (T = 0)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.hf import SpecroundGenerateOutput, generate
from tests.hf._models import tiny_llama, tiny_qwen2

IDS = torch.tensor([[0, 0, 3, 4, 7, 9], [11, 12, 13, 14, 15, 16], [0, 0, 0, 0, 20, 21]])
MASK = (torch.arange(6)[None] >= torch.tensor([[2], [0], [4]])).long()


def _eos_early(model: Any) -> int:
    """A token transformers' greedy row 2 emits early (step 2..6) that rows 0 and 1 never emit."""
    plain = model.generate(IDS, attention_mask=MASK, max_new_tokens=10, do_sample=False, eos_token_id=None)
    new = plain[:, IDS.shape[1] :].tolist()
    for step in range(2, 7):
        token = new[2][step]
        if token not in new[2][:step] and token not in new[0] + new[1]:
            return int(token)
    raise AssertionError("no early end token in this model's greedy output")


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("draft", ["assistant", "lookup", "none"])
def test_greedy_rows_equal_transformers_generate(family: str, draft: str) -> None:
    build = tiny_llama if family == "llama" else tiny_qwen2
    model = build(0)
    eos = _eos_early(model)
    reference = model.generate(IDS, attention_mask=MASK, max_new_tokens=10, do_sample=False, eos_token_id=eos)
    extra: dict[str, Any] = {}
    if draft == "assistant":
        extra = {"assistant_model": build(1), "k": 3}
    elif draft == "lookup":
        extra = {"prompt_lookup_num_tokens": 3}
    out = generate(
        model,
        IDS,
        attention_mask=MASK,
        log=MemoryEventLog(),
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=eos,
        return_dict_in_generate=True,
        **extra,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert out.sequences.shape == reference.shape
    assert torch.equal(out.sequences, reference)
    # Row 2 ended on EOS and was padded with pad_token_id after it, as transformers does.
    assert out.finish_reasons[2] == "stop" and out.finish_reasons[1] != "stop"
    ended = reference[2, IDS.shape[1] :].tolist().index(eos) + 1
    assert out.totals.generated == 10 + 10 + ended
    assert reference[2, IDS.shape[1] + ended :].eq(0).all()


def test_an_assistant_equal_to_the_target_is_always_accepted() -> None:
    model = tiny_llama(0)
    out = generate(
        model,
        IDS,
        attention_mask=MASK,
        assistant_model=model,
        log=MemoryEventLog(),
        max_new_tokens=9,
        do_sample=False,
        eos_token_id=None,
        k=4,
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert out.totals.proposed > 0 and out.totals.accepted == out.totals.proposed
    # One target forward per step: 9 tokens in rounds of K + 1 = 5 -> 2 rounds per row.
    assert all(len(r) == 2 for r in out.rounds)


def test_each_step_is_one_target_forward_with_the_prompt_filled_in_the_first() -> None:
    model = tiny_llama(0)
    calls: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    out = generate(
        model,
        IDS,
        attention_mask=MASK,
        prompt_lookup_num_tokens=3,
        log=MemoryEventLog(),
        max_new_tokens=10,
        do_sample=False,
        eos_token_id=None,
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    assert len(calls) == max(len(r) for r in out.rounds)  # no forward of its own for the prompts
    assert calls[0] >= 6  # row 1's whole prompt is in the first verification


def test_the_assistants_own_draft_length_is_honoured_and_the_calls_overrides_it() -> None:
    model, assistant = tiny_llama(0), tiny_llama(1)
    assistant.generation_config.num_assistant_tokens = 2
    common: dict[str, Any] = {"max_new_tokens": 10, "do_sample": False, "eos_token_id": None}
    own = generate(
        model,
        IDS,
        attention_mask=MASK,
        assistant_model=assistant,
        log=MemoryEventLog(),
        return_dict_in_generate=True,
        **common,
    )
    call = generate(
        model,
        IDS,
        attention_mask=MASK,
        assistant_model=assistant,
        log=MemoryEventLog(),
        return_dict_in_generate=True,
        num_assistant_tokens=3,
        **common,
    )
    assert isinstance(own, SpecroundGenerateOutput) and isinstance(call, SpecroundGenerateOutput)
    assert {r.requested_k for rows in own.rounds for r in rows} <= {0, 1, 2}
    assert max(r.requested_k for rows in own.rounds for r in rows) == 2
    assert max(r.requested_k for rows in call.rounds for r in rows) == 3
    assert torch.equal(own.sequences, call.sequences)  # greedy: the draft length changes no token


def test_returned_tensors_are_ordinary_tensors_the_caller_may_modify() -> None:
    """The forwards run under inference mode; nothing handed back is an inference tensor."""
    out = generate(
        tiny_llama(0),
        IDS,
        attention_mask=MASK,
        prompt_lookup_num_tokens=3,
        log=MemoryEventLog(),
        max_new_tokens=4,
        do_sample=False,
        eos_token_id=None,
        return_dict_in_generate=True,
        output_scores=True,
        output_logits=True,
    )
    assert isinstance(out, SpecroundGenerateOutput) and out.scores and out.logits
    for tensor in (out.sequences, *out.scores, *out.logits):
        assert not tensor.is_inference()
        tensor.add_(0)  # an in-place update raises on an inference tensor
