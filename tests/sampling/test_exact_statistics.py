"""Distributional checks of the exact sampler: the worked round (contract#worked-round), greedy equivalence,
p == q, degenerate residuals, and float32/float64 agreement.

Statistical tests use fixed seeds (Philox seeds ``offset + b``; drafts from a seeded ``torch.Generator``), so
they are deterministic; the stated levels say how unlikely a failure would be for a correct sampler with
fresh seeds, and the powers how surely the named bugs are caught.
"""

from __future__ import annotations

import torch

from specround.sampling.exact import decide, decide_from_uniforms, degenerate_residual_tolerance
from specround.sampling.types import PAD_ID, SamplerBatch, TerminalKind
from tests.sampling.test_exact import make_batch, one_hot, row_of

F64 = torch.float64

# Chi-square critical values at level 0.001 (upper tail), from the standard table.
CHI2_CRITICAL_0_001 = {1: 10.828, 2: 13.816, 3: 16.266}

# The worked round (contract#worked-round): target p, draft q over symbols A/B/C.
P_003 = torch.tensor([0.6, 0.3, 0.1], dtype=F64)
Q_003 = torch.tensor([0.2, 0.3, 0.5], dtype=F64)


def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> float:
    expected = probabilities * counts.sum()
    return float(((counts.to(F64) - expected) ** 2 / expected).sum())


def example_batch(
    n_requests: int, k_max: int, bonus: torch.Tensor, *, seed: int, seed_offset: int
) -> SamplerBatch:
    """``n_requests`` rounds with q = Q_003 and p = P_003 at every draft position, drafts sampled from q."""
    gen = torch.Generator().manual_seed(seed)
    p = torch.cat([P_003.expand(n_requests, k_max, 3), bonus.expand(n_requests, 1, 3)], dim=1)
    q = Q_003.expand(n_requests, k_max, 3)
    drafts = torch.multinomial(Q_003, n_requests * k_max, replacement=True, generator=gen)
    seeds = torch.arange(n_requests) + seed_offset
    return make_batch(p, q, drafts.reshape(n_requests, k_max), seeds=seeds)


class TestWorkedExample003:
    N = 20_000
    BONUS = torch.tensor([0.1, 0.2, 0.7], dtype=F64)

    def test_first_token_follows_the_target(self) -> None:
        # Output of one position ~ p = [0.6, 0.3, 0.1] (contract#positive-residual): chi-square, 2 degrees of
        # freedom, level 0.001. Power: a correction drawn from p instead of the residual gives [0.44, 0.42,
        # 0.14], a statistic of about 2100 at N = 20000; from q, about 5000. Both far beyond 13.8.
        decision = decide(example_batch(self.N, 1, self.BONUS, seed=1, seed_offset=10_000))
        first = decision.output_ids[:, 0]
        counts = torch.bincount(first, minlength=3)
        assert chi_square(counts, P_003) < CHI2_CRITICAL_0_001[2], counts

    def test_correction_is_always_the_residual_symbol_and_acceptance_is_0_6(self) -> None:
        batch = example_batch(self.N, 1, self.BONUS, seed=2, seed_offset=50_000)
        decision = decide(batch)
        corrected = decision.terminal == int(TerminalKind.CORRECTION)
        # The normalised residual is [1, 0, 0]: every correction is A, exactly.
        assert int(corrected.sum()) > 0
        assert (decision.output_ids[corrected, 0] == 0).all()
        # Acceptance rate alpha = sum min(p, q) = 0.6; sd = sqrt(0.24 / N) = 0.0035; tolerance 5 sd.
        rate = 1.0 - float(corrected.to(F64).mean())
        assert abs(rate - 0.6) < 5 * (0.24 / self.N) ** 0.5
        # Conditional acceptance per drafted symbol is [1, 1, 0.2]: A and B always, C with 0.2 (sd of the
        # rate over about 10000 C drafts is 0.004; tolerance 5 sd).
        drafted = batch.draft_ids[:, 0]
        assert not corrected[drafted != 2].any()
        c_rate = 1.0 - float(corrected[drafted == 2].to(F64).mean())
        assert abs(c_rate - 0.2) < 5 * (0.16 / int((drafted == 2).sum())) ** 0.5

    def test_bonus_follows_the_bonus_row(self) -> None:
        # After an accepted draft the second token ~ p_2 = [0.1, 0.2, 0.7]: chi-square, 2 dof, level 0.001
        # on about 12000 bonus draws. Power: a bonus from p_1 or q gives a statistic in the thousands.
        decision = decide(example_batch(self.N, 1, self.BONUS, seed=3, seed_offset=90_000))
        bonus = decision.terminal == int(TerminalKind.BONUS)
        assert (decision.emitted[bonus] == 2).all() and (decision.terminal_row[bonus] == 1).all()
        counts = torch.bincount(decision.output_ids[bonus, 1], minlength=3)
        assert chi_square(counts, self.BONUS) < CHI2_CRITICAL_0_001[2], counts

    def test_output_counts_of_the_iid_scenario(self) -> None:
        # contract#worked-round: gamma = 2 with acceptance 0.6 at both positions: output counts 1, 2, 3 with
        # probabilities 0.4, 0.24, 0.36 and E = 1.96. Chi-square, 2 dof, level 0.001. Power: continuing after
        # a rejection or a bonus-less round shifts these by tens of percent (statistic in the thousands).
        decision = decide(example_batch(self.N, 2, self.BONUS, seed=4, seed_offset=130_000))
        counts = torch.bincount(decision.emitted - 1, minlength=3)
        expected = torch.tensor([0.4, 0.24, 0.36], dtype=F64)
        assert chi_square(counts, expected) < CHI2_CRITICAL_0_001[2], counts
        # Mean: sd of one count is sqrt(0.7584) = 0.87, so 5 sd of the mean is 0.031.
        assert abs(float(decision.emitted.to(F64).mean()) - 1.96) < 5 * (0.7584 / self.N) ** 0.5


def toy_target(prefix: list[int], vocab: int) -> int:
    """A deterministic 'greedy target': the next token as a function of the whole prefix."""
    return (7 * sum(prefix) + 3 * len(prefix) + prefix[-1] * prefix[-1]) % vocab


def toy_draft(prefix: list[int], vocab: int) -> int:
    """A greedy draft that agrees with the target most of the time."""
    guess = toy_target(prefix, vocab)
    return (guess + 1) % vocab if sum(prefix) % 4 == 0 else guess


class TestGreedy:
    def test_one_hot_rows_reproduce_greedy_decoding(self) -> None:
        # contract#processed-rows: one-hot p and q (greedy processors) give exactly the serial
        # greedy tokens.
        vocab, k_max, n_requests = 11, 4, 40
        gen = torch.Generator().manual_seed(9)
        prefixes = [torch.randint(0, vocab, (3,), generator=gen).tolist() for _ in range(n_requests)]
        lens = torch.randint(0, k_max + 1, (n_requests,), generator=gen).tolist()
        p = torch.zeros(n_requests, k_max + 1, vocab, dtype=F64)
        q = torch.zeros(n_requests, k_max, vocab, dtype=F64)
        ids = torch.full((n_requests, k_max), PAD_ID, dtype=torch.int64)
        for b, prefix in enumerate(prefixes):
            path = list(prefix)
            for i in range(k_max + 1):
                p[b, i] = one_hot(toy_target(path, vocab), vocab)
                if i < k_max:
                    draft = toy_draft(path, vocab)
                    q[b, i] = one_hot(draft, vocab)
                    if i < lens[b]:
                        ids[b, i] = draft
                    path.append(draft)
        batch = make_batch(p, q, ids, lens)
        extremes = [
            (torch.zeros(n_requests, k_max, dtype=F64), torch.zeros(n_requests, dtype=F64)),
            (
                torch.full((n_requests, k_max), 1 - 2**-53, dtype=F64),
                torch.full((n_requests,), 1 - 2**-53, dtype=F64),
            ),
        ]
        decisions = [decide(batch)] + [decide_from_uniforms(batch, a, t) for a, t in extremes]
        for decision in decisions:
            for b, prefix in enumerate(prefixes):
                emitted = int(decision.emitted[b])
                serial = list(prefix)
                for _ in range(emitted):
                    serial.append(toy_target(serial, vocab))
                assert decision.output_ids[b, :emitted].tolist() == serial[len(prefix) :]
                # A = the number of leading drafts that equal the greedy token.
                agree = 0
                while agree < lens[b] and int(ids[b, agree]) == serial[len(prefix) + agree]:
                    agree += 1
                assert int(decision.accepted[b]) == agree and emitted == agree + 1


class TestEqualRows:
    def test_p_equal_q_never_corrects(self) -> None:
        gen = torch.Generator().manual_seed(12)
        n_requests, k_max, vocab = 64, 4, 50
        rows = torch.softmax(torch.randn(n_requests, k_max + 1, vocab, generator=gen, dtype=F64) * 3, -1)
        ids = torch.multinomial(rows[:, :k_max].reshape(-1, vocab), 1, generator=gen).reshape(
            n_requests, k_max
        )
        decision = decide(make_batch(rows, rows[:, :k_max].clone(), ids))
        assert (decision.terminal == int(TerminalKind.BONUS)).all()
        assert (decision.accepted == k_max).all()


def two_token_rows(delta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q = [0.5, 0.5], p = [0.5 - delta, 0.5 + delta]: drafted token 0 rejects only for u >= 1 - 2 delta."""
    p = torch.tensor([[[0.5 - delta, 0.5 + delta], [0.5, 0.5]]], dtype=dtype)  # [1, 2, 2]
    q = torch.tensor([[[0.5, 0.5]]], dtype=dtype)  # [1, 1, 2]
    return p, q


class TestDegenerateResidual:
    LARGEST_U = 1 - 2**-53

    def decide_rejected(self, delta: float, dtype: torch.dtype, terminal_u: float):  # type: ignore[no-untyped-def]
        p, q = two_token_rows(delta, dtype)
        batch = make_batch(p, q, [[0]])
        return decide_from_uniforms(
            batch, torch.tensor([[self.LARGEST_U]], dtype=F64), torch.tensor([terminal_u], dtype=F64)
        )

    def test_residual_below_tolerance_draws_from_the_target_row(self) -> None:
        for dtype in (torch.float32, torch.float64):
            eps = float(torch.finfo(dtype).eps)
            delta = 8 * eps  # Z = delta <= 16 eps: p and q equal up to rounding
            assert delta <= degenerate_residual_tolerance(dtype)
            decision = self.decide_rejected(delta, dtype, terminal_u=0.1)
            assert decision.terminal.tolist() == [TerminalKind.CORRECTION]
            assert decision.degenerate_correction.tolist() == [True]
            assert decision.output_ids.tolist() == [[0, PAD_ID]]  # from p: the residual would force token 1
            assert abs(decision.residual_mass.item() - 1.0) < 1e-6

    def test_degenerate_rows_mixed_with_corrections_and_bonuses(self) -> None:
        # Requests: degenerate correction, real correction, bonus, degenerate correction. Each decides as
        # it does alone (the degenerate rows are redrawn from p without disturbing the others).
        eps = float(torch.finfo(F64).eps)
        deltas = [8 * eps, 0.25, 0.0, 4 * eps]
        rows = [two_token_rows(delta, F64) for delta in deltas]
        p = torch.cat([r[0] for r in rows])
        q = torch.cat([r[1] for r in rows])
        batch = make_batch(p, q, [[0], [0], [1], [0]])
        accept = torch.tensor([[self.LARGEST_U], [self.LARGEST_U], [0.3], [self.LARGEST_U]], dtype=F64)
        terminal = torch.tensor([0.1, 0.1, 0.9, 0.9], dtype=F64)
        decision = decide_from_uniforms(batch, accept, terminal)
        assert decision.degenerate_correction.tolist() == [True, False, False, True]
        assert decision.terminal.tolist() == [
            TerminalKind.CORRECTION,
            TerminalKind.CORRECTION,
            TerminalKind.BONUS,
            TerminalKind.CORRECTION,
        ]
        assert decision.output_ids[:, 0].tolist() == [0, 1, 1, 1]
        for b in range(4):
            alone = decide_from_uniforms(
                make_batch(p[b : b + 1], q[b : b + 1], batch.draft_ids[b : b + 1], seeds=[b]),
                accept[b : b + 1],
                terminal[b : b + 1],
            )
            assert row_of(alone, 0) == row_of(decision, b)

    def test_residual_above_tolerance_draws_from_the_residual(self) -> None:
        for dtype in (torch.float32, torch.float64):
            eps = float(torch.finfo(dtype).eps)
            decision = self.decide_rejected(32 * eps, dtype, terminal_u=0.1)
            assert decision.terminal.tolist() == [TerminalKind.CORRECTION]
            assert decision.degenerate_correction.tolist() == [False]
            assert decision.output_ids.tolist() == [[1, PAD_ID]]  # residual [0, delta]
            assert abs(decision.residual_mass.item() - 32 * eps) <= 2 * eps


class TestDtypes:
    def test_float32_and_float64_rows_with_equal_values_decide_identically(self) -> None:
        # Dyadic rows (integer weights / 2**20) are exact in both dtypes and sum to exactly one.
        gen = torch.Generator().manual_seed(21)
        n_requests, k_max, vocab = 32, 3, 300

        def dyadic_rows(shape: tuple[int, ...]) -> torch.Tensor:
            weights = torch.randint(0, 1000, shape, generator=gen).to(F64) ** 2
            scaled = torch.floor(weights / weights.sum(-1, keepdim=True) * 2**20)
            scaled[..., 0] += 2**20 - scaled.sum(-1)
            return scaled / 2**20

        p64 = dyadic_rows((n_requests, k_max + 1, vocab))
        q64 = dyadic_rows((n_requests, k_max, vocab))
        ids = torch.multinomial(q64.reshape(-1, vocab), 1, generator=gen).reshape(n_requests, k_max)
        lens = torch.randint(0, k_max + 1, (n_requests,), generator=gen)
        ids[torch.arange(k_max)[None, :] >= lens[:, None]] = PAD_ID
        budget = torch.randint(1, 4, (n_requests,), generator=gen)
        d64 = decide(make_batch(p64, q64, ids, lens, remaining=budget))
        d32 = decide(make_batch(p64.float(), q64.float(), ids, lens, remaining=budget))
        assert {int(t) for t in d64.terminal} == {0, 1, 2}
        for b in range(n_requests):
            assert row_of(d32, b) == row_of(d64, b)
