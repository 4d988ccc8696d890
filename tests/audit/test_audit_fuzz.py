"""Fuzz of the audit: seeded random byte edits of a real SQLite log give findings or "clean", never a
traceback (and never the audit's own safety net, ``audit-error``).

The log is small (two requests, three rounds each); each case flips 1..4 random bytes of a copy of the
database file, of one ``request_opened`` payload's text, or of one ``rounds`` row's body (kept a BLOB or
stored as text), or sets one column of a ``rounds`` row to a value of another type, and audits it.
``SPECROUND_AUDIT_FUZZ_CASES`` raises the count.
"""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log, replay_against_heads
from specround.errors import SpecroundError
from tests.statemachine._synthetic import run_random_steps

CASES = int(os.environ.get("SPECROUND_AUDIT_FUZZ_CASES", "300"))
SEED = 20261201
V = 16


def _write_log(path: Path) -> None:
    log = SqlEventLog.open(path)
    run_random_steps(log, ("a", "b"), steps=3, vocab=V, generator_seed=5)
    log.close()
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode = DELETE")  # one self-contained file to edit
    connection.close()


def _audit_once(path: Path) -> str:
    """'refused' (a named error opening the log), 'findings' or 'clean'; anything else raises."""
    try:
        log = SqlEventLog.open(path, create=False)
    except SpecroundError:
        return "refused"
    try:
        report = audit_log(log)
        replay_against_heads(log)
    finally:
        log.close()
    safety_net = [f for f in report.findings if f.kind == "audit-error"]
    assert not safety_net, safety_net
    return "clean" if report.ok else "findings"


_ROUND_UPDATE = "UPDATE rounds SET {} = ? WHERE request_no = ? AND generation = ?"
_ROUND_COLUMNS = ("generation", "round_id", "recorded_at", "commit_digest", "prev_hash", "hash", "body")
_ODD_VALUES: tuple[object, ...] = ("x", "Ω", b"\x00" * 3, bytes(32), 7, -1, 2**62, 1.5, float("nan"), None)


def _flipped(rng: random.Random, raw: bytes, *, text_share: float = 0.7) -> str | bytes:
    """``raw`` with 1..4 random bytes changed, as text (``text_share`` of the time) or as a BLOB."""
    edited = bytearray(raw)
    for _ in range(rng.randint(1, 4)):
        edited[rng.randrange(len(edited))] = rng.randrange(256)
    return edited.decode("utf-8", "replace") if rng.random() < text_share else bytes(edited)


def _update(path: Path, statement: str, parameters: tuple[object, ...]) -> None:
    edit = sqlite3.connect(path)
    try:
        with edit:
            edit.execute(statement, parameters)
    except sqlite3.IntegrityError:  # NOT NULL or a key the edit would break: the log stays as it was
        pass
    finally:
        edit.close()


def test_random_byte_edits_never_crash_the_audit(tmp_path: Path) -> None:
    original = tmp_path / "original.sqlite"
    _write_log(original)
    pristine = original.read_bytes()
    connection = sqlite3.connect(original)
    payloads = connection.execute("SELECT request_id, seq, packed_payload FROM events").fetchall()
    bodies = connection.execute("SELECT request_no, generation, body FROM rounds").fetchall()
    connection.close()
    assert len(payloads) == 2 and len(bodies) == 6
    rng = random.Random(SEED)
    outcomes: dict[str, int] = {}
    tracebacks: list[str] = []
    target = tmp_path / "edited.sqlite"
    for case in range(CASES):
        target.write_bytes(pristine)
        kind = case % 4
        if kind == 0:  # the file itself: pages, headers, b-tree cells
            data = bytearray(pristine)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            target.write_bytes(bytes(data))
        elif kind == 1:  # one request_opened payload's packed bytes, the rows themselves intact
            request_id, seq, packed = payloads[rng.randrange(len(payloads))]
            value = _flipped(rng, bytes(packed), text_share=0.2)
            _update(
                target,
                "UPDATE events SET packed_payload = ? WHERE request_id = ? AND seq = ?",
                (value, request_id, seq),
            )
        elif kind == 2:  # one round's body bytes
            number, generation, body = bodies[rng.randrange(len(bodies))]
            value = _flipped(rng, bytes(body), text_share=0.2)
            _update(target, _ROUND_UPDATE.format("body"), (value, number, generation))
        else:  # one column of a round row holding a value of another type
            number, generation, _ = bodies[rng.randrange(len(bodies))]
            column = rng.choice(_ROUND_COLUMNS)
            _update(target, _ROUND_UPDATE.format(column), (rng.choice(_ODD_VALUES), number, generation))
        try:
            outcome = _audit_once(target)
        except Exception as exc:  # the count the issue asks for: tracebacks out of audit or replay
            tracebacks.append(f"case {case}: {type(exc).__name__}: {exc}")
            if os.environ.get("SPECROUND_AUDIT_FUZZ_RAISE"):
                raise
            continue
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert tracebacks == [], tracebacks[:5]
    assert outcomes.get("findings", 0) > CASES // 4, outcomes  # the edits are seen, not waved through
