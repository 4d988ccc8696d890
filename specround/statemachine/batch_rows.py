"""The engine's own tensors for one step, checked once for the whole batch.

:meth:`~specround.statemachine.controller.RoundController.step_batch` takes a step's rounds the way a serving
engine holds them: request ids plus ``draft_ids [B, K]``, ``draft_lens [B]``, ``q [B, K, V]`` and
``p [B, K+1, V]`` on whatever device they live on. :func:`check_batch_rows` checks the batch-wide contract
(ranks, batch size, dtypes, devices) in a few tensor operations and reads the drafts back to the host with one
``tolist``; anything it refuses is refused for the whole step before any state moves, because a malformed
tensor cannot be attributed to one request. What can be attributed to one row (a draft length outside
``[0, K]``, a draft id outside the request's vocabulary) is refused for that row alone by the controller.

Rows are never sliced per request: the sampler reads the batch tensors as they are. Entries beyond a row's
draft length are ignored (draft ids there are replaced by ``PAD_ID``; q and p values there are never read).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.errors import InvalidRequestError, ShapeMismatchError
from specround.sampling.types import PAD_ID
from specround.statemachine.step_inputs import MAX_DRAFT_LENGTH

__all__ = ["BatchRows", "check_batch_rows"]

_INTEGER_DTYPES = frozenset({torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8})


@dataclass(frozen=True, slots=True)
class BatchRows:
    """One step's checked input tensors (all on ``p``'s device) and the drafts as host integers."""

    draft_ids: torch.Tensor
    """[B, K] int64 draft ids, ``PAD_ID`` beyond each row's draft length."""
    draft_lens: torch.Tensor
    """[B] int64 draft lengths (as handed in; a row whose length is outside [0, K] is refused alone)."""
    q: torch.Tensor
    """[B, K, V] float proposal rows q_1..q_K (K may be 0)."""
    p: torch.Tensor
    """[B, K+1, V] float target rows p_1..p_{K+1}, same dtype and device as ``q``."""
    drafts: list[tuple[int, ...]]
    """Row b's drafts ``d_1..d_k`` as host integers (empty for a row with an invalid length)."""
    lens: list[int]
    """Row b's draft length as a host integer."""

    @property
    def size(self) -> int:
        """B, the number of rows."""
        return len(self.lens)

    @property
    def vocab_size(self) -> int:
        """V, the rows' vocabulary size."""
        return int(self.p.shape[-1])

    @property
    def width(self) -> int:
        """K, the padded draft width."""
        return int(self.draft_ids.shape[1])


def _shape(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {tuple(value.shape)}"
    return type(value).__name__


def check_batch_rows(
    request_ids: Sequence[str],
    draft_ids: torch.Tensor,
    draft_lens: torch.Tensor,
    q: torch.Tensor | None,
    p: torch.Tensor,
) -> BatchRows:
    """Check the batch-wide tensor contract; raises a named :class:`~specround.errors.InputError`.

    ``q`` may be None only when K is 0 (plain target sampling). ``draft_ids`` and ``draft_lens`` may be any
    integer dtype on any device; they are moved to ``p``'s device as int64.
    """
    if isinstance(request_ids, str | bytes) or not isinstance(request_ids, Sequence):
        raise InvalidRequestError(
            f"request_ids must be a sequence of strings, got {type(request_ids).__name__}"
        )
    n = len(request_ids)
    if not isinstance(p, torch.Tensor) or p.dim() != 3 or not p.dtype.is_floating_point:
        raise ShapeMismatchError(f"p must be a float tensor [B, K+1, V], got {_shape(p)}")
    if (
        not isinstance(draft_ids, torch.Tensor)
        or draft_ids.dim() != 2
        or draft_ids.dtype not in _INTEGER_DTYPES
    ):
        raise ShapeMismatchError(f"draft_ids must be an integer tensor [B, K], got {_shape(draft_ids)}")
    if (
        not isinstance(draft_lens, torch.Tensor)
        or draft_lens.dim() != 1
        or draft_lens.dtype not in _INTEGER_DTYPES
    ):
        raise ShapeMismatchError(f"draft_lens must be an integer tensor [B], got {_shape(draft_lens)}")
    k = int(draft_ids.shape[1])
    if k > MAX_DRAFT_LENGTH:
        raise InvalidRequestError(f"draft width K = {k}: a round holds at most {MAX_DRAFT_LENGTH} drafts")
    vocab = int(p.shape[2])
    if tuple(p.shape) != (n, k + 1, vocab) or draft_ids.shape[0] != n or draft_lens.shape[0] != n:
        raise ShapeMismatchError(
            f"{n} request ids need draft_ids [{n}, K], draft_lens [{n}] and p [{n}, K+1, V]; got draft_ids "
            f"{tuple(draft_ids.shape)}, draft_lens {tuple(draft_lens.shape)}, p {tuple(p.shape)}"
        )
    if vocab < 1:
        raise ShapeMismatchError("p must have a vocabulary of at least one token")
    if q is None:
        if k:
            raise ShapeMismatchError(f"{k} draft positions need q [{n}, {k}, {vocab}]")
        q = p.new_empty((n, 0, vocab))
    elif not isinstance(q, torch.Tensor) or tuple(q.shape) != (n, k, vocab):
        raise ShapeMismatchError(f"q must be [{n}, {k}, {vocab}], got {_shape(q)}")
    elif q.dtype != p.dtype or q.device != p.device:
        raise ShapeMismatchError(
            f"q ({q.dtype}, {q.device}) and p ({p.dtype}, {p.device}) must share dtype and device"
        )
    ids = draft_ids.to(device=p.device, dtype=torch.int64)
    lens_t = draft_lens.to(device=p.device, dtype=torch.int64)
    lens = lens_t.tolist()
    rows = ids.tolist()
    drafts = [tuple(row[:length]) if 0 <= length <= k else () for row, length in zip(rows, lens, strict=True)]
    if k and any(length != k for length in lens):  # full drafts have no positions to pad
        inside = torch.arange(k, device=p.device)[None, :] < lens_t[:, None]  # [B, K]
        ids = torch.where(inside, ids, PAD_ID)
    return BatchRows(draft_ids=ids, draft_lens=lens_t, q=q, p=p, drafts=drafts, lens=lens)
