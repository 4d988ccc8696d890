"""Proposal draws: one PROPOSAL uniform per draft, turned into a token by inverse CDF over its q row.

The uniform of a draft is ``uniforms(seed, Stream.PROPOSAL, counter)``, a pure function of the request's
seed and its PROPOSAL counter, so a replay (or an audit) re-derives every draft from the logged counters.
The inverse CDF is the sampler's own (:func:`specround.sampling.exact.inverse_cdf`): a zero-mass token is
never drawn, so every draft has ``q(d) > 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.sampling.exact import inverse_cdf
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream

__all__ = ["draw_proposals", "seed_tensor"]

_U64 = 1 << 64
_I64_MAX = (1 << 63) - 1


def seed_tensor(seeds: Sequence[int]) -> torch.Tensor:
    """[B] int64 holding each seed modulo 2**64 (read as signed, the bit pattern Philox keys on)."""
    values = []
    for seed in seeds:
        wrapped = int(seed) % _U64
        values.append(wrapped - _U64 if wrapped > _I64_MAX else wrapped)
    return torch.tensor(values, dtype=torch.int64)


def draw_proposals(q_rows: torch.Tensor, seeds: Sequence[int], counters: Sequence[int]) -> torch.Tensor:
    """One draft per row: q_rows [B, V] probabilities, PROPOSAL counters [B] -> tokens [B] int64."""
    if q_rows.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=q_rows.device)
    u = uniforms(seed_tensor(seeds), Stream.PROPOSAL, torch.tensor(list(counters), dtype=torch.int64))  # [B]
    return inverse_cdf(q_rows, u.to(q_rows.device)).tokens  # [B] on the rows' device
