"""The collector around a serving run: the heap frozen, young collections spaced out, both given back;
and its pauses timed."""

from __future__ import annotations

import gc
import weakref

from specround.serving.collector import YOUNG_THRESHOLD, CollectorClock, serving_collector


class _Node:
    """An object that can refer to itself (a reference cycle only the collector frees)."""

    next: _Node | None = None


def test_the_heap_is_frozen_inside_and_given_back_after() -> None:
    assert gc.get_freeze_count() == 0
    cycle = _Node()
    cycle.next = cycle
    garbage = weakref.ref(cycle)
    del cycle
    thresholds = gc.get_threshold()
    with serving_collector() as froze:
        assert froze and gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *thresholds[1:])
        assert garbage() is None  # the collect before the freeze freed the cycle instead of freezing it
        with serving_collector() as inner:  # already frozen: left alone, and not unfrozen on exit
            assert not inner
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == thresholds


def test_a_disabled_or_caller_frozen_heap_is_left_as_it_is() -> None:
    with serving_collector(enabled=False) as froze:
        assert not froze and gc.get_freeze_count() == 0
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with serving_collector() as froze:
            assert not froze and gc.get_threshold()[0] != YOUNG_THRESHOLD  # the caller's collector, untouched
        assert gc.get_freeze_count() == frozen  # the caller's freeze survives the block
    finally:
        gc.unfreeze()


def test_the_clock_times_collections_only_while_it_runs() -> None:
    gc.collect()  # before the clock: not counted
    with CollectorClock() as clock:
        gc.collect()
        gc.collect(0)
    assert clock.collections == 2
    assert 0.0 <= clock.longest_s <= clock.seconds
    hooks = len(gc.callbacks)
    gc.collect()  # after the clock: its hook is gone
    assert clock.collections == 2 and len(gc.callbacks) == hooks
    with clock:  # entered again, it adds to what it measured
        gc.collect()
    assert clock.collections == 3
