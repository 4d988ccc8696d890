"""`specround bench sampler` at a tiny size: the JSON has the documented shape (no timing assertions)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from specround.bench.devices import bench_device
from specround.bench.sampler_bench import SamplerBenchReport, make_sampler_inputs, run_sampler_bench
from specround.cli import app
from specround.sampling.exact import decide

CASE_FIELDS = {
    "batch_size",
    "sampler_ms",
    "sampler_cold_ms",
    "sampler_full_ms",
    "minimum_pass_ms",
    "minimum_read_ms",
    "full_pass_ms",
    "full_read_ms",
    "sampler_over_minimum",
    "sampler_full_over_minimum",
    "sampler_over_minimum_read",
    "sampler_over_full_pass",
    "sampler_full_over_full_pass",
    "sampler_full_over_full_read",
    "minimum_over_full_pass",
    "minimum_read_bytes",
    "sampler_ops",
    "sampler_compute_ops",
    "sampler_full_ops",
    "sampler_compiled_ms",
    "compile_s",
    "mean_accepted",
    "terminal_counts",
}


def test_cli_prints_the_report_as_json() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "sampler",
            "--json",
            "--repeats",
            "2",
            "--warmup",
            "0",
            "--batch-sizes",
            "1,3",
            "--vocab",
            "300",
            "--threads",
            "1",
        ],
    )
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    report = SamplerBenchReport.model_validate(payload)
    assert report.benchmark == "sampler" and report.vocab == 300 and report.draft_len == 4
    assert report.torch_threads == 1
    assert [case.batch_size for case in report.cases] == [1, 3]
    for case in payload["cases"]:
        assert set(case) == CASE_FIELDS
        assert all(case[name] > 0 for name in CASE_FIELDS if name.endswith("_ms") and "compiled" not in name)
        assert case["sampler_compiled_ms"] is None and case["compile_s"] is None  # compilation is opt-in
        assert sum(case["terminal_counts"].values()) == case["batch_size"]
        assert set(case["terminal_counts"]) == {"correction", "bonus", "stop"}
    assert isinstance(payload["meets_target"], bool)
    assert set(payload["targets"]) == {"ops", "largest_b_ratio", "b1_ms"}
    assert payload["meets_target"] == all(payload["targets"].values())
    for case in payload["cases"]:
        # The fast path's op count does not grow with B; views are part of the count.
        assert 0 < case["sampler_compute_ops"] < case["sampler_ops"] <= 60
        assert case["sampler_full_ops"] > case["sampler_ops"]
        assert case["minimum_read_bytes"] == case["batch_size"] * (2 * 4 + 2 * 300) * 4


def test_cli_refuses_bad_batch_sizes() -> None:
    for bad in ("0", "a,b", ""):
        result = CliRunner().invoke(app, ["bench", "sampler", "--batch-sizes", bad, "--vocab", "64"])
        assert result.exit_code != 0


def test_inputs_are_seeded_and_valid() -> None:
    first = make_sampler_inputs(4, 3, 500, seed=5)
    second = make_sampler_inputs(4, 3, 500, seed=5)
    assert all(
        bool((getattr(first, name) == getattr(second, name)).all())
        for name in ("p", "q", "draft_ids", "seeds")
    )
    decide(first, validate="full")  # realistic inputs pass the strictest validation


def test_the_cold_sweep_must_read_something() -> None:
    with pytest.raises(ValueError, match="cold_sweep_mib"):
        run_sampler_bench([1], draft_len=1, vocab=64, repeats=1, warmup=0, cold_sweep_mib=0)
    report = run_sampler_bench([1], draft_len=1, vocab=64, repeats=1, warmup=0, cold_sweep_mib=1)
    assert report.cases[0].sampler_cold_ms > 0


def test_function_runs_without_drafts() -> None:
    report = run_sampler_bench([2], draft_len=0, vocab=64, repeats=1, warmup=0)
    assert report.cases[0].terminal_counts["bonus"] == 2


def test_device_names_are_checked_before_anything_is_timed() -> None:
    assert bench_device("cpu") == torch.device("cpu")
    for bad, reason in (("tpu", "unknown device"), ("not a device", "unknown device"), ("meta", "'cpu' or")):
        with pytest.raises(ValueError, match=reason):
            bench_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            bench_device("cuda")
        result = CliRunner().invoke(app, ["bench", "sampler", "--device", "cuda", "--vocab", "64"])
        assert result.exit_code != 0 and "no CUDA device" in result.output


def test_an_explicit_cpu_device_is_the_default_run() -> None:
    report = run_sampler_bench([2], draft_len=2, vocab=64, repeats=1, warmup=0, device="cpu")
    assert report.device == "cpu" and "b1_ms" not in report.targets  # B = 1 not measured here
    single = run_sampler_bench([1], draft_len=2, vocab=64, repeats=1, warmup=0, device="cpu")
    assert "b1_ms" in single.targets


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_bench_runs_on_cuda_with_the_cpu_decision() -> None:
    report = run_sampler_bench([1, 3], draft_len=3, vocab=500, repeats=2, warmup=1, device="cuda")
    assert report.device.startswith("cuda:0") and "b1_ms" not in report.targets  # the B = 1 target is CPU's
    cpu = run_sampler_bench([1, 3], draft_len=3, vocab=500, repeats=1, warmup=0, device="cpu")
    for on_gpu, on_cpu in zip(report.cases, cpu.cases, strict=True):
        # The same seeded inputs decide the same way on either device.
        assert on_gpu.terminal_counts == on_cpu.terminal_counts
        # The mean of the same accepted counts, reduced on either device (float64, a few ulp apart).
        assert on_gpu.mean_accepted == pytest.approx(on_cpu.mean_accepted, rel=1e-12)
        assert on_gpu.sampler_ms > 0 and on_gpu.sampler_ops > 0
