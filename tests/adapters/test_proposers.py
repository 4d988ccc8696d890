"""Proposers: n-gram prompt lookup, the draft-model / early-exit proposer and the PROPOSAL draws."""

from __future__ import annotations

import math
import random

import pytest
import torch

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.adapters.proposers import (
    ModelProposer,
    NGramProposer,
    draw_proposals,
    early_exit_proposer,
    lookup_continuation,
    proposer_from_spec,
    reduced_precision_proposer,
)
from specround.errors import InvalidRequestError, UnknownProposerError
from specround.sampling.exact import inverse_cdf
from specround.sampling.processors import ProcessorChain, sampling_chain
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream
from specround.statemachine.model_ports import Proposal, ProposalRequest, Proposer

V = 8


def request(
    rid: str, context: list[int], k: int, chain: ProcessorChain | None = None, seed: int = 7, counter: int = 0
) -> ProposalRequest:
    return ProposalRequest(rid, tuple(context), k, (chain or sampling_chain(V)).clone(), seed, counter)


# --- n-gram --------------------------------------------------------------------------------------------


def test_lookup_finds_the_most_recent_continuation() -> None:
    context = [5, 1, 2, 3, 9, 1, 2, 4, 7, 1, 2]
    assert lookup_continuation(context, 2, max_ngram=3) == [4, 7]  # "1 2" last seen before "4 7"
    assert lookup_continuation(context, 5, max_ngram=3) == [4, 7, 1, 2]  # capped by the context
    assert lookup_continuation([1, 2, 3], 4, max_ngram=2) == []  # no earlier occurrence
    assert lookup_continuation([6, 6, 6], 4, max_ngram=2) == [6]
    assert lookup_continuation([4], 3, max_ngram=3) == []
    assert lookup_continuation(context, 0, max_ngram=3) == []


def test_longer_ngram_wins_over_shorter() -> None:
    # The bigram suffix "0 2" last occurred at the start (then 5); the unigram "2" last occurred before 8.
    context = [0, 2, 5, 1, 2, 8, 0, 2]
    assert lookup_continuation(context, 1, max_ngram=2) == [5]
    assert lookup_continuation(context, 1, max_ngram=1) == [8]


def test_ngram_proposals_are_one_hot_and_exact() -> None:
    proposer: Proposer = NGramProposer(V, max_ngram=3)
    out = proposer.propose([request("a", [1, 2, 3, 1, 2], 4), request("b", [1, 2, 3], 2)])
    a, b = out
    assert a.draft_ids.tolist() == [3, 1, 2]  # K capped by the match's continuation
    assert a.q_rows.shape == (3, V)
    assert torch.equal(a.q_rows.sum(1), torch.ones(3))
    assert torch.equal(a.q_rows[torch.arange(3), a.draft_ids], torch.ones(3))
    assert a.proposal_draws == 0
    assert b.draft_ids.numel() == 0 and b.q_rows.shape == (0, V)
    with pytest.raises(InvalidRequestError):
        proposer.propose([request("c", [1], -1)])


# --- PROPOSAL draws ------------------------------------------------------------------------------------


def test_draws_are_inverse_cdf_of_proposal_uniforms() -> None:
    q = torch.softmax(torch.randn(3, V, generator=torch.Generator().manual_seed(0)), -1)
    seeds, counters = [11, 2**64 - 1, -5], [0, 4, 9]
    tokens = draw_proposals(q, seeds, counters)
    for row in range(3):
        seed = seeds[row] % 2**64
        u = uniforms(seed, Stream.PROPOSAL, counters[row])
        assert int(inverse_cdf(q[row : row + 1], u.reshape(1)).tokens[0]) == int(tokens[row])
    assert torch.equal(draw_proposals(q, seeds, counters), tokens)


def test_draws_follow_q() -> None:
    """Chi-square goodness of fit of N = 4000 draws (counters 0..N-1) against q, V = 8 (7 d.o.f.).

    The critical value 24.32 is the 0.999 quantile of chi2(7): a correct sampler fails with probability
    1e-3 for a random seed, and this fixed seed makes the outcome deterministic. A sampler that skewed
    one cell by 2 percentage points would exceed it with probability > 0.99 at this N.
    """
    q = torch.tensor([0.30, 0.20, 0.15, 0.10, 0.10, 0.08, 0.05, 0.02], dtype=torch.float64)
    n = 4000
    tokens = draw_proposals(q.expand(n, V), [12345] * n, list(range(n)))
    counts = torch.bincount(tokens, minlength=V).to(torch.float64)
    chi2 = float(((counts - n * q) ** 2 / (n * q)).sum())
    assert chi2 < 24.32


# --- model proposers -----------------------------------------------------------------------------------


def fresh_rows(
    bundle: LlamaBundle, tokens: list[int], chain: ProcessorChain, k: int, layers: int | None = None
):  # type: ignore[no-untyped-def]
    """q rows recomputed from scratch: processed logits along the context + drafts."""
    logits = bundle.model.logits(torch.tensor(tokens), num_layers=layers)  # [T, V]
    context_len = len(tokens) - (k - 1)
    return chain.rows_along(logits[context_len - 1 :], tokens[context_len:])


@pytest.mark.parametrize("layers", [None, 1])
def test_model_proposer_rows_are_the_processed_rows_that_sampled(
    tiny: LlamaBundle, layers: int | None
) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = ModelProposer(target) if layers is None else early_exit_proposer(target, layers)
    chain = sampling_chain(V, temperature=0.8, top_k=5, repetition_penalty=1.3)
    context = [1, 2, 3, 4]
    (prop,) = proposer.propose([request("r", context, 4, chain, seed=3, counter=10)])
    assert prop.draft_ids.shape == (4,) and prop.q_rows.shape == (4, V)
    assert prop.proposal_draws == 4
    sums = prop.q_rows.sum(-1).to(torch.float64)
    torch.testing.assert_close(sums, torch.ones(4, dtype=torch.float64), atol=1e-6, rtol=0)
    assert bool((prop.q_rows[torch.arange(4), prop.draft_ids] > 0).all())
    assert int((prop.q_rows > 0).sum(-1).max()) <= 5  # the top-k truncation is in the q rows
    drafts = prop.draft_ids.tolist()
    expected = fresh_rows(tiny, context + drafts[:-1], chain, 4, layers)
    torch.testing.assert_close(prop.q_rows, expected.to(prop.q_rows.dtype), atol=1e-5, rtol=0)
    # Each draft is the inverse-CDF draw of its own row from (seed, PROPOSAL, counter + i).
    u = uniforms(3, Stream.PROPOSAL, torch.arange(10, 14))
    assert inverse_cdf(prop.q_rows.to(torch.float64), u).tokens.tolist() == drafts


def test_model_proposer_is_reproducible_and_follows_published_output(tiny: LlamaBundle) -> None:
    engine = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = ModelProposer(engine)
    context = [3, 1, 4, 1, 5]
    first = proposer.propose([request("r", context, 3, seed=99, counter=0)])[0]
    # Publish: the first draft accepted, then a correction that differs from the second draft.
    correction = (int(first.draft_ids[1]) + 1) % V
    output = [*context, int(first.draft_ids[0]), correction]
    proposer.on_published("r", output, len(output) - 1)
    assert engine.committed_token_ids("r") == tuple(output[:-1][: len(engine.committed_token_ids("r"))])
    assert len(engine.committed_token_ids("r")) <= len(output) - 1
    after = proposer.propose([request("r", output, 3, seed=99, counter=3)])[0]
    # A fresh proposer on the published output draws exactly the same drafts and rows.
    clean = ModelProposer(LlamaTarget(tiny.model, model_id=tiny.model_id))
    again = clean.propose([request("r", output, 3, seed=99, counter=3)])[0]
    assert torch.equal(after.draft_ids, again.draft_ids)
    torch.testing.assert_close(after.q_rows, again.q_rows, atol=1e-5, rtol=0)
    proposer.release("r")
    assert not engine.is_open("r")


def test_model_proposer_batches_mixed_lengths(tiny: LlamaBundle) -> None:
    proposer = ModelProposer(LlamaTarget(tiny.model, model_id=tiny.model_id))
    reqs = [
        request("a", [1, 2], 3, seed=1),
        request("b", [5], 0, seed=2),
        request("c", [7, 7, 7, 0], 1, seed=3),
    ]
    out: list[Proposal] = proposer.propose(reqs)
    assert [p.request_id for p in out] == ["a", "b", "c"]
    assert [p.draft_ids.numel() for p in out] == [3, 0, 1]
    assert out[1].q_rows.shape == (0, V) and out[1].proposal_draws == 0
    for req, prop in zip(reqs, out, strict=True):
        single = ModelProposer(LlamaTarget(tiny.model, model_id=tiny.model_id)).propose(
            [request(req.request_id, list(req.context_ids), req.k, seed=req.seed)]
        )[0]
        assert torch.equal(prop.draft_ids, single.draft_ids)


def test_factory(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    assert isinstance(proposer_from_spec("ngram:4", target=target), NGramProposer)
    assert proposer_from_spec("early_exit:1", target=target).proposer_id.startswith("early_exit:1:")
    draft = proposer_from_spec("draft:bf16", target=target)
    assert isinstance(draft, ModelProposer) and "bfloat16" in draft.proposer_id
    for bad in ("beam", "early_exit:x", "draft:int3", "early_exit:9"):
        with pytest.raises(UnknownProposerError):
            proposer_from_spec(bad, target=target)


def test_reduced_precision_twin_is_close_but_not_equal(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    twin = reduced_precision_proposer(target, torch.bfloat16).engine
    assert isinstance(twin, LlamaTarget)
    w, w16 = tiny.model.weights.layers[0].wq, twin.model.weights.layers[0].wq
    assert not torch.equal(w, w16)
    assert float((w - w16).abs().max()) <= float(w.abs().max()) * 2**-8  # bf16 keeps 8 significant bits
    assert math.isclose(float(w16.to(torch.bfloat16).to(torch.float32).sum()), float(w16.sum()))


def _lookup_by_windows(
    context: list[int], k: int, max_ngram: int, min_ngram: int, earliest: bool = False
) -> list[int]:
    """The definition, window by window with tensors: the latest (or first) earlier n-gram like the suffix."""
    ids = torch.tensor(context, dtype=torch.int64)
    length = len(context)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        windows = ids[: length - 1].unfold(0, n, 1)  # every window that has a successor
        hits = (windows == ids[length - n :]).all(dim=1).nonzero().flatten()
        if hits.numel():
            start = int(hits[0 if earliest else -1]) + n
            return [int(t) for t in ids[start : start + k]]
    return []


def test_lookup_equals_the_window_definition_on_random_contexts() -> None:
    rng = random.Random(11)
    for _ in range(400):
        context = [rng.randrange(rng.choice((2, 4, 9))) for _ in range(rng.randrange(1, 60))]
        k, max_ngram = rng.randrange(0, 6), rng.randrange(1, 5)
        min_ngram = rng.randrange(1, max_ngram + 1)
        for earliest in (False, True):
            expected = _lookup_by_windows(context, k, max_ngram, min_ngram, earliest) if k > 0 else []
            got = lookup_continuation(context, k, max_ngram, min_ngram, earliest=earliest)
            assert got == expected, (context, k, max_ngram, earliest)
