"""Fixtures for the report tests: one small synthetic SQLite log per session, and PostgreSQL schemas."""

from __future__ import annotations

from pathlib import Path

import pytest

from specround.adapters.sql import SqlEventLog
from specround.report.synthetic import SyntheticLogSummary, write_synthetic_log
from tests.adapters.sql.conftest import postgres_base_url, postgres_url

__all__ = ["postgres_base_url", "postgres_url"]

ROUNDS = 900
BATCH = 60


@pytest.fixture(scope="session")
def synthetic_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SyntheticLogSummary]:
    """A valid SQLite log of 900 rounds over 60 concurrent request slots (short budgets: many requests)."""
    path = tmp_path_factory.mktemp("report") / "synthetic.sqlite"
    with SqlEventLog.open(path) as log:
        summary = write_synthetic_log(log, ROUNDS, batch=BATCH, max_new_tokens=60, seed=3)
    return path, summary
