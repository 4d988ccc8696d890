"""Per-request K/V storage with explicit commit and discard.

Each request owns one tensor ``[L, 2, capacity, kv_heads, D]`` indexed by *absolute position*. Rows
``[0, length)`` are committed (their token ids are :attr:`RequestCache.token_ids`). Rows past the committed
length are scratch: a retained frontier row (at position ``length``) and the rows of at most one live
verification branch are written there by the forward itself. Committing ``keep`` rows of a branch therefore
moves no data: it only extends the committed token ids; discarding forgets the branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specround.errors import CacheProtocolError
from specround.statemachine.model_ports import BranchHandle

__all__ = ["KVStore", "RequestCache", "RetainedFrontier"]


@dataclass(frozen=True, slots=True)
class RetainedFrontier:
    """A frontier whose K/V row was computed ahead of its round (``retained_frontier`` layout)."""

    token: int
    logits: torch.Tensor
    """[V] float32 raw logits of the row: they score the token after the frontier (p_1)."""


class RequestCache:
    """The K/V rows of one request."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, capacity: int) -> None:
        self.storage = torch.empty(num_layers, 2, capacity, kv_heads, head_dim)  # [L, 2, cap, kvh, D]
        self.token_ids: list[int] = []
        """Committed token ids, in position order."""
        self.retained: RetainedFrontier | None = None
        """The retained frontier, whose row sits at position ``length`` (not committed yet)."""
        self.branch: BranchHandle | None = None
        """The live verification branch, if any."""

    @property
    def length(self) -> int:
        """Committed rows."""
        return len(self.token_ids)

    @property
    def capacity(self) -> int:
        """Rows the storage holds before it must grow."""
        return int(self.storage.shape[2])

    def reserve(self, rows: int, limit: int) -> None:
        """Make room for positions ``[0, rows)`` (doubling, at most ``limit``), keeping every written row."""
        if rows <= self.capacity:
            return
        new_capacity = min(max(rows, 2 * self.capacity), max(rows, limit))
        keep = self.length + (1 if self.retained is not None else 0)
        grown = torch.empty(
            (*self.storage.shape[:2], new_capacity, *self.storage.shape[3:]), dtype=self.storage.dtype
        )
        grown[:, :, :keep] = self.storage[:, :, :keep]
        self.storage = grown


class KVStore:
    """The caches of every open request of one model (or of one early-exit view of it)."""

    def __init__(
        self, *, num_layers: int, kv_heads: int, head_dim: int, max_positions: int, initial_capacity: int = 64
    ) -> None:
        self.num_layers = num_layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.max_positions = max_positions
        self.initial_capacity = max(1, min(initial_capacity, max_positions))
        self._caches: dict[str, RequestCache] = {}

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._caches

    def __len__(self) -> int:
        return len(self._caches)

    def open(self, request_id: str, rows: int) -> RequestCache:
        """A new empty cache with room for ``rows`` positions; refuses an id that is already open."""
        if request_id in self._caches:
            raise CacheProtocolError(f"request {request_id!r} is already open")
        capacity = min(max(rows, self.initial_capacity), self.max_positions)
        cache = RequestCache(self.num_layers, self.kv_heads, self.head_dim, max(capacity, 1))
        self._caches[request_id] = cache
        return cache

    def get(self, request_id: str) -> RequestCache:
        """The cache of an open request."""
        try:
            return self._caches[request_id]
        except KeyError:
            raise CacheProtocolError(f"request {request_id!r} is not open") from None

    def release(self, request_id: str) -> None:
        """Forget a request; unknown ids are ignored."""
        self._caches.pop(request_id, None)
