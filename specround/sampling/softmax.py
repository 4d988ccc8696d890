"""Two softmax backends over the vocabulary axis, parity-tested against each other (contract#backend-parity).

* :func:`softmax_max_shift` is the conventional form: subtract the row maximum, exponentiate, normalise.
* :func:`softmax_online` walks the vocabulary in blocks and keeps a running maximum ``m`` and a running
  normaliser ``l`` (the sum of ``exp(x - m)`` over the blocks seen so far); a block with maximum ``m_b``
  is merged as ``m' = max(m, m_b)``, ``l' = l * exp(m - m') + sum_block exp(x - m')``. One final pass
  writes ``exp(x - m) / l``. This is the arithmetic of fused "online softmax" kernels, written in plain torch.

Both accept ``-inf`` masks. A row with exactly one finite logit becomes an exact one-hot row (``exp(0) / 1``).
A row whose logits are all ``-inf`` has no distribution: both backends return NaN there, and the processor
chain refuses such rows with :class:`specround.errors.InvalidProcessorError` before calling a backend.

Dtypes are preserved: float64 rows are computed in float64, float32 rows in float32; half-precision rows
are computed in float32 and rounded back.
"""

from __future__ import annotations

from enum import StrEnum

import torch

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "SoftmaxBackend",
    "softmax",
    "softmax_max_shift",
    "softmax_online",
]

DEFAULT_BLOCK_SIZE = 4096
"""Vocabulary block width of :func:`softmax_online` (the real model's V = 49,152 is 12 blocks)."""

_NEG_INF = float("-inf")


class SoftmaxBackend(StrEnum):
    """Which softmax arithmetic turns processed logits into probabilities; part of the chain digest."""

    MAX_SHIFT = "max_shift"
    """Conventional ``exp(x - max) / sum``."""
    ONLINE = "online"
    """Online ``(m, l)`` merge over vocabulary blocks, then one normalising pass."""


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    if not dtype.is_floating_point:
        raise TypeError(f"softmax needs floating-point logits, got {dtype}")
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def softmax_max_shift(logits: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Conventional max-shifted softmax of ``logits`` along ``dim``; same shape and dtype as the input."""
    # torch's softmax is exactly this arithmetic (fused: max, exp(x - max), sum, divide), so it is the
    # conventional backend; an all -inf row comes out NaN.
    return torch.softmax(logits, dim=dim, dtype=_work_dtype(logits.dtype)).to(logits.dtype)


def softmax_online(logits: torch.Tensor, block_size: int = DEFAULT_BLOCK_SIZE) -> torch.Tensor:
    """Softmax along the last axis by an online ``(m, l)`` merge over blocks of ``block_size`` tokens.

    ``logits`` is ``[..., V]``; ``V`` need not be a multiple of ``block_size``. Returns ``[..., V]``.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    x = logits.to(_work_dtype(logits.dtype))  # [..., V]
    lead = x.shape[:-1]
    m = torch.full(lead, _NEG_INF, dtype=x.dtype, device=x.device)  # [...] running maximum
    norm = torch.zeros(lead, dtype=x.dtype, device=x.device)  # [...] running l: sum of exp(x - m)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    for start in range(0, x.shape[-1], block_size):
        block = x[..., start : start + block_size]  # [..., b]
        m_block = block.amax(dim=-1)  # [...]
        m_new = torch.maximum(m, m_block)
        # While a row has seen only -inf, m_new = -inf: shift by 0 so that exp(-inf - 0) = 0, not NaN.
        shift = torch.where(torch.isfinite(m_new), m_new, zero)
        norm_block = torch.exp(block - shift.unsqueeze(-1)).sum(dim=-1)
        rescale = torch.where(torch.isfinite(m), torch.exp(m - shift), zero)
        norm = norm * rescale + norm_block
        m = m_new
    shift = torch.where(torch.isfinite(m), m, zero)
    return (torch.exp(x - shift.unsqueeze(-1)) / norm.unsqueeze(-1)).to(logits.dtype)


def softmax(logits: torch.Tensor, backend: SoftmaxBackend | str = SoftmaxBackend.MAX_SHIFT) -> torch.Tensor:
    """Softmax along the last axis with the named backend (``[..., V]`` -> ``[..., V]``)."""
    chosen = SoftmaxBackend(backend)
    if chosen is SoftmaxBackend.ONLINE:
        return softmax_online(logits)
    return softmax_max_shift(logits, dim=-1)
