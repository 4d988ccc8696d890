"""Fixtures of the state-machine tests: the event-log factory every backend plugs into.

``EVENT_LOG_FACTORIES`` maps a backend name to a :class:`LogFactory`; the ``event_log_factory`` fixture is
parametrised over it, so a backend added here (SQLite, PostgreSQL) runs every backend-parametrised test of
this package, the Hypothesis state machine included.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.errors import SpecroundError
from specround.statemachine.ports import EventLog


@dataclass(frozen=True)
class LogFactory:
    """How a test gets logs of one backend.

    ``new(directory)`` creates an empty log (``directory`` is a fresh temporary directory the backend may
    use); ``reopen(log)`` returns a new handle on the same stored events, as a restarted process would get
    (the memory log returns the same object: its storage is the object).
    """

    name: str
    new: Callable[[Path], EventLog]
    reopen: Callable[[EventLog], EventLog]


EVENT_LOG_FACTORIES: dict[str, LogFactory] = {
    "memory": LogFactory(name="memory", new=lambda _directory: MemoryEventLog(), reopen=lambda log: log),
}


@pytest.fixture(params=sorted(EVENT_LOG_FACTORIES))
def event_log_factory(request: pytest.FixtureRequest) -> Iterator[LogFactory]:
    """One backend's log factory per parametrisation; every handle it hands out is closed afterwards."""
    base = EVENT_LOG_FACTORIES[request.param]
    handles: list[EventLog] = []

    def track(log: EventLog) -> EventLog:
        if all(log is not known for known in handles):
            handles.append(log)
        return log

    yield LogFactory(
        name=base.name,
        new=lambda directory: track(base.new(directory)),
        reopen=lambda log: track(base.reopen(log)),
    )
    for handle in reversed(handles):
        with contextlib.suppress(SpecroundError):
            handle.close()


@pytest.fixture
def event_log(event_log_factory: LogFactory, tmp_path: Path) -> EventLog:
    """A fresh, empty log of each backend."""
    return event_log_factory.new(tmp_path)
