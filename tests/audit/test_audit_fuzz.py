"""Fuzz of the audit: seeded random byte edits of a real SQLite log give findings or "clean", never a
traceback (and never the audit's own safety net, ``audit-error``).

The log is small (two requests, three rounds each); each case flips 1..4 random bytes of a copy of the
database file, or of one payload's text, and audits it. ``SPECROUND_AUDIT_FUZZ_CASES`` raises the count.
"""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path

import torch

from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log, replay_against_heads
from specround.errors import SpecroundError
from specround.statemachine.controller import RoundController
from tests.statemachine._synthetic import random_input

CASES = int(os.environ.get("SPECROUND_AUDIT_FUZZ_CASES", "300"))
SEED = 20261201
V = 16


def _write_log(path: Path) -> None:
    log = SqlEventLog.open(path)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(5)
    for rid in ("a", "b"):
        controller.open_request((1, 2, 3), seed=9, vocab_size=V, request_id=rid, max_new_tokens=40)
    for _ in range(3):
        controller.step([random_input(controller, rid, 3, generator) for rid in ("a", "b")])
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


def test_random_byte_edits_never_crash_the_audit(tmp_path: Path) -> None:
    original = tmp_path / "original.sqlite"
    _write_log(original)
    pristine = original.read_bytes()
    connection = sqlite3.connect(original)
    payloads = connection.execute("SELECT request_id, seq, payload FROM events").fetchall()
    connection.close()
    rng = random.Random(SEED)
    outcomes: dict[str, int] = {}
    tracebacks: list[str] = []
    target = tmp_path / "edited.sqlite"
    for case in range(CASES):
        if case % 2 == 0:  # the file itself: pages, headers, b-tree cells
            data = bytearray(pristine)
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            target.write_bytes(bytes(data))
        else:  # one payload's text, the rows themselves intact
            target.write_bytes(pristine)
            request_id, seq, text = payloads[rng.randrange(len(payloads))]
            raw = bytearray(text.encode("utf-8"))
            for _ in range(rng.randint(1, 4)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            value: str | bytes = raw.decode("utf-8", "replace") if rng.random() < 0.7 else bytes(raw)
            edit = sqlite3.connect(target)
            with edit:
                edit.execute(
                    "UPDATE events SET payload = ? WHERE request_id = ? AND seq = ?", (value, request_id, seq)
                )
            edit.close()
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
