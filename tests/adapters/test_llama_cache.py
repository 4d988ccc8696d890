"""The compact Llama as a target model, on the tiny random-weights model: per-request K/V with commit and
discard, both layouts, packed verification and the visibility predicate (contract#verification,
contract#staging; INV-1, INV-5).

Tolerance: the same logits computed with different row counts go through differently blocked fp32 matrix
kernels, so they agree only up to summation order. On this model (|logits| < 10, two layers of width 16)
the observed differences are ~2e-6; ``ATOL = 1e-4`` leaves a 50x margin while any indexing error (a shifted
row, a missing or duplicated key) moves logits by O(1).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specround.adapters.llama import LlamaBundle, LlamaModel, LlamaTarget, tiny_llama
from specround.errors import CacheProtocolError, DraftIdOutOfVocabError, InvalidRequestError
from specround.sampling.types import Layout
from specround.statemachine.model_ports import TargetModel, VerifyRequest

ATOL = 1e-4
REPLAY = Layout.REPLAY_FRONTIER
RETAINED = Layout.RETAINED_FRONTIER


def fresh(bundle: LlamaBundle, tokens: list[int]) -> torch.Tensor:
    """Logits [T, V] of the whole sequence with no cache (row i scores the token after tokens[:i+1])."""
    return bundle.model.logits(torch.tensor(tokens))


def start_round(target: LlamaTarget, rid: str, output: list[int], layout: Layout, drafts: list[int]):  # type: ignore[no-untyped-def]
    if layout is RETAINED:
        target.materialize_frontier({rid: output[-1]})
    (result,) = target.verify([VerifyRequest(rid, layout, output[-1], tuple(drafts))])
    return result


def test_protocol_conformance(tiny_target: LlamaTarget) -> None:
    target: TargetModel = tiny_target
    assert target.vocab_size == 8
    assert target.model_id.startswith("tiny-llama")


@pytest.mark.parametrize("layout", [REPLAY, RETAINED])
@pytest.mark.parametrize("accepted", [0, 1, 3])
def test_round_commits_frontier_and_accepted_drafts(tiny: LlamaBundle, layout: Layout, accepted: int) -> None:
    """INV-1/INV-5: committed == output[:-1] after the round; rejected draft rows are never committed."""
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    output = [1, 5, 2, 7, 3]
    drafts = [4, 4, 6]
    target.prefill({"r": output[:-1]})
    assert target.committed_token_ids("r") == tuple(output[:-1])
    result = start_round(target, "r", output, layout, drafts)
    assert result.logits.shape == (len(drafts) + 1, 8)
    assert result.computed_rows == (len(drafts) + 1 if layout is REPLAY else len(drafts))
    assert result.branch.token_ids == (output[-1], *drafts)
    # Logical rows: row i scores the token after F, d_1..d_i, in both layouts (contract#logical-tuple).
    expected = fresh(tiny, output + drafts)[len(output) - 1 :]
    torch.testing.assert_close(result.logits, expected, atol=ATOL, rtol=0)

    correction = 0
    target.commit("r", result.branch, accepted + 1)
    published = output + drafts[:accepted] + [correction]
    assert target.committed_token_ids("r") == tuple(published[:-1])
    assert target.retained_frontier("r") is None

    # The committed rows serve the next round exactly like a fresh prefill of the same tokens.
    nxt = start_round(target, "r", published, layout, [2])
    torch.testing.assert_close(
        nxt.logits, fresh(tiny, [*published, 2])[len(published) - 1 :], atol=ATOL, rtol=0
    )


def test_both_layouts_publish_the_same_cache(tiny: LlamaBundle) -> None:
    """contract#staging: layout-specific rows, layout-independent successor."""
    committed = {}
    for layout in (REPLAY, RETAINED):
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        target.prefill({"r": [3, 1, 4]})
        result = start_round(target, "r", [3, 1, 4, 1], layout, [5, 9 % 8, 2])
        target.commit("r", result.branch, 3)
        committed[layout] = target.committed_token_ids("r")
    assert committed[REPLAY] == committed[RETAINED] == (3, 1, 4, 1, 5, 1)


def test_discard_keeps_committed_rows_and_retained_frontier(tiny: LlamaBundle) -> None:
    """F-1..F-5 aborts: a discarded branch leaves C and the retained frontier row as they were."""
    calls = []

    class Counting(LlamaModel):
        def forward(self, token_ids, positions, attention, **kw):  # type: ignore[no-untyped-def,override]
            calls.append(int(token_ids.shape[0]))
            return super().forward(token_ids, positions, attention, **kw)

    target = LlamaTarget(Counting(tiny.config, tiny.model.weights), model_id="counting")
    target.prefill({"r": [2, 3]})
    p1 = target.materialize_frontier({"r": 6})["r"]
    (aborted,) = target.verify([VerifyRequest("r", RETAINED, 6, (1, 1))])
    target.discard("r", aborted.branch)
    assert target.committed_token_ids("r") == (2, 3)
    assert target.retained_frontier("r") == 6
    before = len(calls)
    again = target.materialize_frontier({"r": 6})["r"]  # idempotent: nothing recomputed
    assert len(calls) == before
    assert torch.equal(again, p1)
    (retry,) = target.verify([VerifyRequest("r", RETAINED, 6, (4,))])
    torch.testing.assert_close(retry.logits, fresh(tiny, [2, 3, 6, 4])[2:], atol=ATOL, rtol=0)
    target.commit("r", retry.branch, 1)  # A = 0: only the retained frontier becomes committed
    assert target.committed_token_ids("r") == (2, 3, 6)


def test_retained_keep_zero_leaves_frontier_retained(tiny_target: LlamaTarget) -> None:
    tiny_target.prefill({"r": [1]})
    tiny_target.materialize_frontier({"r": 2})
    (res,) = tiny_target.verify([VerifyRequest("r", RETAINED, 2, (3,))])
    tiny_target.commit("r", res.branch, 0)
    assert tiny_target.committed_token_ids("r") == (1,)
    assert tiny_target.retained_frontier("r") == 2


def test_packed_verify_equals_separate_runs(tiny: LlamaBundle) -> None:
    """Three requests with different prompt and draft lengths in one forward (contract#packed-requests)."""
    prompts = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [7, 7], "c": [0, 3, 5, 1]}
    drafts = {"a": (2, 2), "b": (1, 4, 6, 0), "c": ()}
    layouts = {"a": REPLAY, "b": RETAINED, "c": RETAINED}
    packed = LlamaTarget(tiny.model, model_id=tiny.model_id)
    packed.prefill({rid: p[:-1] for rid, p in prompts.items()})
    packed.materialize_frontier({rid: prompts[rid][-1] for rid in ("b", "c")})
    results = packed.verify(
        [VerifyRequest(rid, layouts[rid], prompts[rid][-1], drafts[rid]) for rid in prompts]
    )
    assert [r.request_id for r in results] == ["a", "b", "c"]
    for res in results:
        alone = LlamaTarget(tiny.model, model_id=tiny.model_id)
        rid = res.request_id
        alone.prefill({rid: prompts[rid][:-1]})
        single = start_round(alone, rid, prompts[rid], layouts[rid], list(drafts[rid]))
        torch.testing.assert_close(res.logits, single.logits, atol=ATOL, rtol=0)
        expected = fresh(tiny, prompts[rid] + list(drafts[rid]))[len(prompts[rid]) - 1 :]
        torch.testing.assert_close(res.logits, expected, atol=ATOL, rtol=0)


def test_visibility_other_requests_cannot_change_a_request(tiny: LlamaBundle) -> None:
    """contract#visibility, contract#packed-requests: with the same shapes, changing every token of the other
    requests leaves a request's logits bit-for-bit unchanged (masked keys get exactly zero weight)."""

    def run(other: int) -> torch.Tensor:
        target = LlamaTarget(tiny.model, model_id=tiny.model_id)
        target.prefill({"x": [1, 2, 3], "y": [other] * 6, "z": [other] * 2})
        results = target.verify(
            [
                VerifyRequest("y", REPLAY, other, (other, other)),
                VerifyRequest("x", REPLAY, 4, (5, 6)),
                VerifyRequest("z", REPLAY, other, (other,)),
            ]
        )
        return results[1].logits

    reference = run(0)
    for other in (3, 7):
        assert torch.equal(run(other), reference)


def test_early_exit_view_runs_the_first_layers(tiny: LlamaBundle) -> None:
    full = LlamaTarget(tiny.model, model_id=tiny.model_id)
    shallow = full.early_exit(1)
    assert shallow.model_id.endswith("#exit1") and shallow.num_layers == 1
    shallow.prefill({"r": [1, 2]})
    (res,) = shallow.verify([VerifyRequest("r", REPLAY, 3, (4,))])
    expected = tiny.model.logits(torch.tensor([1, 2, 3, 4]), num_layers=1)[2:]
    torch.testing.assert_close(res.logits, expected, atol=ATOL, rtol=0)
    assert not torch.allclose(expected, fresh(tiny, [1, 2, 3, 4])[2:], atol=1e-2)
    assert not full.is_open("r")  # its own K/V


def test_refusals_change_nothing(tiny_target: LlamaTarget) -> None:
    t = tiny_target
    t.prefill({"r": [1, 2]})
    with pytest.raises(CacheProtocolError):
        t.prefill({"r": [1]})
    with pytest.raises(CacheProtocolError):
        t.verify([VerifyRequest("nobody", REPLAY, 1, ())])
    with pytest.raises(DraftIdOutOfVocabError):
        t.verify([VerifyRequest("r", REPLAY, 3, (8,))])
    with pytest.raises(CacheProtocolError):  # retained layout without a retained row
        t.verify([VerifyRequest("r", RETAINED, 3, (1,))])
    with pytest.raises(InvalidRequestError):
        t.verify([VerifyRequest("r", REPLAY, 3, ()), VerifyRequest("r", REPLAY, 3, ())])
    with pytest.raises(InvalidRequestError):
        t.verify([VerifyRequest("r", REPLAY, 3, tuple([1] * t.context_length))])
    assert t.committed_token_ids("r") == (1, 2)

    (res,) = t.verify([VerifyRequest("r", REPLAY, 3, (1, 1))])
    with pytest.raises(CacheProtocolError):  # one live branch at a time
        t.verify([VerifyRequest("r", REPLAY, 3, ())])
    with pytest.raises(InvalidRequestError):
        t.commit("r", res.branch, 4)
    t.commit("r", res.branch, 2)
    with pytest.raises(CacheProtocolError):  # stale handle
        t.commit("r", res.branch, 1)
    with pytest.raises(CacheProtocolError):
        t.discard("r", res.branch)
    assert t.committed_token_ids("r") == (1, 2, 3, 1)

    t.materialize_frontier({"r": 5})
    with pytest.raises(CacheProtocolError):  # replaying a retained frontier would duplicate position P
        t.verify([VerifyRequest("r", REPLAY, 5, ())])
    with pytest.raises(CacheProtocolError):
        t.materialize_frontier({"r": 6})
    t.release("r")
    t.release("r")
    assert not t.is_open("r")


def test_truncate_rolls_back_committed_rows(tiny: LlamaBundle) -> None:
    t = LlamaTarget(tiny.model, model_id=tiny.model_id)
    t.prefill({"r": [1, 2, 3, 4, 5]})
    t.truncate("r", 2)
    assert t.committed_token_ids("r") == (1, 2)
    (res,) = t.verify([VerifyRequest("r", REPLAY, 6, (7,))])
    torch.testing.assert_close(res.logits, fresh(tiny, [1, 2, 6, 7])[2:], atol=ATOL, rtol=0)


def test_storage_grows_past_initial_capacity(tiny: LlamaBundle) -> None:
    t = LlamaTarget(tiny.model, model_id=tiny.model_id, initial_capacity=2)
    tokens = [(3 * i + 1) % 8 for i in range(12)]
    t.prefill({"r": tokens[:1]})
    n = 1  # committed rows; tokens[n] is the frontier
    while n + 2 <= len(tokens):
        (res,) = t.verify([VerifyRequest("r", REPLAY, tokens[n], (tokens[n + 1],))])
        torch.testing.assert_close(res.logits, fresh(tiny, tokens[: n + 2])[n:], atol=ATOL, rtol=0)
        t.commit("r", res.branch, 2)
        n += 2
        assert t.committed_token_ids("r") == tuple(tokens[:n])


@settings(max_examples=15)
@given(
    seed=st.integers(0, 3),
    rounds=st.lists(
        st.tuples(st.sampled_from([REPLAY, RETAINED]), st.integers(0, 3), st.integers(0, 3), st.booleans()),
        min_size=1,
        max_size=5,
    ),
)
def test_random_rounds_keep_cache_equal_to_output_minus_frontier(seed: int, rounds: list) -> None:  # type: ignore[type-arg]
    """INV-1 over random sequences of rounds (layouts may change between rounds, aborts included)."""
    bundle = tiny_llama(seed)
    target = LlamaTarget(bundle.model, model_id=bundle.model_id)
    gen = torch.Generator().manual_seed(seed)
    output = torch.randint(0, 8, (3,), generator=gen).tolist()
    target.prefill({"r": output[:-1]})
    for layout, k, accepted, abort in rounds:
        drafts = torch.randint(0, 8, (k,), generator=gen).tolist()
        if layout is REPLAY and target.retained_frontier("r") is not None:
            layout = RETAINED  # a retained row stays retained until it is committed
        res = start_round(target, "r", output, layout, drafts)
        expected = fresh(bundle, output + drafts)[len(output) - 1 :]
        torch.testing.assert_close(res.logits, expected, atol=ATOL, rtol=0)
        if abort:
            target.discard("r", res.branch)
        else:
            a = min(accepted, k)
            target.commit("r", res.branch, a + 1)
            output = output + drafts[:a] + [int(torch.randint(0, 8, (1,), generator=gen))]
        assert target.committed_token_ids("r") == tuple(output[:-1])
