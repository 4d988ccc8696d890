"""``specround conform transformers`` on a tiny random Llama saved with ``save_pretrained`` (offline).

Small N (60 samples of H = 2 tokens, 4 traced requests): these tests check the command's wiring, table,
JSON, exit statuses and errors, not transformers' law (``test_hf_engine`` and real CLI runs do that).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specround.cli import app
from tests.testing.hf_models import tiny_hf_pair

pytest.importorskip("transformers")

runner = CliRunner()
SMALL = ["--samples", "60", "--horizon", "2", "--trace", "4", "--prompt-ids", "1,2,3,1,2"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    target, assistant = tiny_hf_pair()
    root = tmp_path_factory.mktemp("hf")
    target.save_pretrained(root / "target")
    assistant.save_pretrained(root / "assistant")
    return root / "target", root / "assistant"


def conform(*args: str) -> Any:
    return runner.invoke(app, ["conform", "transformers", *args])


def test_assistant_run_prints_a_json_report(saved: tuple[Path, Path]) -> None:
    target, assistant = saved
    result = conform(
        "--model", str(target), "--assistant", str(assistant), "--temperature", "0.8", *SMALL, "--json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is True and report["samples"] == 60
    checks = {r["check"]: r for r in report["results"]}
    assert {"law", "stop", "q-sampled", "decisions", "processor-state"} <= set(checks)
    assert 0.0 <= checks["law"]["tv_low"] <= checks["law"]["tv"] <= checks["law"]["tv_high"] <= 1.0
    assert "samples" in result.stderr  # progress goes to stderr


def test_prompt_lookup_run_prints_the_verdict_table(saved: tuple[Path, Path]) -> None:
    target, _ = saved
    result = conform("--model", str(target), "--prompt-lookup", "3", "--top-k", "5", *SMALL)
    assert result.exit_code == 0, result.stderr
    for word in ("check", "p-value", "TV [CI]", "verdict", "law", "decisions", "PASS"):
        assert word in result.stdout


def test_a_failed_check_exits_with_status_one(
    saved: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from specround.testing.hf_engine import TransformersEngine

    honest = TransformersEngine.generate

    def always_first(self: TransformersEngine, requests: Any) -> list[tuple[int, ...]]:
        outputs = honest(self, requests)
        return [outputs[0] for _ in outputs]  # every request gets the first one's tokens

    monkeypatch.setattr(TransformersEngine, "generate", always_first)
    target, _ = saved
    result = conform("--model", str(target), "--prompt-lookup", "2", *SMALL, "--json")
    assert result.exit_code == 1, result.stderr
    assert "law" in json.loads(result.stdout)["failed"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--prompt-lookup", "2", "--assistant", "ASSISTANT"],
            "exactly one of --assistant and --prompt-lookup",
        ),
        (["--prompt-ids", "1,99"], "prompt ids must lie in [0, 8)"),
        (["--prompt-ids", "1,x"], "not a comma-separated list"),
        (["--temperature", "0"], "temperature must be a finite number > 0"),
    ],
)
def test_bad_input_is_one_line_on_stderr(saved: tuple[Path, Path], args: list[str], message: str) -> None:
    target, assistant = saved
    filled = [str(assistant) if a == "ASSISTANT" else a for a in args]
    base = ["--model", str(target), "--samples", "5"]
    if "--assistant" not in filled and "--prompt-lookup" not in filled:
        base += ["--prompt-lookup", "2"]
    if "--prompt-ids" not in filled:
        base += ["--prompt-ids", "1,2"]
    result = conform(*base, *filled)
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


def test_a_missing_model_is_a_one_line_error(tmp_path: Path) -> None:
    result = conform("--model", str(tmp_path / "nothing"), "--prompt-lookup", "2", "--prompt-ids", "1,2")
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot load a causal LM"), result.stderr
