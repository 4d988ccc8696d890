"""The audit streams a request's events: it never holds more than the round replay has in flight.

The log below yields a fresh copy of every stored event and, each time it yields one, counts the events it
yielded more than :data:`WINDOW` events ago that something besides itself still references. The audit of
a long request (one request, many rounds) must keep that count at a small constant (the request's first
event, which the audit starts replay from), whatever the request's length; an audit that gathered the
request's events before checking them would hold every one of them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.audit import audit_log
from specround.audit.run import audit_request
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import LogHead, StoredEvent
from tests.statemachine._synthetic import random_input

V = 16
ROUNDS = 40
WINDOW = 10
"""Two rounds' events: what replay may hold while it folds a round."""
HELD_AT_MOST = 2


class WatchedLog:
    """A read-only EventLog yielding copies of ``inner``'s events, watching which ones stay referenced."""

    def __init__(self, inner: MemoryEventLog) -> None:
        self._inner = inner
        self.most_held = 0
        """The most older events referenced elsewhere at one time."""
        self.yielded = 0

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        yielded: list[StoredEvent] = []
        for event in self._inner.events(request_id):
            held = 0
            for index in range(len(yielded) - WINDOW):
                if sys.getrefcount(yielded[index]) > 2:  # the list and the call's argument
                    held += 1
            self.most_held = max(self.most_held, held)
            copy = dataclasses.replace(event)
            yielded.append(copy)
            self.yielded += 1
            yield copy

    def request_ids(self) -> list[str]:
        return self._inner.request_ids()

    def head(self, request_id: str) -> LogHead | None:
        return self._inner.head(request_id)


def _long_request_log() -> MemoryEventLog:
    log = MemoryEventLog()
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(3)
    controller.open_request((1, 2, 3), seed=4, vocab_size=V, request_id="long", max_new_tokens=10_000)
    for _ in range(ROUNDS):
        controller.step([random_input(controller, "long", 3, generator)])
    return log


@pytest.mark.parametrize("whole_log", [True, False])
def test_audit_holds_a_bounded_number_of_events(whole_log: bool) -> None:
    log = WatchedLog(_long_request_log())
    if whole_log:
        report = audit_log(log)
        (audit,) = report.requests
    else:
        audit = audit_request(log, "long")
    assert audit.findings == () and audit.rounds == ROUNDS
    assert audit.events == log.yielded == 1 + 5 * ROUNDS
    assert log.most_held <= HELD_AT_MOST
