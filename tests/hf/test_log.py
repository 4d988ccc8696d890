"""A transformers run's log audits clean with ``specround audit``, and tampering with it is caught."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import torch
from typer.testing import CliRunner

from specround.cli import app
from specround.hf import SpecroundGenerateOutput, generate
from tests.hf._models import tiny_llama

runner = CliRunner()


def _run(path: Path) -> SpecroundGenerateOutput:
    ids = torch.tensor([[0, 0, 3, 4, 7, 9], [11, 12, 13, 14, 15, 16]])
    out = generate(
        tiny_llama(0),
        ids,
        attention_mask=(ids != 0).long(),
        assistant_model=tiny_llama(1),
        k=2,
        log=str(path),
        seed=3,
        max_new_tokens=6,
        do_sample=True,
        temperature=0.9,
        repetition_penalty=1.1,
        no_repeat_ngram_size=3,
        eos_token_id=None,
        return_dict_in_generate=True,
    )
    assert isinstance(out, SpecroundGenerateOutput)
    return out


def _audit(path: Path) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["audit", str(path), "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_the_log_audits_clean_and_tampering_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "run.sqlite"
    out = _run(path)
    assert out.log == str(path)
    code, report = _audit(path)
    rounds = sum(len(r) for r in out.rounds)
    assert code == 0 and report["ok"] is True and report["rounds"] == rounds
    connection = sqlite3.connect(path)
    with connection:  # one bit of the last byte of every round body of the second request
        where = "request_no = (SELECT request_no FROM requests WHERE request_id = ?)"
        rows = connection.execute(
            f"SELECT generation, body FROM rounds WHERE {where}", (out.request_ids[1],)
        ).fetchall()
        for generation, body in rows:
            edited = bytes(body[:-1]) + bytes([body[-1] ^ 1])
            connection.execute(
                f"UPDATE rounds SET body = ? WHERE {where} AND generation = ?",
                (edited, out.request_ids[1], generation),
            )
    connection.close()
    code, report = _audit(path)
    assert code == 1 and report["ok"] is False
    findings = report["findings"]
    assert isinstance(findings, list) and findings
    assert {f["request_id"] for f in findings} == {out.request_ids[1]}


def test_the_default_log_is_written_where_specround_generate_writes(
    tmp_path: Path, monkeypatch: object
) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.chdir(tmp_path)
    out = generate(tiny_llama(0), torch.tensor([[3, 4, 7]]), max_new_tokens=2, return_dict_in_generate=True)
    assert isinstance(out, SpecroundGenerateOutput)
    [written] = list((tmp_path / "specround-logs").glob("generate-*.sqlite"))
    assert out.log == str(Path("specround-logs") / written.name)
    code, report = _audit(written)
    assert code == 0 and report["ok"] is True
