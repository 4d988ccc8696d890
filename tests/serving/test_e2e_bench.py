"""``specround bench e2e`` in miniature (lives beside the serving tests it exercises): the report's shape,
paired ratios, targets and the audited log; and prompt-class loading."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specround.bench.e2e import (
    AA_CASE,
    PIPELINED_CASE,
    E2EReport,
    default_prompts_dir,
    load_prompt_classes,
    run_e2e_bench,
)
from specround.errors import InvalidRequestError


def test_prompt_classes_load_from_the_checkout() -> None:
    classes = load_prompt_classes(default_prompts_dir(), ["copy", "code", "prose"])
    assert all(len(prompts) >= 2 for prompts in classes.values())
    with pytest.raises(InvalidRequestError):
        load_prompt_classes(default_prompts_dir(), ["poetry"])


def tiny_run(tmp_path: Path, prompts: str, temperature: float, *, pipelined: bool = False) -> E2EReport:
    """A one-repetition, six-token run of the copy class on ``prompts``, n-gram K = 2, no transformers."""
    (tmp_path / "copy.txt").write_text(prompts)
    return run_e2e_bench(
        classes=["copy"],
        temperatures=[temperature],
        drafts=["ngram"],
        k=2,
        max_tokens=6,
        repeats=1,
        skip_hf=True,
        prompts_dir=tmp_path,
        threads=1,
        pipelined=pipelined,
    )


@pytest.mark.real_model
def test_a_tiny_run_reports_every_case(tmp_path: Path) -> None:
    report = tiny_run(tmp_path, "Copy exactly: one two three four five.\n---\nSay: red green blue.\n", 0.0)
    cases = [r.case for r in report.results]
    assert cases == ["specround plain", AA_CASE, "specround ngram K=2", "specround ngram K=auto"]
    plain, control, fixed, auto = report.results
    assert plain.vs_plain == pytest.approx(1.0) and plain.samples == 2
    assert control.samples == 2 and control.vs_plain is not None and control.vs_plain > 0  # the A/A noise
    assert all(AA_CASE not in t.name for t in report.targets)
    assert fixed.proposed is not None and fixed.predicted_s_per_token is not None
    assert fixed.logged_s_per_token is not None and fixed.wall_s_per_token is not None
    assert fixed.logged_s_per_token <= fixed.wall_s_per_token  # prefill is outside the round ledger
    assert auto.vs_transformers is None  # no transformers counterpart for K = auto
    assert report.log_audited_clean is True
    names = [t.name for t in report.targets]
    assert any("K=auto / plain decode" in n for n in names)
    assert any(n.startswith("best specround case") for n in names)
    assert report.all_targets_met == all(t.met for t in report.targets)


@pytest.mark.real_model
def test_the_pipelined_cases_generate_the_same_tokens(tmp_path: Path) -> None:
    report = tiny_run(tmp_path, "Copy exactly: one two three four five.\n", 0.7, pipelined=True)
    by_case = {r.case: r for r in report.results}
    assert PIPELINED_CASE in by_case and "specround ngram K=auto pipelined" in by_case
    plain, piped = by_case["specround plain"], by_case[PIPELINED_CASE]
    assert piped.samples == plain.samples == 1 and piped.vs_plain is not None and piped.vs_plain > 0
    assert piped.generated_tokens == plain.generated_tokens  # the same seeded draws, the same tokens
    assert report.log_audited_clean is True


def test_the_transformers_bench_takes_its_batch_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--batch-sizes`` reaches the transformers bench; bad values and the wrong engine are refused."""
    from typer.testing import CliRunner

    from specround.bench import hf_e2e
    from specround.cli import app

    seen: dict[str, Any] = {}

    def fake_bench(**kwargs: Any) -> hf_e2e.HfBenchReport:
        seen.update(kwargs)
        return hf_e2e.HfBenchReport(k=kwargs["k"], max_tokens=1, repeats=1, threads=1, cases=(), ratios=())

    monkeypatch.setattr(hf_e2e, "run_hf_e2e_bench", fake_bench)
    runner = CliRunner()
    ran = runner.invoke(app, ["bench", "e2e", "--engine", "transformers", "--batch-sizes", "1, 2"])
    assert ran.exit_code == 0, ran.output
    assert seen["batches"] == [1, 2] and json.loads(ran.stdout)["k"] == 4
    seen.clear()
    assert runner.invoke(app, ["bench", "e2e", "--engine", "transformers"]).exit_code == 0
    assert seen["batches"] == [1, 4]  # the default
    for bad in ("0", "1,x", ""):
        seen.clear()
        refused = runner.invoke(app, ["bench", "e2e", "--engine", "transformers", "--batch-sizes", bad])
        assert refused.exit_code == 2 and "--batch-sizes" in refused.output and not seen, bad
    wrong = runner.invoke(app, ["bench", "e2e", "--batch-sizes", "1"])
    words = " ".join(wrong.output.replace("│", " ").split())  # the error box wraps its lines
    assert wrong.exit_code == 2 and "apply to --engine transformers only" in words
