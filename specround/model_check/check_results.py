"""Check results shared by the oracles and the ``specround check`` report."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CheckResult", "single_threaded", "within"]


@dataclass(frozen=True)
class CheckResult:
    """One named check on one fixture (or on a group of fixtures)."""

    fixture: str
    check: str
    passed: bool
    error: float | None = None
    """The largest deviation found (absolute unless the detail says otherwise), when the check is numeric."""
    tolerance: float | None = None
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        """JSON-able form (infinite or NaN errors become strings)."""

        def number(value: float | None) -> float | str | None:
            if value is None or math.isfinite(value):
                return value
            return repr(value)

        return {
            "fixture": self.fixture,
            "check": self.check,
            "passed": self.passed,
            "error": number(self.error),
            "tolerance": number(self.tolerance),
            "detail": self.detail,
        }


def within(fixture: str, check: str, error: float, tolerance: float, detail: str = "") -> CheckResult:
    """A numeric check that passes when ``error <= tolerance`` (NaN never passes)."""
    return CheckResult(fixture, check, bool(error <= tolerance), error, tolerance, detail)


@contextmanager
def single_threaded() -> Iterator[None]:
    """Run torch on one intra-op thread inside the block, restoring the previous setting afterwards.

    The oracles' tensors are tiny: handing them to a thread pool costs more than the arithmetic.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
