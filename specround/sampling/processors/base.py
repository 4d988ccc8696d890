"""The processor contract: declared, ordered, hashed logit transforms, some of them stateful.

A :class:`LogitProcessor` maps a batch of logit rows ``[N, V]`` to transformed logits ``[N, V]`` (masking
with ``-inf``). Stateless processors depend only on their declared parameters; stateful ones (penalties,
the stop-sequence automaton, the grammar) also hold state that advances over *published* tokens only
(0x06D): a round clones the request's processors, advances the clone along a draft path to build rows, and
the successor advances a fresh clone over the emitted tokens.

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
