"""Deliberately wrong decision functions, each a thin wrapper around the real sampler (contract#failure-lab).

The sampler mutations of :mod:`.sampler` route every decision of the code path through one of these (see
:func:`~.sampler.decision_seams`); Monte Carlo uses one as its stated alternative law. Every function calls
the real ``decide_from_uniforms``; it changes only what the real function is given or how its answer is
spliced, so the oracles are tested against the very code path they check. Each must make the exact
enumeration fail (the oracle's smoke tests and ``specround check`` assert that it does):

* ``correction from p`` — after a rejection at position A + 1 the token is drawn from ``p_{A+1}`` instead
  of the normalised residual (the real function is re-run with ``draft_lens = A``, so its "bonus" row is
  ``p_{A+1}``);
* ``bonus from q`` — the all-accepted branch draws its extra token from the drafter's last row ``q_K``
  instead of ``p_{K+1}`` (``p_{K+1}`` is overwritten with ``q_K`` before the real call);
* ``continue after rejection`` — after the correction, the round keeps testing the stale drafts
  ``d_{A+2}..d_K`` against rows conditioned on the rejected token (a second real call on the shifted suffix),
  and emits what it accepts plus another terminal token;
* ``shifted p row`` — every draft is verified against the next position's target row (an off-by-one
  logit row);
* ``stops ignored`` — the stop sets are dropped, so a stop token inside the accepted prefix does not end
  the round.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch

from specround.sampling.exact import decide_from_uniforms
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind

__all__ = [
    "DecisionFn",
    "bonus_from_q",
    "continue_after_rejection",
    "correction_from_p",
    "shifted_p_row",
    "stops_ignored",
]

DecisionFn = Callable[[SamplerBatch, torch.Tensor, torch.Tensor], SamplerDecision]
"""A decision function with the signature of ``decide_from_uniforms``."""


def _with_lens(batch: SamplerBatch, lens: torch.Tensor) -> SamplerBatch:
    """``batch`` with draft lengths ``lens`` [B] (ids beyond them set to ``PAD_ID``)."""
    positions = torch.arange(batch.draft_ids.shape[1])  # [K]
    ids = torch.where(positions[None, :] < lens[:, None], batch.draft_ids, PAD_ID)  # [B, K]
    return replace(batch, draft_ids=ids, draft_lens=lens)


def correction_from_p(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    """Draw the correction from the target row p_{A+1} instead of the residual."""
    first = decide_from_uniforms(batch, accept, terminal)
    corrected = first.terminal == int(TerminalKind.CORRECTION)  # [B]
    lens = torch.where(corrected, first.accepted, batch.draft_lens)  # [B]
    return decide_from_uniforms(_with_lens(batch, lens), accept, terminal)


def bonus_from_q(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    """Draw the bonus from the drafter's last row q_K instead of the target row p_{K+1}."""
    rows = torch.arange(batch.p.shape[0])  # [B]
    lens = batch.draft_lens
    has_draft = lens > 0
    p = batch.p.clone()  # [B, K+1, V]
    last_q = batch.q[rows, (lens - 1).clamp_min(0)]  # [B, V]
    p[rows[has_draft], lens[has_draft]] = last_q[has_draft].to(p.dtype)
    return decide_from_uniforms(replace(batch, p=p), accept, terminal)


def shifted_p_row(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    """Verify draft i against p_{i+1} (an off-by-one target row); the bonus keeps the last row."""
    rows = torch.arange(batch.p.shape[0])[:, None]  # [B, 1]
    shifted = (torch.arange(batch.p.shape[1])[None, :] + 1).clamp(max=batch.draft_lens[:, None])  # [B, K+1]
    return decide_from_uniforms(replace(batch, p=batch.p[rows, shifted]), accept, terminal)


def stops_ignored(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    """Drop every stop set (the budget still applies)."""
    return decide_from_uniforms(
        replace(batch, stop_ids=torch.full_like(batch.stop_ids, PAD_ID)), accept, terminal
    )


def continue_after_rejection(
    batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor
) -> SamplerDecision:
    """After the correction at A + 1, keep testing d_{A+2}..d_K against their stale rows and emit more."""
    first = decide_from_uniforms(batch, accept, terminal)
    n_batch, k_max = batch.draft_ids.shape
    corrected = (first.terminal == int(TerminalKind.CORRECTION)) & ~first.finished  # [B]
    start = torch.where(corrected, first.accepted + 1, 0)  # [B] first stale draft index (0-based)
    rest = (batch.draft_lens - start).clamp_min(0)  # [B]
    positions = torch.arange(k_max)  # [K]
    source = (start[:, None] + positions[None, :]).clamp(max=k_max - 1)  # [B, K]
    p_source = (start[:, None] + torch.arange(k_max + 1)[None, :]).clamp(max=k_max)  # [B, K+1]
    rows = torch.arange(n_batch)[:, None]
    suffix = replace(
        batch,
        p=batch.p[rows, p_source],
        q=batch.q[rows, source],
        draft_ids=torch.where(positions[None, :] < rest[:, None], batch.draft_ids.gather(1, source), PAD_ID),
        draft_lens=rest,
        remaining=(batch.remaining - first.emitted).clamp_min(1),
    )
    second = decide_from_uniforms(suffix, accept.gather(1, source), terminal)
    # Splice: the first round's tokens, then the continuation's (only where a correction happened).
    columns = torch.arange(k_max + 1)  # [K+1]
    shifted = (columns[None, :] - first.emitted[:, None]).clamp(0, k_max)  # [B, K+1]
    tail = second.output_ids.gather(1, shifted)  # [B, K+1]
    spliced = torch.where(columns[None, :] < first.emitted[:, None], first.output_ids, tail)
    output_ids = torch.where(corrected[:, None], spliced, first.output_ids)
    emitted = torch.where(corrected, first.emitted + second.emitted, first.emitted).clamp(max=k_max + 1)
    output_ids = torch.where(columns[None, :] < emitted[:, None], output_ids, PAD_ID)
    return replace(
        first,
        output_ids=output_ids,
        emitted=emitted,
        accepted=torch.where(corrected, first.accepted + second.accepted, first.accepted),
        finished=torch.where(corrected, second.finished, first.finished),
    )
