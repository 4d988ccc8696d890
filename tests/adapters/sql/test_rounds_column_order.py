"""Migration 0007: PostgreSQL's ``rounds`` rebuilt with its 8-byte columns first, every row and key kept."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from specround.adapters.sql import SqlEventLog, upgrade_database
from specround.statemachine.ports import PublishStatus
from tests.adapters.eventlog_contract import assert_chains_verify, opened
from tests.adapters.synthetic_rounds import build_round, run_rounds

_OLD_ORDER = "request_no, generation, round_id, recorded_at, commit_digest, prev_hash, hash, body"
_NEW_ORDER = [
    "request_no",
    "generation",
    "recorded_at",
    "round_id",
    "commit_digest",
    "prev_hash",
    "hash",
    "body",
]


def _columns(log: SqlEventLog) -> list[str]:
    with log.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() "
                "AND table_name = 'rounds' ORDER BY ordinal_position"
            )
        )
        return [str(name) for name in rows.scalars()]


def _as_written_by_0006(log: SqlEventLog) -> None:
    """Rebuild ``rounds`` in the order revisions 0003..0006 created it and mark the schema 0006."""
    with log.engine.begin() as connection:
        for statement in (
            f"CREATE TABLE rounds_0006 AS SELECT {_OLD_ORDER} FROM rounds",
            "DROP TABLE rounds",
            "ALTER TABLE rounds_0006 RENAME TO rounds",
            "ALTER TABLE rounds ADD CONSTRAINT pk_rounds PRIMARY KEY (request_no, generation)",
            "CREATE UNIQUE INDEX uq_rounds_round ON rounds (request_no, round_id) WHERE round_id <> ''",
            "UPDATE alembic_version SET version_num = '0006'",
        ):
            connection.execute(text(statement))


@pytest.mark.postgres
def test_a_0006_table_is_rebuilt_aligned_with_its_rows_and_keys(postgres_url: str) -> None:
    with SqlEventLog.open(postgres_url) as log:
        config, state = opened(log, "aligned")
        log.publish([publication for publication, _ in run_rounds(config, state, 3)])
        before = list(log.events())
        _as_written_by_0006(log)
        assert _columns(log)[2:4] == ["round_id", "recorded_at"]
    assert upgrade_database(postgres_url).current == "0008"
    with SqlEventLog.open(postgres_url, create=False) as log:
        assert _columns(log) == _NEW_ORDER
        assert list(log.events()) == before
        assert assert_chains_verify(log) == {"aligned": 16}  # synthetic rounds: the chain, not a replay
        config, state = opened(log, "aligned")  # re-opening is idempotent; the state is generation 0
        first, _ = build_round(config, state)
        (outcome,) = log.publish([first])  # the round at generation 1 again: the keys still fence it
        assert outcome.status is PublishStatus.ALREADY_PUBLISHED
        with log.engine.connect() as connection:
            names = connection.execute(
                text(
                    "SELECT indexname FROM pg_indexes "
                    "WHERE schemaname = current_schema() AND tablename = 'rounds'"
                )
            )
            assert sorted(names.scalars()) == ["pk_rounds", "uq_rounds_round"]


def test_sqlite_keeps_its_table(sqlite_path: str) -> None:
    """SQLite rows carry no padding: the migration leaves its table as revision 0003 built it."""
    with SqlEventLog.open(sqlite_path) as log:
        assert _columns_sqlite(log)[2:4] == ["round_id", "recorded_at"]


def _columns_sqlite(log: SqlEventLog) -> list[str]:
    with log.engine.connect() as connection:
        return [str(row[1]) for row in connection.exec_driver_sql("PRAGMA table_info(rounds)")]
