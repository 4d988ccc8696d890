"""Alembic migrations of the event log: up from empty, matching the live metadata, and ``specround db``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, inspect, text
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog, database_status, head_revision, upgrade_database
from specround.adapters.sql.engine import build_engine, parse_location
from specround.adapters.sql.migrate import alembic_config, schema_status
from specround.adapters.sql.tables import metadata
from specround.cli import app
from specround.errors import SchemaVersionError
from tests.adapters.eventlog_contract import assert_chains_verify, opened
from tests.adapters.synthetic_rounds import run_rounds

TABLES = {"alembic_version", "events", "requests", "rounds", "signatures"}


def _tables(url: str) -> set[str]:
    engine = build_engine(parse_location(url))
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_from_empty_builds_the_schema_of_the_live_metadata(log_url: str) -> None:
    assert database_status(log_url).current is None
    status = upgrade_database(log_url)
    assert (status.current, status.head, status.up_to_date) == (head_revision(), head_revision(), True)
    assert _tables(log_url) == TABLES
    engine = build_engine(parse_location(log_url))
    try:
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), metadata)
        assert diff == []
    finally:
        engine.dispose()
    assert upgrade_database(log_url) == status  # idempotent


def test_downgrade_to_base_and_back(log_url: str) -> None:
    upgrade_database(log_url)
    engine = build_engine(parse_location(log_url))
    try:
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "base")
        assert schema_status(engine).current is None
        assert _tables(log_url) == {"alembic_version"}
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), "head")
        assert schema_status(engine).up_to_date
    finally:
        engine.dispose()


def test_open_migrates_only_when_allowed(log_url: str) -> None:
    assert _tables(log_url) == set()  # an empty database (SQLite: the file now exists, without tables)
    with pytest.raises(SchemaVersionError, match="db upgrade"):
        SqlEventLog.open(log_url, create=False)
    assert "events" not in _tables(log_url)
    log = SqlEventLog.open(log_url)  # create=True migrates
    cfg, state = opened(log, "req-a")
    log.publish([p for p, _ in run_rounds(cfg, state, 2)])
    log.close()
    again = SqlEventLog.open(log_url, create=False)
    assert assert_chains_verify(again) == {"req-a": 11}
    assert again.schema_status().up_to_date
    again.close()


def test_a_schema_newer_than_this_release_is_refused(log_url: str) -> None:
    upgrade_database(log_url)
    engine = build_engine(parse_location(log_url))
    try:
        with engine.begin() as connection:
            connection.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    finally:
        engine.dispose()
    with pytest.raises(SchemaVersionError, match="9999"):
        SqlEventLog.open(log_url)
    with pytest.raises(SchemaVersionError):
        database_status(log_url)


def test_db_commands(tmp_path: Path) -> None:
    runner = CliRunner()
    path = str(tmp_path / "cli.sqlite")
    result = runner.invoke(app, ["db", "current", path, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {"current": None, "head": head_revision(), "up_to_date": False}
    assert not Path(path).exists()  # `db current` changes nothing
    assert runner.invoke(app, ["db", "current", path, "--check"]).exit_code == 1
    result = runner.invoke(app, ["db", "upgrade", path])
    assert result.exit_code == 0, result.output
    assert f"current: {head_revision()}" in result.output and "up to date" in result.output
    result = runner.invoke(app, ["db", "current", path, "--check"])
    assert result.exit_code == 0 and "up to date" in result.output
    bad = runner.invoke(app, ["db", "upgrade", "mysql://nobody@nowhere/db"])
    assert bad.exit_code == 1
    assert "SQLite or PostgreSQL" in bad.output


@pytest.mark.postgres
def test_db_commands_on_postgres(postgres_url: str) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["db", "current", postgres_url, "--check"]).exit_code == 1
    assert runner.invoke(app, ["db", "upgrade", postgres_url]).exit_code == 0
    result = runner.invoke(app, ["db", "current", postgres_url, "--json", "--check"])
    assert result.exit_code == 0
    assert json.loads(result.output)["current"] == head_revision()


def _requests_options(engine: Engine) -> list[str]:
    with engine.connect() as connection:
        options = connection.execute(
            text("SELECT reloptions FROM pg_class WHERE oid = 'requests'::regclass")
        ).scalar_one()
    return list(options or [])


def test_requests_pages_leave_room_for_head_updates_on_postgres(postgres_url: str) -> None:
    upgrade_database(postgres_url)
    engine = build_engine(parse_location(postgres_url))
    try:
        assert _requests_options(engine) == ["fillfactor=50"]
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0003")
        assert _requests_options(engine) == []
        with engine.begin() as connection:
            command.upgrade(alembic_config(connection), "head")
        assert _requests_options(engine) == ["fillfactor=50"]
    finally:
        engine.dispose()
