"""The processor contract: declared, ordered, hashed logit transforms, some of them stateful.

A :class:`LogitProcessor` maps a batch of logit rows ``[N, V]`` to transformed logits ``[N, V]`` (masking
with ``-inf``). Stateless processors depend only on their declared parameters; stateful ones (penalties,
the stop-sequence automaton, the grammar) also hold state that advances over *published* tokens only
(contract#reached-events): a round clones the request's processors, advances the clone along a draft path to
build rows, and the successor advances a fresh clone over the emitted tokens.

Every processor has a registry ``kind``, JSON-able ``params()`` (declared configuration) and ``state()``
(empty for stateless ones); together with the order they define the chain's canonical digest.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import torch

__all__ = ["LogitProcessor", "StopAutomaton"]


class LogitProcessor(ABC):
    """One declared transform of logit rows."""

    kind: ClassVar[str]
    """Registry name, e.g. ``"temperature"``; part of the canonical digest."""
    stateful: ClassVar[bool] = False
    """Whether :meth:`advance` changes the processor."""
    transforms_logits: ClassVar[bool] = True
    """Whether :meth:`apply` can change a logit; ``False`` for an identity (a chain skips it)."""
    keeps_non_finite: ClassVar[bool] = False
    """Whether :meth:`apply` always maps a NaN or ``+inf`` logit to NaN or ``+inf`` (e.g. ``x / t``, ``x +
    b``): a chain of such processors finds non-finite input in its processed rows, one pass fewer."""

    @abstractmethod
    def params(self) -> dict[str, Any]:
        """Declared parameters as JSON-able values (the configuration part of the digest)."""

    def state(self) -> dict[str, Any]:
        """JSON-able state of a stateful processor; ``{}`` for stateless ones."""
        return {}

    @abstractmethod
    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Transform logit rows ``[N, V]`` (float) into logit rows ``[N, V]``; ``-inf`` removes a token.

        Every row is processed at this processor's *current* state. Must not modify ``logits`` in place.
        """

    def advance(self, token: int) -> None:
        """Consume one published token (stateful processors); stateless processors ignore it."""
        del token

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse (``InvalidProcessorError``) parameters that name tokens outside ``[0, vocab_size)``."""
        del vocab_size

    def validate_token(self, token: int) -> None:
        """Refuse (``InvalidProcessorError``) a token that :meth:`advance` cannot consume, changing nothing.

        Lets a chain check every processor before advancing any of them, so a refused token leaves the
        whole chain untouched.
        """
        del token

    def apply_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Row ``i`` of ``logits`` ``[n, V]`` processed at this processor's state advanced over ``path[:i]``.

        ``len(path) >= n - 1``; returns ``[n, V]``; ``self`` is not modified. Stateless processors process
        every row at once; the default for stateful ones clones and walks the path one row at a time, and
        subclasses may vectorise it.
        """
        if not self.stateful:
            return self.apply(logits)
        walker = self.clone()
        rows = []
        for i in range(logits.shape[0]):
            rows.append(walker.apply(logits[i : i + 1]))
            if i + 1 < logits.shape[0]:
                walker.advance(path[i])
        return torch.cat(rows, dim=0) if rows else logits.clone()

    def clone(self) -> Self:
        """An independent copy whose later :meth:`advance` calls do not affect this one."""
        return type(self).from_spec(self.params(), self.state())

    @classmethod
    @abstractmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild a processor from :meth:`params` and :meth:`state` (used by replay and the log)."""


class StopAutomaton(ABC):
    """A stateful component that decides which next tokens would end the request (EOS, stop sequences)."""

    @abstractmethod
    def stop_tokens(self) -> Sequence[int]:
        """Tokens that, emitted at the current state, end the request."""

    def stop_sets_along(self, path: Sequence[int]) -> list[frozenset[int]]:
        """``len(path) + 1`` stop sets: set ``i`` is :meth:`stop_tokens` after advancing over ``path[:i]``.

        The default needs ``self`` to be a :class:`LogitProcessor` too (it walks a clone); ``self`` is not
        modified.
        """
        if not isinstance(self, LogitProcessor):
            raise TypeError(f"{type(self).__name__} must override stop_sets_along")
        walker = self.clone()
        assert isinstance(walker, StopAutomaton)
        sets = [frozenset(walker.stop_tokens())]
        for token in path:
            walker.advance(token)
            sets.append(frozenset(walker.stop_tokens()))
        return sets
