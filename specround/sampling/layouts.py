"""Verification layouts: which inputs a target call receives and which rows it returns.

Contract: contract#frontier-layouts, contract#verification.

For one request whose round-start output ends in the frontier ``x_t`` at absolute position ``t`` and a
draft path ``d_1..d_K``:

* ``replay_frontier``: the cache ends before ``x_t``; the call replays it. Inputs ``[x_t, d_1..d_K]`` at
  positions ``t..t+K``; logits row ``j`` scores position ``t+j+1``; ``K + 1`` logits rows and ``K + 1``
  new K/V rows, the first being ``KV(x_t)``.
* ``retained_frontier``: the cache already holds ``x_t`` and the previous call's row ``p_1`` was retained.
  Inputs ``[d_1..d_K]`` at positions ``t+1..t+K``; ``K`` logits rows and ``K`` new K/V rows.

Both yield the same logical tuple ``([p_1..p_K], p_{K+1}, [KV(d_1)..KV(d_K)])`` (contract#logical-tuple); the
replay layout also hands back ``KV(x_t)``, which a published round always commits. Row ``j`` of every input
owns both its K/V row and the logits that score the *next* position: the one-row offset is structural.

Every layout decision is made here, by :func:`replays_frontier`; the row count (:func:`verify_row_count`),
the inputs (:func:`verification_inputs`) and the row mapping (:func:`extract_verification`) derive from it,
and the target adapters, the serving loop and the controller call these functions rather than compare
layouts themselves.

Attention visibility is a predicate on request identity and absolute position, never on local row
indices: query ``u`` may read key ``v`` iff ``request(u) == request(v) and position(v) <= position(u)``
(contract#visibility, contract#packed-requests).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    InvalidRequestError,
    ShapeMismatchError,
    UnknownLayoutError,
)
from specround.sampling.types import Layout

__all__ = [
    "RowSequence",
    "Verification",
    "VerificationInputs",
    "extract_verification",
    "parse_layout",
    "replays_frontier",
    "retains_frontier",
    "verification_inputs",
    "verify_row_count",
    "visibility_mask",
]


class RowSequence(Protocol):
    """Anything with rows on its first axis: a tensor ``[rows, ...]``, a list or tuple of row handles."""

    def __len__(self) -> int:
        """Number of rows."""
        ...

    def __getitem__(self, index: slice, /) -> Any:
        """Rows selected by a slice, as the same kind of container."""
        ...


def parse_layout(layout: Layout | str) -> Layout:
    """The :class:`Layout` named by ``layout``; anything else raises :class:`UnknownLayoutError`."""
    try:
        return Layout(layout)
    except ValueError as exc:
        raise UnknownLayoutError(f"unknown verification layout {layout!r}") from exc


def replays_frontier(layout: Layout | str) -> bool:
    """Whether a verification under ``layout`` feeds the frontier ``x_t`` again (``replay_frontier``).

    The one layout decision: under ``retained_frontier`` the frontier's K/V row and ``p_1`` were computed by
    a one-row call before the round and are retained beside the cache instead.
    """
    member = layout if type(layout) is Layout else parse_layout(layout)  # a member needs no parsing
    return member is Layout.REPLAY_FRONTIER


def retains_frontier(layout: Layout | str) -> bool:
    """Whether ``layout`` retains the frontier's row, computed before the round (``retained_frontier``)."""
    return not replays_frontier(layout)


def verify_row_count(layout: Layout | str, k: int) -> int:
    """Input (and logits) rows a verification of ``k`` drafts computes: ``k + 1`` replayed, ``k`` retained."""
    return k + 1 if replays_frontier(layout) else k


@dataclass(frozen=True, slots=True)
class VerificationInputs:
    """What one request contributes to a verification call, by absolute position."""

    layout: Layout
    input_ids: tuple[int, ...]
    """Tokens fed to the target: ``[x_t, d_1..d_K]`` (replay) or ``[d_1..d_K]`` (retained)."""
    positions: tuple[int, ...]
    """Absolute position of each input row (the position its K/V row will own)."""
    scored_positions: tuple[int, ...]
    """Absolute position of the event each logits row scores: ``positions[j] + 1``."""
    first_position: int
    """Absolute position of the first input row: ``t`` (replay) or ``t + 1`` (retained), even with no rows."""


def verification_inputs(
    layout: Layout | str, frontier: int, drafts: Sequence[int], start_position: int
) -> VerificationInputs:
    """Input ids and absolute positions of one request's verification rows.

    ``frontier`` is ``x_t``, the last emitted token; ``start_position`` is its absolute position ``t``
    (``T - 1`` for a conditioning sequence of ``T`` tokens, the same in both layouts). Under
    ``replay_frontier`` the first input row is ``x_t`` at ``t``; under ``retained_frontier`` it is ``d_1``
    at ``t + 1``.
    """
    chosen = parse_layout(layout)
    tokens = [frontier, *drafts]
    if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in tokens):
        raise DraftIdOutOfVocabError(f"token ids must be non-negative integers, got {tokens}")
    if isinstance(start_position, bool) or not isinstance(start_position, int) or start_position < 0:
        raise InvalidRequestError(f"start_position must be a non-negative integer, got {start_position!r}")
    ids = tuple(tokens[len(tokens) - verify_row_count(chosen, len(drafts)) :])  # the last rows of [x_t, d..]
    first = start_position + len(tokens) - len(ids)
    positions = tuple(range(first, first + len(ids)))
    return VerificationInputs(chosen, ids, positions, tuple(p + 1 for p in positions), first)


@dataclass(frozen=True, slots=True)
class Verification:
    """The logical tuple a verification yields, independent of the layout (contract#logical-tuple).

    Rows are whatever the target returned (raw logits, before any processor); ``kv_*`` are slices of the
    caller's ``new_kv`` container (a tensor with rows on dim 0, a list of handles, ...).
    """

    layout: Layout
    p_rows: torch.Tensor
    """[k+1, V] ``p_1..p_{k+1}`` (what the exact sampler takes for one request): the target's own block
    under ``replay_frontier``; under ``retained_frontier`` the retained ``p_1`` joined to the call's rows."""
    kv_for_replayed_frontier: Any
    """``KV(x_t)``: one row under ``replay_frontier``, zero rows under ``retained_frontier``."""
    kv_for_draft: Any
    """``[KV(d_1)..KV(d_k)]``: k rows."""

    @property
    def k(self) -> int:
        """Number of drafts."""
        return int(self.p_rows.shape[0]) - 1

    @property
    def p_for_draft(self) -> torch.Tensor:
        """[k, V] rows scoring d_1..d_k (p_1..p_k), a view of :attr:`p_rows`."""
        return self.p_rows[:-1]

    @property
    def p_for_bonus(self) -> torch.Tensor:
        """[V] row scoring the position after d_k (p_{k+1}), a view of :attr:`p_rows`."""
        return self.p_rows[-1]


def extract_verification(
    layout: Layout | str,
    logits: torch.Tensor,
    new_kv: RowSequence,
    k: int,
    retained_p1: torch.Tensor | None = None,
) -> Verification:
    """Split one request's target output into the logical tuple (contract#verification-tensors).

    ``replay_frontier``: ``logits`` ``[k+1, V]``, ``new_kv`` ``k + 1`` rows, ``retained_p1`` is ``None``.
    ``retained_frontier``: ``logits`` ``[k, V]``, ``new_kv`` ``k`` rows, ``retained_p1`` ``[V]`` required
    (with ``k = 0`` no target call is needed: ``logits`` is ``[0, V]`` and ``p_{k+1} = retained_p1``).
    Anything else raises :class:`ShapeMismatchError` (or :class:`UnknownLayoutError`).
    """
    chosen = parse_layout(layout)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise ShapeMismatchError(f"k must be a non-negative integer, got {k!r}")
    if logits.dim() != 2:
        raise ShapeMismatchError(f"logits must be [rows, V], got {tuple(logits.shape)}")
    vocab = logits.shape[1]
    kv_rows = len(new_kv)
    needed = verify_row_count(chosen, k)
    if logits.shape[0] != needed or kv_rows != needed:
        raise ShapeMismatchError(
            f"{chosen.value} with k = {k} needs {needed} logits and K/V rows, "
            f"got {logits.shape[0]} and {kv_rows}"
        )
    replayed = needed - k  # input rows before d_1: 1 (x_t replayed) or 0 (its row was retained)
    if replayed:
        if retained_p1 is not None:
            raise ShapeMismatchError("replay_frontier recomputes p_1: retained_p1 must be None")
        rows = logits  # [k+1, V]
    else:
        if retained_p1 is None:
            raise ShapeMismatchError("retained_frontier needs the retained p_1 row")
        if retained_p1.shape != (vocab,) or retained_p1.dtype != logits.dtype:
            raise ShapeMismatchError(
                f"retained_p1 must be [{vocab}] {logits.dtype}, "
                f"got {tuple(retained_p1.shape)} {retained_p1.dtype}"
            )
        rows = torch.cat([retained_p1.unsqueeze(0), logits], dim=0)  # [k+1, V]
    kv_frontier, kv_draft = new_kv[:replayed], new_kv[replayed:]
    return Verification(chosen, rows, kv_frontier, kv_draft)


def _as_ids(values: torch.Tensor | Sequence[int], name: str) -> torch.Tensor:
    tensor = values if isinstance(values, torch.Tensor) else torch.tensor(list(values), dtype=torch.int64)
    if tensor.dim() != 1:
        raise ShapeMismatchError(f"{name} must be one-dimensional, got {tuple(tensor.shape)}")
    return tensor


def visibility_mask(
    query_request_ids: torch.Tensor | Sequence[int],
    query_positions: torch.Tensor | Sequence[int],
    key_request_ids: torch.Tensor | Sequence[int],
    key_positions: torch.Tensor | Sequence[int],
) -> torch.Tensor:
    """Rectangular attention visibility ``bool [Q, Kv]`` (contract#visibility, contract#packed-requests).

    Query row ``u`` may read key row ``v`` exactly when
    ``request(u) == request(v) and position(v) <= position(u)``. Keys are the past cache rows plus the new
    rows, in any order; request ids and positions are absolute (packing several requests into one call
    never lets one see another).
    """
    qr = _as_ids(query_request_ids, "query_request_ids")
    qp = _as_ids(query_positions, "query_positions")
    kr = _as_ids(key_request_ids, "key_request_ids")
    kp = _as_ids(key_positions, "key_positions")
    if qr.shape != qp.shape or kr.shape != kp.shape:
        raise ShapeMismatchError(
            f"request ids and positions must pair up: queries {tuple(qr.shape)} vs {tuple(qp.shape)}, "
            f"keys {tuple(kr.shape)} vs {tuple(kp.shape)}"
        )
    same_request = qr.unsqueeze(1) == kr.unsqueeze(0)  # [Q, Kv]
    not_future = kp.unsqueeze(0) <= qp.unsqueeze(1)  # [Q, Kv]
    return same_request & not_future
