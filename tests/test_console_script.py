"""The console script: output is flushed and the exit status survives the fast exit of ``cli.main``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

RUN_MAIN = "import sys; from specround.cli import main; sys.argv[0] = 'specround'; main()"
SCRIPT = [sys.executable, "-c", RUN_MAIN]


def test_help_is_printed_and_exits_zero() -> None:
    result = subprocess.run([*SCRIPT, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "audit" in result.stdout and "generate" in result.stdout


def test_a_refusal_keeps_its_message_and_status(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    result = subprocess.run([*SCRIPT, "audit", str(missing)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: ") and "LogUnavailableError" in result.stderr
    assert not missing.exists()


def test_a_usage_error_exits_two() -> None:
    result = subprocess.run([*SCRIPT, "no-such-command"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "No such command" in result.stderr


def test_python_dash_m_runs_the_same_command_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "specround", "check", "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "--only" in result.stdout and "--lab-mutation" in result.stdout
