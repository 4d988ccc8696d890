"""``RoundController.step_batch``: the engine's tensors in, the transactions of the per-request step out."""

from __future__ import annotations

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.errors import ShapeMismatchError
from specround.sampling.types import PAD_ID, TerminalKind
from specround.statemachine.controller import RoundController
from specround.statemachine.rounds import RoundInput, RoundStatus
from tests.statemachine._synthetic import log_fingerprint, random_input

V = 16


def _open(ctl: RoundController, n: int, *, max_new_tokens: int = 12) -> list[str]:
    return [
        ctl.open_request(
            [1, 2, 3 + i],
            seed=100 + i,
            max_new_tokens=max_new_tokens,
            vocab_size=V,
            request_id=f"r{i}",
            stop_token_ids=[0],
        ).request_id
        for i in range(n)
    ]


def _pad(inputs: list[RoundInput], width: int, fill: float) -> tuple[torch.Tensor, ...]:
    """Batch tensors of per-request inputs; entries beyond each draft length hold ``fill`` (never read)."""
    n = len(inputs)
    draft_ids = torch.full((n, width), 7, dtype=torch.int32)
    lens = torch.tensor([len(x.draft_ids) for x in inputs], dtype=torch.int64)
    q = torch.full((n, width, V), fill, dtype=torch.float64)
    p = torch.full((n, width + 1, V), fill, dtype=torch.float64)
    for b, x in enumerate(inputs):
        k = len(x.draft_ids)
        if k:
            draft_ids[b, :k] = torch.tensor(list(x.draft_ids))
            assert x.q_rows is not None
            q[b, :k] = x.q_rows
        p[b, : k + 1] = x.p_rows
    return draft_ids, lens, q, p


@pytest.mark.parametrize("fill", [0.0, float("nan")])
def test_step_batch_publishes_what_the_per_request_step_publishes(fill: float) -> None:
    """Same requests, same rows: identical logs (hash for hash) and results that match the tensors."""
    by_round, by_batch = RoundController(MemoryEventLog()), RoundController(MemoryEventLog())
    ids = _open(by_round, 6)
    assert _open(by_batch, 6) == ids
    generator = torch.Generator().manual_seed(5)
    for step in range(8):
        live = [r for r in ids if not by_round.state(r).finished]
        if not live:
            break
        inputs = [random_input(by_round, r, (step + i) % 5, generator) for i, r in enumerate(live)]
        expected = by_round.step(inputs)
        draft_ids, lens, q, p = _pad(inputs, 4, fill)
        out = by_batch.step_batch(
            live, draft_ids, lens, q, p, proposal_draws=[len(x.draft_ids) for x in inputs]
        )
        assert [r.status for r in out] == [r.status for r in expected]
        assert all(r.status is RoundStatus.PUBLISHED for r in out)
        for b, (got, want) in enumerate(zip(out, expected, strict=True)):
            assert got.emitted_ids == want.emitted_ids
            assert got.state == want.state
            assert out.emitted_ids[b, : len(want.emitted_ids)].tolist() == list(want.emitted_ids)
            assert (out.emitted_ids[b, len(want.emitted_ids) :] == PAD_ID).all()
            assert int(out.accepted[b]) == want.accepted
            assert want.kv is not None and int(out.keep[b]) == want.kv.keep
            assert int(out.new_frontier[b]) == want.kv.new_frontier
            assert bool(out.finished[b]) == want.finished
            assert want.terminal is not None
            assert int(out.terminal[b]) == int(TerminalKind[want.terminal.upper()])
    assert log_fingerprint(by_batch.log) == log_fingerprint(by_round.log)


def test_a_malformed_batch_is_refused_before_any_state_moves() -> None:
    ctl = RoundController(MemoryEventLog())
    ids = _open(ctl, 2)
    before = log_fingerprint(ctl.log)
    ok_ids = torch.zeros((2, 1), dtype=torch.int64)
    lens = torch.ones(2, dtype=torch.int64)
    q = torch.full((2, 1, V), 1.0 / V, dtype=torch.float64)
    p = torch.full((2, 2, V), 1.0 / V, dtype=torch.float64)
    bad = [
        (ok_ids.float(), lens, q, p),  # float draft ids
        (ok_ids, lens, q, p[:, :1]),  # p without the bonus row
        (ok_ids, lens, q.float(), p),  # q and p of different dtypes
        (ok_ids, lens[:1], q, p),  # one length for two rows
        (ok_ids, lens, None, p),  # drafts without q
        (ok_ids, lens, q.tolist(), p),  # not a tensor
    ]
    for draft_ids, draft_lens, q_rows, p_rows in bad:
        with pytest.raises(ShapeMismatchError):
            ctl.step_batch(ids, draft_ids, draft_lens, q_rows, p_rows)  # type: ignore[arg-type]
    with pytest.raises(ShapeMismatchError):
        ctl.step_batch(ids, ok_ids, lens, q, p, proposal_draws=[1])
    assert log_fingerprint(ctl.log) == before
    out = ctl.step_batch(ids, ok_ids, lens, q, p)  # nothing was left in flight
    assert out.published.all()


def test_a_bad_row_is_refused_alone() -> None:
    """A row with a draft length past K, an unknown request or an out-of-vocabulary draft aborts alone."""
    ctl = RoundController(MemoryEventLog())
    ids = _open(ctl, 3)
    draft_ids = torch.tensor([[1, 2], [3, V + 4], [5, 6]])
    lens = torch.tensor([2, 2, 3])
    q = torch.full((3, 2, V), 1.0 / V, dtype=torch.float64)
    p = torch.full((3, 3, V), 1.0 / V, dtype=torch.float64)
    out = ctl.step_batch(ids, draft_ids, lens, q, p)
    assert out.published.tolist() == [True, False, False]
    assert out[1].error is not None and out[2].error is not None
    assert int(out.keep[1]) == 0 and int(out.terminal[2]) == -1
    assert (out.emitted_ids[1:] == PAD_ID).all()
    out = ctl.step_batch(["r1", "nope"], draft_ids[:2, :1], lens[:2] - 1, q[:2, :1], p[:2, :2])
    assert out.published.tolist() == [True, False]
    assert ctl.state("r1").generation == 1 and ctl.state("r2").generation == 0
