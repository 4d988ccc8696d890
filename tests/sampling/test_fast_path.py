"""The CPU fast path decides exactly as the reference path, bit for bit, with a bounded number of tensor ops.

The decision fixture pins machine-independent (dyadic) cases; these tests add realistic, rounding-sensitive
inputs (softmax rows whose sums depend on the summation order) and compare the fast path with the reference
path on the same machine, field by field, including the float64 masses of the inverse-CDF bracket.
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import pytest
import torch

from specround.bench.sampler_bench import make_sampler_inputs
from specround.sampling import exact, fast_path, host_terminal
from specround.sampling.exact import decide, decide_from_uniforms, round_uniforms
from specround.sampling.fast_path import search_host
from specround.sampling.op_count import count_tensor_ops
from specround.sampling.rng import round_uniforms_host, uniforms, uniforms_host
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, Stream

OP_BUDGET = 60
"""Target of issue 9: at most this many tensor ops per decision on the fast path, at any batch size."""


def realistic_batch(
    seed: int, n_batch: int, k_max: int, vocab: int, *, dtype: torch.dtype = torch.float32
) -> SamplerBatch:
    """Softmax target rows, draft rows near them, ragged draft lengths, stops (2-D or per position)."""
    gen = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n_batch, k_max + 1, vocab, generator=gen, dtype=torch.float64)
    p = torch.softmax(logits, -1).to(dtype)
    q = torch.softmax(logits[:, :k_max] + 0.7 * torch.randn(n_batch, k_max, vocab, generator=gen), -1).to(
        dtype
    )
    lens = torch.randint(0, k_max + 1, (n_batch,), generator=gen)
    ids = torch.full((n_batch, k_max), PAD_ID, dtype=torch.int64)
    for b in range(n_batch):
        for i in range(int(lens[b])):
            ids[b, i] = int(torch.multinomial(q[b, i].to(torch.float64), 1, generator=gen))
    if seed % 3 == 0:
        stop_ids = torch.randint(0, vocab, (n_batch, k_max + 1, 2), generator=gen)
    elif seed % 3 == 1:
        stop_ids = torch.cat([ids[:, :1].clamp_min(0), torch.full((n_batch, 1), PAD_ID)], dim=1)
    else:
        stop_ids = torch.zeros(n_batch, 0, dtype=torch.int64)
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=ids,
        draft_lens=lens,
        stop_ids=stop_ids,
        remaining=torch.randint(1, k_max + 3, (n_batch,), generator=gen),
        seeds=torch.randint(-(2**62), 2**62, (n_batch,), generator=gen),
        accept_counters=torch.randint(0, 2**40, (n_batch,), generator=gen),
        terminal_counters=torch.randint(0, 2**40, (n_batch,), generator=gen),
    )


def assert_same(fast: SamplerDecision, reference: SamplerDecision) -> None:
    for f in fields(SamplerDecision):
        a, b = getattr(fast, f.name), getattr(reference, f.name)
        assert a.dtype == b.dtype and a.shape == b.shape, f.name
        assert torch.equal(a.isnan(), b.isnan()) if a.is_floating_point() else True, f.name
        if a.is_floating_point():
            # Bit patterns of the non-NaN entries (signed zeros included).
            keep = ~a.isnan()
            assert torch.equal(a[keep].view(torch.int64), b[keep].view(torch.int64)), f.name
        else:
            assert torch.equal(a, b), f.name


def reference(batch: SamplerBatch, mode: str = "read") -> SamplerDecision:
    accept, terminal = round_uniforms(batch)
    with torch.no_grad():
        return exact._decide_reference(batch, accept, terminal, mode)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(24))
def test_fast_path_equals_the_reference_on_rounding_sensitive_rows(seed: int) -> None:
    n_batch = (1, 2, 7, 33)[seed % 4]
    vocab = (257, 1000, 4096, 50)[seed % 4]
    dtype = torch.float64 if seed % 5 == 0 else torch.float32
    batch = realistic_batch(seed, n_batch, 4, vocab, dtype=dtype)
    assert_same(decide(batch), reference(batch))
    assert_same(decide(batch, validate="full"), reference(batch, "full"))


@pytest.mark.parametrize("seed", range(4))
def test_many_long_rows_are_passed_row_by_row_and_equal_the_reference(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """24 rows of V = 16,385 (past one chunk, at the row-by-row vocabulary): the row-by-row pass, exact."""
    vocab = host_terminal.ROW_BY_ROW_VOCAB + 1  # a last block of one column: its padding must read zero
    n_batch = 24
    assert not n_batch * vocab <= host_terminal.HOST_CHUNK_ELEMENTS  # too many rows for one chunk

    def chunked(*args: object, **kwargs: object) -> None:
        raise AssertionError("long rows went through the chunked pass")

    monkeypatch.setattr(fast_path, "terminal_blocks_host", chunked)
    dtype = torch.float64 if seed % 2 else torch.float32

    def every_request_draws(batch: SamplerBatch) -> SamplerBatch:  # no stop token, no budget cap
        no_stops = torch.zeros(n_batch, 0, dtype=torch.int64)
        return replace(batch, stop_ids=no_stops, remaining=torch.full((n_batch,), 100))

    batch = every_request_draws(realistic_batch(seed, n_batch, 3, vocab, dtype=dtype))
    assert_same(decide(batch), reference(batch))
    assert_same(decide(batch, validate="full"), reference(batch, "full"))
    shorter = every_request_draws(
        realistic_batch(seed, n_batch, 3, host_terminal.ROW_BY_ROW_VOCAB - 1, dtype=dtype)
    )
    with pytest.raises(AssertionError, match="chunked pass"):  # below the size the chunks are kept
        decide(shorter)


@pytest.mark.parametrize("max_groups", [16, 2])
def test_long_rows_in_groups_with_a_partial_last_group_equal_the_reference(
    max_groups: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """67 rows of V = 16,385 in groups: of eleven rows (what 1.5 MiB holds), or of 34 when at most two groups
    may be made; the last group is partial either way.

    Each group's block sums are taken on its own, and the search reads its blocks formed again from the
    input rows; both must give the reference's decision bit for bit, corrections and bonus rows alike.
    """
    monkeypatch.setattr(host_terminal, "MAX_GROUPS", max_groups)
    n_batch, vocab = 67, host_terminal.ROW_BY_ROW_VOCAB + 1
    group = host_terminal.rows_per_group(n_batch, vocab + (-vocab % exact.block_width(vocab)))
    assert 1 < group < n_batch and n_batch % group, group
    assert group == (11 if max_groups == 16 else 34)
    batch = realistic_batch(11, n_batch, 3, vocab)
    batch = replace(batch, stop_ids=torch.zeros(n_batch, 0, dtype=torch.int64))
    batch = replace(batch, remaining=torch.full((n_batch,), 100))
    decision = decide(batch)
    kinds = set(decision.terminal.tolist())
    assert {0, 1} <= kinds, kinds  # corrections and bonus rows both drawn
    assert_same(decision, reference(batch))


def test_long_rows_keep_the_tensor_op_budget_at_any_batch_size() -> None:
    """At V = 49,152 the row-by-row pass sums its blocks a group at a time: still within the op budget."""
    for n_batch in (1, 8, 64, 256):
        batch = make_sampler_inputs(n_batch, 4, 49_152, seed=n_batch)
        count = count_tensor_ops(lambda batch=batch: decide(batch))
        assert count.total <= OP_BUDGET, (n_batch, count.by_name)
        assert count.by_name.get("sum", 0) <= host_terminal.MAX_GROUPS + 1, (n_batch, count.by_name)


def test_many_short_rows_keep_the_chunked_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    """256 rows of V = 64 fit one chunk, yet row by row they would pay numpy's call cost 256 times."""

    def row_by_row(*args: object, **kwargs: object) -> None:
        raise AssertionError("short rows went through the row-by-row pass")

    monkeypatch.setattr(fast_path, "terminal_blocks_rows", row_by_row)
    batch = make_sampler_inputs(256, 4, 64, seed=3)
    assert_same(decide(batch), reference(batch))


def test_fast_path_equals_the_reference_with_explicit_uniforms_near_one() -> None:
    batch = realistic_batch(5, 16, 3, 300)
    accept = torch.full((16, 3), 1.0 - 2.0**-53, dtype=torch.float64)  # reject every p(d) < q(d)
    terminal = torch.linspace(0.0, 1.0 - 2.0**-53, 16, dtype=torch.float64)
    fast = decide_from_uniforms(batch, accept, terminal)
    with torch.no_grad():
        assert_same(fast, exact._decide_reference(batch, accept, terminal, "read"))


@pytest.mark.parametrize("n_batch", [1, 40])
def test_a_reused_mass_buffer_holds_no_mass_of_an_earlier_vocabulary(n_batch: int) -> None:
    """Vocabularies of 300 and 400 both pad to 512 columns: the padding past 300 must read as zero again.

    The host pass keeps its float64 mass buffer between decisions. A decision at V = 400 writes columns
    300..399, which a later decision at V = 300 sums as padding; each V = 300 decision must still equal
    the reference (n_batch = 1 takes the row-by-row pass, 40 the chunked one).
    """
    for seed in range(6):
        wide = make_sampler_inputs(n_batch, 4, 400, seed=seed)
        narrow = make_sampler_inputs(n_batch, 4, 300, seed=seed + 100)
        decide(wide)
        assert_same(decide(narrow), reference(narrow))


def test_the_fast_path_handles_the_decision_without_a_tensor_op_per_request() -> None:
    """Tensor ops per decision do not grow with B and stay within the budget (K = 4)."""
    counts = []
    for n_batch in (1, 64, 300):
        batch = make_sampler_inputs(n_batch, 4, 2048, seed=n_batch)  # every request draws a terminal token
        count = count_tensor_ops(lambda batch=batch: decide(batch))
        counts.append(count.total)
        assert count.total <= OP_BUDGET, count.by_name
        assert count.total <= 24, count.by_name  # nine wrappers of the decision, the host views, one sum
        assert count.compute <= 16, count.by_name
    # The only difference is a branch: the q-row gather and residual when some request is a correction.
    assert max(counts) - min(counts) <= 12


def test_the_reference_path_is_what_raises_refusals() -> None:
    """A refused value reaches the reference path, which names the error (here q(d) = 0)."""
    batch = realistic_batch(1, 2, 2, 64)
    b = int((batch.draft_lens > 0).to(torch.int64).argmax())
    q = batch.q.clone()
    q[b, 0, int(batch.draft_ids[b, 0])] = 0.0
    with pytest.raises(Exception, match="cannot have been proposed"):
        decide(replace(batch, q=q))


def test_host_philox_equals_the_torch_philox() -> None:
    rng = np.random.default_rng(7)
    for n in (1, 3, 16, 17, 200):  # the Python-integer path and the numpy path
        seeds = rng.integers(-(2**63), 2**63 - 1, size=(n, 1), dtype=np.int64, endpoint=True)
        seeds[0, 0] = -1
        counters = rng.integers(0, 2**63 - 1, size=(n, 3), dtype=np.int64)
        streams = np.array([[int(Stream.ACCEPT), int(Stream.TERMINAL), int(Stream.PROPOSAL)]])
        expected = uniforms(torch.from_numpy(seeds), torch.from_numpy(streams), torch.from_numpy(counters))
        assert np.array_equal(uniforms_host(seeds, streams, counters), expected.numpy())
        first = rng.integers(0, 2**62, size=n, dtype=np.int64)
        last = rng.integers(0, 2**62, size=n, dtype=np.int64)
        drawn = round_uniforms_host(seeds[:, 0].tolist(), first.tolist(), last.tolist(), 4)
        torch_accept = uniforms(
            torch.from_numpy(seeds), int(Stream.ACCEPT), torch.from_numpy(first[:, None]) + torch.arange(4)
        )
        torch_terminal = uniforms(torch.from_numpy(seeds[:, 0]), int(Stream.TERMINAL), torch.from_numpy(last))
        assert np.array_equal(drawn[:, :4], torch_accept.numpy())
        assert np.array_equal(drawn[:, 4], torch_terminal.numpy())


def _torch_search(
    block_sums: torch.Tensor, u: torch.Tensor, values: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """The two-level search written with torch ops (searchsorted), as the sampler computed it before."""

    def last_true(mask: torch.Tensor) -> torch.Tensor:
        return (mask.shape[1] - 1) - mask.flip(1).to(torch.int64).argmax(1)

    n_blocks = block_sums.shape[1]
    cumulative = block_sums.cumsum(1)
    total = cumulative[:, -1]
    target = u * total
    block = torch.searchsorted(cumulative, target[:, None], right=True).squeeze(1)
    block = torch.where(block < n_blocks, block, last_true(block_sums > 0))
    before = cumulative.gather(1, (block - 1).clamp_min(0)[:, None]).squeeze(1)
    prefix = torch.where(block > 0, before, torch.zeros_like(before))
    width = values.shape[2]
    chosen = values[torch.arange(values.shape[0]), block]
    inside = prefix[:, None] + chosen.cumsum(1)
    offset = torch.searchsorted(inside, target[:, None], right=True).squeeze(1)
    offset = torch.where(offset < width, offset, last_true(chosen > 0))
    before_token = inside.gather(1, (offset - 1).clamp_min(0)[:, None]).squeeze(1)
    mass_before = torch.where(offset > 0, before_token, prefix)
    token_mass = chosen.gather(1, offset[:, None]).squeeze(1)
    return block * width + offset, mass_before, token_mass, total


def test_host_search_equals_the_torch_search_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(3)
    for trial in range(40):
        n_rows, n_blocks, width = 1 + trial % 9, 1 + trial % 13, (1, 7, 256)[trial % 3]
        values = torch.rand(n_rows, n_blocks, width, generator=gen, dtype=torch.float64) ** 6
        values[values < 0.05] = 0.0  # zero-mass tokens and blocks
        values[0, 0] = 0.0
        values[:, -1, -1] = 1e-3  # every row keeps some mass
        block_sums = values.sum(-1)
        u = torch.rand(n_rows, generator=gen, dtype=torch.float64)
        u[0] = 1.0 - 2.0**-53
        expected = _torch_search(block_sums, u, values)
        host_values = values.numpy()
        got = search_host(
            block_sums.numpy(), u.numpy(), lambda block, v=host_values, n=n_rows: v[np.arange(n), block]
        )
        for mine, theirs in zip(
            (got.tokens, got.mass_before, got.token_mass, got.total), expected, strict=True
        ):
            assert np.array_equal(mine, theirs.numpy())


def test_the_one_row_search_equals_the_vectorised_search_bit_for_bit() -> None:
    """A single row takes the search on Python floats; the same row twice takes the vectorised one.

    Rows with zero-mass blocks, targets at the very top (u just below one), a last block lighter than its
    entries' sum, and rows the checks would refuse (a negative entry, a NaN, a NaN target): every field
    must agree bit for bit (NaN where the vectorised search gives NaN).
    """
    gen = np.random.default_rng(11)
    for trial in range(300):
        n_blocks, width = 1 + trial % 17, (1, 2, 7, 64, 256)[trial % 5]
        values = gen.random((1, n_blocks, width)) ** 4
        values[values < 0.1] = 0.0
        if trial % 7 == 0:
            values[0, : n_blocks // 2] = 0.0  # leading empty blocks
        values[0, -1, -1] = max(values[0, -1, -1], 1e-9)  # some mass
        if trial % 11 == 3:
            values[0, 0, 0] = -0.25  # non-monotone: counted entry by entry
        if trial % 13 == 5:
            values[0, -1, 0] = float("nan")
        if trial % 9 == 4 and width > 1:  # the fallback's last positive entry is not the last entry
            values[0, -1, -1], values[0, -1, 0] = 0.0, 0.5
        block_sums = values.sum(-1)
        if trial % 9 == 4:
            block_sums[0, -1] *= 1.0 + 1e-12  # the last block's sum above its entries' cumulative sum
        u = np.array([(1.0 - 2.0**-53) if trial % 4 == 0 else gen.random()])
        if trial % 7 == 2 and n_blocks > 1:  # a target at the total, empty blocks after the last mass
            values[0, -1] = 0.0
            values[0, 0, 0] = 0.5
            block_sums, u[0] = values.sum(-1), 1.0
        if trial % 19 == 6:  # an infinite total and u = 0: a NaN target
            block_sums[0, 0], u[0] = float("inf"), 0.0
        one = search_host(block_sums, u, lambda block, v=values: v[np.arange(1), block])
        twice = np.concatenate((values, values))
        with np.errstate(invalid="ignore"):  # the NaN-target trials multiply inf by 0 on purpose
            both = search_host(
                np.concatenate((block_sums, block_sums)),
                np.concatenate((u, u)),
                lambda block, v=twice: v[np.arange(2), block],
            )
        for mine, theirs in zip(
            (one.tokens, one.mass_before, one.token_mass, one.total),
            (both.tokens, both.mass_before, both.token_mass, both.total),
            strict=True,
        ):
            assert mine.shape == (1,) and mine.dtype == theirs.dtype, trial
            assert np.array_equal(mine, theirs[:1], equal_nan=True), (trial, mine, theirs)


def test_signed_zeros_and_host_chunks_match_the_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows holding -0.0 entries, drawn as corrections across many host column chunks, decide as the
    reference does (the host clamp keeps a zero's sign as torch's does)."""
    monkeypatch.setattr(host_terminal, "HOST_CHUNK_ELEMENTS", 512)
    batch = realistic_batch(4, 6, 3, 1000)
    p, q = batch.p.clone(), batch.q.clone()
    p[:, :, :40] = -0.0  # leading zero mass written as -0.0 (p - q = -0.0 where q = +0.0)
    q[:, :, :20] = 0.0
    p = p / p.sum(-1, keepdim=True)
    q = q / q.sum(-1, keepdim=True)
    ids = torch.where(batch.draft_ids >= 0, 40 + batch.draft_ids % 900, PAD_ID)  # drafts keep q > 0
    batch = replace(batch, p=p, q=q, draft_ids=ids)
    accept = torch.full((6, 3), 1.0 - 2.0**-53, dtype=torch.float64)  # force corrections
    terminal = torch.linspace(0.0, 0.999, 6, dtype=torch.float64)
    fast = decide_from_uniforms(batch, accept, terminal)
    with torch.no_grad():
        assert_same(fast, exact._decide_reference(batch, accept, terminal, "read"))
    assert_same(decide(batch), reference(batch))
    assert int((fast.terminal == 0).sum()) >= 3  # corrections really were drawn


def test_the_torch_form_of_the_terminal_pass_decides_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """What ``SPECROUND_SAMPLER_COMPILE=1`` runs (here uncompiled, to keep the test fast) is exact too."""
    monkeypatch.setenv(fast_path.COMPILE_ENV, "1")
    monkeypatch.setattr(fast_path, "_compiled_pass", fast_path._residual_functional)
    for seed in range(4):
        batch = realistic_batch(seed, (1, 9, 4, 2)[seed], 4, (300, 1000, 4096, 257)[seed])
        assert_same(decide(batch), reference(batch))


@pytest.mark.parametrize("seed", range(60))
def test_scalar_and_numpy_control_equal_the_reference(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small batches take the scalar control, larger ones numpy's: both equal the reference, bit for bit."""
    from specround.sampling import scalar_path

    n_batch, k_max = (1, 2, 3, 4, 6)[seed % 5], (0, 1, 2, 4, 5)[seed % 5]
    batch = realistic_batch(seed, n_batch, k_max, (17, 64, 301)[seed % 3])
    expected = reference(batch)
    scalar_calls: list[int] = []
    original = scalar_path.decide_with_scalars

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        decision = original(*args, **kwargs)
        scalar_calls.append(decision is not None)
        return decision

    monkeypatch.setattr(exact, "decide_with_scalars", counted)
    for limit in (0, 10_000):  # numpy's control, then the scalar one
        monkeypatch.setattr(exact, "SCALAR_LIMIT", limit)
        assert_same(decide(batch), expected)
        assert_same(decide(batch, validate="full"), reference(batch, "full"))
    assert scalar_calls == [
        True,
        True,
    ]  # the scalar control decided (no reference fallback) at the large limit
