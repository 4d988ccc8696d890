"""z3 is the ``check`` extra: the package and every command but ``check`` run without it.

Each run is a fresh interpreter whose import system refuses ``z3`` (a ``sys.meta_path`` finder that also
reports every attempt on stderr, so an import swallowed by an ``except ImportError`` still shows).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specround.adapters.sql import SqlEventLog
from specround.extras import CHECK_EXTRA, Extra, missing_extra
from specround.statemachine.controller import RoundController
from specround.statemachine.rounds import RoundInput

ATTEMPT = "z3 import attempted"

BLOCK_Z3 = f"""
import sys

class _RefuseZ3:
    def find_spec(self, name, path=None, target=None):
        if name == "z3" or name.startswith("z3."):
            print("{ATTEMPT}: " + name, file=sys.stderr)
            raise ModuleNotFoundError("No module named " + repr(name), name=name)
        return None

sys.meta_path.insert(0, _RefuseZ3())
"""

RUN_CLI = BLOCK_Z3 + "from specround.cli import main\nsys.argv[0] = 'specround'\nmain()\n"


def _without_z3(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300, check=False
    )


def _cli_without_z3(*args: str) -> subprocess.CompletedProcess[str]:
    return _without_z3(RUN_CLI, *args)


def _small_log(path: Path) -> str:
    """A SQLite log with one request and two published rounds; returns the request id."""
    vocab = 8
    gen = torch.Generator().manual_seed(0)
    with SqlEventLog.open(path) as log:
        controller = RoundController(log)
        state = controller.open_request([1, 4, 7], seed=3, max_new_tokens=16, vocab_size=vocab)
        request_id = state.request_id
        for _ in range(2):
            q = torch.softmax(torch.randn(2, vocab, generator=gen, dtype=torch.float64), dim=-1)  # [K, V]
            p = torch.softmax(torch.randn(3, vocab, generator=gen, dtype=torch.float64), dim=-1)  # [K+1, V]
            drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(2)]
            [result] = controller.step(
                [RoundInput(request_id, controller.coordinate_digest(request_id), drafts, q, p)]
            )
            assert result.status == "published"
        controller.close()
    return request_id


def test_the_blocker_really_refuses_z3() -> None:
    result = _without_z3(BLOCK_Z3 + "import z3\n")
    assert result.returncode != 0
    assert f"{ATTEMPT}: z3" in result.stderr and "ModuleNotFoundError" in result.stderr


def test_importing_the_package_and_its_public_names_does_not_import_z3() -> None:
    code = BLOCK_Z3 + (
        "import specround, specround.cli\n"
        "for name in specround.__all__:\n"
        "    getattr(specround, name)\n"
        "print('z3' in sys.modules, len(specround.__all__))\n"
    )
    result = _without_z3(code)
    assert result.returncode == 0, result.stderr
    assert ATTEMPT not in result.stderr
    loaded, names = result.stdout.split()
    assert loaded == "False" and int(names) > 0


def test_check_without_z3_refuses_and_says_how_to_install_it() -> None:
    result = _cli_without_z3("check", "--only", "oracle", "--random-fixtures", "1")
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert result.stdout == ""
    [line] = result.stderr.replace(f"{ATTEMPT}: z3\n", "").splitlines()
    assert line.startswith("error: specround check needs z3-solver")
    assert "pip install 'specround[check]'" in line


def test_check_help_needs_no_z3() -> None:
    result = _cli_without_z3("check", "--help")
    assert result.returncode == 0, result.stderr
    assert "--only" in result.stdout
    assert ATTEMPT not in result.stderr


@pytest.mark.parametrize("command", ["audit", "replay", "log"])
def test_read_commands_run_without_z3(tmp_path: Path, command: str) -> None:
    path = tmp_path / "run.sqlite"
    request_id = _small_log(path)
    args = [command, str(path)] + (["--request", request_id] if command == "log" else [])
    result = _cli_without_z3(*args)
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert ATTEMPT not in result.stderr
    assert result.stdout.strip()


@pytest.mark.real_model
def test_generate_runs_without_z3(tmp_path: Path) -> None:
    path = tmp_path / "generate.sqlite"
    result = _cli_without_z3(
        "generate", "one two three, one two three,", "--raw", "--temperature", "0", "--max-tokens", "8",
        "--k", "3", "--threads", "1", "--log", str(path), "--json",
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout, result.stderr)
    assert ATTEMPT not in result.stderr
    assert path.exists()
    audited = _cli_without_z3("audit", str(path))
    assert audited.returncode == 0, (audited.stdout, audited.stderr)
    assert ATTEMPT not in audited.stderr


def test_missing_extra_names_the_install_command() -> None:
    absent = Extra(name="check", module="specround_no_such_module", distribution="nothing", purpose="a test")
    message = missing_extra(absent)
    assert message is not None
    assert message.startswith("a test needs nothing") and "pip install 'specround[check]'" in message
    assert missing_extra(CHECK_EXTRA) is None  # the test environment installs the check extra
