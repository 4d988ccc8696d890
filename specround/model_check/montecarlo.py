"""Seeded Monte Carlo through the real ``decide`` (contract#monte-carlo): a second path to the target joint.

Every sample is one request with its own seed and four separate counter-based streams:

* PROPOSAL — the drafter samples ``d_1..d_K`` from its processed ``q`` rows (inverse CDF, counters 0..K-1);
* ACCEPT and TERMINAL — drawn *inside* the real :func:`specround.sampling.exact.decide` from the request's
  seed and counters (the oracle re-derives them afterwards: INV-3, INV-10);
* COMPLETION (stream id :data:`COMPLETION_STREAM`, outside the sampler's three) — ordinary target draws
  that complete an unfinished branch to the horizon.

The empirical joint over all horizon sequences (stops padded as in the exact oracle, bonus position
included) is tested against the exact target joint with Pearson's chi-square at level ``alpha`` after
pooling cells that expect fewer than 5 samples. The test is sound because the samples are independent (one
request seed each, Philox outputs for distinct keys being independent uniforms for every practical
purpose) and every pooled cell expects at least 5 samples. Its power is stated against a concrete wrong
algorithm: the exact joint of the "correction from p" mutation, computed by the exact oracle.

Beside the joint, each fixture checks that no sample lands on a sequence the target cannot produce, the
RNG accounting of every decision (INV-3: reached ACCEPT uniforms are exactly ``Philox(seed, ACCEPT, i)``,
the terminal uniform is ``Philox(seed, TERMINAL, 0)`` when drawn), and that the speedup ledger's estimators
fed with the sampled rounds (:func:`specround.model_check.ledger_estimate.estimate_ledger`) agree with the
exact progress law within 5 standard errors.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specround.model_check.check_results import CheckResult, within
from specround.model_check.chi_square import ChiSquareTest, chi_square_test
from specround.model_check.fixture_tables import IMPOSSIBLE, STOPPED, FixtureTables, Joint, RowTree
from specround.model_check.ledger_estimate import RoundRecord, estimate_ledger
from specround.sampling.exact import decide
from specround.sampling.rng import uniforms
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, Stream

__all__ = ["ALTERNATIVE", "COMPLETION_STREAM", "DEFAULT_ALPHA", "MonteCarloResult", "run_monte_carlo"]

COMPLETION_STREAM = 3
"""Counter-based stream of the ordinary target completion draws (not one of the sampler's streams)."""
DEFAULT_ALPHA = 1e-3
"""Level of each fixture's chi-square test (family-wise at most ``fixtures * alpha`` by Bonferroni)."""
ALTERNATIVE = "correction from p"
"""The stated alternative of the power computation (its exact joint comes from the mutation oracle)."""
CONTAMINATION = 0.05
"""Weight of the alternative in the second, subtler stated alternative (a 5 % mixture)."""
SIGMAS = 5.0
"""Width, in standard errors, of the ledger-estimate agreement check (two-sided false alarm < 6e-7)."""

DecideRng = Callable[[SamplerBatch], SamplerDecision]


@dataclass(frozen=True)
class _IndexedTree:
    """A row tree as tensors: rows [n, V], child [n, V] (-1: none), stop mask [n, V]."""

    rows: torch.Tensor
    child: torch.Tensor
    stops: torch.Tensor

    @classmethod
    def build(cls, tree: RowTree, vocab: int) -> _IndexedTree:
        prefixes = sorted(tree.rows, key=lambda p: (len(p), p))
        index = {prefix: n for n, prefix in enumerate(prefixes)}
        rows = torch.stack([tree.rows[p] for p in prefixes])  # [n, V]
        child = torch.full((len(prefixes), vocab), -1, dtype=torch.int64)
        stops = torch.zeros(len(prefixes), vocab, dtype=torch.bool)
        for prefix, n in index.items():
            for token in range(vocab):
                child[n, token] = index.get((*prefix, token), -1)
            for token in tree.stops[prefix]:
                stops[n, token] = True
        return cls(rows, child, stops)


def _inverse_cdf(rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """[N] first token whose cumulative mass exceeds ``u * total`` in ``rows`` [N, V] (never zero mass)."""
    cumulative = rows.cumsum(1)  # [N, V]
    target = (u * cumulative[:, -1])[:, None]  # [N, 1]
    token = torch.searchsorted(cumulative, target, right=True).squeeze(1)  # [N]
    last_positive = (rows.shape[1] - 1) - (rows > 0).flip(1).to(torch.int64).argmax(1)  # [N]
    return torch.minimum(token, last_positive)


@dataclass
class MonteCarloResult:
    """The Monte Carlo evidence for one fixture."""

    fixture: str
    samples: int
    test: ChiSquareTest
    unexpected: int
    """Samples on sequences of target probability zero."""
    max_frequency_error: float
    """Max |empirical - exact| probability over all sequences (informative; the test is the chi-square)."""
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Whether every check passed."""
        return all(c.passed for c in self.checks)


def _sample_drafts(tables: FixtureTables, seeds: torch.Tensor) -> torch.Tensor:
    """[N, K] draft paths sampled from the processed q rows with PROPOSAL uniforms."""
    fixture = tables.fixture
    tree = _IndexedTree.build(tables.draft, fixture.vocab_size)
    n = seeds.shape[0]
    node = torch.zeros(n, dtype=torch.int64)
    tokens = torch.zeros(n, fixture.draft_len, dtype=torch.int64)
    for i in range(fixture.draft_len):
        u = uniforms(seeds, Stream.PROPOSAL, i)  # [N]
        token = _inverse_cdf(tree.rows[node], u)
        tokens[:, i] = token
        if i + 1 < fixture.draft_len:
            node = tree.child[node, token]
    return tokens


def _round_batch(tables: FixtureTables, drafts: torch.Tensor, seeds: torch.Tensor) -> SamplerBatch:
    """The sampler batch of the sampled paths (rows from the fixture's path table)."""
    fixture = tables.fixture
    k, vocab = fixture.draft_len, fixture.vocab_size
    codes = (drafts * (vocab ** torch.arange(k))[None, :]).sum(1)  # [N]
    lookup = torch.full((vocab**k,), -1, dtype=torch.int64)
    for j, path in enumerate(tables.paths):
        lookup[sum(t * vocab**i for i, t in enumerate(path.tokens))] = j
    path_index = lookup[codes]  # [N]
    if bool((path_index < 0).any()):
        raise AssertionError("a sampled draft path has zero q mass")  # unreachable by construction
    p_all = torch.stack([p.p_rows for p in tables.paths])  # [P, K+1, V]
    q_all = torch.stack([p.q_rows for p in tables.paths])  # [P, K, V]
    s_max = max([1, *(len(s) for p in tables.paths for s in p.stop_sets)])
    stop_all = torch.full((len(tables.paths), k + 1, s_max), PAD_ID, dtype=torch.int64)  # [P, K+1, S]
    for j, path in enumerate(tables.paths):
        for i, stops in enumerate(path.stop_sets):
            if stops:
                stop_all[j, i, : len(stops)] = torch.tensor(sorted(stops), dtype=torch.int64)
    n = seeds.shape[0]
    zeros = torch.zeros(n, dtype=torch.int64)
    return SamplerBatch(
        p=p_all[path_index],
        q=q_all[path_index],
        draft_ids=drafts,
        draft_lens=torch.full((n,), k, dtype=torch.int64),
        stop_ids=stop_all[path_index],
        remaining=torch.full((n,), fixture.budget, dtype=torch.int64),
        seeds=seeds,
        accept_counters=zeros,
        terminal_counters=zeros,
    )


def _complete(tables: FixtureTables, decision: SamplerDecision, seeds: torch.Tensor) -> torch.Tensor:
    """[N, horizon] sequences: the round's output, then ordinary target draws (COMPLETION stream)."""
    fixture = tables.fixture
    horizon, vocab = fixture.horizon, fixture.vocab_size
    tree = _IndexedTree.build(tables.target, vocab)
    n = seeds.shape[0]
    emitted = decision.emitted  # [N]
    sequences = torch.full((n, horizon), STOPPED, dtype=torch.int64)
    width = decision.output_ids.shape[1]
    sequences[:, :width] = torch.where(
        torch.arange(width)[None, :] < emitted[:, None], decision.output_ids, STOPPED
    )
    # Walk the target tree along the emitted tokens.
    node = torch.zeros(n, dtype=torch.int64)
    for i in range(width):
        step = (i < emitted) & (node >= 0)
        nxt = tree.child[node.clamp_min(0), decision.output_ids[:, i].clamp_min(0)]
        node = torch.where(step, nxt, node)
    live = ~decision.finished  # [N]
    impossible = live & (node < 0) & (emitted < horizon)
    sequences[impossible] = torch.where(
        torch.arange(horizon)[None, :] < emitted[impossible][:, None], sequences[impossible], IMPOSSIBLE
    )
    live &= ~impossible
    length = emitted.clone()
    for position in range(horizon):
        active = live & (length == position)
        if not bool(active.any()):
            continue
        u = uniforms(seeds, COMPLETION_STREAM, position - emitted.clamp_max(position))  # [N]
        safe = node.clamp_min(0)
        token = _inverse_cdf(tree.rows[safe], u)
        sequences[:, position] = torch.where(active, token, sequences[:, position])
        stopped = tree.stops[safe, token] | (position + 1 >= fixture.budget)
        live &= ~(active & stopped)
        node = torch.where(active, tree.child[safe, token], node)
        length = torch.where(active, length + 1, length)
        dead_end = live & active & (node < 0) & (length < horizon)
        if bool(dead_end.any()):
            raise AssertionError("the target tree lacks a reachable prefix")  # unreachable by construction
    return sequences


def _codes(sequences: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N] integer code of each sequence (STOPPED -> V, IMPOSSIBLE -> V + 1, base V + 2)."""
    symbols = torch.where(sequences == STOPPED, vocab, sequences)
    symbols = torch.where(sequences == IMPOSSIBLE, vocab + 1, symbols)
    base = (vocab + 2) ** torch.arange(sequences.shape[1])
    return (symbols * base[None, :]).sum(1)


def _key_code(key: tuple[int, ...], vocab: int) -> int:
    code = 0
    for i, symbol in enumerate(key):
        digit = vocab if symbol == STOPPED else vocab + 1 if symbol == IMPOSSIBLE else symbol
        code += digit * (vocab + 2) ** i
    return code


def _rng_accounting(batch: SamplerBatch, decision: SamplerDecision) -> int:
    """Number of rounds whose logged uniforms or draw counts differ from the counter-based RNG (INV-3)."""
    k = batch.draft_ids.shape[1]
    expected_accept = uniforms(batch.seeds[:, None], Stream.ACCEPT, torch.arange(k)[None, :])  # [N, K]
    reached = ~torch.isnan(decision.accept_uniforms)  # [N, K]
    leading = torch.arange(k)[None, :] < decision.accept_draws[:, None]
    bad = (reached != leading).any(1)
    bad |= (reached & (decision.accept_uniforms != expected_accept)).any(1)
    expected_terminal = uniforms(batch.seeds, Stream.TERMINAL, 0)  # [N]
    drawn = decision.terminal_draws == 1
    bad |= drawn & (decision.terminal_uniform != expected_terminal)
    bad |= ~drawn & ~torch.isnan(decision.terminal_uniform)
    return int(bad.sum())


def run_monte_carlo(
    tables: FixtureTables,
    exact_joint: Joint,
    exact_progress: dict[int, float],
    *,
    samples: int,
    seed: int = 0,
    alpha: float = DEFAULT_ALPHA,
    alternative: Joint | None = None,
    decide_rng: DecideRng | None = None,
) -> MonteCarloResult:
    """Sample ``samples`` rounds of ``tables.fixture`` through the real ``decide`` and test the joint.

    ``exact_joint`` is the target joint, ``exact_progress`` the exact law of round progress G (from the
    enumeration), ``alternative`` the exact joint of a stated wrong algorithm (for the power).
    """
    fixture = tables.fixture
    name = fixture.name
    decide_fn = decide_rng or decide
    seeds = torch.arange(samples, dtype=torch.int64) + (seed << 32)  # one request (key) per sample
    drafts = _sample_drafts(tables, seeds)
    batch = _round_batch(tables, drafts, seeds)
    decision = decide_fn(batch)
    sequences = _complete(tables, decision, seeds)

    vocab = fixture.vocab_size
    counts = torch.bincount(_codes(sequences, vocab), minlength=(vocab + 2) ** fixture.horizon).tolist()
    keys = list(exact_joint)
    codes = [_key_code(key, vocab) for key in keys]
    probabilities = [exact_joint[key] for key in keys]
    observed = [float(counts[c]) for c in codes]
    unexpected = samples - int(sum(observed))
    alternatives: dict[str, list[float]] = {}
    if alternative is not None:
        wrong = [alternative.get(key, 0.0) for key in keys]
        alternatives[ALTERNATIVE] = wrong
        alternatives[f"{CONTAMINATION:.0%} {ALTERNATIVE}"] = [
            (1.0 - CONTAMINATION) * p + CONTAMINATION * w for p, w in zip(probabilities, wrong, strict=True)
        ]
    test = chi_square_test(probabilities, observed, alpha, alternatives)
    frequency_error = max(abs(o / samples - p) for o, p in zip(observed, probabilities, strict=True))

    power_text = ", ".join(f"{power:.3f} vs '{name}'" for name, power in test.power.items()) or "n/a"
    checks = [
        CheckResult(
            name,
            "Monte Carlo chi-square vs target joint",
            test.passed and unexpected == 0 and test.df >= 1,
            test.statistic,
            test.critical,
            f"N = {samples}, cells = {test.cells}, df = {test.df}, alpha = {alpha:g}, "
            f"p = {test.p_value:.3g}, power {power_text}",
        ),
        CheckResult(name, "Monte Carlo: no impossible sequence", unexpected == 0, float(unexpected), 0.0),
    ]
    bad_rng = _rng_accounting(batch, decision)
    checks.append(
        CheckResult(name, "INV-3 RNG accounting (Monte Carlo)", bad_rng == 0, float(bad_rng), 0.0, "rounds")
    )
    checks.extend(_ledger_checks(name, decision, fixture.draft_len, exact_progress))
    return MonteCarloResult(
        fixture=name,
        samples=samples,
        test=test,
        unexpected=unexpected,
        max_frequency_error=frequency_error,
        checks=checks,
    )


def _ledger_checks(
    name: str, decision: SamplerDecision, k: int, exact_progress: dict[int, float]
) -> list[CheckResult]:
    """The ledger's estimators, fed the sampled rounds, agree with the exact progress law."""
    outcomes = torch.stack(
        [decision.accepted, decision.emitted, decision.finished.to(torch.int64)], dim=1
    )  # [N, 3]
    distinct, counts = torch.unique(outcomes, dim=0, return_counts=True)
    records = [
        RoundRecord(accepted=a, drafted=k, emitted=g, stopped=bool(s), count=c)
        for (a, g, s), c in zip(distinct.tolist(), counts.tolist(), strict=True)
    ]
    estimate = estimate_ledger(records)
    n_rounds = int(decision.emitted.shape[0])
    mean = math.fsum(g * p for g, p in exact_progress.items())
    variance = math.fsum((g - mean) ** 2 * p for g, p in exact_progress.items())
    standard_error = math.sqrt(variance / n_rounds) if variance > 0 else 0.0
    gap = abs(estimate.mean_progress - mean)
    return [
        within(
            name,
            "ledger E[G] from sampled rounds vs exact",
            gap,
            SIGMAS * standard_error + 1e-12,
            f"estimate {estimate.mean_progress:.5f}, exact {mean:.5f}, {SIGMAS:g} standard errors",
        )
    ]
