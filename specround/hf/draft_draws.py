"""The assistant's PROPOSAL draws: every uniform of a draft call at once, and a draw per step.

Draft ``i`` of a row uses the uniform ``(seed, PROPOSAL, counter + i)``, a pure function of its arguments,
so all of a call's uniforms come from ONE Philox evaluation (:func:`proposal_uniforms`) instead of one per
draft step. :func:`draw_tokens` is the sampler's inverse CDF (:func:`specround.sampling.exact.inverse_cdf`);
when every row is a point mass (greedy q) it reads the one positive token directly, which is the token the
inverse CDF returns for any uniform in ``[0, 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.adapters.proposers.draws import seed_tensor
from specround.sampling.exact import inverse_cdf
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream

__all__ = ["draw_tokens", "proposal_uniforms"]


def proposal_uniforms(seeds: Sequence[int], counters: Sequence[int], steps: int) -> torch.Tensor:
    """[B, steps] float64: row ``b``'s PROPOSAL uniforms for counters ``counters[b] + 0..steps-1``."""
    offsets = torch.arange(max(steps, 0), dtype=torch.int64)  # [S]
    base = torch.tensor(list(counters), dtype=torch.int64)  # [B]
    return uniforms(seed_tensor(seeds)[:, None], Stream.PROPOSAL, base[:, None] + offsets[None, :])


def draw_tokens(q_rows: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row by inverse CDF: ``q_rows`` [B, V] masses, ``u`` [B] float64 -> [B] int64.

    Rows that are all point masses (one positive entry, none negative) return that entry's index without
    a cumulative sum; any other batch goes through :func:`inverse_cdf` (which also validates it).
    """
    if q_rows.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64)
    positive = q_rows > 0  # [B, V]
    if bool((positive.sum(-1) == 1).all() & (q_rows >= 0).all() & torch.isfinite(q_rows.amax(-1)).all()):
        return positive.to(torch.uint8).argmax(-1).to(torch.int64)  # [B]
    return inverse_cdf(q_rows, u).tokens  # [B]
