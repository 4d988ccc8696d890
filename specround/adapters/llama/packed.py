"""Packed attention rows: the new rows of several requests in one forward.

Contract: contract#visibility, contract#packed-requests.

Queries are the concatenated new rows; the keys of request ``s`` are its stored rows ``[0, start_s + n_s)``
(committed rows, a retained frontier if any, then its new rows), concatenated request after request. Query
row ``u`` may read key row ``v`` exactly when they belong to the same request and
``position(v) <= position(u)`` (:func:`specround.sampling.layouts.visibility_mask`); the mask is built
once per forward and shared by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.adapters.llama.kv_cache import RequestCache
from specround.sampling.layouts import visibility_mask

__all__ = ["PackedRows", "Segment"]


@dataclass(frozen=True, slots=True)
class Segment:
    """One request's new rows in a packed forward: ``rows`` tokens at absolute positions ``start..``."""

    cache: RequestCache
    start: int
    rows: int


class PackedRows:
    """Implements the model's ``AttentionRows`` over per-request caches (see module docstring)."""

    def __init__(self, segments: Sequence[Segment]) -> None:
        self.segments = tuple(s for s in segments if s.rows > 0)
        q_req, q_pos, k_req, k_pos = [], [], [], []
        for index, seg in enumerate(self.segments):
            end = seg.start + seg.rows
            q_req.append(torch.full((seg.rows,), index, dtype=torch.int64))
            q_pos.append(torch.arange(seg.start, end))
            k_req.append(torch.full((end,), index, dtype=torch.int64))
            k_pos.append(torch.arange(end))
        self.positions = torch.cat(q_pos) if q_pos else torch.empty(0, dtype=torch.int64)  # [Q]
        if q_pos:
            self._mask = visibility_mask(torch.cat(q_req), self.positions, torch.cat(k_req), torch.cat(k_pos))
        else:
            self._mask = torch.empty(0, 0, dtype=torch.bool)  # [Q, Kv]

    @property
    def mask(self) -> torch.Tensor:
        """[Q, Kv] bool visibility."""
        return self._mask

    def keys_values(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each request's new rows at their positions; return every request's readable rows."""
        keys, values = [], []
        offset = 0
        for seg in self.segments:
            end = seg.start + seg.rows
            store = seg.cache.storage[layer]  # [2, cap, kvh, D]
            store[0, seg.start : end] = k[offset : offset + seg.rows]
            store[1, seg.start : end] = v[offset : offset + seg.rows]
            keys.append(store[0, :end])
            values.append(store[1, :end])
            offset += seg.rows
        if len(keys) == 1:
            return keys[0], values[0]
        return torch.cat(keys), torch.cat(values)  # [Kv, kvh, D] each
