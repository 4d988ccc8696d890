"""Hand-computed decisions of the exact sampler: thresholds, corrections, bonus
rows with ragged draft lengths, stops and length caps, k = 0, and the RNG accounting of INV-2 / INV-3.

``make_batch`` here is shared by the other ``test_exact*`` modules.

Contract: contract#sampler-law, contract#round-progress, contract#reached-events.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
import torch

from specround.sampling.exact import accepts, decide, decide_from_uniforms, round_uniforms
from specround.sampling.rng import uniforms
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, Stream, TerminalKind

F64 = torch.float64
NAN = float("nan")


def as_long(values: torch.Tensor | Sequence[object]) -> torch.Tensor:
    return (
        values.to(torch.int64)
        if isinstance(values, torch.Tensor)
        else torch.tensor(values, dtype=torch.int64)
    )


def make_batch(
    p: torch.Tensor,
    q: torch.Tensor,
    draft_ids: torch.Tensor | Sequence[Sequence[int]],
    draft_lens: torch.Tensor | Sequence[int] | None = None,
    *,
    stop_ids: torch.Tensor | Sequence[object] | None = None,
    remaining: torch.Tensor | Sequence[int] | None = None,
    seeds: torch.Tensor | Sequence[int] | None = None,
    accept_counters: torch.Tensor | Sequence[int] | None = None,
    terminal_counters: torch.Tensor | Sequence[int] | None = None,
) -> SamplerBatch:
    """A SamplerBatch with defaults: full draft lengths, no stop ids, a large budget, seed b, counters 0."""
    n_batch, k_max = q.shape[0], q.shape[1]
    ids = as_long(draft_ids).reshape(n_batch, k_max)
    zeros = [0] * n_batch
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=ids,
        draft_lens=as_long(draft_lens if draft_lens is not None else [k_max] * n_batch),
        stop_ids=as_long(stop_ids if stop_ids is not None else [[PAD_ID]] * n_batch),
        remaining=as_long(remaining if remaining is not None else [1000] * n_batch),
        seeds=as_long(seeds if seeds is not None else list(range(n_batch))),
        accept_counters=as_long(accept_counters if accept_counters is not None else zeros),
        terminal_counters=as_long(terminal_counters if terminal_counters is not None else zeros),
    )


def one_hot(token: int, vocab: int, dtype: torch.dtype = F64) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=dtype)
    row[token] = 1.0
    return row


def row_of(decision: SamplerDecision, b: int) -> dict[str, object]:
    """Request b's decision as plain Python values (NaN-safe comparison through repr)."""
    return {
        name: repr(getattr(decision, name)[b].tolist())
        for name in SamplerDecision.__dataclass_fields__  # type: ignore[attr-defined]
    }


# The vocabulary of contract#worked-coupling: drafted A with p(A) = 0.30, q(A) = 0.60 accepts with probability
# 0.5; the residual is [0, 0.25, 0.05] with Z = 0.30, so a correction is B with probability 0.833 and C with
# 0.167.
P_03E = torch.tensor([0.30, 0.45, 0.25], dtype=F64)
Q_03E = torch.tensor([0.60, 0.20, 0.20], dtype=F64)
TOKEN_A, TOKEN_B, TOKEN_C = 0, 1, 2


def batch_03e(**kwargs: object) -> SamplerBatch:
    p = torch.stack([P_03E, P_03E])[None]  # [1, 2, 3]: p_1 and a bonus row equal to it
    q = Q_03E[None, None]  # [1, 1, 3]
    return make_batch(p, q, [[TOKEN_A]], **kwargs)  # type: ignore[arg-type]


def decide_with(
    batch: SamplerBatch, accept: Sequence[Sequence[float]], terminal: Sequence[float]
) -> SamplerDecision:
    return decide_from_uniforms(batch, torch.tensor(accept, dtype=F64), torch.tensor(terminal, dtype=F64))


class TestAcceptancePredicate:
    def test_threshold_is_strict_at_p_over_q(self) -> None:
        # contract#worked-coupling: a(A) = 0.30 / 0.60 = 0.5 exactly; accept iff u < 0.5.
        assert bool(accepts(torch.tensor(0.4999999), torch.tensor(0.3), torch.tensor(0.6)))
        assert not bool(
            accepts(torch.tensor(0.5, dtype=F64), torch.tensor(0.3, dtype=F64), torch.tensor(0.6, dtype=F64))
        )

    def test_p_at_least_q_always_accepts_and_p_zero_always_rejects(self) -> None:
        largest_uniform = torch.tensor(1.0 - 2.0**-53, dtype=F64)
        assert bool(accepts(largest_uniform, torch.tensor(0.25), torch.tensor(0.25)))  # p == q never corrects
        assert bool(accepts(largest_uniform, torch.tensor(0.9), torch.tensor(0.1)))
        assert not bool(accepts(torch.tensor(0.0, dtype=F64), torch.tensor(0.0), torch.tensor(0.1)))

    def test_evaluated_in_float64(self) -> None:
        # In float32 the ratio 1/3 rounds up past u; the float64 predicate must not.
        u = torch.tensor(0.33333334, dtype=torch.float32).to(F64)  # 0.3333333432674408
        p, q = torch.tensor(1.0, dtype=F64) / 3, torch.tensor(1.0, dtype=F64)
        assert not bool(accepts(u, p, q))

    def test_decision_accepts_below_ratio_and_rejects_at_it(self) -> None:
        batch = batch_03e()
        accepted = decide_with(batch, [[0.49]], [0.5])
        rejected = decide_with(batch, [[0.5]], [0.5])
        assert accepted.accepted.tolist() == [1] and accepted.terminal.tolist() == [TerminalKind.BONUS]
        assert rejected.accepted.tolist() == [0] and rejected.terminal.tolist() == [TerminalKind.CORRECTION]


class TestCorrection:
    @pytest.mark.parametrize(
        ("u", "token", "before", "mass"),
        [
            (0.0, TOKEN_B, 0.0, 0.25),
            (0.83, TOKEN_B, 0.0, 0.25),
            (0.84, TOKEN_C, 0.25, 0.05),
            (0.999, TOKEN_C, 0.25, 0.05),
        ],
    )
    def test_correction_from_the_positive_residual(
        self, u: float, token: int, before: float, mass: float
    ) -> None:
        # Residual [0, 0.25, 0.05], Z = 0.30: token B iff u * 0.30 < 0.25, i.e. u < 0.8333.
        decision = decide_with(batch_03e(), [[0.9]], [u])
        assert decision.output_ids.tolist() == [[token, PAD_ID]]
        assert decision.terminal.tolist() == [TerminalKind.CORRECTION]
        assert decision.terminal_row.tolist() == [0]
        assert decision.residual_mass.item() == pytest.approx(0.30, abs=1e-15)
        assert decision.terminal_mass_before.item() == pytest.approx(before, abs=1e-15)
        assert decision.terminal_token_mass.item() == pytest.approx(mass, abs=1e-15)
        assert decision.degenerate_correction.tolist() == [False]

    def test_rejected_token_is_never_the_correction(self) -> None:
        # The drafted A has q(A) > p(A): its residual is zero, so no uniform can emit it.
        for u in torch.linspace(0, 1 - 2**-20, 50, dtype=F64).tolist():
            decision = decide_with(batch_03e(), [[0.99]], [u])
            assert decision.output_ids[0, 0].item() != TOKEN_A

    def test_correction_at_a_later_position_uses_that_row(self) -> None:
        # K = 3, tests 1 and 2 accept (p >= q), test 3 rejects; the correction comes from row 2 (0-based).
        vocab = 4
        p = torch.stack(
            [
                one_hot(0, vocab),
                one_hot(1, vocab),
                torch.tensor([0.1, 0.1, 0.1, 0.7], dtype=F64),
                one_hot(0, vocab),
            ]
        )
        q = torch.stack([one_hot(0, vocab), one_hot(1, vocab), torch.tensor([0.0, 0.0, 1.0, 0.0], dtype=F64)])
        decision = decide_with(make_batch(p[None], q[None], [[0, 1, 2]]), [[0.5, 0.5, 0.5]], [0.5])
        # Residual of row 2: [0.1, 0.1, 0, 0.7], Z = 0.9, target 0.45 -> token 3.
        assert decision.output_ids.tolist() == [[0, 1, 3, PAD_ID]]
        assert decision.accepted.tolist() == [2]
        assert decision.terminal_row.tolist() == [2]
        assert decision.residual_mass.item() == pytest.approx(0.9)
        assert decision.accept_draws.tolist() == [3] and decision.terminal_draws.tolist() == [1]


class TestBonusRow:
    def test_bonus_comes_from_row_k_with_ragged_draft_lengths(self) -> None:
        # Row j of p is one-hot at token 10 + j; drafts d_i = 10 + i - 1 with one-hot q are all accepted, so
        # the bonus of a request with k drafts is token 10 + k, from row k (not the last padded row K).
        vocab, k_max = 16, 3
        lens = [0, 1, 3]
        p = torch.stack([torch.stack([one_hot(10 + j, vocab) for j in range(k_max + 1)])] * 3)  # [3, 4, 16]
        q = torch.stack([torch.stack([one_hot(10 + j, vocab) for j in range(k_max)])] * 3)  # [3, 3, 16]
        ids = [[10 + i if i < k else PAD_ID for i in range(k_max)] for k in lens]
        # Rows beyond each draft length are padding: the decision never reads them (validate="read").
        p[0, 1:] = NAN
        q[0, :] = NAN
        p[1, 2:] = NAN
        q[1, 1:] = NAN
        batch = make_batch(p, q, ids, lens)
        for validate in ("read", "full"):
            decision = decide_from_uniforms(
                batch, torch.zeros(3, k_max, dtype=F64), torch.full((3,), 0.5, dtype=F64), validate=validate
            )  # type: ignore[arg-type]
            assert decision.output_ids.tolist() == [
                [10, PAD_ID, PAD_ID, PAD_ID],
                [10, 11, PAD_ID, PAD_ID],
                [10, 11, 12, 13],
            ]
            assert decision.terminal.tolist() == [TerminalKind.BONUS] * 3
            assert decision.terminal_row.tolist() == lens
            assert decision.emitted.tolist() == [1, 2, 4]
            assert decision.accept_draws.tolist() == lens
            assert decision.residual_mass.tolist() == [1.0, 1.0, 1.0]

    def test_k_zero_is_plain_target_sampling_from_p1(self) -> None:
        p = torch.tensor([[[0.5, 0.25, 0.25]]], dtype=F64)  # [1, 1, 3]
        q = torch.zeros(1, 0, 3, dtype=F64)
        batch = make_batch(p, q, torch.zeros(1, 0, dtype=torch.int64), [0])
        for u, token in ((0.49, 0), (0.5, 1), (0.74, 1), (0.75, 2)):
            decision = decide_with(batch, [[]], [u])
            assert decision.output_ids.tolist() == [[token]]
            assert decision.terminal.tolist() == [TerminalKind.BONUS]
            assert decision.terminal_row.tolist() == [0]
            assert decision.accept_draws.tolist() == [0] and decision.terminal_draws.tolist() == [1]
            assert decision.emitted.tolist() == [1] and decision.accepted.tolist() == [0]


def accepting_batch(k_max: int, vocab: int = 8, **kwargs: object) -> SamplerBatch:
    """One request whose drafts d_i = i (one-hot q and p) are all accepted; bonus row one-hot at token 7."""
    p = torch.stack([one_hot(i, vocab) for i in range(k_max)] + [one_hot(7, vocab)])[None]
    q = torch.stack([one_hot(i, vocab) for i in range(k_max)])[None]
    return make_batch(p, q, [list(range(k_max))], **kwargs)  # type: ignore[arg-type]


def decide_accepting(batch: SamplerBatch) -> SamplerDecision:
    k_max = batch.q.shape[1]
    return decide_with(batch, [[0.5] * k_max], [0.5])


class TestStops:
    def test_stop_inside_the_prefix_with_per_position_stop_sets(self) -> None:
        # Stop sets per position [B, K+1, S]: token 1 ends the request at position 2 only.
        stops = [[[5, PAD_ID], [1, PAD_ID], [PAD_ID, PAD_ID], [PAD_ID, PAD_ID]]]
        decision = decide_accepting(accepting_batch(3, stop_ids=stops))
        assert decision.output_ids.tolist() == [[0, 1, PAD_ID, PAD_ID]]
        assert decision.terminal.tolist() == [TerminalKind.STOP]
        assert decision.accepted.tolist() == [2] and decision.emitted.tolist() == [2]
        assert decision.accept_draws.tolist() == [2]  # test 3 is never reached (INV-3)
        assert decision.terminal_draws.tolist() == [0]
        assert decision.finished.tolist() == [True] and decision.stopped_by_token.tolist() == [True]
        assert decision.terminal_row.tolist() == [PAD_ID]
        assert math.isnan(decision.terminal_uniform.item()) and math.isnan(decision.residual_mass.item())
        assert decision.accept_uniforms[0, :2].tolist() == [0.5, 0.5]
        assert math.isnan(decision.accept_uniforms[0, 2].item())

    def test_stop_set_of_another_position_does_not_stop(self) -> None:
        # Token 1 stops only at position 1, but it is drafted at position 2: no stop, the bonus follows.
        stops = [[[1, PAD_ID], [PAD_ID, PAD_ID], [PAD_ID, PAD_ID], [PAD_ID, PAD_ID]]]
        decision = decide_accepting(accepting_batch(3, stop_ids=stops))
        assert decision.output_ids.tolist() == [[0, 1, 2, 7]]
        assert decision.terminal.tolist() == [TerminalKind.BONUS]
        assert decision.finished.tolist() == [False]

    def test_two_dimensional_stop_set_applies_at_every_position(self) -> None:
        decision = decide_accepting(accepting_batch(3, stop_ids=[[2, PAD_ID]]))
        assert decision.output_ids.tolist() == [[0, 1, 2, PAD_ID]]
        assert decision.terminal.tolist() == [TerminalKind.STOP]
        assert decision.stopped_by_token.tolist() == [True]

    def test_stop_after_the_rejection_is_not_emitted(self) -> None:
        # d_2 is a stop token but test 2 rejects it: the correction is emitted instead, nothing after.
        vocab = 4
        p = torch.stack([one_hot(0, vocab), one_hot(3, vocab), one_hot(0, vocab)])[None]
        q = torch.stack([one_hot(0, vocab), one_hot(1, vocab)])[None]
        decision = decide_with(make_batch(p, q, [[0, 1]], stop_ids=[[1]]), [[0.5, 0.5]], [0.5])
        assert decision.output_ids.tolist() == [[0, 3, PAD_ID]]
        assert decision.terminal.tolist() == [TerminalKind.CORRECTION]
        assert decision.finished.tolist() == [False]

    @pytest.mark.parametrize("budget", [1, 2, 3, 4, 5])
    def test_length_cap_at_every_position(self, budget: int) -> None:
        # K = 3, all accepted: budget R <= 3 stops inside the prefix; R = 4 finishes on the bonus.
        decision = decide_accepting(accepting_batch(3, remaining=[budget]))
        full = [0, 1, 2, 7]
        emitted = min(4, budget)
        assert decision.emitted.tolist() == [emitted]  # INV-2: min(A + 1, H)
        assert decision.output_ids.tolist() == [full[:emitted] + [PAD_ID] * (4 - emitted)]
        assert decision.finished.tolist() == [budget <= 4]
        assert decision.stopped_by_token.tolist() == [False]
        if budget <= 3:
            assert decision.terminal.tolist() == [TerminalKind.STOP]
            assert decision.accept_draws.tolist() == [budget] and decision.terminal_draws.tolist() == [0]
        else:
            assert decision.terminal.tolist() == [TerminalKind.BONUS]
            assert decision.accept_draws.tolist() == [3] and decision.terminal_draws.tolist() == [1]

    def test_length_cap_on_the_correction(self) -> None:
        decision = decide_with(batch_03e(remaining=[1]), [[0.9]], [0.5])
        assert decision.terminal.tolist() == [TerminalKind.CORRECTION]
        assert decision.finished.tolist() == [True] and decision.stopped_by_token.tolist() == [False]
        assert decision.emitted.tolist() == [1]

    def test_stop_token_and_cap_at_the_same_position_reports_the_stop(self) -> None:
        decision = decide_accepting(accepting_batch(3, remaining=[2], stop_ids=[[1]]))
        assert decision.emitted.tolist() == [2]
        assert decision.finished.tolist() == [True] and decision.stopped_by_token.tolist() == [True]

    def test_terminal_token_in_its_stop_set_finishes(self) -> None:
        # The bonus token 7 at position K + 1 = 4 is a stop there (per-position sets), not at position 1.
        stops = [[[PAD_ID], [PAD_ID], [PAD_ID], [7]]]
        decision = decide_accepting(accepting_batch(3, stop_ids=stops))
        assert decision.terminal.tolist() == [TerminalKind.BONUS]
        assert decision.output_ids.tolist() == [[0, 1, 2, 7]]
        assert decision.finished.tolist() == [True] and decision.stopped_by_token.tolist() == [True]
        stops_elsewhere = [[[7], [PAD_ID], [PAD_ID], [PAD_ID]]]
        decision = decide_accepting(accepting_batch(3, stop_ids=stops_elsewhere))
        assert decision.finished.tolist() == [False]

    def test_pad_entries_of_the_stop_set_never_match(self) -> None:
        decision = decide_accepting(accepting_batch(3, stop_ids=[[PAD_ID, PAD_ID]]))
        assert decision.finished.tolist() == [False]


class TestRngAccounting:
    def random_batch(self, n_batch: int = 12, k_max: int = 4, vocab: int = 40, seed: int = 3) -> SamplerBatch:
        gen = torch.Generator().manual_seed(seed)
        # Close p and q so that both long accepted runs and rejections occur.
        base = torch.randn(n_batch, k_max + 1, vocab, generator=gen, dtype=F64)
        p = torch.softmax(base, -1)
        q = torch.softmax(
            base[:, :k_max] + 0.7 * torch.randn(n_batch, k_max, vocab, generator=gen, dtype=F64), -1
        )
        ids = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(n_batch, k_max)
        lens = torch.randint(0, k_max + 1, (n_batch,), generator=gen)
        ids[torch.arange(k_max)[None, :] >= lens[:, None]] = PAD_ID
        return make_batch(
            p,
            q,
            ids,
            lens,
            stop_ids=[[3, 17]] * n_batch,
            remaining=torch.randint(1, 6, (n_batch,), generator=gen),
            seeds=torch.randint(-(2**62), 2**62, (n_batch,), generator=gen),
            accept_counters=torch.randint(0, 1000, (n_batch,), generator=gen),
            terminal_counters=torch.randint(0, 1000, (n_batch,), generator=gen),
        )

    def test_uniforms_come_from_their_streams_and_counters(self) -> None:
        batch = self.random_batch()
        decision = decide(batch)
        for b in range(batch.seeds.shape[0]):
            seed = int(batch.seeds[b])
            draws = int(decision.accept_draws[b])
            expected = uniforms(seed, Stream.ACCEPT, torch.arange(draws) + int(batch.accept_counters[b]))
            assert decision.accept_uniforms[b, :draws].tolist() == expected.tolist()
            assert torch.isnan(decision.accept_uniforms[b, draws:]).all()
            if int(decision.terminal_draws[b]) == 1:
                expected_t = uniforms(seed, Stream.TERMINAL, int(batch.terminal_counters[b]))
                assert decision.terminal_uniform[b].item() == expected_t.item()
            else:
                assert math.isnan(decision.terminal_uniform[b].item())

    def test_decide_equals_the_core_on_round_uniforms(self) -> None:
        batch = self.random_batch()
        accept_u, terminal_u = round_uniforms(batch)
        drawn, replayed = decide(batch), decide_from_uniforms(batch, accept_u, terminal_u)
        for b in range(batch.seeds.shape[0]):
            assert row_of(drawn, b) == row_of(replayed, b)

    def test_draw_counts_follow_reached_events(self) -> None:
        # INV-3: ACCEPT draws = reached tests; TERMINAL draws = 1 unless a stop inside the prefix ended it.
        batch = self.random_batch(n_batch=40, seed=11)
        decision = decide(batch)
        kinds = set()
        for b in range(40):
            k = int(batch.draft_lens[b])
            kind = TerminalKind(int(decision.terminal[b]))
            kinds.add(kind)
            a = int(decision.accepted[b])
            if kind is TerminalKind.STOP:
                assert int(decision.accept_draws[b]) == a and int(decision.terminal_draws[b]) == 0
            else:
                assert int(decision.accept_draws[b]) == min(a + 1, k)
                assert int(decision.terminal_draws[b]) == 1
                assert (kind is TerminalKind.BONUS) == (a == k)
            # Successor counters = before + draws; the next round's first uniforms are the unused ones.
            assert not torch.isnan(decision.accept_uniforms[b, : int(decision.accept_draws[b])]).any()
        assert kinds == {TerminalKind.STOP, TerminalKind.BONUS, TerminalKind.CORRECTION}

    def test_accepted_prefix_is_the_leading_accepted_run(self) -> None:
        batch = self.random_batch(n_batch=40, seed=5)
        decision = decide(batch)
        for b in range(40):
            k = int(batch.draft_lens[b])
            u = decision.accept_uniforms[b]
            ratios = decision.p_draft[b] / decision.q_draft[b]
            run = 0
            while run < k and not math.isnan(float(u[run])) and float(u[run]) < float(ratios[run]):
                run += 1
            assert int(decision.accepted[b]) <= run
            if TerminalKind(int(decision.terminal[b])) is not TerminalKind.STOP:
                assert int(decision.accepted[b]) == run
            emitted = int(decision.emitted[b])
            assert (
                decision.output_ids[b, : decision.accepted[b]].tolist()
                == batch.draft_ids[b, : decision.accepted[b]].tolist()
            )
            assert (decision.output_ids[b, emitted:] == PAD_ID).all()
            assert (decision.output_ids[b, :emitted] >= 0).all()

    def test_p_and_q_draft_are_padded_with_zero_and_one(self) -> None:
        batch = self.random_batch()
        decision = decide(batch)
        for b in range(batch.seeds.shape[0]):
            k = int(batch.draft_lens[b])
            assert decision.p_draft[b, k:].tolist() == [0.0] * (4 - k)
            assert decision.q_draft[b, k:].tolist() == [1.0] * (4 - k)
            for i in range(k):
                d = int(batch.draft_ids[b, i])
                assert decision.p_draft[b, i].item() == batch.p[b, i, d].item()
                assert decision.q_draft[b, i].item() == batch.q[b, i, d].item()
