"""The assistant's PROPOSAL draws: every uniform of a draft call at once, and a draw per step.

Draft ``i`` of a row uses the uniform ``(seed, PROPOSAL, counter + i)``, a pure function of its arguments,
so all of a call's uniforms come from ONE Philox evaluation (:func:`proposal_uniforms`) instead of one per
draft step. :func:`draw_tokens` is the sampler's inverse CDF (:func:`specround.sampling.exact.inverse_cdf`);
when every row is a point mass (greedy q) it reads the one positive token directly, which is the token the
inverse CDF returns for any uniform in ``[0, 1)``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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

    The tokens are on ``q_rows``' device, wherever ``u`` was computed.

    Rows that are all point masses (one positive entry, none negative) return that entry's index without
    a cumulative sum; any other batch goes through :func:`inverse_cdf` (which also validates it).
    """
    if q_rows.shape[0] == 0:
        return torch.empty(0, dtype=torch.int64, device=q_rows.device)
    point = _point_masses(q_rows)
    # The uniforms are computed on the host; the rows may live on an accelerator.
    return point if point is not None else inverse_cdf(q_rows, u.to(q_rows.device)).tokens  # [B]


def _point_masses(q_rows: torch.Tensor) -> torch.Tensor | None:
    """[B] each row's one positive entry when every row is a finite point mass (none negative), else None.

    CPU float rows are read with numpy's vectorised reductions (a few fast passes: minimum, maximum,
    non-zero count, arg-max); torch's own otherwise.
    """
    if q_rows.device.type == "cpu" and q_rows.dtype in (torch.float32, torch.float64):
        rows = q_rows.detach().numpy()  # [B, V]
        top = rows.max(axis=-1)  # [B]; NaN propagates
        if not (rows.min() >= 0 and np.isfinite(top).all() and (np.count_nonzero(rows, axis=-1) == 1).all()):
            return None
        return torch.from_numpy(rows.argmax(axis=-1).astype(np.int64))  # [B] the only positive entry
    positive = q_rows > 0  # [B, V]
    if bool((positive.sum(-1) == 1).all() & (q_rows >= 0).all() & torch.isfinite(q_rows.amax(-1)).all()):
        return positive.to(torch.uint8).argmax(-1).to(torch.int64)  # [B]
    return None
