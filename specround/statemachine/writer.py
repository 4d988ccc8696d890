"""The controller's writer: one background thread that runs pipelined group commits in submission order.

A pipelined step (:meth:`~specround.statemachine.controller.RoundController.submit_batch`) hands its group
commit to :meth:`PublicationWriter.submit` and returns to the engine, which launches its next forward while
the write runs. Commits run one at a time, in the order they were submitted, so a request's rounds reach
the log in order. The generation fence alone is not enough for a round built on a predecessor that never
became durable: if another writer published a different round at that generation in between, the fence
would let the dependent round through onto the other writer's state. So each publication names its
*parent* (the pipelined round whose staged successor it was built on, if any), and the writer drops, without
writing, every publication whose parent failed (reported as ``STALE_GENERATION``). Every other use of the log
by the controller's thread goes through :meth:`PublicationWriter.exclusive`, so the log is never used by two
threads at once (the logs are not required to be thread-safe).

On Linux the writer's thread runs at a lower scheduling priority (:data:`WRITER_NICE`). The scheduler tends
to wake it on the core of the thread that queued the commit, the one about to run the engine's next
forward; at the same priority the two then share that core and the forward slows down. A lower priority
gives the forward the core, and the write takes what the forward leaves idle. The write never waits long
for it: the engine's thread blocks on :meth:`PendingStep.wait` one step later, and the writer then has
a core to itself.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress

from specround.statemachine.ports import EventLog, PublishOutcome, PublishStatus, RoundPublication

RoundKey = tuple[str, str]
"""(request id, round id)."""

WriteKey = tuple[str, str, int]
"""(request id, round id, expected generation) of a submitted publication."""

_DURABLE = (PublishStatus.PUBLISHED, PublishStatus.ALREADY_PUBLISHED)

__all__ = ["WRITER_NICE", "PublicationWriter"]

WRITER_NICE = 10
"""How much lower than the rest of the process the writer thread is scheduled (Linux ``nice`` steps)."""


def _lower_priority() -> None:
    """Lower the calling thread's scheduling priority by :data:`WRITER_NICE` (Linux only).

    Linux schedules threads one by one, so ``setpriority`` on a thread id changes that thread alone. Other
    systems would apply it to a whole process, so the thread is left as it is there, as it is where the
    call is refused.
    """
    if sys.platform != "linux":
        return
    tid = threading.get_native_id()
    with suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)


class PublicationWriter:
    """Runs :meth:`EventLog.publish` on one background thread, in submission order."""

    def __init__(self, log: EventLog) -> None:
        """A writer for ``log``; its thread starts with the first submitted commit."""
        self._log = log
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.busy_s = 0.0
        """Wall seconds the writer's thread has spent inside ``publish``."""
        self._failed: set[RoundKey] = set()
        """Submitted rounds that did not become durable (their dependants are dropped)."""

    def submit(
        self,
        build: Callable[[], Sequence[RoundPublication]],
        keys: Sequence[WriteKey],
        parents: Sequence[RoundKey | None],
    ) -> Future[list[PublishOutcome]]:
        """Queue one group commit; the future holds its outcomes (or the exception that failed it).

        ``build`` returns the publications, one per entry of ``keys``, and runs on the writer's thread:
        encoding the rounds is part of the durable write. ``parents[i]`` is the round publication ``i`` was
        built on while that round's write was pending.
        """
        if len(keys) != len(parents):
            raise ValueError(f"{len(keys)} publications with {len(parents)} parents")
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="specround-writer", initializer=_lower_priority
            )
        return self._pool.submit(self._write, build, list(keys), list(parents))

    def _write(
        self,
        build: Callable[[], Sequence[RoundPublication]],
        keys: list[WriteKey],
        parents: list[RoundKey | None],
    ) -> list[PublishOutcome]:
        failed = self._failed
        outcomes: list[PublishOutcome | None] = [None] * len(keys)
        kept: list[int] = []
        for i, ((request_id, round_id, expected), parent) in enumerate(zip(keys, parents, strict=True)):
            if parent is not None and parent in failed:  # built on a round that never became durable
                failed.add((request_id, round_id))
                outcomes[i] = PublishOutcome(request_id, round_id, PublishStatus.STALE_GENERATION, expected)
            else:
                kept.append(i)
        written: list[PublishOutcome] = []
        if kept:
            with self._lock:
                start = time.perf_counter()
                try:
                    publications = build()
                    written = self._log.publish([publications[i] for i in kept])
                except BaseException:
                    failed.update((keys[i][0], keys[i][1]) for i in kept)
                    raise
                finally:
                    self.busy_s += time.perf_counter() - start
        for i, outcome in zip(kept, written, strict=True):
            outcomes[i] = outcome
            key = (outcome.request_id, outcome.round_id)
            if outcome.status in _DURABLE:  # a retry under a failed round's id made it durable after all
                failed.discard(key)
            else:
                failed.add(key)
        return [o for o in outcomes if o is not None]

    @contextmanager
    def exclusive(self) -> Iterator[EventLog]:
        """The log, held against the writer's thread for the duration of the block."""
        with self._lock:
            yield self._log

    def close(self) -> None:
        """Wait for the queued commits and stop the thread (a later submit starts a new one)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
