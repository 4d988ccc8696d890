"""Token lists as z3 terms, and the small term builders the protocol model shares.

Lists are z3 arrays plus a length, which z3 decides quickly; the sequence theory times out on symbolic
truncation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeAlias

import z3

from specround.sampling.types import PAD_ID

__all__ = ["Bool", "Int", "TokenList", "first_true", "select"]

Int: TypeAlias = z3.ArithRef
"""A z3 integer term."""
Bool: TypeAlias = z3.BoolRef
"""A z3 boolean term."""
_ARRAY = z3.ArraySort(z3.IntSort(), z3.IntSort())


def select(items: Sequence[Int], index: Int, first: int = 1) -> Int:
    """``items[index - first]`` for a symbolic ``index`` in ``[first, first + len(items))``."""
    result = items[0]
    for offset in range(1, len(items)):
        result = z3.If(index == first + offset, items[offset], result)
    return result


def first_true(conditions: Sequence[Bool], default: Int) -> Int:
    """The smallest 1-based ``j`` with ``conditions[j - 1]``, else ``default``."""
    result = default
    for j in reversed(range(1, len(conditions) + 1)):
        result = z3.If(conditions[j - 1], z3.IntVal(j), result)
    return result


@dataclass(frozen=True)
class TokenList:
    """A list of token ids: a z3 array and a length (entries at and beyond the length are don't-care)."""

    tokens: z3.ArrayRef
    length: Int

    @classmethod
    def symbolic(cls, name: str) -> TokenList:
        """Unconstrained list named ``name``."""
        return cls(z3.Const(name, _ARRAY), z3.Int(f"{name}_len"))

    @classmethod
    def concrete(cls, values: Iterable[int]) -> TokenList:
        """The list of ``values``; entries beyond it hold ``PAD_ID``."""
        tokens = z3.K(z3.IntSort(), z3.IntVal(PAD_ID))
        count = 0
        for index, value in enumerate(values):
            tokens = z3.Store(tokens, index, int(value))
            count = index + 1
        return cls(tokens, z3.IntVal(count))

    def at(self, index: Int | int) -> Int:
        """The token at ``index``."""
        return self.tokens[index]

    def last(self) -> Int:
        """The final token."""
        return self.tokens[self.length - 1]

    def extended(self, items: Sequence[Int], count: Int) -> TokenList:
        """The list followed by ``items[:count]`` for a symbolic ``0 <= count <= len(items)``."""
        tokens = self.tokens
        for j, item in enumerate(items):
            position = self.length + j
            tokens = z3.Store(tokens, position, z3.If(j < count, item, self.tokens[position]))
        return TokenList(tokens, self.length + count)

    def identical(self, other: TokenList) -> Bool:
        """Same length and the same array (what the relation requires of a successor)."""
        return z3.And(self.length == other.length, self.tokens == other.tokens)

    def choose(self, condition: Bool, other: TokenList) -> TokenList:
        """``self`` when ``condition`` holds, else ``other``."""
        return TokenList(
            z3.If(condition, self.tokens, other.tokens), z3.If(condition, self.length, other.length)
        )
