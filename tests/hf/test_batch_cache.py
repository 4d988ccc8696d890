"""The batched, per-row-masked cache: each row's logits equal a plain forward over its tokens alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.errors import CacheProtocolError
from specround.hf.batch_cache import BatchedCausalLM
from tests.hf._models import tiny_llama, tiny_qwen2


def _alone(model: Any, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(input_ids=torch.tensor([tokens])).logits[0]
    return logits


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2])
def test_rows_commit_truncate_and_leave_independently(build: Any) -> None:
    model = build(0)
    cache = BatchedCausalLM(model, [0, 1, 2])
    prompts = {0: [1, 2, 3, 4, 5], 1: [7, 8], 2: [9, 10, 11]}
    out = cache.forward(prompts)
    for row, tokens in prompts.items():
        assert torch.allclose(out[row], _alone(model, tokens), atol=1e-5)
    cache.commit({row: len(t) for row, t in prompts.items()})
    out = cache.forward({0: [6, 7, 8], 1: [9], 2: [12, 13]}, rows="last")
    assert torch.allclose(out[0], _alone(model, [1, 2, 3, 4, 5, 6, 7, 8])[-1:], atol=1e-5)
    cache.commit({0: 1, 1: 1, 2: 0})  # each row keeps its own prefix of what it fed
    cache.compact([0, 2])  # row 1 leaves the batch
    assert cache.rows == [0, 2] and cache.tokens == {0: [1, 2, 3, 4, 5, 6], 2: [9, 10, 11]}
    out = cache.forward({0: [20, 21], 2: [30]})
    assert torch.allclose(out[0], _alone(model, [1, 2, 3, 4, 5, 6, 20, 21])[-2:], atol=1e-5)
    assert torch.allclose(out[2], _alone(model, [9, 10, 11, 30])[-1:], atol=1e-5)
    cache.commit({0: 2, 2: 1})
    cache.truncate(0, 6)
    cache.compact()
    assert cache.width == 6  # the holes are gone
    out = cache.forward({0: [40], 2: [41, 42]})
    assert torch.allclose(out[0], _alone(model, [1, 2, 3, 4, 5, 6, 40])[-1:], atol=1e-5)
    assert torch.allclose(out[2], _alone(model, [9, 10, 11, 30, 41, 42])[-2:], atol=1e-5)
    with pytest.raises(CacheProtocolError):
        cache.forward({0: [1]})  # the previous forward is not committed yet
