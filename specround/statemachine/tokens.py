"""An immutable token sequence that a round extends in O(emitted), not O(length).

A request's output O and cache C only ever grow by a round's few tokens, but a tuple is copied whole on
every extension: staging a successor, and replaying a log, cost O(T) per round and O(T^2) over a long
request. :class:`Tokens` is an immutable view of the first ``n`` entries of a list that is only ever
appended to. Extending it appends to that list in place when no longer view has appended to it already,
and copies the prefix otherwise (a retry that stages another successor from the same state), so every
view keeps seeing exactly the tokens it was made with.

It behaves as an immutable sequence of ints: ``len``, indexing (a slice gives a tuple), iteration,
equality with another :class:`Tokens` or with a tuple or list of the same ints, hashing as the tuple
would, ``+`` giving a tuple. A pydantic field typed :class:`Tokens` validates any sequence of ints into
one, dumps it as a tuple (an array in JSON) and is described as an array of integers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, overload

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["Tokens"]

_extend_lock = threading.Lock()
"""Serialises the check-then-append of :meth:`Tokens.extended` (two threads may extend one state)."""


class Tokens(Sequence[int]):
    """The first ``length`` entries of an append-only list of token ids (see the module docstring)."""

    __slots__ = ("_items", "_length")

    def __init__(self, tokens: Iterable[int] = ()) -> None:
        self._items: list[int] = list(tokens)
        self._length = len(self._items)

    @classmethod
    def _view(cls, items: list[int], length: int) -> Tokens:
        view = cls.__new__(cls)
        view._items, view._length = items, length
        return view

    @classmethod
    def of(cls, tokens: Sequence[int]) -> Tokens:
        """``tokens`` itself when it is a :class:`Tokens`, else a new one holding them.

        A state built without validation (``model_construct``, ``model_copy(update=...)``) may hold a
        tuple; staging from it starts a new list once.
        """
        return tokens if isinstance(tokens, Tokens) else cls(tokens)

    def extended(self, tokens: Iterable[int]) -> Tokens:
        """The tokens followed by ``tokens``: O(len(tokens)), unless another view extended them first."""
        with _extend_lock:
            items = self._items
            if len(items) != self._length:  # a longer view already appended here: copy our prefix
                items = items[: self._length]
            items.extend(tokens)
            return Tokens._view(items, len(items))

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...

    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        if isinstance(index, slice):  # O(len(slice)): only the sliced entries are read
            start, stop, step = index.indices(self._length)
            if step == 1:  # the usual slice: both bounds are within the view
                return tuple(self._items[start:stop])
            return tuple(self._items[i] for i in range(start, stop, step))
        length = self._length
        if not -length <= index < length:
            raise IndexError("token index out of range")
        return self._items[index if index >= 0 else length + index]

    def __iter__(self) -> Iterator[int]:
        return islice(self._items, self._length)

    def __reversed__(self) -> Iterator[int]:
        return reversed(self._items[: self._length])

    def as_tuple(self) -> tuple[int, ...]:
        """The tokens as a tuple (a copy)."""
        return tuple(self._items[: self._length])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Tokens):
            return self._length == other._length and (
                (self._items is other._items) or self._items[: self._length] == other._items[: other._length]
            )
        if isinstance(other, (tuple, list)):
            return self._length == len(other) and self._items[: self._length] == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.as_tuple())

    def __add__(self, other: Iterable[int]) -> tuple[int, ...]:
        return (*self, *other)

    def __radd__(self, other: Iterable[int]) -> tuple[int, ...]:
        return (*other, *self)

    def __repr__(self) -> str:
        return repr(self.as_tuple())

    def __reduce__(self) -> tuple[type[Tokens], tuple[tuple[int, ...]]]:
        return (Tokens, (self.as_tuple(),))

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """Validate a sequence of ints (or take a :class:`Tokens` as it is); dump it as a tuple."""
        items = core_schema.tuple_schema([core_schema.int_schema()], variadic_item_index=0)
        from_items = core_schema.no_info_after_validator_function(cls, items)
        return core_schema.json_or_python_schema(
            json_schema=from_items,
            python_schema=core_schema.union_schema([core_schema.is_instance_schema(cls), from_items]),
            serialization=core_schema.plain_serializer_function_ser_schema(_as_tuple, return_schema=items),
        )


def _as_tuple(tokens: Sequence[int]) -> tuple[int, ...]:
    """The dump of a token field: a tuple (a record assembled without validation may hold a tuple)."""
    return tokens.as_tuple() if isinstance(tokens, Tokens) else tuple(tokens)
