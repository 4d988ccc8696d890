"""Processors over the token history: no-repeat n-grams, banned sequences, suppressed tokens, min length.

These follow the transformers logits processors of the same purpose, over the tokens the processor was
advanced over (the prompt, then published tokens only, contract#reached-events):

* :class:`NoRepeatNGram` (``no_repeat_ngram_size``): a token that would complete an n-gram already present
  in the history is removed.
* :class:`BannedSequences` (``bad_words_ids``): a one-token sequence is always removed; a longer one removes
  its last token when the history ends with the rest of it.
* :class:`SuppressTokens` (``suppress_tokens``, stateless): the listed tokens are always removed.
* :class:`MinLength` (``min_length`` / ``min_new_tokens``): the end tokens are removed while fewer than
  ``min_length`` tokens were advanced over.

State is JSON-able (the history, the tail, the count) so a chain's digest covers it and replay rebuilds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, integer, spec_arguments, token_id
from specround.sampling.processors.processor import LogitProcessor

__all__ = ["BannedSequences", "MinLength", "NoRepeatNGram", "SuppressTokens"]

_NEG_INF = float("-inf")


def _token_list(kind: str, name: str, values: Any) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise InvalidProcessorError(f"{kind}: {name} must be a list of token ids")
    return [token_id(kind, t) for t in values]


def _mask(logits: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    out = logits.clone()
    if tokens:
        out[:, torch.tensor(sorted(set(tokens)), dtype=torch.int64, device=logits.device)] = _NEG_INF
    return out


class NoRepeatNGram(LogitProcessor):
    """Remove each token that would repeat an n-gram of the history (``no_repeat_ngram_size``)."""

    kind: ClassVar[str] = "no_repeat_ngram"
    stateful: ClassVar[bool] = True

    def __init__(self, n: int, history: Sequence[int] = ()) -> None:
        self.n = integer(self.kind, "n", n, low=1)
        self.history: list[int] = _token_list(self.kind, "history", history)
        self._next: dict[tuple[int, ...], set[int]] = {}
        for end in range(self.n, len(self.history) + 1):
            self._index(end)

    def _index(self, end: int) -> None:
        """Record the n-gram ending at ``history[end - 1]``."""
        gram = self.history[end - self.n : end]
        self._next.setdefault(tuple(gram[:-1]), set()).add(gram[-1])

    def params(self) -> dict[str, Any]:
        """``{"n": n}``."""
        return {"n": self.n}

    def state(self) -> dict[str, Any]:
        """``{"history": [ids...]}``."""
        return {"history": list(self.history)}

    def banned(self) -> set[int]:
        """Tokens that would complete a repeated n-gram now."""
        if len(self.history) + 1 < self.n:
            return set()
        prefix = tuple(self.history[len(self.history) - self.n + 1 :]) if self.n > 1 else ()
        return self._next.get(prefix, set())

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Remove the banned tokens from every row."""
        return _mask(logits, sorted(self.banned()))

    def advance(self, token: int) -> None:
        """Append one token to the history."""
        self.history.append(int(token))
        if len(self.history) >= self.n:
            self._index(len(self.history))

    def clone(self) -> Self:
        """An independent copy (the history and its index are copied)."""
        twin = object.__new__(type(self))
        twin.n = self.n
        twin.history = list(self.history)
        twin._next = {key: set(value) for key, value in self._next.items()}
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse history tokens outside the vocabulary."""
        if self.history and max(self.history) >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {max(self.history)} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}``: empty history)."""
        return cls(*spec_arguments(cls.kind, params, ("n",), state, "history"))


class BannedSequences(LogitProcessor):
    """Token sequences that must not be generated (transformers' ``bad_words_ids``)."""

    kind: ClassVar[str] = "banned_sequences"
    stateful: ClassVar[bool] = True

    def __init__(self, sequences: Sequence[Sequence[int]], tail: Sequence[int] = ()) -> None:
        if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence) or not sequences:
            raise InvalidProcessorError(f"{self.kind}: declare at least one sequence")
        normalised = set()
        for seq in sequences:
            ids = _token_list(self.kind, "sequence", seq)
            if not ids:
                raise InvalidProcessorError(f"{self.kind}: a sequence must hold at least one token id")
            normalised.add(tuple(ids))
        self.sequences: tuple[tuple[int, ...], ...] = tuple(sorted(normalised))
        self._width = max(len(s) for s in self.sequences) - 1
        self._always = sorted({s[0] for s in self.sequences if len(s) == 1})
        ids = _token_list(self.kind, "tail", tail)
        self.tail: list[int] = ids[len(ids) - self._width :] if self._width and ids else []

    def params(self) -> dict[str, Any]:
        """``{"sequences": [[ids...], ...]}`` sorted and deduplicated."""
        return {"sequences": [list(s) for s in self.sequences]}

    def state(self) -> dict[str, Any]:
        """``{"tail": [ids...]}``: the last tokens advanced over (as many as the longest prefix needs)."""
        return {"tail": list(self.tail)}

    def banned(self) -> set[int]:
        """Tokens that would complete a banned sequence now."""
        out = set(self._always)
        for seq in self.sequences:
            head = len(seq) - 1
            if head and len(self.tail) >= head and tuple(self.tail[len(self.tail) - head :]) == seq[:-1]:
                out.add(seq[-1])
        return out

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Remove the banned tokens from every row."""
        return _mask(logits, sorted(self.banned()))

    def advance(self, token: int) -> None:
        """Append one token to the tail, keeping only what the longest sequence needs."""
        if self._width:
            self.tail.append(int(token))
            if len(self.tail) > self._width:
                del self.tail[0]

    def clone(self) -> Self:
        """An independent copy sharing the immutable sequences."""
        twin = object.__new__(type(self))
        twin.sequences = self.sequences
        twin._width = self._width
        twin._always = self._always
        twin.tail = list(self.tail)
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse sequence tokens outside the vocabulary."""
        top = max(max(s) for s in self.sequences)
        if top >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {top} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}``: nothing seen yet)."""
        return cls(*spec_arguments(cls.kind, params, ("sequences",), state, "tail"))


class SuppressTokens(LogitProcessor):
    """Always remove the listed tokens (transformers' ``suppress_tokens``)."""

    kind: ClassVar[str] = "suppress_tokens"

    def __init__(self, tokens: Sequence[int]) -> None:
        ids = _token_list(self.kind, "tokens", tokens)
        if not ids:
            raise InvalidProcessorError(f"{self.kind}: declare at least one token")
        self.tokens: tuple[int, ...] = tuple(sorted(set(ids)))

    def params(self) -> dict[str, Any]:
        """``{"tokens": [ids...]}`` sorted and deduplicated."""
        return {"tokens": list(self.tokens)}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Remove the listed tokens from every row."""
        return _mask(logits, self.tokens)

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse tokens outside the vocabulary."""
        if self.tokens[-1] >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {self.tokens[-1]} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` (stateless)."""
        check_keys(cls.kind, params, {"tokens"})
        if state:
            raise InvalidProcessorError(f"{cls.kind} is stateless but was given state {state!r}")
        return cls(params["tokens"])


class MinLength(LogitProcessor):
    """Remove the end tokens while fewer than ``min_length`` tokens were advanced over."""

    kind: ClassVar[str] = "min_length"
    stateful: ClassVar[bool] = True

    def __init__(self, min_length: int, end_tokens: Sequence[int], length: int = 0) -> None:
        self.min_length = integer(self.kind, "min_length", min_length, low=0)
        ids = _token_list(self.kind, "end_tokens", end_tokens)
        if not ids:
            raise InvalidProcessorError(f"{self.kind}: declare at least one end token")
        self.end_tokens: tuple[int, ...] = tuple(sorted(set(ids)))
        self.length = integer(self.kind, "length", length, low=0)

    def params(self) -> dict[str, Any]:
        """``{"min_length": m, "end_tokens": [ids...]}``."""
        return {"min_length": self.min_length, "end_tokens": list(self.end_tokens)}

    def state(self) -> dict[str, Any]:
        """``{"length": tokens advanced over, capped at min_length}``."""
        return {"length": self.length}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Remove the end tokens from every row while the length is short."""
        if self.length < self.min_length:
            return _mask(logits, self.end_tokens)
        return logits.clone()

    def advance(self, token: int) -> None:
        """Count one token (the count stops at ``min_length``: beyond it nothing changes)."""
        del token
        self.length = min(self.length + 1, self.min_length)

    def clone(self) -> Self:
        """An independent copy."""
        twin = object.__new__(type(self))
        twin.min_length = self.min_length
        twin.end_tokens = self.end_tokens
        twin.length = self.length
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse end tokens outside the vocabulary."""
        if self.end_tokens[-1] >= vocab_size:
            raise InvalidProcessorError(
                f"{self.kind}: token {self.end_tokens[-1]} outside vocab {vocab_size}"
            )

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}``: nothing counted yet)."""
        return cls(*spec_arguments(cls.kind, params, ("min_length", "end_tokens"), state, "length"))
