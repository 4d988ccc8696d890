"""`specround check`: parts, exit status, JSON; a failing row or a surviving mutation exits non-zero."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

import specround.model_check.mutants as mutants
from specround.audit.pipelined_faults import PIPELINED_CELLS
from specround.cli import app
from specround.model_check import check_suite as report_module
from specround.model_check import enumeration
from specround.model_check.check_results import CheckResult
from specround.model_check.check_suite import PARTS, CheckOptions, CheckReport, run_checks
from specround.model_check.mutants import Mutation, Seam, mutation_named
from specround.sampling.exact import decide_from_uniforms

FIXTURE_PARTS = "oracle,monte_carlo,ledger"


def _check(*args: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["check", *args])
    payload = json.loads(result.stdout) if "--json" in args and result.exit_code in (0, 1) else {}
    return result.exit_code, payload, result.output


def test_small_check_passes_with_json() -> None:
    code, payload, output = _check(
        "--only",
        FIXTURE_PARTS,
        "--random-fixtures",
        "8",
        "--mc-samples",
        "3000",
        "--mc-random-fixtures",
        "1",
        "--json",
    )
    assert code == 0, output
    assert payload["passed"] is True
    assert payload["failed"] == 0
    assert payload["parts"] == ["oracle", "monte_carlo", "ledger"]
    names = {row["check"] for row in payload["results"]}
    assert "speculative joint = target joint" in names
    assert "Monte Carlo chi-square vs target joint" in names
    assert "contract#worked-round: E[K] = 1.96" in names
    assert "the oracle rejects it" in names  # the oracle's decision smoke tests
    assert "interior optimum found when one exists" in names
    assert payload["proofs"] == [] and payload["mutation_lab"] is None and payload["mutation_score"] is None
    assert len(payload["coverage"]) == 20  # INV-1..INV-10, F-1..F-6, the four pipelined cells


def test_report_groups_random_fixtures() -> None:
    report = run_checks(
        CheckOptions(random_fixtures=6, mc_samples=0, mutations=False, parts=frozenset({"oracle"}))
    )
    rows = [r for r in report.results if r.fixture == "random fixtures (6)"]
    joint = next(r for r in rows if r.check == "speculative joint = target joint")
    assert joint.passed
    assert joint.detail.startswith("6/6")


def test_only_selects_parts_and_coverage_is_always_built() -> None:
    code, payload, output = _check("--only", "ledger", "--json")
    assert code == 0, output
    fixtures = {row["fixture"] for row in payload["results"]}
    assert "coverage" in fixtures
    assert not any(str(f).startswith(("random fixtures", "mutation", "z3", "conformance")) for f in fixtures)
    assert payload["seconds"].keys() >= {"ledger"}
    coverage = {row["item"]: row for row in payload["coverage"]}
    assert all(coverage[item]["proofs"] for item in coverage)  # from the registry, without solving
    assert coverage["F-6"]["proofs_ok"] is None
    for cell in PIPELINED_CELLS:
        assert any(".pipelined." in proof for proof in coverage[cell]["proofs"]), cell  # z3-covered
        assert any("test_z3_pipelined.py::" in test for test in coverage[cell]["tests"]), cell


@pytest.mark.parametrize(
    "args",
    [("--only", "oracle,nonsense"), ("--lab-mutation", "no such mutation"), ("--lab-check", "nonsense")],
)
def test_bad_selections_are_refused(args: tuple[str, ...]) -> None:
    code, _, output = _check(*args)
    assert code == 2, output


def test_failing_report_exits_non_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(options: CheckOptions, progress: object = None) -> CheckReport:
        return CheckReport(results=[CheckResult("f", "c", False, 1.0, 0.0)], options=options)

    monkeypatch.setattr(report_module, "run_checks", broken)
    result = CliRunner().invoke(app, ["check", "--random-fixtures", "0"])
    assert result.exit_code == 1
    assert "FAIL" in result.stdout


def test_conformance_part() -> None:
    code, payload, output = _check("--only", "conformance", "--walk-rules", "15", "--json")
    assert code == 0, output
    conformance = payload["conformance"]
    assert isinstance(conformance, dict)
    assert conformance["pairs"] == conformance["conforming"] > 0
    assert conformance["nonconforming"] == [] and conformance["violations"] == []
    assert len(conformance["witness_kinds"]) == 20
    assert "pipelined" in conformance["walk_rules"]
    evidence = {row["item"]: row["conformance"] for row in payload["coverage"]}
    pipelined = [item for item, found in evidence.items() if any("walk pipelined rule" in e for e in found)]
    assert pipelined == ["INV-5", "INV-6", "INV-7", "F-5"]  # what the pipelined rule checks


def test_the_lab_part_passes_with_a_killed_mutation() -> None:
    code, payload, output = _check(
        "--only", "mutations", "--lab-mutation", "correction from p", "--lab-check", "enumeration", "--json"
    )
    assert code == 0, output
    assert payload["mutation_score"] == 1.0
    lab = payload["mutation_lab"]
    assert isinstance(lab, dict)
    assert [m["verdict"] for m in lab["mutations"]] == ["killed"]


def test_a_surviving_mutation_makes_check_exit_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deliberately harmless "mutation" (it changes nothing) survives; the command must fail."""
    harmless = Mutation(
        "harmless",
        "test",
        "replaces the oracle's decision function with itself",
        ("INV-10",),
        (Seam(enumeration, decide_from_uniforms, lambda original, _scratch: original),),
    )
    monkeypatch.setattr(mutants, "MUTATIONS", (mutation_named("bonus from q"), harmless))
    code, payload, _ = _check("--only", "mutations", "--lab-check", "enumeration", "--json")
    assert code == 1
    assert payload["passed"] is False and payload["mutation_score"] == 0.5
    lab = payload["mutation_lab"]
    assert isinstance(lab, dict)
    verdicts = {m["name"]: (m["verdict"], m["active"]) for m in lab["mutations"]}
    assert verdicts == {"bonus from q": ("killed", True), "harmless": ("survived", False)}
    failing = [r["fixture"] for r in payload["results"] if not r["passed"]]
    assert "mutation lab: harmless" in failing and "mutation lab" in failing


def test_rendered_report_shows_the_tables() -> None:
    result = CliRunner().invoke(
        app, ["check", "--only", "mutations", "--lab-mutation", "bonus from q", "--lab-check", "enumeration"]
    )
    assert result.exit_code == 0, result.output
    assert "mutation lab: 1/1 killed" in result.stdout
    assert "coverage of INV-n and F-n" in result.stdout
    assert "mutation score 100%" in result.stdout


@pytest.mark.slow
def test_full_check_passes_with_every_part() -> None:
    """The whole default `specround check --json`: every proof, pair and mutation (about two minutes)."""
    code, payload, output = _check("--json")
    assert code == 0, output[-2000:]
    assert payload["passed"] is True and payload["parts"] == list(PARTS)
    assert payload["mutation_score"] == 1.0
    proofs = payload["proofs"]
    assert isinstance(proofs, list) and proofs and all(p["ok"] for p in proofs)
    assert all(isinstance(p["wall_s"], float) for p in proofs)  # the time of each proof is reported
    lab = payload["mutation_lab"]
    assert isinstance(lab, dict) and lab["killed"] == lab["total"] == len(mutants.MUTATIONS)
    assert all(row["covered"] for row in payload["coverage"])
