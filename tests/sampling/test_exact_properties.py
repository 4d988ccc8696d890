"""Properties of the exact sampler: inverse-CDF brackets (Hypothesis), agreement with the audit's
re-derivation (INV-10), independence of batch composition and padding, and device parity (CUDA if present).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specround.errors import (
    InvalidRequestError,
    NegativeMassError,
    NonFiniteProbabilityError,
    NotNormalisedError,
    ShapeMismatchError,
)
from specround.sampling.exact import (
    BLOCK_SIZE,
    accepts,
    decide,
    inverse_cdf,
    round_uniforms,
    terminal_mass,
)
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from tests.sampling.test_exact import make_batch, row_of

F64 = torch.float64
LARGEST_U = 1 - 2**-53


def reference_token(row: torch.Tensor, target: float) -> int:
    """Smallest index whose plain float64 cumulative sum exceeds ``target``."""
    cumulative = row.to(F64).cumsum(0)
    return int((cumulative <= target).sum())


@st.composite
def mass_rows(draw: st.DrawFn) -> tuple[torch.Tensor, float]:
    vocab = draw(st.integers(1, 3 * BLOCK_SIZE + 5))
    density = draw(st.sampled_from([1.0, 0.5, 0.05]))
    seed = draw(st.integers(0, 2**31))
    gen = torch.Generator().manual_seed(seed)
    row = torch.rand(vocab, generator=gen, dtype=F64) ** 3
    row = row * (torch.rand(vocab, generator=gen) < density)
    row[draw(st.integers(0, vocab - 1))] += draw(st.floats(1e-6, 1.0))  # at least one positive entry
    u = draw(st.one_of(st.floats(0.0, 1.0, exclude_max=True), st.just(0.0), st.just(LARGEST_U)))
    return row, u


class TestInverseCdf:
    @given(mass_rows())
    def test_bracket_and_smallest_index(self, case: tuple[torch.Tensor, float]) -> None:
        row, u = case
        draw = inverse_cdf(row[None], torch.tensor([u], dtype=F64))
        token = int(draw.tokens[0])
        total = float(draw.total[0])
        target = u * total
        assert 0 <= token < row.shape[0]
        assert float(row[token]) > 0  # never a zero-mass token
        assert float(draw.token_mass[0]) == float(row[token])
        assert total == pytest.approx(float(row.sum()), rel=1e-12)
        # Bracket: exact unless the rounding clamp applied (a few ulps of the total).
        slack = 8 * torch.finfo(F64).eps * total
        before = float(draw.mass_before[0])
        assert before - slack <= target < before + float(draw.token_mass[0]) + slack
        # The same token as a plain cumulative sum, unless the target sits within rounding of a boundary.
        cumulative = row.cumsum(0)
        if bool(((cumulative - target).abs() > 1e-12 * total).all()):
            assert token == reference_token(row, target)

    @given(st.integers(1, 700), st.integers(0, 2**31), st.floats(0.0, 1.0, exclude_max=True))
    def test_dyadic_rows_are_exact(self, vocab: int, seed: int, u: float) -> None:
        # Integer masses: every partial sum is exact, so the bracket holds exactly and matches the reference.
        gen = torch.Generator().manual_seed(seed)
        row = torch.randint(0, 4, (vocab,), generator=gen).to(F64)
        row[-1] += 1
        draw = inverse_cdf(row[None], torch.tensor([u], dtype=F64))
        target = u * float(row.sum())
        token = int(draw.tokens[0])
        assert token == reference_token(row, target)
        assert float(draw.mass_before[0]) == float(row[:token].sum())
        assert float(draw.mass_before[0]) <= target < float(draw.mass_before[0]) + float(draw.token_mass[0])

    def test_batched_rows_equal_single_rows(self) -> None:
        gen = torch.Generator().manual_seed(4)
        rows = torch.rand(9, 1000, generator=gen, dtype=F64)
        us = torch.rand(9, generator=gen, dtype=F64)
        batched = inverse_cdf(rows, us)
        for i in range(9):
            single = inverse_cdf(rows[i : i + 1], us[i : i + 1])
            assert int(single.tokens[0]) == int(batched.tokens[i])
            assert float(single.mass_before[0]) == float(batched.mass_before[i])

    def test_top_end_clamps_to_the_last_positive_token(self) -> None:
        # Trailing zeros across block boundaries: the largest uniform still lands on the last positive token.
        for vocab, last in ((3 * BLOCK_SIZE, BLOCK_SIZE - 1), (700, 2 * BLOCK_SIZE + 3), (5, 2)):
            row = torch.zeros(vocab, dtype=F64)
            row[0] = 1.0
            row[last] = 1e-300
            draw = inverse_cdf(row[None], torch.tensor([LARGEST_U], dtype=F64))
            assert int(draw.tokens[0]) in (0, last)
            assert float(row[int(draw.tokens[0])]) > 0
        # A single positive entry takes every uniform.
        row = torch.zeros(600, dtype=F64)
        row[437] = 0.3
        for u in (0.0, 0.5, LARGEST_U):
            assert int(inverse_cdf(row[None], torch.tensor([u], dtype=F64)).tokens[0]) == 437

    def test_float32_rows(self) -> None:
        row = torch.tensor([0.25, 0.0, 0.5, 0.25], dtype=torch.float32)
        tokens = [
            int(inverse_cdf(row[None], torch.tensor([u], dtype=F64)).tokens[0]) for u in (0.1, 0.3, 0.74, 0.8)
        ]
        assert tokens == [0, 2, 2, 3]

    def test_refuses_bad_rows_and_uniforms(self) -> None:
        u = torch.tensor([0.5], dtype=F64)
        with pytest.raises(NegativeMassError):
            inverse_cdf(torch.tensor([[0.5, -0.1, 0.6]], dtype=F64), u)
        with pytest.raises(NonFiniteProbabilityError):
            inverse_cdf(torch.tensor([[0.5, float("nan")]], dtype=F64), u)
        with pytest.raises(NotNormalisedError):
            inverse_cdf(torch.zeros(1, 4, dtype=F64), u)
        with pytest.raises(ShapeMismatchError):
            inverse_cdf(torch.ones(4, dtype=F64), u)
        with pytest.raises(ShapeMismatchError):
            inverse_cdf(torch.ones(2, 4, dtype=F64), u)
        with pytest.raises(InvalidRequestError):
            inverse_cdf(torch.ones(1, 4, dtype=F64), torch.tensor([1.0], dtype=F64))


def random_batch(
    n_batch: int, k_max: int, vocab: int, *, seed: int, dtype: torch.dtype = F64, spread: float = 0.8
) -> SamplerBatch:
    """Realistic rows: softmax of random logits, q a perturbed target, drafts sampled from q, ragged k."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(n_batch, k_max + 1, vocab, generator=gen, dtype=F64) * 2
    p = torch.softmax(logits, -1)
    q = torch.softmax(
        logits[:, :k_max] + spread * torch.randn(n_batch, k_max, vocab, generator=gen, dtype=F64), -1
    )
    ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(n_batch, k_max)
    lens = torch.randint(0, k_max + 1, (n_batch,), generator=gen)
    ids[torch.arange(k_max)[None, :] >= lens[:, None]] = PAD_ID
    stops = torch.randint(0, vocab, (n_batch, k_max + 1, 2), generator=gen)
    return make_batch(
        p.to(dtype),
        q.to(dtype),
        ids,
        lens,
        stop_ids=stops,
        remaining=torch.randint(1, k_max + 3, (n_batch,), generator=gen),
        seeds=torch.randint(0, 2**62, (n_batch,), generator=gen),
        accept_counters=torch.randint(0, 10_000, (n_batch,), generator=gen),
        terminal_counters=torch.randint(0, 10_000, (n_batch,), generator=gen),
    )


def select(batch: SamplerBatch, index: torch.Tensor) -> SamplerBatch:
    return SamplerBatch(
        p=batch.p[index],
        q=batch.q[index],
        draft_ids=batch.draft_ids[index],
        draft_lens=batch.draft_lens[index],
        stop_ids=batch.stop_ids[index],
        remaining=batch.remaining[index],
        seeds=batch.seeds[index],
        accept_counters=batch.accept_counters[index],
        terminal_counters=batch.terminal_counters[index],
    )


def widen(batch: SamplerBatch, extra: int) -> SamplerBatch:
    """The same requests padded to K + extra: PAD drafts, NaN garbage rows, stop sets repeated."""
    n_batch, k_max = batch.draft_ids.shape
    vocab = batch.p.shape[2]
    nan_rows = torch.full((n_batch, extra, vocab), float("nan"), dtype=batch.p.dtype)
    pad_ids = torch.full((n_batch, extra), PAD_ID, dtype=torch.int64)
    stop_pad = batch.stop_ids[:, -1:].expand(-1, extra, -1)
    # Each request's bonus row stays at k_b; every p row after it becomes NaN garbage (never read).
    p = torch.cat([batch.p, nan_rows], dim=1)
    lens = batch.draft_lens
    after_bonus = torch.arange(k_max + extra + 1)[None, :] > lens[:, None]  # [B, K'+1]
    p[after_bonus] = float("nan")
    return SamplerBatch(
        p=p,
        q=torch.cat([batch.q, nan_rows], dim=1),
        draft_ids=torch.cat([batch.draft_ids, pad_ids], dim=1),
        draft_lens=lens,
        stop_ids=torch.cat([batch.stop_ids, stop_pad], dim=1),
        remaining=batch.remaining,
        seeds=batch.seeds,
        accept_counters=batch.accept_counters,
        terminal_counters=batch.terminal_counters,
    )


def decision_columns(decision: SamplerDecision, b: int, k_max: int) -> dict[str, str]:
    """Request b's decision restricted to K draft columns (K + 1 output columns)."""
    row = {}
    for name in SamplerDecision.__dataclass_fields__:  # type: ignore[attr-defined]
        value = getattr(decision, name)[b]
        if value.dim() == 1:
            value = value[: k_max + 1] if name == "output_ids" else value[:k_max]
        row[name] = repr(value.tolist())
    return row


class TestBatchIndependence:
    def test_decision_does_not_depend_on_batch_composition_or_row_index(self) -> None:
        batch = random_batch(16, 4, 300, seed=1)
        whole = decide(batch)
        assert {int(t) for t in whole.terminal} == {0, 1, 2}
        permutation = torch.randperm(16, generator=torch.Generator().manual_seed(2))
        permuted = decide(select(batch, permutation))
        for new, old in enumerate(permutation.tolist()):
            assert row_of(permuted, new) == row_of(whole, old)
            alone = decide(select(batch, torch.tensor([old])))
            assert row_of(alone, 0) == row_of(whole, old)

    def test_decision_does_not_depend_on_padding_to_a_larger_k(self) -> None:
        batch = random_batch(12, 3, 200, seed=3)
        narrow = decide(batch)
        wide = decide(widen(batch, 2))
        for b in range(12):
            assert decision_columns(wide, b, 3) == decision_columns(narrow, b, 3)
            assert (wide.output_ids[b, 4:] == PAD_ID).all()


class TestAuditRederivation:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_every_logged_decision_rederives(self, dtype: torch.dtype) -> None:
        # INV-10: the acceptance decisions re-derive with `accepts`, and the terminal token is the inverse-CDF
        # draw of its TERMINAL uniform over terminal_mass(p[A], q[A]) -- bit for bit, with the same bracket.
        batch = random_batch(40, 4, 1000, seed=7, dtype=dtype)
        decision = decide(batch)
        _, terminal_u = round_uniforms(batch)
        assert {int(t) for t in decision.terminal} == {0, 1, 2}
        for b in range(40):
            draws = int(decision.accept_draws[b])
            verdicts = accepts(
                decision.accept_uniforms[b, :draws], decision.p_draft[b, :draws], decision.q_draft[b, :draws]
            ).tolist()
            a = int(decision.accepted[b])
            kind = TerminalKind(int(decision.terminal[b]))
            assert verdicts[:a] == [True] * a
            if kind is TerminalKind.CORRECTION:
                assert verdicts == [True] * a + [False]
            if kind is TerminalKind.STOP:
                continue
            row = int(decision.terminal_row[b])
            correction = torch.tensor([kind is TerminalKind.CORRECTION])
            q_row = batch.q[b, row][None] if kind is TerminalKind.CORRECTION else None
            mass = terminal_mass(batch.p[b, row][None], q_row, correction)
            redraw = inverse_cdf(mass, terminal_u[b : b + 1])
            emitted = int(decision.emitted[b])
            assert int(redraw.tokens[0]) == int(decision.output_ids[b, emitted - 1])
            assert float(redraw.mass_before[0]) == float(decision.terminal_mass_before[b])
            assert float(redraw.token_mass[0]) == float(decision.terminal_token_mass[b])
            assert float(redraw.total[0]) == float(decision.residual_mass[b])
            assert float(decision.terminal_uniform[b]) == float(terminal_u[b])

    def test_terminal_mass_clamps_tiny_negative_residuals(self) -> None:
        # p(1) - q(1) = -2**-54 is rounding residue (contract#degenerate-cases): clamped to exactly zero.
        p = torch.tensor([[0.5, 0.5 - 2**-54, 2**-54]], dtype=F64)
        q = torch.tensor([[0.25, 0.5, 0.25]], dtype=F64)
        assert float(p[0, 1] - q[0, 1]) < 0
        mass = terminal_mass(p, q, torch.tensor([True]))
        assert mass.tolist() == [[0.25, 0.0, 0.0]]
        assert terminal_mass(p, q, torch.tensor([False])).tolist() == p.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
def test_cuda_decisions_match_cpu() -> None:
    batch = random_batch(32, 4, 5000, seed=11, dtype=torch.float32)
    cuda = torch.device("cuda")
    on_device = SamplerBatch(
        **{name: getattr(batch, name).to(cuda) for name in SamplerBatch.__dataclass_fields__}
    )  # type: ignore[attr-defined]
    cpu_decision = decide(batch)
    gpu_decision = decide(on_device)
    for name in (
        "output_ids",
        "emitted",
        "accepted",
        "terminal",
        "finished",
        "accept_draws",
        "terminal_draws",
    ):
        assert torch.equal(getattr(gpu_decision, name).cpu(), getattr(cpu_decision, name)), name
    for name in ("accept_uniforms", "terminal_uniform", "p_draft", "q_draft"):
        assert torch.equal(
            getattr(gpu_decision, name).cpu().nan_to_num(-1), getattr(cpu_decision, name).nan_to_num(-1)
        )
    torch.testing.assert_close(gpu_decision.residual_mass.cpu(), cpu_decision.residual_mass, equal_nan=True)
