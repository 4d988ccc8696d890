"""The other ways in: transformers' ``custom_generate`` and ``specround generate --engine transformers``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specround.adapters.memory_log import MemoryEventLog
from specround.cli import app
from specround.hf import custom_generate_dir
from tests.hf._models import tiny_llama


def test_model_generate_with_custom_generate_runs_specround() -> None:
    model = tiny_llama(0)
    ids = torch.tensor([[3, 4, 7, 9]])
    reference = model.generate(ids, max_new_tokens=8, do_sample=False)
    log = MemoryEventLog()
    out = model.generate(
        ids,
        max_new_tokens=8,
        do_sample=False,
        custom_generate=custom_generate_dir(),
        trust_remote_code=True,
        log=log,
        prompt_lookup_num_tokens=2,
    )
    assert torch.equal(out, reference)
    [request_id] = log.request_ids()
    assert log.head(request_id) is not None


@pytest.mark.real_model
def test_the_cli_runs_a_transformers_directory(tmp_path: Path) -> None:
    from specround.adapters.llama import default_gguf_path

    transformers = pytest.importorskip("transformers")
    gguf = default_gguf_path()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = tiny_llama(0, vocab=len(tokenizer), eos=int(tokenizer.eos_token_id))
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    log = tmp_path / "run.sqlite"
    result = CliRunner().invoke(
        app,
        [
            *("generate", "Hello", "--model", str(tmp_path / "tiny"), "--draft", "model:bf16", "--k", "2"),
            *("--temperature", "0", "--max-tokens", "6", "--log", str(log), "--json"),
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["engine"] == "transformers" and report["generated_tokens"] >= 1
    audit = CliRunner().invoke(app, ["audit", str(log), "--json"])
    assert audit.exit_code == 0 and json.loads(audit.stdout)["ok"] is True
