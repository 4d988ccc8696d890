"""Optional dependencies: whether an extra's module can be imported, and how to install it when not.

The package itself needs none of them; a command that does (``specround check`` needs z3 from the
``check`` extra) asks :func:`missing_extra` first and refuses with its message instead of failing deep
inside an import.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Extra:
    """One optional dependency: the extra that installs it and the module it provides."""

    name: str
    """The extra's name in ``pyproject.toml`` (``pip install 'specround[NAME]'``)."""
    module: str
    """The top-level module the extra installs."""
    distribution: str
    """The distribution that provides :attr:`module`, as pip names it."""
    purpose: str
    """What needs it, as the subject of the refusal message."""

    @property
    def install_hint(self) -> str:
        """The command that installs the extra."""
        return f"pip install 'specround[{self.name}]'"


CHECK_EXTRA = Extra(name="check", module="z3", distribution="z3-solver", purpose="specround check")
"""The z3 solver behind ``specround check`` (proofs, conformance to the z3 model, the mutation lab)."""


def missing_extra(extra: Extra) -> str | None:
    """The refusal message when ``extra``'s module cannot be imported; None when it can.

    The module is imported (not merely looked up), so an installed but broken copy is reported too.
    """
    try:
        importlib.import_module(extra.module)
    except ImportError as exc:
        return (
            f"{extra.purpose} needs {extra.distribution} (module {extra.module!r}: {exc}); "
            f"install it with: {extra.install_hint}"
        )
    return None
