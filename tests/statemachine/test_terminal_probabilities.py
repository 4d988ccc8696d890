"""The terminal p and q a decided round records: the host path reads what the tensor path reads."""

from __future__ import annotations

import pytest
import torch

from specround.sampling.exact import decide
from specround.sampling.types import PAD_ID, SamplerBatch
from specround.statemachine.batching import _terminal_pq, terminal_probabilities


def _batch(n: int, k: int, vocab: int, dtype: torch.dtype, seed: int) -> SamplerBatch:
    gen = torch.Generator().manual_seed(seed)
    p = torch.softmax(2 * torch.randn(n, k + 1, vocab, generator=gen, dtype=torch.float64), -1).to(dtype)
    q = torch.softmax(2 * torch.randn(n, k, vocab, generator=gen, dtype=torch.float64), -1).to(dtype)
    drafts = torch.randint(0, vocab, (n, k), generator=gen)
    lens = torch.randint(0, k + 1, (n,), generator=gen)
    drafts[torch.arange(k)[None, :] >= lens[:, None]] = PAD_ID  # positions beyond each draft length
    # some rows stop on a token, some hit their budget: every terminal kind shows up
    stop_ids = torch.full((n, k + 1, 1), PAD_ID, dtype=torch.int64)
    stop_ids[::3, :, 0] = 0
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=drafts,
        draft_lens=lens,
        stop_ids=stop_ids,
        remaining=torch.randint(1, k + 3, (n,), generator=gen),
        seeds=torch.arange(n, dtype=torch.int64) + seed,
        accept_counters=torch.zeros(n, dtype=torch.int64),
        terminal_counters=torch.zeros(n, dtype=torch.int64),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("k", [0, 1, 4])
@pytest.mark.parametrize("n", [1, 3, 24])  # up to 8 rows are read element by element, more in numpy
def test_host_terminal_probabilities_equal_the_tensor_path(dtype: torch.dtype, k: int, n: int) -> None:
    kinds: set[int] = set()
    for seed in range(6 if n > 3 else 24):
        batch = _batch(n, k, 16, dtype, seed)
        decision = decide(batch)
        output_ids, emitted = decision.output_ids.tolist(), decision.emitted.tolist()
        terminal_row, terminal = decision.terminal_row.tolist(), decision.terminal.tolist()
        kinds.update(terminal)
        p_host, q_host = _terminal_pq(batch, decision, output_ids, emitted, terminal_row, terminal)
        p_t, q_t = terminal_probabilities(batch, decision)
        assert p_host == p_t.tolist()  # bit for bit: the same elements, widened the same way
        assert q_host == q_t.tolist()
        assert all(type(v) is float for v in p_host + q_host)
    assert len(kinds) >= (2 if k else 1)  # corrections and bonuses both exercised where drafts exist
