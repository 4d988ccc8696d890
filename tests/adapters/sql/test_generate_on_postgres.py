"""``specround generate --log <URL>`` writes its rounds to a PostgreSQL log that audits clean."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specround.cli import app

runner = CliRunner()


@pytest.mark.real_model
@pytest.mark.postgres
def test_generate_logs_to_postgres_and_audits_clean(postgres_url: str) -> None:
    args = ["generate", "Count: one two three.", "--temperature", "0", "--max-tokens", "8", "--k", "2"]
    result = runner.invoke(app, [*args, "--threads", "1", "--log", postgres_url, "--json"])
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["log"].startswith("postgresql+psycopg://")
    assert 1 <= report["generated_tokens"] <= 8
    audited = runner.invoke(app, ["audit", postgres_url, "--json"])
    assert audited.exit_code == 0, audited.stdout
    verdict = json.loads(audited.stdout)
    assert verdict["ok"] is True


def test_generate_refuses_an_unsupported_log_url() -> None:
    result = runner.invoke(app, ["generate", "hi", "--log", "mysql://user@host/db"])
    assert result.exit_code == 2, result.output
    assert "unsupported database 'mysql'" in result.stderr
