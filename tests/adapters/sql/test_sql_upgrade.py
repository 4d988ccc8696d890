"""Logs written by schema revision 0001 (one row per event) upgrade to one row per round unchanged.

The fixtures in ``fixtures/`` were written by the release before the change (see ``fixtures/README.md``).
Each test loads a fixture's rows into a database at revision 0001 (a SQLite file or a PostgreSQL schema),
upgrades it, and compares what the upgraded log reads back with the rows as that release stored them:
every event, seq, envelope, canonical text, hash link and time, the ``specround log`` output, replay
and audit.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch
from alembic import command
from sqlalchemy import text
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog, database_status, head_revision, upgrade_database
from specround.adapters.sql.engine import build_engine, parse_location
from specround.adapters.sql.migrate import alembic_config
from specround.audit import audit_log, audit_signatures
from specround.audit.run import replay_against_heads
from specround.cli import app
from specround.errors import LogIntegrityError
from specround.signing import HmacSigner, checkpoint_message, head_message
from specround.statemachine.controller import RoundController
from specround.statemachine.round_ids import derived_generation
from specround.statemachine.rounds import RoundInput

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = ("v0001_generate", "v0001_controller")
EVENT_COLUMNS = (
    "request_id, seq, kind, round_id, generation, schema_version, prev_hash, hash, recorded_at, payload"
)
TABLE_COLUMNS = {
    "requests": "request_id, generation, head_seq, head_hash, state_digest, finished, opened_digest, "
    "opened_at, updated_at",
    "events": EVENT_COLUMNS,
    "publications": "request_id, generation, round_id, commit_digest, successor_digest, event_seq, "
    "recorded_at",
}


def _fixture_rows(name: str) -> dict[str, list[tuple[Any, ...]]]:
    connection = sqlite3.connect(f"file:{FIXTURES / name}.sqlite?mode=ro", uri=True)
    try:
        return {
            table: connection.execute(f"SELECT {columns} FROM {table}").fetchall()
            for table, columns in TABLE_COLUMNS.items()
        }
    finally:
        connection.close()


def _load_at_0001(url: str, rows: dict[str, list[tuple[Any, ...]]]) -> None:
    """A database at revision 0001 holding exactly the fixture's rows."""
    upgrade_database(url, "0001")
    engine = build_engine(parse_location(url))
    try:
        with engine.begin() as connection:
            for table, columns in TABLE_COLUMNS.items():
                names = [c.strip() for c in columns.split(",")]
                statement = text(
                    f"INSERT INTO {table} ({columns}) VALUES ({', '.join(':' + n for n in names)})"
                )
                values = [dict(zip(names, row, strict=True)) for row in rows[table]]
                if table == "requests":
                    for value in values:
                        value["finished"] = bool(value["finished"])
                connection.execute(statement, values)
    finally:
        engine.dispose()


def _event_tuples(log: SqlEventLog) -> list[tuple[Any, ...]]:
    out = []
    for e in log.events():
        assert e.payload_bytes is not None
        payload = e.payload_bytes.decode("utf-8")
        out.append(
            (
                e.request_id,
                e.seq,
                e.kind,
                e.round_id,
                e.generation,
                e.schema_version,
                e.prev_hash,
                e.hash,
                e.recorded_at,
                payload,
            )
        )
        assert e.payload == json.loads(payload)
    return out


@pytest.mark.parametrize("name", LOGS)
def test_a_0001_log_upgrades_with_its_logical_event_stream_unchanged(log_url: str, name: str) -> None:
    rows = _fixture_rows(name)
    _load_at_0001(log_url, rows)
    assert database_status(log_url).current == "0001"
    assert upgrade_database(log_url).current == head_revision()
    expected = sorted(rows["events"], key=lambda row: (row[0], row[1]))
    with SqlEventLog.open(log_url, create=False) as log:
        assert _event_tuples(log) == [tuple(row) for row in expected]
        report = audit_log(log)
        assert report.ok, [f.message for f in report.findings]
        assert sum(r.rounds for r in report.requests) == len(rows["publications"])
        checks = replay_against_heads(log)
        assert checks and all(check.ok for check in checks)
        heads = {row[0]: row for row in rows["requests"]}
        for request_id, head in heads.items():
            now = log.head(request_id)
            assert now is not None
            assert (now.generation, now.seq, now.hash, now.state_digest) == tuple(head[1:5])
        engine = log.engine
        with engine.connect() as connection:
            kinds = connection.execute(text("SELECT DISTINCT kind FROM events")).scalars().all()
            stored_rounds = connection.execute(text("SELECT count(*) FROM rounds")).scalar_one()
        assert kinds == ["request_opened"]
        assert stored_rounds == len(rows["publications"])


@pytest.mark.parametrize("name", LOGS)
def test_specround_log_prints_what_the_0001_release_printed(tmp_path: Path, name: str) -> None:
    path = str(tmp_path / "upgraded.sqlite")
    rows = _fixture_rows(name)
    _load_at_0001(path, rows)
    runner = CliRunner()
    upgraded = runner.invoke(app, ["db", "upgrade", path])
    assert upgraded.exit_code == 0
    published = len(rows["publications"])
    assert f"0008: {published} of {published} rounds keep the first bytes" in upgraded.stderr
    request_args = [arg for row in sorted(rows["requests"]) for arg in ("--request", row[0])]
    result = runner.invoke(app, ["log", path, "--json", *request_args])
    assert result.exit_code == 0, result.output
    assert result.output == (FIXTURES / f"{name}.log.jsonl").read_text()
    audit = runner.invoke(app, ["audit", path])
    assert audit.exit_code == 0, audit.output


def test_downgrade_gives_back_the_0001_rows(sqlite_path: str) -> None:
    rows = _fixture_rows("v0001_controller")
    _load_at_0001(sqlite_path, rows)
    upgrade_database(sqlite_path)
    engine = build_engine(parse_location(sqlite_path))
    try:
        with engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0001")
    finally:
        engine.dispose()
    connection = sqlite3.connect(sqlite_path)
    try:
        for table, columns in TABLE_COLUMNS.items():
            if table == "requests":
                columns = "request_id, generation, head_seq, head_hash, state_digest, finished, opened_digest"
                want = sorted(row[:7] for row in rows[table])
            else:
                want = sorted(rows[table])
            assert sorted(connection.execute(f"SELECT {columns} FROM {table}").fetchall()) == want
    finally:
        connection.close()


def test_a_damaged_0001_log_is_refused_and_left_as_it_was(sqlite_path: str) -> None:
    rows = _fixture_rows("v0001_controller")
    dropped = next(row for row in rows["events"] if row[1] == 7)
    rows["events"] = [row for row in rows["events"] if row is not dropped]
    _load_at_0001(sqlite_path, rows)
    with pytest.raises(LogIntegrityError, match=f"{dropped[0]}.*seq"):
        upgrade_database(sqlite_path)
    assert database_status(sqlite_path).current == "0001"
    connection = sqlite3.connect(sqlite_path)
    try:
        assert connection.execute("SELECT count(*) FROM events").fetchone()[0] == len(rows["events"])
    finally:
        connection.close()


@pytest.mark.parametrize("name", LOGS)
def test_a_signed_0002_log_upgrades_with_its_signatures_still_valid(sqlite_path: str, name: str) -> None:
    """A log at ``0002_signatures`` (one row per event, signed heads and a checkpoint) upgrades to head."""
    rows = _fixture_rows(name)
    _load_at_0001(sqlite_path, rows)
    assert upgrade_database(sqlite_path, "0002_signatures").current == "0002_signatures"
    signer = HmacSigner(b"an upgrade test key, 16+ bytes")
    heads = [
        (str(r[0]), int(r[1]), int(r[2]), str(r[3]), str(r[4]), bool(r[5])) for r in sorted(rows["requests"])
    ]
    messages = [("head", head[0], head_message(*head, 1.0)) for head in heads]
    messages.append(("checkpoint", None, checkpoint_message(heads, 1.0)))
    connection = sqlite3.connect(sqlite_path)
    with connection:
        connection.executemany(
            "INSERT INTO signatures (scope, request_id, scheme, key_id, message, signature, recorded_at) "
            "VALUES (?, ?, ?, ?, ?, ?, 1.0)",
            [
                (scope, rid, signer.scheme, signer.key_id, message.decode(), signer.sign(message))
                for scope, rid, message in messages
            ],
        )
    connection.close()
    assert upgrade_database(sqlite_path).current == head_revision() == "0008"
    with SqlEventLog.open(sqlite_path, create=False) as log:
        assert audit_log(log).ok
        assert audit_signatures(log, signer) == []
        assert len(log.signature_rows()) == len(heads) + 1


def test_a_0004_log_upgrades_unchanged_and_goes_on_with_derived_ids_stored_empty(tmp_path: Path) -> None:
    """A log written at revision 0004 (every round id in full) upgrades to 0005 and takes new rounds."""
    path = tmp_path / "v0004.sqlite"
    shutil.copyfile(FIXTURES / "v0004_controller.sqlite", path)
    assert database_status(str(path)).current == "0004"
    assert upgrade_database(str(path)).current == head_revision()
    expected = json.loads((FIXTURES / "v0004_controller.events.json").read_text())
    with SqlEventLog.open(str(path), create=False) as log:
        read = [[e.request_id, e.seq, e.kind, e.round_id, e.generation, e.hash] for e in log.events()]
        assert read == expected
        assert audit_log(log).ok
        controller = RoundController(log)
        assert not controller.state("synth-2").finished  # the fixture's request still open at generation 12
        gen = torch.Generator().manual_seed(11)
        p = torch.softmax(torch.randn(5, 64, generator=gen, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(4, 64, generator=gen, dtype=torch.float64), -1)
        drafts = torch.multinomial(q, 1, generator=gen).reshape(4)
        coordinate = controller.coordinate_digest("synth-2")
        (result,) = controller.step([RoundInput("synth-2", coordinate, drafts, q, p)])
        result.raise_for_error()
        with log.engine.connect() as connection:
            stored = connection.execute(
                text(
                    "SELECT r.generation, r.round_id FROM rounds r JOIN requests q USING (request_no) "
                    "WHERE q.request_id = 'synth-2' ORDER BY r.generation"
                )
            ).all()
        assert [g for g, _ in stored] == list(range(1, 14))
        assert all(round_id for _, round_id in stored[:12]) and stored[12][1] == ""  # the new round's id
        (new_id,) = {e.round_id for e in log.events("synth-2") if e.generation == 13}
        assert derived_generation(new_id) == 13 and new_id == result.round_id
        report = audit_log(log)
        assert report.ok and sum(r.rounds for r in report.requests) == 31 + 1
    runner = CliRunner()
    result = runner.invoke(app, ["log", str(path), "--json", "--request", "synth-0", "--request", "synth-1"])
    assert result.exit_code == 0, result.output
    old = (FIXTURES / "v0001_controller.log.jsonl").read_text().splitlines(True)
    assert result.output == "".join(line for line in old if '"synth-2"' not in line)
