"""The order in which a benchmark runs its cases, alternated so that a drift within a block cancels out.

A benchmark that runs its cases in the same order every block measures the later cases on a slightly
different machine: in one run of ``specround bench e2e --engine transformers`` the same transformers case,
run once more at the end of each block (the A/A control), came out 6 % slower than at its usual place.
Running the blocks alternately forward and backward (A B C, C B A, ...) puts every case as often early as
late over an even number of blocks, so a linear drift within a block adds nothing to a paired ratio.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["case_order"]

T = TypeVar("T")


def case_order(cases: Sequence[T], block: int) -> list[T]:
    """``cases`` in their order for an even ``block``, reversed for an odd one."""
    ordered = list(cases)
    return ordered[::-1] if block % 2 else ordered
