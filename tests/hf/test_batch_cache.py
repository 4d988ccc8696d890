"""The batched, per-row-masked cache: each row's logits equal a plain forward over its tokens alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specround.errors import CacheProtocolError, InvalidRequestError
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


def test_tidy_cuts_the_tail_keeps_small_holes_and_compacts_large_ones() -> None:
    model = tiny_llama(0)
    cache = BatchedCausalLM(model, [0, 1])
    tokens = {0: [1, 2, 3, 4], 1: [7, 8, 9, 10]}
    cache.forward(tokens, rows="none")
    cache.commit({0: 4, 1: 4})
    cache.forward({0: [11, 12, 13], 1: [14, 15, 16]}, rows="none")
    cache.commit({0: 1, 1: 2})  # column 6 is kept by no row, column 5 by row 1 only
    cache.tidy()
    assert cache.width == 6  # only the unused tail went
    assert all(layer.keys.shape[2] == 6 for layer in cache.cache.layers)
    out = cache.forward({0: [20], 1: [21, 22]})
    assert torch.allclose(out[0], _alone(model, [1, 2, 3, 4, 11, 20])[-1:], atol=1e-5)
    assert torch.allclose(out[1], _alone(model, [7, 8, 9, 10, 14, 15, 21, 22])[-2:], atol=1e-5)
    cache.commit({0: 1, 1: 2})
    for row in (0, 1):
        cache.truncate(row, 2)  # 6 holes over rows of 2 columns: within MIN_HOLES, so kept
    cache.tidy()
    assert cache.width == 2  # the columns past every row's last one are cut
    cache.forward({0: list(range(30, 50)), 1: [50]}, rows="none")
    cache.commit({0: 20, 1: 1})
    cache.truncate(0, 2)  # row 0 drops its 20 columns; only row 1 holds column 2
    cache.tidy()
    assert cache.width == 3
    cache.forward({0: [60], 1: [61]}, rows="none")
    cache.commit({0: 1, 1: 1})
    cache.tidy()
    assert cache.width == 4  # no holes above the budget: row 0 holds columns 0, 1 and 3
    cache.forward({0: [62] * 20, 1: [63] * 20}, rows="none")
    cache.commit({0: 20, 1: 20})
    for row in (0, 1):
        cache.truncate(row, 4)
    cache.forward({0: [64], 1: [65]}, rows="none")  # column 24: 20 holes below it in every row
    cache.commit({0: 1, 1: 1})
    cache.tidy()
    assert cache.width == 5  # the holes passed the budget: compacted
    out = cache.forward({0: [66], 1: [67]})
    assert torch.allclose(out[0], _alone(model, [1, 2, 60, 62, 64, 66])[-1:], atol=1e-5)
    assert torch.allclose(out[1], _alone(model, [7, 8, 50, 61, 65, 67])[-1:], atol=1e-5)


def test_a_row_with_a_hole_sees_only_its_own_columns_around_it() -> None:
    """Contiguous rows take the slice path of the mask, a row with a hole the column-list path."""
    model = tiny_llama(0)
    cache = BatchedCausalLM(model, [0, 1])
    cache.forward({0: [1, 2], 1: [3, 4]}, rows="none")
    cache.commit({0: 2, 1: 2})
    cache.forward({0: [5, 6, 7], 1: [8]}, rows="none")
    cache.commit({0: 1, 1: 1})  # row 0 keeps column 2; columns 3 and 4 are no row's
    cache.forward({0: [9], 1: [10]}, rows="none")
    cache.commit({0: 1, 1: 1})  # column 5: row 0 now holds 0, 1, 2, 5 (a hole at 3..4)
    cache.forward({0: [11], 1: [12]}, rows="none")  # column 6: row 1 holds 0, 1, 2, 5, 6 likewise
    cache.commit({0: 0, 1: 1})
    out = cache.forward({0: [13], 1: [14, 15]})
    assert torch.allclose(out[0], _alone(model, [1, 2, 5, 9, 13])[-1:], atol=1e-5)
    assert torch.allclose(out[1], _alone(model, [3, 4, 8, 10, 12, 14, 15])[-2:], atol=1e-5)


def test_tails_return_only_the_asked_positions_and_head_only_their_columns() -> None:
    model = tiny_llama(0)
    head_rows: list[int] = []
    model.get_output_embeddings().register_forward_hook(
        lambda _m, args, _out: head_rows.append(args[0].shape[0] * args[0].shape[1])
    )
    cache = BatchedCausalLM(model, [0, 1])
    feeds = {0: [1, 2, 3, 4, 5, 6], 1: [7, 8, 9]}
    out = cache.forward(feeds, tails={0: 2, 1: 1})
    assert head_rows == [2 * 3]  # columns 2 (row 1's last), 4 and 5 (row 0's last two), for both rows
    assert set(out) == {0, 1} and out[0].shape[0] == 2 and out[1].shape[0] == 1
    assert torch.allclose(out[0], _alone(model, feeds[0])[-2:], atol=1e-5)
    assert torch.allclose(out[1], _alone(model, feeds[1])[-1:], atol=1e-5)
    cache.commit({0: 6, 1: 3})
    assert cache.forward({0: [10], 1: [11]}, tails={0: 0, 1: 0}) == {}
    cache.commit({0: 1, 1: 1})
    with pytest.raises(InvalidRequestError):
        cache.forward({0: [12]}, tails={0: 2})  # more than it fed
