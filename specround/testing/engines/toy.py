"""A toy language model: next-token logits from a seeded table indexed by the last two tokens.

It has the shape of a real target (a function of the whole context, through its last two tokens) and runs
in microseconds, so statistical tests of engines built on it take seconds.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.errors import ShapeMismatchError

__all__ = ["ToyLM"]


class ToyLM:
    """``logits(context) = table[context[-2], context[-1]]`` (a one-token context reads row ``[0, t]``)."""

    def __init__(self, vocab_size: int = 8, *, seed: int = 0, scale: float = 1.5) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.table = scale * torch.randn(
            vocab_size, vocab_size, vocab_size, generator=gen, dtype=torch.float64
        )
        """``[V, V, V]``: the logits after the context ``(a, b)`` are ``table[a, b]``."""

    def perturbed(self, noise: float, *, seed: int) -> ToyLM:
        """A draft model: this table plus seeded Gaussian noise of scale ``noise``."""
        twin = ToyLM(self.vocab_size, seed=seed, scale=noise)
        twin.table = self.table + twin.table
        return twin

    def next_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """``[B, V]`` float64 logits after each sequence."""
        if not sequences or any(len(s) == 0 for s in sequences):
            raise ShapeMismatchError("ToyLM needs non-empty sequences")
        a = torch.tensor([s[-2] if len(s) > 1 else 0 for s in sequences])  # [B]
        b = torch.tensor([s[-1] for s in sequences])  # [B]
        return self.table[a, b]  # [B, V]
