"""`specround check`: exit status, JSON report, and a failing report exits non-zero."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specround.cli import app
from specround.model_check import report as report_module
from specround.model_check.report import CheckOptions, CheckReport, run_checks
from specround.model_check.results import CheckResult


def test_small_check_passes_with_json() -> None:
    runner = CliRunner()
    result = runner.invoke(
        app,
        ["check", "--random-fixtures", "8", "--mc-samples", "3000", "--mc-random-fixtures", "1", "--json"],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["passed"] is True
    assert payload["failed"] == 0
    names = {row["check"] for row in payload["results"]}
    assert "speculative joint = target joint" in names
    assert "Monte Carlo chi-square vs target joint" in names
    assert "003 E[K] = 1.96" in names
    assert "the oracle rejects it" in names  # mutation rows
    assert "interior optimum found when one exists" in names


def test_report_groups_random_fixtures() -> None:
    report = run_checks(CheckOptions(random_fixtures=6, mc_samples=0, mutations=False))
    rows = [r for r in report.results if r.fixture == "random fixtures (6)"]
    joint = next(r for r in rows if r.check == "speculative joint = target joint")
    assert joint.passed
    assert joint.detail.startswith("6/6")


def test_failing_report_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(options: CheckOptions, progress: object = None) -> CheckReport:
        return CheckReport(results=[CheckResult("f", "c", False, 1.0, 0.0)], options=options)

    monkeypatch.setattr(report_module, "run_checks", broken)
    result = CliRunner().invoke(app, ["check", "--random-fixtures", "0"])
    assert result.exit_code == 1
    assert "FAIL" in result.stdout
