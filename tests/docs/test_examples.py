"""Every example in README.md and specs/*.md runs.

Collected fenced blocks:

* ```` ```python ```` blocks are executed, each in a fresh namespace, with the repository root as the
  working directory (a block may read ``specs/...``; it writes only to temporary directories).
* ```` ```sh test ```` blocks (opt-in: ``sh`` blocks are often setup instructions such as ``make test``) run
  each ``specround ...`` line through the CLI in-process and require exit status 0.

The collection is by file and line, so a new example in README.md is picked up without touching this test.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```", re.S | re.M)


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "specs").glob("*.md"))]


def blocks(kind: str) -> list[tuple[str, str]]:
    found = []
    for path in documents():
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            info = match.group(1).strip().split()
            if info[:1] == [kind.split()[0]] and all(word in info for word in kind.split()[1:]):
                line = text.count("\n", 0, match.start()) + 1
                found.append((f"{path.relative_to(ROOT)}:{line}", match.group(2)))
    return found


PYTHON = blocks("python")
SHELL = blocks("sh test")


def test_the_specs_have_examples() -> None:
    assert len([name for name, _ in PYTHON if name.startswith("specs/")]) >= 4


@pytest.mark.parametrize(("where", "code"), PYTHON, ids=[name for name, _ in PYTHON])
def test_python_example_runs(where: str, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    namespace: dict[str, object] = {"__name__": f"example:{where}"}
    exec(compile(code, where, "exec"), namespace)


@pytest.mark.parametrize(
    ("where", "code"), SHELL or [("none", "")], ids=[name for name, _ in SHELL] or ["none"]
)
def test_shell_example_runs(where: str, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if where == "none":
        pytest.skip("no ```sh test block in README.md or specs/")
    from specround.cli import app

    monkeypatch.chdir(ROOT)
    runner = CliRunner()
    for line in code.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        argv = shlex.split(line)
        assert argv[0] == "specround", f"{where}: only specround commands run here: {line!r}"
        result = runner.invoke(app, argv[1:])
        assert result.exit_code == 0, f"{where}: {line!r} exited {result.exit_code}\n{result.output}"
