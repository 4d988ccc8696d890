"""Names and tensor contracts shared by the sampler and everything that consumes its decisions.

Shapes are written at every tensor boundary: ``B`` requests, ``K`` the padded draft length of the batch,
``V`` the declared vocabulary, ``S`` the padded number of stop tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum, StrEnum

import torch

__all__ = [
    "PAD_ID",
    "Layout",
    "SamplerBatch",
    "SamplerDecision",
    "Stream",
    "TerminalKind",
]

PAD_ID = -1
"""Sentinel for "no token" in padded id tensors (draft ids, output ids, stop ids)."""


class Stream(IntEnum):
    """Counter-based RNG streams of one request. A uniform is a pure function of (seed, stream, counter)."""

    PROPOSAL = 0
    """Draws that sample draft tokens from q (owned by the proposer)."""
    ACCEPT = 1
    """One uniform per reached acceptance test."""
    TERMINAL = 2
    """One uniform per correction or bonus draw (inverse CDF over its row)."""


class Layout(StrEnum):
    """Where the frontier's K/V row lives at round start (contract#frontier-layouts)."""

    REPLAY_FRONTIER = "replay_frontier"
    """The cache ends before the frontier; verification replays it: inputs ``[x_t, d_1..d_K]``."""
    RETAINED_FRONTIER = "retained_frontier"
    """The cache already holds the frontier and ``p_1`` was retained: inputs ``[d_1..d_K]``."""


class TerminalKind(IntEnum):
    """How a round ended. Stored as small integers in tensors and as names in logs."""

    CORRECTION = 0
    """A draft was rejected; one token was drawn from the normalised residual max(p - q, 0)."""
    BONUS = 1
    """Every draft was accepted; one token was drawn from the target row after the last draft."""
    STOP = 2
    """A stop token or the length cap inside the accepted prefix ended the request; no terminal draw."""


@dataclass(frozen=True, slots=True)
class SamplerBatch:
    """Inputs of one batched exact speculative decision.

    Rows must be *processed* distributions: ``p`` after the target's processors at each logical prefix,
    ``q`` exactly the rows that sampled the drafts. Request ``b`` drafted ``draft_lens[b] <= K`` tokens;
    its draft ids beyond that are ``PAD_ID``, its ``q`` rows beyond that are ignored, and its bonus row is
    ``p[b, draft_lens[b]]``.
    """

    p: torch.Tensor
    """[B, K+1, V] float32/float64 target rows p_1..p_{K+1}."""
    q: torch.Tensor
    """[B, K, V] float32/float64 proposal rows q_1..q_K."""
    draft_ids: torch.Tensor
    """[B, K] int64 draft tokens, ``PAD_ID`` beyond each request's draft length."""
    draft_lens: torch.Tensor
    """[B] int64 per-request draft length k_b in 0..K."""
    stop_ids: torch.Tensor
    """[B, S] or [B, K+1, S] int64 tokens that end the request when emitted (per position when 3-D,
    e.g. the completions of a stop-sequence automaton), ``PAD_ID`` padded; ``S`` may be 0 (no stop
    tokens: only the budget ends a request)."""
    remaining: torch.Tensor
    """[B] int64 remaining output budget (>= 1): emitting that many tokens ends the request."""
    seeds: torch.Tensor
    """[B] int64 request seeds (any 64-bit value)."""
    accept_counters: torch.Tensor
    """[B] int64 next unused ACCEPT counter of each request."""
    terminal_counters: torch.Tensor
    """[B] int64 next unused TERMINAL counter of each request."""


@dataclass(frozen=True, slots=True)
class SamplerDecision:
    """What the exact sampler decided for each request of a batch, with the evidence an audit needs.

    Its tensors are on the host when the decision was taken there (every CPU batch, and an accelerator's
    batch on the fast path, whose control runs on the host), else on the batch's device.

    RNG accounting: request ``b`` used ACCEPT counters ``accept_counters[b] + [0, accept_draws[b])`` and,
    when ``terminal_draws[b] == 1``, TERMINAL counter ``terminal_counters[b]``. Successor counters are the
    inputs plus these draw counts.
    """

    output_ids: torch.Tensor
    """[B, K+1] int64 emitted tokens (accepted drafts, then the correction or bonus), ``PAD_ID`` padded."""
    emitted: torch.Tensor
    """[B] int64 number of emitted tokens = min(A + 1, H)."""
    accepted: torch.Tensor
    """[B] int64 accepted drafts that were emitted (A, or the stop distance when a stop ends the prefix)."""
    terminal: torch.Tensor
    """[B] int64 :class:`TerminalKind` codes."""
    finished: torch.Tensor
    """[B] bool: an emitted stop token or the length cap ended the request."""
    accept_draws: torch.Tensor
    """[B] int64 ACCEPT uniforms consumed = reached acceptance tests."""
    terminal_draws: torch.Tensor
    """[B] int64 TERMINAL uniforms consumed (0 or 1)."""
    p_draft: torch.Tensor
    """[B, K] float64 p_i(d_i), 0 beyond each draft length."""
    q_draft: torch.Tensor
    """[B, K] float64 q_i(d_i), 1 beyond each draft length."""
    accept_uniforms: torch.Tensor
    """[B, K] float64 the ACCEPT uniforms of reached tests, NaN for tests never reached."""
    terminal_uniform: torch.Tensor
    """[B] float64 the TERMINAL uniform, NaN when no terminal draw happened."""
    terminal_row: torch.Tensor
    """[B] int64 index of the p row the terminal token came from (A for a correction, k_b for a bonus),
    ``PAD_ID`` for a stop."""
    residual_mass: torch.Tensor
    """[B] float64 total mass Z of the row the terminal token was drawn from (the unnormalised residual
    for a correction, the target row's sum for a bonus), NaN for a stop."""
    terminal_mass_before: torch.Tensor
    """[B] float64 cumulative row mass strictly before the terminal token (inverse-CDF bracket low)."""
    terminal_token_mass: torch.Tensor
    """[B] float64 row mass of the terminal token itself: ``u * Z`` lies in
    ``[terminal_mass_before, terminal_mass_before + terminal_token_mass)``."""
    stopped_by_token: torch.Tensor
    """[B] bool: an emitted stop token ended the request (finish reason "stop"); ``finished`` without it
    means the length cap did (finish reason "length"). When both happen at once, the stop token wins."""
    degenerate_correction: torch.Tensor
    """[B] bool: a rejection whose residual mass was at or below the degenerate tolerance (p and q equal up
    to rounding, contract#degenerate-cases), so the correction was drawn from the target row
    ``p[terminal_row]`` itself; ``residual_mass`` then holds that row's sum."""

    @property
    def batch_size(self) -> int:
        """Number of requests B."""
        return int(self.emitted.shape[0])
