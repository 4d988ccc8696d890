"""A batch without stop columns (``stop_ids`` [B, 0]) decides exactly like one with all-PAD_ID stop sets."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specround.bench.sampler_bench import make_sampler_inputs
from specround.sampling.exact import decide
from specround.sampling.types import PAD_ID, SamplerDecision


def _fields(decision: SamplerDecision) -> dict[str, torch.Tensor]:
    return {f.name: getattr(decision, f.name) for f in dataclasses.fields(decision)}


@pytest.mark.parametrize("seed", range(4))
def test_no_stop_columns_equals_all_pad_stop_sets(seed: int) -> None:
    batch = make_sampler_inputs(16, 4, 50, seed=seed)
    # Budgets 1..4 so that the length cap ends some rounds inside the prefix and some at the terminal.
    remaining = torch.arange(16, dtype=torch.int64) % 5 + 1
    lens = torch.arange(16, dtype=torch.int64) % 5  # ragged drafts 0..4
    drafts = torch.where(torch.arange(4)[None, :] < lens[:, None], batch.draft_ids, PAD_ID)
    base = dataclasses.replace(batch, remaining=remaining, draft_lens=lens, draft_ids=drafts)
    empty = decide(dataclasses.replace(base, stop_ids=torch.empty(16, 0, dtype=torch.int64)))
    for pad in (torch.full((16, 1), PAD_ID), torch.full((16, 5, 2), PAD_ID)):
        reference = decide(dataclasses.replace(base, stop_ids=pad.to(torch.int64)))
        for name, value in _fields(reference).items():
            assert torch.equal(value.nan_to_num(-7.0), _fields(empty)[name].nan_to_num(-7.0)), name
    assert bool(empty.finished.any()) and not bool(empty.stopped_by_token.any())
