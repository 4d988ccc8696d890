"""Stop sequences as an Aho–Corasick automaton over token ids (EOS is a one-token sequence).

The automaton's state is the longest suffix of the tokens advanced over that is a prefix of some stop
sequence (a node of the sequences' trie). Emitting token ``t`` at that state ends the request exactly
when some stop sequence is a suffix of ``history + [t]``; those tokens are precomputed per node (the
node's own completing children united with those of its failure link), so :meth:`StopSequences.stop_tokens`
is a lookup and :meth:`StopSequences.advance` follows at most a few failure links (amortised O(1)).

The tables are immutable and shared between clones: cloning copies one integer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, token_id
from specround.sampling.processors.processor import LogitProcessor, StopAutomaton

__all__ = ["StopSequences"]

_ROOT = 0


@dataclass(frozen=True, slots=True)
class _Automaton:
    """Trie of the stop sequences with failure links and per-node stop sets."""

    children: tuple[dict[int, int], ...]
    """Trie edges of each node."""
    fail: tuple[int, ...]
    """Failure link: the node of the longest proper suffix that is also a trie node."""
    paths: tuple[tuple[int, ...], ...]
    """Token path from the root to each node."""
    stops: tuple[frozenset[int], ...]
    """Tokens that complete a stop sequence when emitted at each node."""

    @classmethod
    def build(cls, sequences: Sequence[tuple[int, ...]]) -> _Automaton:
        children: list[dict[int, int]] = [{}]
        paths: list[tuple[int, ...]] = [()]
        completing: list[set[int]] = [set()]
        for seq in sequences:
            node = _ROOT
            for token in seq[:-1]:
                node = cls._child(children, paths, completing, node, token)
            completing[node].add(seq[-1])
            cls._child(children, paths, completing, node, seq[-1])
        fail = [_ROOT] * len(children)
        stops: list[frozenset[int]] = [frozenset()] * len(children)
        stops[_ROOT] = frozenset(completing[_ROOT])
        queue = deque(children[_ROOT].values())
        while queue:  # breadth first: a node's failure link is shallower, so already complete
            node = queue.popleft()
            stops[node] = frozenset(completing[node]) | stops[fail[node]]
            for token, child in children[node].items():
                link = fail[node]
                while link != _ROOT and token not in children[link]:
                    link = fail[link]
                target = children[link].get(token, _ROOT)
                fail[child] = target if target != child else _ROOT
                queue.append(child)
        return cls(tuple(children), tuple(fail), tuple(paths), tuple(stops))

    @staticmethod
    def _child(
        children: list[dict[int, int]],
        paths: list[tuple[int, ...]],
        completing: list[set[int]],
        node: int,
        token: int,
    ) -> int:
        nxt = children[node].get(token)
        if nxt is None:
            nxt = len(children)
            children[node][token] = nxt
            children.append({})
            paths.append((*paths[node], token))
            completing.append(set())
        return nxt

    def step(self, node: int, token: int) -> int:
        """The node after consuming ``token`` at ``node``."""
        while node != _ROOT and token not in self.children[node]:
            node = self.fail[node]
        return self.children[node].get(token, _ROOT)

    def walk(self, tokens: Sequence[int]) -> int:
        """The node reached from the root along ``tokens``, which must be a trie path."""
        node = _ROOT
        for token in tokens:
            nxt = self.children[node].get(token)
            if nxt is None:
                raise InvalidProcessorError(
                    f"stop_sequences: state {list(tokens)} is not a stop-sequence prefix"
                )
            node = nxt
        return node


class StopSequences(LogitProcessor, StopAutomaton):
    """Token-id stop sequences: :meth:`apply` is the identity, :meth:`stop_tokens` what would stop now."""

    kind: ClassVar[str] = "stop_sequences"
    stateful: ClassVar[bool] = True
    transforms_logits: ClassVar[bool] = False

    def __init__(self, sequences: Sequence[Sequence[int]]) -> None:
        if isinstance(sequences, (str, bytes)) or not isinstance(sequences, Sequence):
            raise InvalidProcessorError(f"{self.kind}: sequences must be a list of token-id lists")
        if len(sequences) == 0:
            raise InvalidProcessorError(f"{self.kind}: declare at least one sequence")
        normalised: set[tuple[int, ...]] = set()
        for seq in sequences:
            if isinstance(seq, (str, bytes)) or not isinstance(seq, Sequence) or len(seq) == 0:
                raise InvalidProcessorError(f"{self.kind}: each sequence must be a non-empty list of ids")
            normalised.add(tuple(token_id(self.kind, t) for t in seq))
        self.sequences: tuple[tuple[int, ...], ...] = tuple(sorted(normalised))
        self._automaton = _Automaton.build(self.sequences)
        self._node = _ROOT

    def params(self) -> dict[str, Any]:
        """``{"sequences": [[ids...], ...]}`` sorted and deduplicated."""
        return {"sequences": [list(seq) for seq in self.sequences]}

    def state(self) -> dict[str, Any]:
        """``{"match": [ids...]}``: the longest suffix of the history that is a stop-sequence prefix."""
        return {"match": list(self._automaton.paths[self._node])}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Identity (a copy): stopping is decided by the sampler from :meth:`stop_tokens`."""
        return logits.clone()

    def apply_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Identity for every row."""
        del path
        return logits.clone()

    def advance(self, token: int) -> None:
        """Consume one token."""
        self._node = self._automaton.step(self._node, token)

    def stop_tokens(self) -> tuple[int, ...]:
        """Tokens that complete a stop sequence if emitted now, ascending."""
        return tuple(sorted(self._automaton.stops[self._node]))

    def stop_sets_along(self, path: Sequence[int]) -> list[frozenset[int]]:
        """``len(path) + 1`` stop sets along ``path`` from the current state (``self`` unchanged)."""
        node = self._node
        sets = [self._automaton.stops[node]]
        for token in path:
            node = self._automaton.step(node, token)
            sets.append(self._automaton.stops[node])
        return sets

    def clone(self) -> Self:
        """An independent copy sharing the immutable automaton."""
        twin = object.__new__(type(self))
        twin.sequences = self.sequences
        twin._automaton = self._automaton
        twin._node = self._node
        return twin

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse stop tokens outside the vocabulary."""
        top = max((max(seq) for seq in self.sequences), default=-1)
        if top >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {top} outside vocab {vocab_size}")

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}`` state: nothing matched yet)."""
        check_keys(cls.kind, params, {"sequences"})
        made = cls(params["sequences"])
        if state:
            check_keys(cls.kind, state, {"match"})
            match = state["match"]
            if not isinstance(match, (list, tuple)):
                raise InvalidProcessorError(f"{cls.kind}: match must be a list of token ids")
            made._node = made._automaton.walk([token_id(cls.kind, t) for t in match])
        return made
