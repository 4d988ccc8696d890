"""Damaged logs give named findings, never a traceback: malformed payloads, rows, heads and deleted rows."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.adapters.sql.round_body import encode_raw
from specround.audit import AuditReport, audit_log, replay_against_heads
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


def _execute(path: Path, statement: str, parameters: tuple[object, ...] = ()) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(statement, parameters)
    finally:
        connection.close()


_ROUND = "(SELECT request_no FROM requests WHERE request_id = ?)"
"""The stored key of a request's rounds (each round's five events are one ``rounds`` row)."""


def _last_event(path: Path, request_id: str) -> tuple[int, str, str]:
    """(seq, prev_hash, payload text) of the request's last event, as the log reads it."""
    with SqlEventLog.open(path, create=False) as log:
        last = list(log.events(request_id))[-1]
    assert last.payload_bytes is not None
    return last.seq, last.prev_hash, last.payload_bytes.decode("utf-8")


def _round_texts(path: Path, request_id: str, generation: int) -> list[bytes]:
    with SqlEventLog.open(path, create=False) as log:
        events = [e for e in log.events(request_id) if e.generation == generation and e.seq > 0]
    texts = [e.payload_bytes for e in events]
    assert len(texts) == 5 and all(t is not None for t in texts)
    return [t for t in texts if t is not None]


def _set_payload(path: Path, request_id: str, payload: str | bytes, *, rechain: bool) -> int:
    """Replace the last event's payload of ``request_id`` (its round's body rewritten in the RAW form, the
    other four events' texts kept); with ``rechain`` also the round's stored hash and the head."""
    seq, prev, _ = _last_event(path, request_id)
    generation = (seq + 4) // 5
    texts = _round_texts(path, request_id, generation)
    data = payload if isinstance(payload, bytes) else payload.encode("utf-8", "surrogateescape")
    texts[-1] = data
    where = f"request_no = {_ROUND} AND generation = ?"
    _execute(path, f"UPDATE rounds SET body = ? WHERE {where}", (encode_raw(texts), request_id, generation))
    if rechain:
        link = hashlib.sha256(prev.encode("ascii") + data).digest()
        _execute(path, f"UPDATE rounds SET hash = ? WHERE {where}", (link, request_id, generation))
        _execute(path, "UPDATE requests SET head_hash = ? WHERE request_id = ?", (link.hex(), request_id))
    return seq


def _set_opened_payload(path: Path, request_id: str, payload: str | bytes) -> None:
    """Replace the ``request_opened`` event's stored payload with a text (its packed form dropped)."""
    _execute(
        path,
        "UPDATE events SET payload = ?, packed_payload = NULL WHERE request_id = ? AND seq = 0",
        (payload, request_id),
    )


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


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_a_malformed_opened_payload_is_a_named_finding_at_seq_0(sqlite_log: Path, name: str) -> None:
    edit, _ = PAYLOADS[name]
    with SqlEventLog.open(sqlite_log, create=False) as log:
        original = next(iter(log.events("b"))).payload_bytes
    assert original is not None
    _set_opened_payload(sqlite_log, "b", edit(original.decode("utf-8")))
    code, report = _audit_cli(sqlite_log)
    assert code == 1
    assert ("b", "malformed", 0) in [(f["request_id"], f["kind"], f["seq"]) for f in _findings(report)]
    assert all(f["request_id"] == "b" for f in _findings(report))


def test_a_blob_payload_is_a_named_finding(sqlite_log: Path) -> None:
    with SqlEventLog.open(sqlite_log, create=False) as log:
        original = next(iter(log.events("a"))).payload_bytes
    assert original is not None
    _set_opened_payload(sqlite_log, "a", original)
    code, report = _audit_cli(sqlite_log)
    assert code == 1
    [finding] = [f for f in _findings(report) if f["kind"] == "malformed"]
    assert (finding["request_id"], finding["seq"]) == ("a", 0) and "BLOB" in str(finding["message"])


def test_a_text_round_body_is_a_named_finding(sqlite_log: Path) -> None:
    _execute(
        sqlite_log,
        f"UPDATE rounds SET body = 'not a blob' WHERE request_no = {_ROUND} AND generation = 2",
        ("a",),
    )
    report = audit_log_of(sqlite_log)
    malformed = {f.seq: f.message for f in report.findings if f.kind == "malformed"}
    assert all(f.request_id == "a" for f in report.findings)
    # the next round's body may refer to this one's processor digest, so it cannot be rebuilt either
    assert set(range(6, 11)) <= set(malformed) <= set(range(6, 16))
    assert all("body 'not a blob' is not a BLOB" in malformed[seq] for seq in range(6, 11))


@pytest.mark.parametrize(
    "edit",
    [
        b"",  # empty
        b"\x07garbage",  # an unknown form
        b"\x01",  # a compact body cut after its form byte
    ],
)
def test_unreadable_round_body_bytes_are_a_named_finding(sqlite_log: Path, edit: bytes) -> None:
    _execute(
        sqlite_log, f"UPDATE rounds SET body = ? WHERE request_no = {_ROUND} AND generation = 1", (edit, "b")
    )
    report = audit_log_of(sqlite_log)
    malformed = {(f.request_id, f.seq) for f in report.findings if f.kind == "malformed"}
    assert {("b", seq) for seq in range(1, 6)} <= malformed
    assert all(f.request_id == "b" for f in report.findings)


def test_a_cut_round_body_is_a_named_finding(sqlite_log: Path) -> None:
    where = f"request_no = {_ROUND} AND generation = 3"
    _execute(sqlite_log, f"UPDATE rounds SET body = substr(body, 1, length(body) / 2) WHERE {where}", ("a",))
    report = audit_log_of(sqlite_log)
    malformed = {(f.request_id, f.seq) for f in report.findings if f.kind == "malformed"}
    assert malformed == {("a", seq) for seq in range(11, 16)}


def test_wrongly_typed_columns_are_named(sqlite_log: Path) -> None:
    _execute(sqlite_log, "UPDATE events SET generation = 'x', prev_hash = 'Ω' WHERE request_id = 'a'")
    _execute(
        sqlite_log,
        f"UPDATE rounds SET generation = 'x', prev_hash = 'Ω' WHERE request_no = {_ROUND} AND generation = 3",
        ("a",),
    )
    _execute(
        sqlite_log,
        f"UPDATE rounds SET recorded_at = 'never' WHERE request_no = {_ROUND} AND generation = 1",
        ("b",),
    )
    _execute(
        sqlite_log, f"UPDATE rounds SET hash = 42 WHERE request_no = {_ROUND} AND generation = 2", ("b",)
    )
    report = audit_log_of(sqlite_log)
    malformed = {(f.request_id, f.seq) for f in report.findings if f.kind == "malformed"}
    expected = {("a", 0), *(("a", seq) for seq in range(11, 16)), *(("b", seq) for seq in range(1, 11))}
    assert malformed == expected
    messages = " ".join(f.message for f in report.findings if f.kind == "malformed")
    assert "generation 'x'" in messages and "recorded_at 'never'" in messages and "hash 42" in messages


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
        connection.execute("DELETE FROM requests WHERE request_id = 'b'")
    connection.close()
    code, report = _audit_cli(sqlite_log)
    # b's request_opened event (events table) and its rounds (keyed by the deleted row's request_no)
    assert code == 1 and report["requests"] == 3
    orphans = [f for f in _findings(report) if f["kind"] == "orphan"]
    found = sorted((f["request_id"], f["seq"]) for f in orphans)
    assert found == [("(rounds of request_no 2)", 1), ("b", 0)]
    counts = {f["request_id"]: str(f["message"]).split()[0] for f in orphans}
    assert counts == {"b": "1", "(rounds of request_no 2)": "15"}


def test_a_listed_request_without_events_is_reported(sqlite_log: Path) -> None:
    connection = sqlite3.connect(sqlite_log)
    with connection:
        connection.execute(f"DELETE FROM rounds WHERE request_no = {_ROUND}", ("a",))
        connection.execute("DELETE FROM events WHERE request_id = 'a'")
    connection.close()
    report = audit_log_of(sqlite_log)
    assert [(f.request_id, f.kind) for f in report.findings] == [("a", "dropped")]


class _OneByOne:
    """The SQL log seen through the EventLog port only: no ``heads()``, so the audit reads each head."""

    def __init__(self, log: SqlEventLog) -> None:
        self.events, self.request_ids, self.head = log.events, log.request_ids, log.head


@pytest.mark.parametrize(
    "damage",
    [
        None,
        "UPDATE requests SET state_digest = '" + "0" * 64 + "' WHERE request_id = 'b'",
        "UPDATE requests SET generation = 'x' WHERE request_id = 'a'",  # heads() refuses: one by one
        "DELETE FROM rounds WHERE request_no = (SELECT request_no FROM requests WHERE request_id = 'a')",
    ],
)
def test_the_audit_reads_the_sql_heads_at_once_and_finds_what_reading_them_one_by_one_finds(
    sqlite_log: Path, damage: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if damage is not None:
        _execute(sqlite_log, damage)
    calls: list[str] = []
    head, heads = SqlEventLog.head, SqlEventLog.heads
    monkeypatch.setattr(SqlEventLog, "head", lambda self, rid: calls.append("head") or head(self, rid))
    monkeypatch.setattr(SqlEventLog, "heads", lambda self: calls.append("heads") or heads(self))
    with SqlEventLog.open(sqlite_log, create=False) as log:
        at_once = audit_log(log)
        read, calls[:] = list(calls), []
        one_by_one = audit_log(_OneByOne(log))  # type: ignore[arg-type]
    assert calls == ["head", "head"]
    readable = damage is None or "'x'" not in damage
    assert read == (["heads"] if readable else ["heads", "head", "head"])
    assert at_once == one_by_one
    assert bool(at_once.findings) == (damage is not None)
