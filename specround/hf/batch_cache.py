"""One transformers causal LM over a batch of rows: one forward per call, each row's K/V kept on its own.

The batch shares one ``DynamicCache`` whose key/value tensors are ``[B, H, T, D]``. Each row owns a list of
cache columns (its committed tokens, in order); a forward appends ``n`` columns for every row, row ``b``'s
``n_b`` new tokens in the first ``n_b`` of them (the rest are fillers). Every query sees exactly

    the key columns its row has committed, plus its row's new tokens at or before its own position

(the request-and-position visibility predicate), written as a 4-D additive mask ``[B, 1, n, T + n]``;
positions are per row (``position_ids`` = the row's committed length + offset), so RoPE sees logical
positions whatever the column. After a forward each row keeps a prefix of its new tokens
(:meth:`BatchedCausalLM.commit`) or drops committed rows (:meth:`BatchedCausalLM.truncate`); columns no
row keeps become holes that :meth:`BatchedCausalLM.compact` squeezes out (one gather per layer), which also
removes finished rows from the batch. Between steps :meth:`BatchedCausalLM.tidy` cuts only the unused
tail (no copy) and compacts only when rows leave or the holes grow past a budget.

Only full-attention ``DynamicLayer`` caches under the ``eager`` or ``sdpa`` attention paths are accepted
(a sliding-window layer would drop columns; flash attention takes no 4-D mask).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from specround.errors import CacheProtocolError, InvalidRequestError, ModelLoadError

__all__ = ["BatchedCausalLM"]

_ATTENTION_PATHS = ("eager", "sdpa")

HOLE_BUDGET = 0.125
"""Fraction of the longest row's columns that :meth:`BatchedCausalLM.tidy` leaves as holes."""
MIN_HOLES = 16
"""Holes :meth:`BatchedCausalLM.tidy` always tolerates, whatever the rows' lengths."""


class BatchedCausalLM:
    """A batch of rows over one model and one shared, per-row-masked ``DynamicCache``."""

    def __init__(self, model: Any, rows: Sequence[int], *, filler_id: int = 0) -> None:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        path = getattr(model.config, "_attn_implementation", "eager") or "eager"
        if path not in _ATTENTION_PATHS:
            raise ModelLoadError(
                f"attention implementation {path!r} takes no 4-D mask; load the model with "
                "attn_implementation='sdpa' or 'eager'"
            )
        self.model = model
        """The transformers model."""
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._slices = "logits_to_keep" in params
        try:
            self.cache = DynamicCache(config=model.config)
        except TypeError:  # releases before the config argument
            self.cache = DynamicCache()
        layers = getattr(self.cache, "layers", [])
        if any(type(layer) is not DynamicLayer for layer in layers):
            kinds = sorted({type(layer).__name__ for layer in layers})
            raise ModelLoadError(f"only full-attention caches are supported, this model uses {kinds}")
        weight = model.get_output_embeddings().weight
        self.vocab_size = int(weight.shape[0])
        """Rows of the output embedding."""
        self.device = weight.device
        self.dtype = next(model.parameters()).dtype
        self.filler_id = filler_id
        self.rows: list[int] = list(rows)
        """Row ids in batch order."""
        self.tokens: dict[int, list[int]] = {row: [] for row in self.rows}
        """Committed tokens of each row."""
        self._columns: dict[int, list[int]] = {row: [] for row in self.rows}
        self._width = 0
        self._pending: tuple[int, dict[int, list[int]]] | None = None

    # --- forward ---------------------------------------------------------------------------------------

    @torch.inference_mode()
    def forward(
        self,
        feeds: Mapping[int, Sequence[int]],
        *,
        rows: str = "all",
        tails: Mapping[int, int] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Run each row's new tokens (rows not in ``feeds`` feed nothing) in ONE forward.

        Returns the logits (float32) of each row's last ``tails[row]`` fed tokens, ``[tails[row], V]``, for
        every row with a non-zero tail. Without ``tails``, ``rows`` says which: ``"all"`` (every fed token),
        ``"last"`` (the last one) or ``"none"``. The output head runs only on the columns some row wants.
        The new tokens are pending until :meth:`commit`; a second forward before it is refused.
        """
        if self._pending is not None:
            raise CacheProtocolError("the previous forward is neither committed nor dropped")
        for row in feeds:
            if row not in self._columns:
                raise CacheProtocolError(f"row {row} is not in the batch")
        wanted = _tails(feeds, rows, tails)
        n = max((len(f) for f in feeds.values()), default=0)
        if n == 0:
            return {}
        batch, width, device = len(self.rows), self._width, self.device
        ids = torch.full((batch, n), self.filler_id, dtype=torch.int64)  # [B, n]
        positions = torch.zeros((batch, n), dtype=torch.int64)  # [B, n]
        old = torch.zeros((batch, width), dtype=torch.bool)  # [B, T] committed columns per row
        new = torch.zeros((batch, n), dtype=torch.bool)  # [B, n] real new tokens per row
        for b, row in enumerate(self.rows):
            feed = [int(t) for t in feeds.get(row, ())]
            base = len(self.tokens[row])
            positions[b] = base + torch.arange(n)
            if feed:
                ids[b, : len(feed)] = torch.tensor(feed, dtype=torch.int64)
                new[b, : len(feed)] = True
            cols = self._columns[row]
            if cols and cols[-1] - cols[0] + 1 == len(cols):  # columns only increase: a contiguous run
                old[b, cols[0] : cols[-1] + 1] = True  # a slice (a list index costs O(T) Python ints)
            elif cols:
                old[b, cols] = True
        causal = torch.ones((n, n), dtype=torch.bool).tril()  # [n(q), n(k)]
        own = new[:, None, :] & causal[None]  # [B, n, n]
        own |= torch.eye(n, dtype=torch.bool)[None]  # a filler query sees itself (no empty softmax row)
        visible = torch.cat((old[:, None, :].expand(batch, n, width), own), dim=-1)  # [B, n, T + n]
        mask = torch.zeros(visible.shape, dtype=self.dtype)
        mask.masked_fill_(~visible, torch.finfo(self.dtype).min)
        # The head's columns: the union of every row's wanted tail (row b's n_b tokens are columns 0..n_b-1).
        spans = {row: (len(feeds[row]) - t, len(feeds[row])) for row, t in wanted.items() if t}
        columns = sorted({c for start, end in spans.values() for c in range(start, end)})
        extra: dict[str, Any] = {self._cache_kwarg: self.cache}
        if self._slices and not columns:
            extra["logits_to_keep"] = 1
        elif self._slices and len(columns) < n:
            extra["logits_to_keep"] = torch.tensor(columns, dtype=torch.int64).to(device)  # [C]
        else:
            columns = list(range(n))
        out = self.model(
            input_ids=ids.to(device),
            position_ids=positions.to(device),
            attention_mask=mask[:, None].to(device),  # [B, 1, n, T + n]
            use_cache=True,
            **extra,
        )
        self._pending = (width, {row: [int(t) for t in f] for row, f in feeds.items()})
        self._width = width + n
        if not spans:
            return {}
        logits = out.logits.to(torch.float32)  # [B, C, V]
        at = {c: i for i, c in enumerate(columns)}  # a row's span is contiguous in ``columns``
        return {
            row: logits[self.rows.index(row), at[start] : at[start] + end - start]
            for row, (start, end) in spans.items()
        }

    def commit(self, keep: Mapping[int, int]) -> None:
        """Keep the first ``keep[row]`` tokens each row fed in the last forward (others keep none)."""
        if self._pending is None:
            if any(keep.values()):
                raise CacheProtocolError("no forward to commit")
            return
        start, feeds = self._pending
        for row, count in keep.items():
            fed = feeds.get(row, [])
            if not 0 <= count <= len(fed):
                raise CacheProtocolError(f"row {row}: keep {count} of {len(fed)} fed tokens")
        for row, count in keep.items():
            self._columns[row].extend(range(start, start + count))
            self.tokens[row].extend(feeds[row][:count] if count else [])
        self._pending = None

    def truncate(self, row: int, length: int) -> None:
        """Drop the row's committed tokens at positions ``>= length``."""
        if self._pending is not None:
            raise CacheProtocolError("truncate after a forward that is not committed")
        if not 0 <= length <= len(self.tokens[row]):
            raise InvalidRequestError(f"row {row}: length {length} outside 0..{len(self.tokens[row])}")
        del self.tokens[row][length:]
        del self._columns[row][length:]

    # --- layout ----------------------------------------------------------------------------------------

    def compact(self, rows: Sequence[int] | None = None) -> None:
        """Keep only ``rows`` (default: all) and squeeze every hole out of the cache.

        Afterwards row ``b``'s ``L_b`` committed tokens occupy the last ``L_b`` of ``max L`` columns.
        """
        if self._pending is not None:
            raise CacheProtocolError("compact after a forward that is not committed")
        keep_rows = list(self.rows if rows is None else rows)
        for row in keep_rows:
            if row not in self._columns:
                raise CacheProtocolError(f"row {row} is not in the batch")
        width = max((len(self._columns[r]) for r in keep_rows), default=0)
        tight = keep_rows == self.rows and all(
            self._columns[r] == list(range(self._width - len(self._columns[r]), self._width))
            for r in keep_rows
        )
        if tight and width == self._width:
            return
        batch_index = torch.tensor([self.rows.index(r) for r in keep_rows], dtype=torch.int64)
        columns = torch.zeros((len(keep_rows), width), dtype=torch.int64)  # [B', W]
        for b, row in enumerate(keep_rows):
            cols = self._columns[row]
            if cols:
                columns[b, width - len(cols) :] = torch.tensor(cols, dtype=torch.int64)
        batch_index = batch_index.to(self.device)
        columns = columns.to(self.device)
        for layer in getattr(self.cache, "layers", []):
            if not getattr(layer, "is_initialized", False) or layer.keys is None:
                continue
            for name in ("keys", "values"):
                tensor = getattr(layer, name).index_select(0, batch_index)  # [B', H, T, D]
                heads, dim = tensor.shape[1], tensor.shape[3]
                index = columns[:, None, :, None].expand(len(keep_rows), heads, width, dim)
                setattr(layer, name, tensor.gather(2, index).contiguous())  # [B', H, W, D]
        for row in list(self.rows):
            if row not in keep_rows:
                del self._columns[row]
                del self.tokens[row]
        self.rows = keep_rows
        for row in keep_rows:
            count = len(self._columns[row])
            self._columns[row] = list(range(width - count, width))
        self._width = width

    def tidy(self, rows: Sequence[int] | None = None) -> None:
        """The per-round form of :meth:`compact`: keep only ``rows`` (default: all) at the least cost.

        Rows leaving the batch, or holes that waste more than :data:`HOLE_BUDGET` of the longest row's
        columns (at least :data:`MIN_HOLES`), cost a :meth:`compact`. Otherwise only the tail columns no
        row keeps are cut (a view per layer, no copy); the holes left inside rows stay masked.
        """
        if self._pending is not None:
            raise CacheProtocolError("tidy after a forward that is not committed")
        keep_rows = list(self.rows if rows is None else rows)
        if keep_rows != self.rows:
            self.compact(keep_rows)
            return
        end = max((cols[-1] + 1 for cols in self._columns.values() if cols), default=0)
        longest = max((len(cols) for cols in self._columns.values()), default=0)
        if end - longest > max(MIN_HOLES, int(longest * HOLE_BUDGET)):
            self.compact(keep_rows)
            return
        if end == self._width:
            return
        for layer in getattr(self.cache, "layers", []):
            if not getattr(layer, "is_initialized", False) or layer.keys is None:
                continue
            layer.keys = layer.keys[:, :, :end]  # [B, H, end, D]
            layer.values = layer.values[:, :, :end]
        self._width = end

    @property
    def width(self) -> int:
        """Columns of the shared cache (holes included)."""
        return self._width


def _tails(feeds: Mapping[int, Sequence[int]], rows: str, tails: Mapping[int, int] | None) -> dict[int, int]:
    """How many of each fed row's last tokens :meth:`BatchedCausalLM.forward` returns logits for."""
    if tails is None:
        if rows not in ("all", "last", "none"):
            raise InvalidRequestError(f"rows must be all, last or none, got {rows!r}")
        every = {"all": None, "last": 1, "none": 0}[rows]
        return {row: len(f) if every is None else min(every, len(f)) for row, f in feeds.items()}
    wanted = {}
    for row, t in tails.items():
        fed = len(feeds.get(row, ()))
        if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t <= fed:
            raise InvalidRequestError(f"row {row}: a tail of {t!r} of {fed} fed tokens")
        wanted[row] = t
    return wanted
