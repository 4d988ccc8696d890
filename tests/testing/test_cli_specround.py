"""``specround conform specround`` (both engines) and ``--json-out``, on tiny models at small N.

The compact Llama is the seeded vocabulary-8 model (``load_llama`` replaced by ``tiny_llama``); the drop-in
runs on the tiny random transformers pair. These check the command's wiring and that specround's engines
pass with their ``audit`` row, not the law at power (``test_specround_engine`` and real runs do that).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from specround.adapters.llama import LlamaBundle, tiny_llama
from specround.cli import app
from tests.testing.hf_models import tiny_hf_pair

runner = CliRunner()
SMALL = ["--samples", "60", "--horizon", "2", "--prompt-ids", "1,2,3,1,2", "--top-k", "5"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    pytest.importorskip("transformers")
    target, assistant = tiny_hf_pair()
    root = tmp_path_factory.mktemp("hf")
    target.save_pretrained(root / "target")
    assistant.save_pretrained(root / "assistant")
    return root / "target", root / "assistant"


@pytest.fixture
def tiny_gguf(monkeypatch: pytest.MonkeyPatch) -> None:
    def load(path: Any = None, **kwargs: Any) -> LlamaBundle:
        return tiny_llama(seed=0)

    monkeypatch.setattr("specround.adapters.llama.load_llama", load)


def conform(*args: str) -> Any:
    return runner.invoke(app, ["conform", *args])


def test_the_drop_in_with_an_assistant_passes_and_writes_the_json_file(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    target, assistant = saved
    out = tmp_path / "report.json"
    args = ["specround", "--engine", "hf", "--model", str(target), "--assistant", str(assistant)]
    result = conform(*args, *SMALL, "--json-out", str(out))
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "law" in result.stdout and "audit" in result.stdout  # the table is still printed
    report = json.loads(out.read_text())
    assert report["engine"] == "specround.hf:assistant" and report["passed"] is True
    checks = {r["check"]: r for r in report["results"]}
    assert checks["audit"]["passed"] and checks["audit"]["checked"] == 60
    assert checks["law"]["detectable_tv"] > 0


def test_the_drop_in_with_prompt_lookup_passes(saved: tuple[Path, Path]) -> None:
    target, _ = saved
    result = conform(
        "specround", "--engine", "hf", "--model", str(target), "--prompt-lookup", "2", *SMALL, "--json"
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["engine"] == "specround.hf:prompt-lookup:2" and report["passed"] is True


@pytest.mark.parametrize("draft", [["--assistant", "bf16"], ["--prompt-lookup", "2"]])
def test_the_compact_llama_passes_with_its_audit(tiny_gguf: None, draft: list[str]) -> None:
    result = conform("specround", *draft, *SMALL, "--eos-token-id", "7", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["engine"].startswith("specround:llama:") and report["passed"] is True
    assert {"law", "stop", "seed-reproducible", "batch-invariance", "audit"} <= {
        r["check"] for r in report["results"]
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--assistant", "/some/dir"], "takes --assistant bf16 or fp16"),
        (["--assistant", "bf16", "--prompt-lookup", "2"], "exactly one of --assistant and --prompt-lookup"),
        (["--prompt-lookup", "2", "--engine", "vllm"], "--engine must be llama or hf"),
        (["--prompt-lookup", "2", "--engine", "hf"], "--engine hf needs --model"),
    ],
)
def test_bad_input_exits_with_status_two(tiny_gguf: None, args: list[str], message: str) -> None:
    result = conform("specround", *args, "--prompt-ids", "1,2", "--samples", "5")
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


def test_the_transformers_command_writes_the_json_file(saved: tuple[Path, Path], tmp_path: Path) -> None:
    target, _ = saved
    out = tmp_path / "t.json"
    result = conform(
        "transformers",
        "--model",
        str(target),
        "--prompt-lookup",
        "2",
        *SMALL,
        "--trace",
        "2",
        "--json-out",
        str(out),
    )
    assert result.exit_code == 0, result.stderr
    assert "verdict" in result.stdout
    assert json.loads(out.read_text())["engine"] == "transformers:prompt-lookup:2"
