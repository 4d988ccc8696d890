"""A token-level grammar: a deterministic finite automaton of allowed next tokens.

States are ``0 .. num_states - 1``; ``transitions[state][token] = next_state``. At a state, tokens with no
transition are masked to ``-inf``; advancing over such a token is refused with
:class:`specround.errors.InvalidProcessorError` (published tokens always come from processed rows, so a
refused token means the caller broke the protocol).

The transition tables are immutable and shared between clones; the state is one integer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, integer, token_id
from specround.sampling.processors.processor import LogitProcessor

__all__ = ["TokenGrammar"]

_NEG_INF = float("-inf")
Transitions = Mapping[int, Mapping[int, int]]
"""``{state: {token: next_state}}``."""


class TokenGrammar(LogitProcessor):
    """Allowed-next-token automaton; rows along a path use each row's own grammar state."""

    kind: ClassVar[str] = "grammar"
    stateful: ClassVar[bool] = True

    def __init__(
        self,
        num_states: int,
        start: int,
        transitions: Transitions | Sequence[Sequence[int]],
        state: int | None = None,
    ) -> None:
        self.num_states = integer(self.kind, "num_states", num_states, low=1)
        self.start = self._check_state("start", start)
        table: list[dict[int, int]] = [{} for _ in range(self.num_states)]
        for src, token, dst in self._triples(transitions):
            s = self._check_state("transition source", src)
            t = token_id(self.kind, token)
            if t in table[s]:
                raise InvalidProcessorError(f"{self.kind}: two transitions from state {s} on token {t}")
            table[s][t] = self._check_state("transition target", dst)
        self._table: tuple[dict[int, int], ...] = tuple(dict(sorted(row.items())) for row in table)
        self._allowed: tuple[torch.Tensor, ...] = tuple(
            torch.tensor(list(row), dtype=torch.int64) for row in self._table
        )  # per state: [allowed tokens]
        self.current = self.start if state is None else self._check_state("state", state)

    def _check_state(self, name: str, value: Any) -> int:
        s = integer(self.kind, name, value, low=0)
        if s >= self.num_states:
            raise InvalidProcessorError(f"{self.kind}: {name} {s} outside 0..{self.num_states - 1}")
        return s

    def _triples(self, transitions: Transitions | Sequence[Sequence[int]]) -> list[tuple[Any, Any, Any]]:
        if isinstance(transitions, Mapping):
            triples: list[tuple[Any, Any, Any]] = []
            for src, row in transitions.items():
                if not isinstance(row, Mapping):
                    raise InvalidProcessorError(f"{self.kind}: transitions[{src!r}] must map token -> state")
                triples.extend((src, token, dst) for token, dst in row.items())
            return triples
        if isinstance(transitions, (str, bytes)) or not isinstance(transitions, Sequence):
            raise InvalidProcessorError(f"{self.kind}: transitions must be a mapping or [[src, token, dst]]")
        out: list[tuple[Any, Any, Any]] = []
        for triple in transitions:
            if not isinstance(triple, Sequence) or len(triple) != 3:
                raise InvalidProcessorError(f"{self.kind}: expected [src, token, dst], got {triple!r}")
            out.append((triple[0], triple[1], triple[2]))
        return out

    def params(self) -> dict[str, Any]:
        """``{"num_states", "start", "transitions": [[src, token, dst], ...]}`` sorted."""
        return {
            "num_states": self.num_states,
            "start": self.start,
            "transitions": [[s, t, d] for s, row in enumerate(self._table) for t, d in row.items()],
        }

    def state(self) -> dict[str, Any]:
        """``{"state": current}``."""
        return {"state": self.current}

    def allowed(self, state: int | None = None) -> frozenset[int]:
        """Tokens allowed next at ``state`` (default: the current state)."""
        return frozenset(self._table[self.current if state is None else state])

    def _mask(self, logits: torch.Tensor, states: Sequence[int]) -> torch.Tensor:
        keep = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)  # [n, V]
        if len(set(states)) == 1:
            keep[:, self._allowed[states[0]].to(logits.device)] = True
        else:
            for row, s in enumerate(states):
                keep[row, self._allowed[s].to(logits.device)] = True
        return logits.masked_fill(~keep, _NEG_INF)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the tokens the current state does not allow (``[N, V]``)."""
        return self._mask(logits, [self.current] * logits.shape[0])

    def apply_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Row ``i`` masked at the state reached over ``path[:i]`` (``[n, V]``; ``self`` unchanged).

        A path token the grammar refuses makes the following rows unreachable (their row already gives
        that token probability 0, so an exact sampler rejects there); those rows are masked at the last
        state reached, so that every row stays a distribution.
        """
        states = [self.current]
        for token in path[: max(0, logits.shape[0] - 1)]:
            states.append(self._table[states[-1]].get(token, states[-1]))
        return self._mask(logits, states)

    def validate_token(self, token: int) -> None:
        """Refuse a token the current state does not allow."""
        if token not in self._table[self.current]:
            raise InvalidProcessorError(f"{self.kind}: token {token} is not allowed at state {self.current}")

    def advance(self, token: int) -> None:
        """Follow the transition on ``token``; refused (nothing changes) when there is none."""
        self.validate_token(token)
        self.current = self._table[self.current][token]

    def clone(self) -> Self:
        """An independent copy sharing the immutable tables."""
        twin = object.__new__(type(self))
        twin.num_states = self.num_states
        twin.start = self.start
        twin._table = self._table
        twin._allowed = self._allowed
        twin.current = self.current
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse transitions on tokens outside the vocabulary."""
        top = max((max(row) for row in self._table if row), default=-1)
        if top >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {top} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}`` state: at the start state)."""
        check_keys(cls.kind, params, {"num_states", "start", "transitions"})
        current = None
        if state:
            check_keys(cls.kind, state, {"state"})
            current = state["state"]
        return cls(params["num_states"], params["start"], params["transitions"], state=current)
