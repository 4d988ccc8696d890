"""Authoritative request state S = (O, C, F, P, G, R, V) and the speculative commit record.

Contract: contract#round-transaction, contract#fenced-publication.

Both are frozen pydantic models. A round never mutates a state: it stages a successor off to the side from
the round-start snapshot S_0, validates it by token identities, and publishes it under the generation fence.

State digest. :meth:`RequestState.digest` hashes the canonical JSON of every field, except that the two
token sequences O and C enter as ``{"length": n, "fold": hex}`` where the fold is a left fold of SHA-256
over the tokens (:func:`fold_tokens`). The fold extends in O(emitted) per round, so the controller and
replay digest a successor without re-serialising the whole output (:func:`state_digest` takes the folds);
the value is the same whichever way it is computed.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specround.canonical import digest, dumps_trusted, first_non_finite
from specround.sampling.types import Layout
from specround.statemachine.records import record_digest, register_record
from specround.statemachine.tokens import Tokens

__all__ = [
    "TOKEN_FOLD_SEED",
    "FinishReason",
    "RequestConfig",
    "RequestState",
    "RngCounters",
    "SpeculativeCommit",
    "TerminalName",
    "fold_tokens",
    "state_digest",
]

TOKEN_FOLD_SEED: bytes = hashlib.sha256(b"specround/token-fold/v1").digest()
"""The fold of the empty token sequence."""


_pack_int64_le = struct.Struct("<q").pack


def fold_tokens(fold: bytes, tokens: Iterable[int]) -> bytes:
    """Extend a token fold: ``fold <- sha256(fold || int64_le(token))`` for each token in order."""
    sha = hashlib.sha256
    pack = _pack_int64_le
    for token in tokens:
        try:
            data = pack(token)  # the bytes of token.to_bytes(8, "little", signed=True), at less cost
        except struct.error:  # what pack refuses fails as it always did (OverflowError, AttributeError)
            data = token.to_bytes(8, "little", signed=True)
        fold = sha(fold + data).digest()
    return fold


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
    softmax: str = "max_shift"
    """The processor chain's softmax backend (part of the chain's digest, not of its spec)."""
    prompt_advances_processors: bool = True
    """Whether the initial processor state G_0 is the declared chain advanced over the prompt (penalties
    count prompt tokens, stop sequences may straddle the prompt's end) or the declared chain itself (needed
    for a grammar that constrains the generated text only)."""

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
    output: Tokens
    """O: every emitted token, prompt included (any sequence of ints validates into :class:`Tokens`)."""
    prompt_len: int = Field(ge=1)
    cache: Tokens
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

    @property
    def generated_count(self) -> int:
        """``len(self.generated)`` without copying the tokens."""
        return max(0, len(self.output) - self.prompt_len)

    def digest(self) -> str:
        """Canonical digest of the whole state (see the module docstring for how O and C enter)."""
        return state_digest(
            self, fold_tokens(TOKEN_FOLD_SEED, self.output), fold_tokens(TOKEN_FOLD_SEED, self.cache)
        )


def state_digest(state: RequestState, output_fold: bytes, cache_fold: bytes) -> str:
    """:meth:`RequestState.digest` given the folds of ``state.output`` and ``state.cache`` (not rechecked)."""
    document = {
        "cache": {"fold": cache_fold.hex(), "length": len(state.cache)},
        "finish_reason": state.finish_reason,
        "finished": state.finished,
        "frontier": state.frontier,
        "generation": state.generation,
        "output": {"fold": output_fold.hex(), "length": len(state.output)},
        "position": state.position,
        "processors": state.processors,
        "processors_digest": state.processors_digest,
        "prompt_len": state.prompt_len,
        "request_id": state.request_id,
        "rng": {"accept": state.rng.accept, "proposal": state.rng.proposal, "terminal": state.rng.terminal},
    }
    if state.processors and first_non_finite(state.processors) is not None:
        raise ValueError(f"the processor state of {state.request_id!r} holds a non-finite float")
    # Every other field is an int, str, bool or None: no NaN check needed.
    return hashlib.sha256(dumps_trusted(document)).hexdigest()


class SpeculativeCommit(BaseModel):
    """The transaction record of one round, checked before the fence (contract#fenced-publication)."""

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
        return record_digest(self)


for _record in (RngCounters, RequestState, SpeculativeCommit):
    register_record(_record)
