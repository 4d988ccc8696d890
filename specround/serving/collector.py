"""The cyclic garbage collector around a serving run: the start-up heap frozen, young collections spaced out.

CPython's periodic full collections traverse every container object the process holds. After importing
torch, SQLAlchemy, pydantic and transformers and loading a model, that is a few hundred thousand objects
that will never be garbage, and the rounds' own allocations decide how often the collector walks them. On
the shared 2-core machine one such collection took about 110 ms in the middle of a step (the controller
bench, B = 1, SQLite): a stall an engine sees as one slow token.

The young collections cost the rest: with CPython's default threshold (700 net container allocations) a
step of 256 rounds runs about ten of them, and each traverses the step's own objects, which are nearly all
freed when the step ends. Measured with :class:`CollectorClock` on SQLite at B = 256 (``step_batch``): the
collector took 34 µs per round with the defaults, 9 µs with the heap frozen, under 1 µs with the young
threshold raised as well.

:func:`serving_collector` does what a serving process does once it has started up: collect once,
:func:`gc.freeze` what is left (later collections only traverse what the run allocates), and raise the
youngest generation's threshold to :data:`YOUNG_THRESHOLD`. Cyclic garbage made during the run is still
collected, after at most that many net allocations. Both are undone when the run ends, so a library caller
gets its collector back as it was; a heap that the caller froze already is left alone, threshold included.

:class:`CollectorClock` measures the collector's pauses (count, total and longest) with
:data:`gc.callbacks`, for the benches to report how much of a step was the collector's.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

__all__ = ["YOUNG_THRESHOLD", "CollectorClock", "serving_collector"]

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young collections during a serving run (CPython's default: 700).

Enough for a step's transient objects at B = 256 to be freed before a collection would traverse them;
at most about this many objects of cyclic garbage wait for the next collection.
"""


@contextmanager
def serving_collector(enabled: bool = True) -> Iterator[bool]:
    """Freeze the heap as it is now and space out young collections for the body of the ``with``.

    Yields whether this call changed the collector. Nothing happens when ``enabled`` is false or the heap
    is frozen already (by the caller, or an outer ``with``): only the call that froze the heap unfreezes it
    and restores the thresholds.
    """
    owns = enabled and gc.get_freeze_count() == 0
    thresholds = gc.get_threshold()
    if owns:
        gc.collect()
        gc.freeze()
        gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
    try:
        yield owns
    finally:
        if owns:
            gc.set_threshold(*thresholds)
            gc.unfreeze()


class CollectorClock:
    """The collector's pauses while the clock is running (a context manager; it can be entered again).

    ``collections`` counts the collections of every generation, ``seconds`` is their total wall time and
    ``longest_s`` the longest one. Pauses in other threads are counted too: the collector stops them all.
    """

    def __init__(self) -> None:
        self.collections = 0
        self.seconds = 0.0
        self.longest_s = 0.0
        self._started: float | None = None

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        """The :data:`gc.callbacks` hook: ``start`` and ``stop`` of each collection."""
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        elif self._started is not None:
            pause = now - self._started
            self._started = None
            self.collections += 1
            self.seconds += pause
            self.longest_s = max(self.longest_s, pause)

    def __enter__(self) -> CollectorClock:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._observe)
        self._started = None
