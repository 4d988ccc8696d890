"""The controller's writer thread is scheduled below the engine's threads (Linux)."""

from __future__ import annotations

import os
import sys
import threading

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.statemachine.ports import RoundPublication
from specround.statemachine.writer import WRITER_NICE, PublicationWriter


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


@pytest.mark.skipif(sys.platform != "linux", reason="only Linux gives each thread a priority of its own")
def test_the_writer_thread_runs_below_the_thread_that_submits() -> None:
    if _nice() >= 19:
        pytest.skip("this process already runs at the lowest priority")
    seen: list[int] = []

    def build() -> list[RoundPublication]:  # runs on the writer's thread
        seen.append(_nice())
        raise RuntimeError("nothing to publish")

    writer = PublicationWriter(MemoryEventLog())
    try:
        with pytest.raises(RuntimeError, match="nothing to publish"):
            writer.submit(build, [("r", "round-1", 0)], [None]).result()
    finally:
        writer.close()
    assert seen == [min(_nice() + WRITER_NICE, 19)]
    assert _nice() < seen[0]  # the caller's own priority is untouched
