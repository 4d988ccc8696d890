"""Damaged logs give named findings, never a traceback: malformed payloads, rows, heads and deleted rows."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.audit import AuditReport, audit_log, replay_against_heads
from specround.cli import app
from specround.statemachine.controller import RoundController
from tests.statemachine._synthetic import random_input

runner = CliRunner()
V = 16


@pytest.fixture
def sqlite_log(tmp_path: Path) -> Path:
    path = tmp_path / "log.sqlite"
    log = SqlEventLog.open(path)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(5)
    for rid in ("a", "b"):
        controller.open_request((1, 2, 3), seed=9, vocab_size=V, request_id=rid, max_new_tokens=40)
    for _ in range(3):
        controller.step([random_input(controller, rid, 3, generator) for rid in ("a", "b")])
    log.close()
    return path


def _execute(path: Path, statement: str, parameters: tuple[object, ...] = ()) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(statement, parameters)
    finally:
        connection.close()


def _last_event(path: Path, request_id: str) -> tuple[int, str, str]:
    connection = sqlite3.connect(path)
    try:
        row = connection.execute(
            "SELECT seq, prev_hash, payload FROM events WHERE request_id = ? ORDER BY seq DESC LIMIT 1",
            (request_id,),
        ).fetchone()
    finally:
        connection.close()
    return int(row[0]), str(row[1]), str(row[2])


def _set_payload(path: Path, request_id: str, payload: str | bytes, *, rechain: bool) -> int:
    """Replace the last event's payload of ``request_id``; with ``rechain`` also its hash and the head."""
    seq, prev, _ = _last_event(path, request_id)
    _execute(
        path, "UPDATE events SET payload = ? WHERE request_id = ? AND seq = ?", (payload, request_id, seq)
    )
    if rechain:
        data = payload if isinstance(payload, bytes) else payload.encode("utf-8")
        link = hashlib.sha256(prev.encode("ascii") + data).hexdigest()
        _execute(path, "UPDATE events SET hash = ? WHERE request_id = ? AND seq = ?", (link, request_id, seq))
        _execute(path, "UPDATE requests SET head_hash = ? WHERE request_id = ?", (link, request_id))
    return seq


def _audit_cli(path: Path) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["audit", str(path), "--json"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, json.loads(result.stdout)


def _findings(report: dict[str, object]) -> list[dict[str, object]]:
    findings = report["findings"]
    assert isinstance(findings, list)
    return findings


def _cut(text: str) -> str:
    return text[:-5]


def _deep(_: str) -> str:
    return "[" * 5000 + "]" * 5000


PAYLOADS = {
    "cut by five bytes": (_cut, False),
    "invalid JSON": (lambda _: "{not json", False),
    "1e400": (lambda _: '{"kind": 1e400}', False),
    "nesting 5000 deep": (_deep, False),
    "an array, chain recomputed": (lambda _: "[1, 2, 3]", True),
    "a string, chain recomputed": (lambda _: '"I have been HACKED"', True),
    "invalid JSON, chain recomputed": (lambda _: "{not json", True),
}


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_malformed_payload_is_a_named_finding_at_its_seq(sqlite_log: Path, name: str) -> None:
    edit, rechain = PAYLOADS[name]
    _, _, original = _last_event(sqlite_log, "b")
    seq = _set_payload(sqlite_log, "b", edit(original), rechain=rechain)
    code, report = _audit_cli(sqlite_log)
    assert code == 1
    found = [(f["request_id"], f["kind"], f["seq"]) for f in _findings(report)]
    assert ("b", "malformed", seq) in found
    assert all(f["request_id"] == "b" for f in _findings(report))  # "a" still audits clean
    result = runner.invoke(app, ["replay", str(sqlite_log), "--json"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    checks = {c["request_id"]: c for c in json.loads(result.stdout)["requests"]}
    assert checks["a"]["ok"] and not checks["b"]["ok"] and "malformed row" in checks["b"]["error"]


def test_a_blob_payload_is_a_named_finding(sqlite_log: Path) -> None:
    _, _, original = _last_event(sqlite_log, "a")
    seq = _set_payload(sqlite_log, "a", original.encode("utf-8"), rechain=True)
    code, report = _audit_cli(sqlite_log)
    assert code == 1
    [finding] = [f for f in _findings(report) if f["kind"] == "malformed"]
    assert (finding["request_id"], finding["seq"]) == ("a", seq) and "BLOB" in str(finding["message"])


def test_wrongly_typed_columns_are_named(sqlite_log: Path) -> None:
    _execute(
        sqlite_log, "UPDATE events SET generation = 'x', prev_hash = 'Ω' WHERE request_id = 'a' AND seq = 3"
    )
    _execute(sqlite_log, "UPDATE events SET recorded_at = 'never' WHERE request_id = 'b' AND seq = 2")
    report = audit_log_of(sqlite_log)
    malformed = {(f.request_id, f.seq) for f in report.findings if f.kind == "malformed"}
    assert malformed == {("a", 3), ("b", 2)}


def audit_log_of(path: Path) -> AuditReport:
    with SqlEventLog.open(path, create=False) as log:
        return audit_log(log)


def test_a_head_generation_that_is_not_a_number_is_a_head_finding(sqlite_log: Path) -> None:
    _execute(sqlite_log, "UPDATE requests SET generation = 'x' WHERE request_id = 'a'")
    code, report = _audit_cli(sqlite_log)
    assert code == 1
    [finding] = _findings(report)
    assert (finding["request_id"], finding["kind"]) == ("a", "head") and "'x'" in str(finding["message"])
    with SqlEventLog.open(sqlite_log, create=False) as log:
        checks = {c.request_id: c for c in replay_against_heads(log)}
    assert checks["b"].ok and not checks["a"].ok and "malformed" in str(checks["a"].error)


def test_events_of_a_deleted_request_row_are_orphans(sqlite_log: Path) -> None:
    connection = sqlite3.connect(sqlite_log)
    with connection:
        connection.execute("PRAGMA foreign_keys = OFF")
        connection.execute("DELETE FROM publications WHERE request_id = 'b'")
        connection.execute("DELETE FROM requests WHERE request_id = 'b'")
    connection.close()
    code, report = _audit_cli(sqlite_log)
    assert code == 1 and report["requests"] == 2
    orphans = [f for f in _findings(report) if f["kind"] == "orphan"]
    assert [(f["request_id"], f["seq"]) for f in orphans] == [("b", 0)]
    assert "16 event(s)" in str(orphans[0]["message"])


def test_a_listed_request_without_events_is_reported(sqlite_log: Path) -> None:
    connection = sqlite3.connect(sqlite_log)
    with connection:
        connection.execute("DELETE FROM events WHERE request_id = 'a'")
    connection.close()
    report = audit_log_of(sqlite_log)
    assert [(f.request_id, f.kind) for f in report.findings] == [("a", "dropped")]
