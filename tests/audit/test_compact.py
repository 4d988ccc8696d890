"""Retention: finished requests older than a cutoff move to an archive log; both logs audit clean."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.adapters.sql.compact import compact_log
from specround.audit import audit_log, audit_signatures
from specround.cli import app
from specround.errors import InvalidRequestError
from specround.signing import HmacSigner
from specround.statemachine.controller import RoundController
from tests.statemachine.step_fuzz import random_input

KEY = b"the archive key, sixteen+ bytes"


def _log(path: Path, signer: HmacSigner | None = None, prefix: str = "") -> None:
    log = SqlEventLog.open(path, signer=signer)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(3)
    budgets = {f"{prefix}done-1": 3, f"{prefix}done-2": 4, f"{prefix}running": 500}
    for rid, budget in budgets.items():
        controller.open_request((1, 2), seed=2, vocab_size=16, request_id=rid, max_new_tokens=budget)
    for _ in range(4):
        live = [rid for rid in budgets if not controller.state(rid).finished]
        controller.step([random_input(controller, rid, 2, generator) for rid in live])
    assert controller.state(f"{prefix}done-1").finished and controller.state(f"{prefix}done-2").finished
    log.close()


def _ids_and_audit(path: Path, signer: HmacSigner | None = None) -> tuple[list[str], bool]:
    with SqlEventLog.open(path, read_only=True) as log:
        report = audit_log(log)
        signed_ok = signer is None or audit_signatures(log, signer) == []
        return [r.request_id for r in report.requests], report.ok and signed_ok


def test_finished_requests_move_with_their_chains(tmp_path: Path) -> None:
    source, archive = tmp_path / "log.sqlite", tmp_path / "archive.sqlite"
    _log(source)
    report = compact_log(source, archive, before=time.time() + 60)
    assert report.moved == ("done-1", "done-2") and report.events > 0
    assert _ids_and_audit(source) == (["running"], True)
    assert _ids_and_audit(archive) == (["done-1", "done-2"], True)
    assert compact_log(source, archive, before=time.time() + 60).moved == ()  # nothing left to move
    assert compact_log(source, archive, before=0.0).moved == ()  # the cutoff is honoured
    assert _round_rows(source) == {"running": 4}
    moved = _round_rows(archive)
    assert set(moved) == {"done-1", "done-2"} and report.events == 2 + 5 * sum(moved.values())


def _round_rows(path: Path) -> dict[str, int]:
    """Stored ``rounds`` rows per request id (each holds a round's five events)."""
    with SqlEventLog.open(path, read_only=True) as log, log.engine.connect() as connection:
        rows = connection.exec_driver_sql(
            "SELECT q.request_id, count(*) FROM rounds r JOIN requests q ON q.request_no = r.request_no "
            "GROUP BY q.request_id"
        ).fetchall()
    return {str(row[0]): int(row[1]) for row in rows}


def test_a_second_log_compacted_into_the_same_archive_gets_fresh_request_numbers(tmp_path: Path) -> None:
    archive = tmp_path / "archive.sqlite"
    for prefix in ("x-", "y-"):
        source = tmp_path / f"{prefix}log.sqlite"
        _log(source, prefix=prefix)
        before = _round_rows(source)
        compact_log(source, archive, before=time.time() + 60)
        archived = _round_rows(archive)
        assert all(archived[f"{prefix}{rid}"] == before[f"{prefix}{rid}"] for rid in ("done-1", "done-2"))
    ids, ok = _ids_and_audit(archive)
    assert ids == ["x-done-1", "x-done-2", "y-done-1", "y-done-2"] and ok


def test_a_signed_log_needs_its_key_and_both_logs_stay_signed(tmp_path: Path) -> None:
    source, archive = tmp_path / "log.sqlite", tmp_path / "archive.sqlite"
    signer = HmacSigner(KEY)
    _log(source, signer)
    with pytest.raises(InvalidRequestError, match="signed"):
        compact_log(source, archive, before=time.time() + 60)
    assert not archive.exists()
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    cutoff = str(time.time() + 60)
    result = CliRunner().invoke(
        app, ["compact", str(source), "--archive", str(archive), "--before", cutoff, "--key", str(key_file)]
    )
    assert result.exit_code == 0 and "moved 2 requests" in result.output, result.output
    assert _ids_and_audit(source, signer) == (["running"], True)
    assert _ids_and_audit(archive, signer) == (["done-1", "done-2"], True)
