"""Every refusal of the CLI is one line, a non-zero exit, and nothing created or modified."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

from specround.adapters.sql import SqlEventLog
from specround.cli import app
from specround.statemachine.controller import RoundController
from tests.statemachine._synthetic import random_input

runner = CliRunner()


def _tree(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the SHA-256 of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _refused(args: list[str], root: Path) -> Result:
    before = _tree(root)
    result = runner.invoke(app, args)
    assert result.exit_code != 0, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert _tree(root) == before  # nothing created, nothing modified
    return result


def _foreign_database(path: Path) -> None:
    connection = sqlite3.connect(path)
    with connection:
        connection.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        connection.execute("INSERT INTO notes (body) VALUES ('keep me')")
    connection.close()


def _journal_mode(path: Path) -> str:
    connection = sqlite3.connect(path)
    try:
        return str(connection.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        connection.close()


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)  # the default log location is relative to the working directory
    return tmp_path


def test_a_prompt_that_is_not_utf8_is_refused(workdir: Path) -> None:
    prompt = b"hello \xff\xfe world".decode("utf-8", "surrogateescape")  # how Python reads such argv
    result = _refused(["generate", prompt, "--log", str(workdir / "x.sqlite")], workdir)
    assert "UTF-8" in result.output


def test_a_log_under_a_file_is_refused(workdir: Path) -> None:
    (workdir / "file.txt").write_text("plain text\n")
    result = _refused(["generate", "hi", "--log", str(workdir / "file.txt" / "log.sqlite")], workdir)
    assert "is a file" in result.output


@pytest.mark.parametrize("command", ["generate", "audit", "replay"])
def test_a_bracketed_postgres_url_is_refused(workdir: Path, command: str) -> None:
    url = "postgresql+psycopg://[::1"
    args = ["generate", "hi", "--log", url] if command == "generate" else [command, url]
    result = _refused(args, workdir)
    assert "InvalidLogUrlError" in result.output


def test_a_seed_past_64_bits_is_refused_before_a_log_exists(workdir: Path) -> None:
    result = _refused(["generate", "hi", "--seed", "18446744073709551616"], workdir)
    assert "--seed" in result.output and not (workdir / "specround-logs").exists()


@pytest.mark.parametrize("command", ["generate", "audit", "replay", "log"])
def test_another_tools_database_is_left_untouched(workdir: Path, command: str) -> None:
    path = workdir / "other.db"
    _foreign_database(path)
    args = {
        "generate": ["generate", "hi", "--log", str(path)],
        "audit": ["audit", str(path)],
        "replay": ["replay", str(path)],
        "log": ["log", str(path), "--request", "r"],
    }[command]
    result = _refused(args, workdir)
    assert "another tool" in result.output
    assert _journal_mode(path) == "delete"


@pytest.mark.parametrize("command", ["audit", "replay", "log"])
def test_an_empty_file_stays_empty(workdir: Path, command: str) -> None:
    path = workdir / "empty.sqlite"
    path.touch()
    args = [command, str(path), *(["--request", "r"] if command == "log" else [])]
    result = _refused(args, workdir)
    assert path.stat().st_size == 0 and "empty" in result.output


@pytest.mark.parametrize("command", ["generate", "audit"])
def test_a_plain_text_file_gets_a_truthful_error(workdir: Path, command: str) -> None:
    path = workdir / "notes.txt"
    path.write_text("just some text, long enough to fill a SQLite header and then some more.\n" * 3)
    args = ["generate", "hi", "--log", str(path)] if command == "generate" else ["audit", str(path)]
    result = _refused(args, workdir)
    assert "not a SQLite database" in result.output and "holds every round" not in result.output


def test_read_only_commands_change_no_byte_of_a_log(workdir: Path) -> None:
    path = workdir / "log.sqlite"
    log = SqlEventLog.open(path)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(5)
    controller.open_request((1, 2, 3), seed=9, vocab_size=16, request_id="r", max_new_tokens=40)
    controller.step([random_input(controller, "r", 3, generator)])
    log.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    for args in (["audit", str(path)], ["replay", str(path)], ["log", str(path), "--request", "r"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with SqlEventLog.open(path, read_only=True) as reader, pytest.raises(Exception) as caught:
        reader.open_request(*_opened_again(controller))
    assert "readonly" in str(caught.value).lower() or "read-only" in str(caught.value).lower()


def _opened_again(controller: RoundController) -> tuple[object, str]:
    from specround.statemachine.events import RequestOpened
    from specround.statemachine.staging import open_snapshot

    config = controller.config("r").model_copy(update={"request_id": "s"})
    snapshot = open_snapshot(config)
    return RequestOpened(request_id="s", config=config, initial_state_digest=snapshot.digest), snapshot.digest
