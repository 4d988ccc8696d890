"""Verification layouts: inputs, extraction and visibility.

Contract: contract#frontier-layouts, contract#layout-snapshot, contract#verification.
"""

from __future__ import annotations

import hashlib

import pytest
import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    InvalidRequestError,
    ShapeMismatchError,
    UnknownLayoutError,
)
from specround.sampling.layouts import (
    extract_verification,
    replays_frontier,
    retains_frontier,
    verification_inputs,
    verify_row_count,
    visibility_mask,
)
from specround.sampling.types import Layout

VOCAB = 16
CONDITIONING = [1, 4, 7, 9, 3, 12]  # contract#layout-snapshot: T = 6, frontier 12 at position 5
DRAFTS = [8, 6, 2]


def target_row(prefix: list[int]) -> torch.Tensor:
    """A deterministic stand-in for the target: logits of the next token given the whole prefix. [V]"""
    seed = int.from_bytes(hashlib.sha256(repr(prefix).encode()).digest()[:8], "little")
    return torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def run_target(layout: Layout) -> tuple[torch.Tensor, list[tuple[int, int]], torch.Tensor | None]:
    """Compile one verification call of the snapshot (contract#layout-snapshot) under ``layout``; run it."""
    inputs = verification_inputs(layout, CONDITIONING[-1], DRAFTS, start_position=len(CONDITIONING) - 1)
    committed = CONDITIONING[: inputs.positions[0]]  # the cache precondition of the layout
    logits = torch.stack(
        [target_row(committed + list(inputs.input_ids[: j + 1])) for j in range(len(inputs.input_ids))]
    )  # [rows, V]
    new_kv = list(zip(inputs.input_ids, inputs.positions, strict=True))  # KV(token, position) handles
    retained = target_row(CONDITIONING) if layout is Layout.RETAINED_FRONTIER else None
    return logits, new_kv, retained


def test_worked_snapshot_inputs_and_positions() -> None:
    replay = verification_inputs("replay_frontier", 12, DRAFTS, start_position=5)
    assert replay.input_ids == (12, 8, 6, 2)
    assert replay.positions == (5, 6, 7, 8)
    assert replay.scored_positions == (6, 7, 8, 9)  # target logit events
    retained = verification_inputs(Layout.RETAINED_FRONTIER, 12, DRAFTS, start_position=5)
    assert retained.input_ids == (8, 6, 2)
    assert retained.positions == (6, 7, 8)
    assert retained.scored_positions == (7, 8, 9)  # p_1 (position 6) was retained


def test_the_one_decision_and_what_derives_from_it() -> None:
    assert replays_frontier("replay_frontier") and not retains_frontier(Layout.REPLAY_FRONTIER)
    assert retains_frontier("retained_frontier") and not replays_frontier(Layout.RETAINED_FRONTIER)
    assert [verify_row_count(Layout.REPLAY_FRONTIER, k) for k in range(4)] == [1, 2, 3, 4]
    assert [verify_row_count("retained_frontier", k) for k in range(4)] == [0, 1, 2, 3]
    for layout in Layout:
        for k in range(4):
            inputs = verification_inputs(layout, 12, DRAFTS[:k], start_position=5)
            assert len(inputs.input_ids) == verify_row_count(layout, k)
            assert inputs.first_position == (5 if replays_frontier(layout) else 6)  # also with no rows
    with pytest.raises(UnknownLayoutError):
        replays_frontier("tree")
    with pytest.raises(UnknownLayoutError):
        verify_row_count("tree", 1)


def test_worked_snapshot_commit_after_two_accepts() -> None:
    """contract#layout-snapshot: A = 2, correction 11: commit positions 5..7, discard 8, 11 is F."""
    logits, new_kv, _ = run_target(Layout.REPLAY_FRONTIER)
    v = extract_verification(Layout.REPLAY_FRONTIER, logits, new_kv, k=3)
    accepted = 2
    committed = list(v.kv_for_replayed_frontier) + list(v.kv_for_draft[:accepted])
    discarded = list(v.kv_for_draft[accepted:])
    assert [pos for _, pos in committed] == [5, 6, 7]
    assert [tok for tok, _ in committed] == [12, 8, 6]
    assert discarded == [(2, 8)]
    output_after = [*CONDITIONING, 8, 6, 11]
    cache_after = CONDITIONING[:-1] + [tok for tok, _ in committed]
    assert len(output_after) == 9 and len(cache_after) == 8
    assert cache_after == output_after[:-1]  # K_c_after == T_after - 1, by token identity


def test_both_layouts_extract_the_same_logical_tuple() -> None:
    """contract#logical-tuple: ([p_1..p_K], p_{K+1}, [KV(d_1)..KV(d_K)]) whatever the layout."""
    replay_logits, replay_kv, _ = run_target(Layout.REPLAY_FRONTIER)
    retained_logits, retained_kv, p1 = run_target(Layout.RETAINED_FRONTIER)
    a = extract_verification("replay_frontier", replay_logits, replay_kv, k=3)
    b = extract_verification("retained_frontier", retained_logits, retained_kv, k=3, retained_p1=p1)
    expected_p = torch.stack([target_row(CONDITIONING + DRAFTS[:i]) for i in range(4)])  # p_1..p_4
    for v in (a, b):
        assert v.k == 3
        assert torch.equal(v.p_for_draft, expected_p[:3])
        assert torch.equal(v.p_for_bonus, expected_p[3])
        assert torch.equal(v.p_rows, expected_p)
        assert list(v.kv_for_draft) == [(8, 6), (6, 7), (2, 8)]
    assert list(a.kv_for_replayed_frontier) == [(12, 5)]
    assert list(b.kv_for_replayed_frontier) == []
    # Negative control: the off-by-one slice (dropping the replayed row's logits) scores the wrong events.
    assert not torch.equal(replay_logits[1:], expected_p[:3])


def test_tensor_kv_rows_and_empty_drafts() -> None:
    kv = torch.arange(4 * 2 * 3).reshape(4, 2, 3)  # [rows, ...]: rows on dim 0
    logits = torch.randn(4, VOCAB)
    v = extract_verification("replay_frontier", logits, kv, k=3)
    assert torch.equal(v.kv_for_replayed_frontier, kv[:1]) and torch.equal(v.kv_for_draft, kv[1:])
    w = extract_verification("retained_frontier", logits[1:], kv[1:], k=3, retained_p1=logits[0])
    assert torch.equal(w.kv_for_replayed_frontier, kv[1:][:0]) and torch.equal(w.kv_for_draft, kv[1:])
    assert torch.equal(w.p_rows, v.p_rows)
    # k = 0: replay scores only the bonus row; retained needs no call at all.
    z = extract_verification("replay_frontier", logits[:1], kv[:1], k=0)
    assert z.p_for_draft.shape == (0, VOCAB) and torch.equal(z.p_for_bonus, logits[0])
    r = extract_verification("retained_frontier", logits[:0], [], k=0, retained_p1=logits[0])
    assert r.p_for_draft.shape == (0, VOCAB) and torch.equal(r.p_for_bonus, logits[0])


def test_p_rows_is_the_targets_block_itself_and_its_parts_are_views_of_it() -> None:
    """replay_frontier hands the target's [k+1, V] block on without a copy; retained joins p_1 to it."""
    logits = torch.randn(4, VOCAB)
    kv = list(range(4))
    for k in (3, 0):
        rows = logits[: k + 1]
        v = extract_verification("replay_frontier", rows, kv[: k + 1], k=k)
        assert torch.equal(v.p_rows, rows) and v.p_rows.shape == (k + 1, VOCAB) and v.k == k
        assert v.p_rows.data_ptr() == rows.data_ptr()  # no copy
        assert v.p_for_draft.shape == (k, VOCAB)
        assert v.p_for_draft.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()
        assert v.p_for_bonus.data_ptr() == rows[k].data_ptr()
    w = extract_verification("retained_frontier", logits[1:], kv[1:], k=3, retained_p1=logits[0])
    assert torch.equal(w.p_rows, logits) and w.p_rows.data_ptr() != logits.data_ptr()
    assert torch.equal(w.p_for_draft, logits[:3]) and torch.equal(w.p_for_bonus, logits[3])


def test_extraction_refuses_wrong_shapes_and_layouts() -> None:
    logits = torch.randn(4, VOCAB)
    kv = list(range(4))
    with pytest.raises(UnknownLayoutError):
        extract_verification("tree", logits, kv, k=3)
    with pytest.raises(ShapeMismatchError):
        extract_verification("replay_frontier", logits, kv, k=3, retained_p1=logits[0])
    with pytest.raises(ShapeMismatchError):
        extract_verification("replay_frontier", logits[:3], kv, k=3)
    with pytest.raises(ShapeMismatchError):
        extract_verification("replay_frontier", logits, kv[:3], k=3)
    with pytest.raises(ShapeMismatchError):
        extract_verification("retained_frontier", logits[1:], kv[1:], k=3)
    with pytest.raises(ShapeMismatchError):
        extract_verification("retained_frontier", logits, kv, k=3, retained_p1=logits[0])
    with pytest.raises(ShapeMismatchError):
        extract_verification("retained_frontier", logits[1:], kv[1:], k=3, retained_p1=logits[0, :5])
    with pytest.raises(ShapeMismatchError):
        extract_verification("retained_frontier", logits[1:], kv[1:], k=3, retained_p1=logits[0].double())
    with pytest.raises(ShapeMismatchError):
        extract_verification("replay_frontier", logits, kv, k=-1)
    with pytest.raises(ShapeMismatchError):
        extract_verification("replay_frontier", logits[0], kv, k=0)
    with pytest.raises(UnknownLayoutError):
        verification_inputs("tree", 1, [2], 0)
    with pytest.raises(DraftIdOutOfVocabError):
        verification_inputs("replay_frontier", 1, [-2], 0)
    with pytest.raises(InvalidRequestError):
        verification_inputs("replay_frontier", 1, [2], -1)


def test_retained_rectangular_mask_of_0x04c() -> None:
    """Prefix at 0..2, drafts at 3..5: three query rows against six logical key positions."""
    inputs = verification_inputs("retained_frontier", 30, [31, 32, 33], start_position=2)
    assert inputs.positions == (3, 4, 5)
    mask = visibility_mask([0, 0, 0], inputs.positions, [0] * 6, range(6))
    expected = torch.tensor(
        [
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(mask, expected)


def test_replay_mask_sees_the_frontier_once() -> None:
    inputs = verification_inputs("replay_frontier", 30, [31, 32, 33], start_position=2)
    assert inputs.positions == (2, 3, 4, 5)
    keys = list(range(2)) + list(inputs.positions)  # past cache 0..1, then the new rows 2..5
    mask = visibility_mask([0] * 4, inputs.positions, [0] * 6, keys)
    assert torch.equal(mask, torch.tril(torch.ones(4, 6, dtype=torch.bool), diagonal=2))
    assert mask[:, 2].all()  # every row sees KV(x_t), and only one key has position 2
    assert keys.count(2) == 1


def test_packed_requests_do_not_see_each_other() -> None:
    """contract#packed-requests: request A at positions 3..5 and B at 8..9, packed into one call."""
    query_requests = [0, 0, 0, 1, 1]
    query_positions = [3, 4, 5, 8, 9]
    key_requests = [0] * 6 + [1] * 10  # A: past 0..2 + new 3..5; B: past 0..7 + new 8..9
    key_positions = list(range(6)) + list(range(10))
    mask = visibility_mask(
        torch.tensor(query_requests), torch.tensor(query_positions), torch.tensor(key_requests), key_positions
    )
    assert mask.shape == (5, 16)
    assert not mask[:3, 6:].any()  # A never reads B, although B's positions 0..5 are <= A's
    assert not mask[3:, :6].any()  # B never reads A, although A's positions are all <= B's
    assert torch.equal(mask[:3, :6], torch.tril(torch.ones(3, 6, dtype=torch.bool), diagonal=3))
    assert torch.equal(mask[3:, 6:], torch.tril(torch.ones(2, 10, dtype=torch.bool), diagonal=8))
    # Position order alone would have let B read A: the request term is load-bearing.
    position_only = torch.tensor(key_positions).unsqueeze(0) <= torch.tensor(query_positions).unsqueeze(1)
    assert position_only[3:, :6].all()


def test_visibility_refuses_unpaired_inputs() -> None:
    with pytest.raises(ShapeMismatchError):
        visibility_mask([0, 0], [1], [0], [0])
    with pytest.raises(ShapeMismatchError):
        visibility_mask(torch.zeros(2, 2), torch.zeros(2, 2), [0], [0])
