"""What a mutation is: named wrong variants of real functions, patched in by reference inside a ``with``.

The same shape serves the code path (the mutation lab kills those) and the z3 model (a wrong variant of one
of its rules, refuted by the proof the mutation names).

A :class:`Mutation` lists its :class:`Seam` s: a module or class object (``owner``), the function object the
real code path calls through it (``target``), and a factory that builds the wrong variant *from the
original* (so a variant wraps the real function instead of copying its algorithm). Seams hold the objects
themselves, not their names as strings: :meth:`Mutation.applied` finds the attribute of ``owner`` that *is*
``target`` (by identity) and replaces it with ``unittest.mock.patch.object`` for the duration of the block.
A refactoring that renames the function, moves it, or makes the owner bind another object raises
:class:`SeamGoneError` when the mutation is applied, instead of silently disarming it.

Every replacement counts its calls in the :class:`Reach` the block yields: a mutation whose seams were never
called while the checks ran did not test anything, and the lab reports it as an error (``unreached``).

The seams' factories share one scratch dictionary per application, for mutations that need to carry a
value from one patched call to the next (e.g. the rows a verification computed to the commit that follows).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

__all__ = ["Mutation", "Reach", "Scratch", "Seam", "SeamGoneError"]

Scratch = dict[str, Any]
"""Values shared by the wrong variants of one application of a mutation."""


class SeamGoneError(AttributeError):
    """The owner no longer binds the seam's function (renamed, moved or replaced by a refactoring)."""


def _owner_name(owner: Any) -> str:
    module = getattr(owner, "__module__", None)
    if isinstance(owner, type) and module:
        return f"{module}.{owner.__qualname__}"
    return str(getattr(owner, "__name__", type(owner).__name__))


@dataclass(frozen=True)
class Seam:
    """One binding a mutation replaces (found by identity), and how to build its wrong variant."""

    owner: Any
    """The module or class object through which the code path reaches ``target``."""
    target: Callable[..., Any]
    """The real function bound there (for a method: the function in the class's ``__dict__``)."""
    wrong: Callable[[Any, Scratch], Any]
    """``wrong(original, scratch)`` returns the replacement."""

    def attribute(self) -> str:
        """The owner's attribute that holds ``target``; :class:`SeamGoneError` if none does."""
        for name, value in vars(self.owner).items():
            if value is self.target:
                return str(name)
        raise SeamGoneError(
            f"{_owner_name(self.owner)} no longer binds {getattr(self.target, '__qualname__', self.target)!r}"
        )

    @property
    def name(self) -> str:
        """``owner.function`` as written in reports."""
        return f"{_owner_name(self.owner)}.{getattr(self.target, '__name__', '?')}"


@dataclass
class Reach:
    """Calls of a mutation's replacements while it was applied, per seam name."""

    calls: dict[str, int] = field(default_factory=dict)

    @property
    def reached(self) -> bool:
        """Whether any replacement was called."""
        return any(self.calls.values())


def _counted(replacement: Any, reach: Reach, name: str) -> Any:
    """``replacement`` counting its calls (a plain function, so that it binds as a method on a class)."""
    reach.calls.setdefault(name, 0)
    if not callable(replacement):
        return replacement

    @functools.wraps(replacement)
    def counted(*args: Any, **kwargs: Any) -> Any:
        reach.calls[name] += 1
        return replacement(*args, **kwargs)

    return counted


@dataclass(frozen=True)
class Mutation:
    """A named failure class of contract#failure-lab as wrong variants of functions on the real code path."""

    name: str
    family: str
    """``sampler``, ``stops and RNG``, ``K/V``, ``processors``, ``publication`` or ``z3 model``."""
    failure_class: str
    """What is wrong, in words."""
    violates: tuple[str, ...]
    """The invariants (``INV-n``) and spec sections the failure class breaks."""
    seams: tuple[Seam, ...]
    refuted_by: str | None = None
    """For a mutation of the z3 model: the registered proof that must fail under it (the mutation lab runs
    the others, which mutate the code path)."""

    @contextmanager
    def applied(self) -> Iterator[Reach]:
        """Replace every seam for the duration of the block; yields the replacements' call counts."""
        scratch: Scratch = {}
        reach = Reach()
        with ExitStack() as stack:
            for seam in self.seams:
                attribute = seam.attribute()  # SeamGoneError when the binding is gone
                original = getattr(seam.owner, attribute)
                replacement = _counted(seam.wrong(original, scratch), reach, seam.name)
                stack.enter_context(mock.patch.object(seam.owner, attribute, replacement))
            yield reach
