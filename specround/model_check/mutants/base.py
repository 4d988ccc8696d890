"""What a mutation is: named wrong variants of real functions, patched in inside a context manager.

A :class:`Mutation` lists its :class:`Seam` s: an attribute of a module or class (a function the real code
path calls) and a factory that builds the wrong variant *from the original* (so a variant wraps the real
function instead of copying its algorithm). :meth:`Mutation.applied` replaces every seam with
``unittest.mock.patch.object`` for the duration of a ``with`` block and restores them afterwards. A seam
that no longer exists raises :class:`AttributeError` when the mutation is applied: a refactoring that
removes a seam breaks the lab loudly instead of making the mutation a silent no-op.

The seams' factories share one scratch dictionary per application, for mutations that need to carry a
value from one patched call to the next (e.g. the rows a verification computed to the commit that follows).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any
from unittest import mock

__all__ = ["Mutation", "Scratch", "Seam", "resolve"]

Scratch = dict[str, Any]
"""Values shared by the wrong variants of one application of a mutation."""


def resolve(owner: str) -> Any:
    """The object named ``module`` or ``module:Class`` (``module:Class.Inner`` for nested classes)."""
    module_name, _, attribute_path = owner.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute_path.split(".") if attribute_path else []:
        target = getattr(target, part)
    return target


@dataclass(frozen=True)
class Seam:
    """One attribute a mutation replaces, and how to build its wrong variant from the original."""

    owner: str
    """``module`` or ``module:Class`` holding the attribute."""
    attribute: str
    wrong: Callable[[Any, Scratch], Any]
    """``wrong(original, scratch)`` returns the replacement."""

    @property
    def name(self) -> str:
        """``owner.attribute`` as written in reports."""
        return f"{self.owner.replace(':', '.')}.{self.attribute}"


@dataclass(frozen=True)
class Mutation:
    """A named failure class of 0x07 as wrong variants of functions on the real code path."""

    name: str
    family: str
    """``sampler``, ``stops and RNG``, ``K/V``, ``processors`` or ``publication``."""
    failure_class: str
    """What is wrong, in words."""
    violates: tuple[str, ...]
    """The invariants (``INV-n``) and spec sections the failure class breaks."""
    seams: tuple[Seam, ...]

    @contextmanager
    def applied(self) -> Iterator[None]:
        """Replace every seam for the duration of the block."""
        scratch: Scratch = {}
        with ExitStack() as stack:
            for seam in self.seams:
                owner = resolve(seam.owner)
                original = getattr(owner, seam.attribute)  # AttributeError when the seam is gone
                stack.enter_context(mock.patch.object(owner, seam.attribute, seam.wrong(original, scratch)))
            yield
