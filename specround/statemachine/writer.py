"""The controller's writer: one background thread that runs pipelined group commits in submission order.

A pipelined step (:meth:`~specround.statemachine.controller.RoundController.submit_batch`) hands its group
commit to :meth:`PublicationWriter.submit` and returns to the engine, which launches its next forward while
the write runs. Commits run one at a time, in the order they were submitted, so a request's rounds reach
the log in order and the generation fence sees them as it would synchronously. Every other use of the log
by the controller's thread goes through :meth:`PublicationWriter.exclusive`, so the log is never used by two
threads at once (the logs are not required to be thread-safe).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication

__all__ = ["PublicationWriter"]


class PublicationWriter:
    """Runs :meth:`EventLog.publish` on one background thread, in submission order."""

    def __init__(self, log: EventLog) -> None:
        """A writer for ``log``; its thread starts with the first submitted commit."""
        self._log = log
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.busy_s = 0.0
        """Wall seconds the writer's thread has spent inside ``publish``."""

    def submit(self, publications: Sequence[RoundPublication]) -> Future[list[PublishOutcome]]:
        """Queue one group commit; the future holds its outcomes (or the exception that failed it)."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specround-writer")
        return self._pool.submit(self._write, list(publications))

    def _write(self, publications: list[RoundPublication]) -> list[PublishOutcome]:
        import time

        with self._lock:
            start = time.perf_counter()
            try:
                return self._log.publish(publications)
            finally:
                self.busy_s += time.perf_counter() - start

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
