"""Next-token logits of a model, the one thing the kit needs to compute an exact law or re-derive a row.

A :class:`LogitsModel` maps a batch of equal-length token sequences to the raw logits of the token after
each one. Adapters cover a transformers causal LM (:class:`TransformersLogits`), specround's compact Llama
(:class:`CompactLlamaLogits`) and any function (:class:`FunctionLogits`). Rows are returned in float64.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import torch

from specround.errors import ShapeMismatchError

__all__ = ["CompactLlamaLogits", "FunctionLogits", "LogitsModel", "TransformersLogits", "logits_after"]


@runtime_checkable
class LogitsModel(Protocol):
    """Raw next-token logits of a language model."""

    vocab_size: int

    def next_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B, V]`` float64: the logits after each of ``B`` sequences (all of one length, >= 1)."""
        ...


def logits_after(model: LogitsModel, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[B, V]`` float64 logits after each sequence, of any lengths: one model call per length."""
    by_length: dict[int, list[int]] = {}
    for i, seq in enumerate(sequences):
        by_length.setdefault(len(seq), []).append(i)
    out = torch.empty(len(sequences), model.vocab_size, dtype=torch.float64)
    for indices in by_length.values():
        out[indices] = model.next_logits([sequences[i] for i in indices]).to(torch.float64)
    return out


def _batch(sequences: Sequence[Sequence[int]]) -> torch.Tensor:
    lengths = {len(s) for s in sequences}
    if len(lengths) != 1 or 0 in lengths:
        raise ShapeMismatchError(
            f"next_logits needs non-empty sequences of one length, got {sorted(lengths)}"
        )
    return torch.tensor([list(s) for s in sequences], dtype=torch.int64)  # [B, L]


class TransformersLogits:
    """A transformers causal LM (``model(input_ids).logits``), evaluated without a cache."""

    def __init__(self, model: Any, *, batch_rows: int = 64) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)
        self.batch_rows = batch_rows

    def next_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B, V]`` float64 last-position logits, computed ``batch_rows`` sequences at a time."""
        ids = _batch(sequences)  # [B, L]
        device = next(self.model.parameters()).device
        out = []
        with torch.no_grad():
            for start in range(0, ids.shape[0], self.batch_rows):
                chunk = ids[start : start + self.batch_rows].to(device)
                logits = self.model(input_ids=chunk).logits[:, -1, :]  # [b, V]
                out.append(logits.to(torch.float64).cpu())
        return torch.cat(out, dim=0)[:, : self.vocab_size]


class CompactLlamaLogits:
    """specround's compact Llama (:class:`specround.adapters.llama.LlamaModel`), one sequence at a time."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.vocab_size = int(model.config.vocab_size)

    def next_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B, V]`` float64 logits after each sequence."""
        ids = _batch(sequences)  # [B, L]
        with torch.no_grad():
            rows = [self.model.logits(row)[-1] for row in ids]  # B x [V]
        return torch.stack(rows).to(torch.float64)


class FunctionLogits:
    """Any function ``[B, L] int64 -> [B, V]`` as a :class:`LogitsModel`."""

    def __init__(self, function: Callable[[torch.Tensor], torch.Tensor], vocab_size: int) -> None:
        self.function = function
        self.vocab_size = vocab_size

    def next_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B, V]`` float64 ``function(ids)``."""
        return self.function(_batch(sequences)).to(torch.float64)
