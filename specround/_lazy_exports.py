"""Public names of a package imported from the modules that define them, on first use.

``import specround`` stays light: a package declares where each public name lives, and its module-level
``__getattr__`` and ``__dir__`` ask a :class:`LazyExports` for them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

__all__ = ["LazyExports"]


class LazyExports:
    """Resolves the public names of ``package`` from ``exports`` (name -> defining module) on first use."""

    def __init__(self, package: str, exports: Mapping[str, str], namespace: dict[str, Any]) -> None:
        self.package = package
        """The package's dotted name (for the error of an unknown attribute)."""
        self.exports = exports
        """Each public name and the module that defines it."""
        self.namespace = namespace
        """The package's globals, where a resolved name is cached."""

    def resolve(self, name: str) -> Any:
        """Import ``name`` from its defining module and cache it in the package; AttributeError if unknown."""
        module = self.exports.get(name)
        if module is None:
            raise AttributeError(f"module {self.package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        self.namespace[name] = value
        return value

    def names(self) -> list[str]:
        """The package's attributes, resolved or not, sorted."""
        return sorted([*self.namespace, *self.exports])
