"""The replay, audit and faults commands, with tampering done by direct SQL on a SQLite log (INV-9).

A round's five events are one ``rounds`` row, so rows are edited, dropped, copied and moved whole.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.audit.pipelined_faults import PIPELINED_CELLS
from specround.cli import app
from tests.statemachine._synthetic import run_random_steps

runner = CliRunner()
V = 16


@pytest.fixture
def sqlite_log(tmp_path: Path) -> Path:
    path = tmp_path / "log.sqlite"
    log = SqlEventLog.open(path)
    run_random_steps(log, ("a", "b"), steps=3, vocab=V, generator_seed=5)
    log.close()
    return path


def _sql(path: Path, *statements: tuple[str, tuple[object, ...]]) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            for statement, parameters in statements:
                connection.execute(statement, parameters)
    finally:
        connection.close()


def _audit(path: Path) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["audit", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_a_clean_sqlite_log_audits_and_replays_clean(sqlite_log: Path) -> None:
    code, report = _audit(sqlite_log)
    assert code == 0 and report["ok"] is True and report["rounds"] == 6
    result = runner.invoke(app, ["replay", str(sqlite_log), "--json"])
    assert result.exit_code == 0
    replayed = json.loads(result.stdout)
    assert replayed["ok"] and [r["request_id"] for r in replayed["requests"]] == ["a", "b"]
    one = runner.invoke(app, ["replay", str(sqlite_log), "--request", "b"])
    assert one.exit_code == 0 and "match" in one.stdout
    human = runner.invoke(app, ["audit", str(sqlite_log)])
    assert human.exit_code == 0 and "clean" in human.stdout


def _kinds(report: dict[str, object]) -> set[str]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return {f["kind"] for f in findings if f["invariant"] == "INV-9"}


_ROUND = "(SELECT request_no FROM requests WHERE request_id = ?)"
"""The stored key of a request's rounds (each round's five events are one ``rounds`` row)."""


def test_an_edited_round_is_reported(sqlite_log: Path) -> None:
    connection = sqlite3.connect(sqlite_log)
    try:
        where = f"request_no = {_ROUND} AND generation = 1"
        (body,) = connection.execute(f"SELECT body FROM rounds WHERE {where}", ("a",)).fetchone()
        edited = bytes(body[:-1]) + bytes([body[-1] ^ 1])  # one bit of the successor digest
        with connection:
            connection.execute(f"UPDATE rounds SET body = ? WHERE {where}", (edited, "a"))
    finally:
        connection.close()
    code, report = _audit(sqlite_log)
    assert code == 1 and "edited" in _kinds(report)
    assert runner.invoke(app, ["replay", str(sqlite_log)]).exit_code == 1


def test_a_dropped_round_is_reported(sqlite_log: Path) -> None:
    _sql(sqlite_log, (f"DELETE FROM rounds WHERE request_no = {_ROUND} AND generation = 2", ("a",)))
    code, report = _audit(sqlite_log)
    assert code == 1 and "dropped" in _kinds(report)


def test_a_duplicated_round_is_reported(sqlite_log: Path) -> None:
    _sql(
        sqlite_log,
        (
            "INSERT INTO rounds (request_no, generation, round_id, recorded_at, commit_digest, prev_hash, "
            "hash, body) SELECT request_no, 100, round_id || '-copy', recorded_at, commit_digest, prev_hash, "
            f"hash, body FROM rounds WHERE request_no = {_ROUND} AND generation = 1",
            ("b",),
        ),
    )
    code, report = _audit(sqlite_log)
    assert code == 1 and "duplicated" in _kinds(report)


def test_reordered_rounds_are_reported(sqlite_log: Path) -> None:
    swap = f"UPDATE rounds SET generation = ? WHERE request_no = {_ROUND} AND generation = ?"
    _sql(sqlite_log, (swap, (-1, "a", 2)), (swap, (2, "a", 3)), (swap, (3, "a", -1)))
    code, report = _audit(sqlite_log)
    assert code == 1 and "reordered" in _kinds(report)
    # The untouched request still audits clean.
    assert all(f["request_id"] == "a" for f in report["findings"])  # type: ignore[union-attr,index]


def test_audit_of_a_missing_log_is_an_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["audit", str(tmp_path / "nothing.sqlite")])
    assert result.exit_code == 2 and not (tmp_path / "nothing.sqlite").exists()


@pytest.mark.parametrize("db", ["memory", "sqlite"])
def test_the_fault_matrix_holds_on_every_cell(db: str, tmp_path: Path) -> None:
    target = db if db == "memory" else str(tmp_path / "faults.sqlite")
    result = runner.invoke(app, ["faults", "--db", target, "--json"])
    assert result.exit_code == 0, result.stdout
    report = json.loads(result.stdout)
    cells = report["cells"]
    assert report["ok"] and len(cells) == (6 + len(PIPELINED_CELLS)) * 2 * 5
    assert {c["verdict"] for c in cells if c["point"] == "F-6"} == {"acknowledged"}
    assert {c["verdict"] for c in cells if c["point"] in PIPELINED_CELLS} == {"held"}
    assert {c["verdict"] for c in cells if c["point"] not in ("F-6", *PIPELINED_CELLS)} == {"unchanged"}
    assert all(c["audit_clean"] for c in cells)
