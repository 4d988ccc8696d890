"""The EventLog contract on every backend: SQLite (temp file), PostgreSQL (fresh schema), memory."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog
from specround.statemachine.ports import EventLog
from tests.adapters.eventlog_contract import EventLogContract


class TestSqliteEventLog(EventLogContract):
    @pytest.fixture
    def log(self, sqlite_path: str) -> Iterator[EventLog]:
        log = SqlEventLog.open(sqlite_path)
        yield log
        log.close()


@pytest.mark.postgres
class TestPostgresEventLog(EventLogContract):
    @pytest.fixture
    def log(self, postgres_url: str) -> Iterator[EventLog]:
        log = SqlEventLog.open(postgres_url)
        yield log
        log.close()


class TestMemoryEventLog(EventLogContract):
    @pytest.fixture
    def log(self) -> Iterator[EventLog]:
        log = MemoryEventLog()
        yield log
        log.close()
