"""The audit streams a request's events: it never holds more than the round replay has in flight.

The log below yields a fresh copy of every stored event and, each time it yields one, counts the events it
yielded more than :data:`WINDOW` events ago that something besides itself still references. The audit of
a long request (one request, many rounds) must keep that count at a small constant (the request's first
event, which the audit starts replay from), whatever the request's length; an audit that gathered the
request's events before checking them would hold every one of them.

A stream that breaks off in the middle of a request drops that request's partial audit: the break is named
once and every listed request is read again on its own, as when the audit gathered whole requests.
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
from specround.errors import LogUnavailableError
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


class BreakingLog:
    """A read-only EventLog whose whole-log stream raises after ``limit`` events (a lost connection)."""

    def __init__(self, inner: MemoryEventLog, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        for count, event in enumerate(self._inner.events(request_id)):
            if request_id is None and count == self._limit:
                raise LogUnavailableError("the connection was lost")
            yield event

    def request_ids(self) -> list[str]:
        return self._inner.request_ids()

    def head(self, request_id: str) -> LogHead | None:
        return self._inner.head(request_id)


@pytest.mark.parametrize("limit", [0, 3, 11, 16])
def test_a_stream_that_breaks_off_is_named_and_every_request_read_again(limit: int) -> None:
    inner = MemoryEventLog()
    controller = RoundController(inner)
    generator = torch.Generator().manual_seed(5)
    for rid in ("a", "b"):
        controller.open_request((1, 2, 3), seed=1, vocab_size=V, request_id=rid, max_new_tokens=10_000)
    for _ in range(2):
        controller.step([random_input(controller, rid, 3, generator) for rid in ("a", "b")])
    report = audit_log(BreakingLog(inner, limit))  # 11 events a request: the break is in a, b or between
    assert [audit.request_id for audit in report.requests] == ["(log)", "a", "b"]
    broke, *audits = report.requests
    assert [(f.kind, f.message.split(":")[0]) for f in broke.findings] == [
        ("unreadable", "the event stream broke off")
    ]
    assert all(audit.findings == () and audit.events == 11 and audit.rounds == 2 for audit in audits)
