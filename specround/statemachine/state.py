"""Authoritative request state S = (O, C, F, P, G, R, V) and the speculative commit record (0x06A, 0x06E).

Both are frozen pydantic models. A round never mutates a state: it stages a successor off to the side from
the round-start snapshot S_0, validates it by token identities, and publishes it under the generation fence.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specround.canonical import digest
from specround.sampling.types import Layout

__all__ = [
    "FinishReason",
    "RequestConfig",
    "RequestState",
    "RngCounters",
    "SpeculativeCommit",
    "TerminalName",
]

FinishReason = Literal["stop", "length"]
"""Why a request finished: an emitted stop token/sequence, or the output budget."""

TerminalName = Literal["correction", "bonus", "stop"]
"""Terminal kinds by name, as logged (see :class:`specround.sampling.types.TerminalKind`)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class RngCounters(BaseModel):
    """Next unused counter of each counter-based stream of one request (R)."""

    model_config = _FROZEN

    proposal: int = Field(0, ge=0)
    accept: int = Field(0, ge=0)
    terminal: int = Field(0, ge=0)

    def as_tuple(self) -> tuple[int, int, int]:
        """``(proposal, accept, terminal)``."""
        return (self.proposal, self.accept, self.terminal)


class RequestConfig(BaseModel):
    """What a request was opened with; immutable for its whole life."""

    model_config = _FROZEN

    request_id: str = Field(min_length=1, max_length=200)
    prompt_ids: tuple[int, ...] = Field(min_length=1)
    seed: int
    max_new_tokens: int = Field(ge=1)
    layout: Layout
    processors: tuple[dict[str, Any], ...] = ()
    """The declared processor chain (``ProcessorChain.to_spec()``) before any token was consumed."""
    vocab_size: int = Field(ge=1)
    coordinate: dict[str, Any] = Field(default_factory=dict)
    """Static parts of the round coordinate (model ids, vocabulary, ...), opaque to the state machine."""

    def digest(self) -> str:
        """Canonical digest of the configuration."""
        return digest(self)


class RequestState(BaseModel):
    """S = (O, C, F, P, G, R, V) plus the finished flag.

    For an unfinished request, ``cache == output[:-1]`` and ``frontier == output[-1]`` (INV-1); a finished
    request keeps the same shape (the final token's row is never materialised).
    """

    model_config = _FROZEN

    request_id: str
    output: tuple[int, ...]
    """O: every emitted token, prompt included."""
    prompt_len: int = Field(ge=1)
    cache: tuple[int, ...]
    """C: token ids whose target K/V rows are committed, in position order."""
    frontier: int | None
    """F: the emitted token with no K/V row yet."""
    position: int = Field(ge=0)
    """P: absolute position of the next input row, ``len(cache)``."""
    processors: tuple[dict[str, Any], ...]
    """G: the processor chain's spec with state, advanced over published tokens only."""
    processors_digest: str
    rng: RngCounters
    """R."""
    generation: int = Field(ge=0)
    """V: publication version; round r publishes generation r."""
    finished: bool = False
    finish_reason: FinishReason | None = None

    @property
    def generated(self) -> tuple[int, ...]:
        """Tokens emitted after the prompt."""
        return self.output[self.prompt_len :]

    def digest(self) -> str:
        """Canonical digest of the whole state."""
        return digest(self)


class SpeculativeCommit(BaseModel):
    """The transaction record of one round (0x06E), built and validated before the fence."""

    model_config = _FROZEN

    request_id: str
    round_id: str
    expected_generation: int = Field(ge=0)
    layout: Layout
    accepted_draft_count: int = Field(ge=0)
    terminal_kind: TerminalName
    emitted_token_ids: tuple[int, ...] = Field(min_length=1)
    committed_kv_token_ids: tuple[int, ...]
    discarded_kv_token_ids: tuple[int, ...]
    rng_before: tuple[int, int, int]
    rng_after: tuple[int, int, int]
    processor_before_hash: str
    processor_after_hash: str
    finished: bool
    finish_reason: FinishReason | None = None
    coordinate_digest: str
    successor_digest: str
    """Digest of the staged successor :class:`RequestState`."""

    def digest(self) -> str:
        """Canonical digest: two publications are "the same transaction" iff their digests agree."""
        return digest(self)
