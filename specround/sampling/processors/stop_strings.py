"""Stop strings over decoded text (transformers' ``stop_strings``), as a stop automaton over token ids.

A stop string ends the request when it occurs in the decoded text and its occurrence ends inside the text
of the token just emitted (that token may run past the string's end), as transformers' stop-string
criterion does. Only characters of the stop strings can take part in a match, so the declared table holds
the text of every token that contains such a character; any other token reads as one sentinel character.
The state is the last ``max(len(s)) - 1`` characters of that projected text.

:meth:`StopStrings.stop_tokens` is memoised per state in a table shared between clones (the declared
parameters are immutable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, token_id
from specround.sampling.processors.processor import LogitProcessor, StopAutomaton

__all__ = ["StopStrings"]

SENTINEL = "\uffff"
"""The character a token without any stop-string character reads as (refused inside stop strings)."""


class StopStrings(LogitProcessor, StopAutomaton):
    """Stop strings matched on token texts: :meth:`apply` is the identity."""

    kind: ClassVar[str] = "stop_strings"
    stateful: ClassVar[bool] = True

    def __init__(self, strings: Sequence[str], texts: Mapping[int, str], tail: str = "") -> None:
        if isinstance(strings, str) or not isinstance(strings, Sequence) or not strings:
            raise InvalidProcessorError(f"{self.kind}: declare at least one stop string")
        for s in strings:
            if not isinstance(s, str) or not s or SENTINEL in s:
                raise InvalidProcessorError(f"{self.kind}: stop strings are non-empty text, got {s!r}")
        self.strings: tuple[str, ...] = tuple(sorted(set(strings)))
        alphabet = set("".join(self.strings))
        table: dict[int, str] = {}
        for token, text in texts.items():
            t = token_id(self.kind, token)
            if not isinstance(text, str):
                raise InvalidProcessorError(f"{self.kind}: the text of token {t} must be a string")
            if alphabet.intersection(text):
                table[t] = text
        self.texts: Mapping[int, str] = table
        self._width = max(len(s) for s in self.strings) - 1
        if not isinstance(tail, str) or len(tail) > self._width:
            raise InvalidProcessorError(f"{self.kind}: tail must be text of at most {self._width} characters")
        self.tail = tail
        self._memo: dict[str, tuple[int, ...]] = {}

    @classmethod
    def from_tokenizer(cls, strings: Sequence[str], tokenizer: Any, vocab_size: int) -> StopStrings:
        """Build the table from a transformers tokenizer (each token decoded on its own)."""
        texts = tokenizer.batch_decode([[t] for t in range(vocab_size)], skip_special_tokens=False)
        return cls(strings, dict(enumerate(texts)))

    def params(self) -> dict[str, Any]:
        """``{"strings": [...], "texts": [[token, text], ...]}`` (only tokens holding a stop character)."""
        return {"strings": list(self.strings), "texts": [[t, self.texts[t]] for t in sorted(self.texts)]}

    def state(self) -> dict[str, Any]:
        """``{"tail": text}``: the last characters of the projected text."""
        return {"tail": self.tail}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Identity (a copy): stopping is decided by the sampler from :meth:`stop_tokens`."""
        return logits.clone()

    def apply_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Identity for every row."""
        del path
        return logits.clone()

    def _stops(self, tail: str) -> tuple[int, ...]:
        found = self._memo.get(tail)
        if found is None:
            hits = []
            for token, text in self.texts.items():
                combined = tail + text
                for s in self.strings:
                    if combined.find(s, max(0, len(tail) - len(s) + 1)) != -1:
                        hits.append(token)
                        break
            found = tuple(sorted(hits))
            self._memo[tail] = found
        return found

    def _after(self, tail: str, token: int) -> str:
        if not self._width:
            return ""
        return (tail + self.texts.get(token, SENTINEL))[-self._width :]

    def stop_tokens(self) -> tuple[int, ...]:
        """Tokens whose text completes a stop string now, ascending."""
        return self._stops(self.tail)

    def stop_sets_along(self, path: Sequence[int]) -> list[frozenset[int]]:
        """``len(path) + 1`` stop sets along ``path`` from the current state (``self`` unchanged)."""
        tail = self.tail
        sets = [frozenset(self._stops(tail))]
        for token in path:
            tail = self._after(tail, token)
            sets.append(frozenset(self._stops(tail)))
        return sets

    def advance(self, token: int) -> None:
        """Consume one token's text."""
        self.tail = self._after(self.tail, int(token))

    def clone(self) -> Self:
        """An independent copy sharing the immutable table and the memo."""
        twin = object.__new__(type(self))
        twin.strings = self.strings
        twin.texts = self.texts
        twin._width = self._width
        twin.tail = self.tail
        twin._memo = self._memo
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse table tokens outside the vocabulary."""
        if self.texts and max(self.texts) >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {max(self.texts)} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}``: empty tail)."""
        check_keys(cls.kind, params, {"strings", "texts"})
        pairs = params["texts"]
        if not isinstance(pairs, (list, tuple)) or any(
            not isinstance(p, (list, tuple)) or len(p) != 2 for p in pairs
        ):
            raise InvalidProcessorError(f"{cls.kind}: texts must be [[token, text], ...]")
        texts = {p[0]: p[1] for p in pairs}
        if state:
            check_keys(cls.kind, state, {"tail"})
            return cls(params["strings"], texts, state["tail"])
        return cls(params["strings"], texts)
