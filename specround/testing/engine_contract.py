"""What the kit asks of an engine: the first tokens of its speculative path, and optionally its rounds.

The black-box contract (:class:`Engine`) is one batched call: for each :class:`EngineRequest` (prompt ids,
sampling settings, seed, horizon H) return the first H tokens the engine's speculative decoding generates
(fewer when it stopped at the end-of-sequence token; the stop token included). A request's output must be
a function of its own prompt, settings and seed, whatever else is in the batch.

Engines that expose their rounds also implement :class:`TracingEngine`: one request, run alone, with a
:class:`RoundTrace` per round holding what the engine used (drafts, the q rows that sampled them, the
target's p rows, what it emitted and, when it has them, the uniforms it drew). The white-box checks of
:mod:`specround.testing.round_checks` re-derive each of those from the models themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from specround.testing.settings import SamplingSettings

__all__ = ["Engine", "EngineRequest", "RoundTrace", "TracingEngine"]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation the kit asks for."""

    prompt: tuple[int, ...]
    settings: SamplingSettings
    seed: int
    horizon: int
    """How many generated tokens the kit reads (the engine may stop earlier at EOS)."""


@dataclass(frozen=True)
class RoundTrace:
    """One speculative round as the engine ran it (white-box evidence)."""

    prefix: tuple[int, ...]
    """Tokens generated before this round (the prompt excluded): the published state it starts from."""
    draft_ids: tuple[int, ...]
    q_rows: torch.Tensor | None
    """[k, V] the distributions the drafts were sampled from; None for a deterministic proposer (prompt
    lookup), whose q is one-hot at each draft."""
    p_rows: torch.Tensor
    """[k+1, V] the target's processed rows the engine decided with."""
    emitted: tuple[int, ...]
    """Tokens the round appended to the output."""
    sampling_rows: torch.Tensor | None = None
    """[k, V] the rows the drafts were actually drawn from, when the engine can expose them (read at the
    sampling call itself); ``q_rows`` must equal them."""
    accept_uniforms: tuple[float, ...] | None = None
    """The uniforms of the reached acceptance tests, when the engine exposes them."""
    terminal_uniform: float | None = None
    """The uniform of the correction or bonus draw (None when no such draw or not exposed)."""


@runtime_checkable
class Engine(Protocol):
    """A speculative decoding engine under test (black box)."""

    name: str
    """Shown in verdict tables."""

    def generate(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """The first ``horizon`` generated tokens of each request, in order (one batch)."""
        ...


@runtime_checkable
class TracingEngine(Engine, Protocol):
    """An engine that also exposes its rounds (white box)."""

    def trace(self, request: EngineRequest) -> tuple[tuple[int, ...], list[RoundTrace]]:
        """Run one request alone: its first ``horizon`` tokens and every round that produced them."""
        ...
