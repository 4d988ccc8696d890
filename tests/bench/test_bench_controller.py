"""``specround bench controller`` runs end to end and reports consistent numbers (no timed assertions)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from typer.testing import CliRunner

from specround import MemoryEventLog, RoundController
from specround.bench.controller_bench import (
    CONTROLLER_TARGET_US,
    LOG_BYTES_TARGET,
    REPLAY_TARGET_EVENTS_PER_S,
    ControllerBenchReport,
    _format_floor,
    _TimedLog,
    run_controller_bench,
)
from specround.canonical import canonical_bytes
from specround.cli import app


def _check(report: ControllerBenchReport, backends: set[str], sizes: tuple[int, ...], rounds: int) -> None:
    assert {(c.backend, c.batch_size) for c in report.cases} == {(b, s) for b in backends for s in sizes}
    for case in report.cases:
        assert case.rounds_per_repetition == (rounds // case.batch_size) * case.batch_size
        assert case.us_per_round > 0 and case.cpu_us_per_round > 0
        assert 0 < case.publish_us_per_round < case.us_per_round
        assert case.controller_us_per_round == pytest.approx(case.us_per_round - case.publish_us_per_round)
        assert 1 <= case.mean_emitted <= report.draft_len + 1  # min(A + 1, H) tokens per round (INV-2)
        assert case.gc_us_per_round >= 0 and case.gc_longest_ms >= 0  # the collector's pauses, if any
        if case.backend == "memory":
            assert case.over_memory == 1.0
    assert report.target_us_per_round == CONTROLLER_TARGET_US
    floor = report.format_floor  # timed over the memory log's last step at the largest B: B rounds
    assert floor is not None and floor.rounds == max(sizes)
    assert floor.canonical_us_per_round > 0 and floor.chain_us_per_round > 0
    assert floor.us_per_round == pytest.approx(floor.canonical_us_per_round + floor.chain_us_per_round)
    assert report.replay_target_events_per_s == REPLAY_TARGET_EVENTS_PER_S
    largest = max(sizes)
    sqlite = next(c for c in report.cases if c.backend == "sqlite" and c.batch_size == largest)
    assert report.meets_target == (sqlite.us_per_round <= CONTROLLER_TARGET_US)
    assert {r.backend for r in report.replay} == backends - {"memory"}
    expected = {(backend, size) for backend in ("sqlite", "postgresql") for size in {1, largest} & set(sizes)}
    assert {(r.backend, r.batch_size) for r in report.replay} == {e for e in expected if e[0] in backends}
    for replay in report.replay:
        assert replay.events > replay.requests >= replay.batch_size
        assert replay.stream_events_per_s > 0 and replay.replay_events_per_s > 0
        assert replay.audit_events_per_s > 0
        assert replay.rounds == (replay.events - replay.requests) // 5
        assert replay.bytes_per_round > 0
        # the parts that grow with rounds and with requests: all of PostgreSQL's size, SQLite's but its schema
        assert replay.round_bytes_per_round is not None and replay.request_bytes_per_request is not None
        parts = (
            replay.round_bytes_per_round * replay.rounds + replay.request_bytes_per_request * replay.requests
        )
        whole = replay.bytes_per_round * replay.rounds
        assert replay.round_bytes_per_round > 0 and replay.request_bytes_per_request > 0
        assert parts == pytest.approx(whole) if replay.backend == "postgresql" else 0 < parts < whole


def test_controller_bench_on_memory_and_sqlite() -> None:
    report = run_controller_bench((1, 4), rounds_per_repetition=8, repeats=2, warmup=1, vocab=16)
    _check(report, {"memory", "sqlite"}, (1, 4), 8)
    replays = {r.batch_size: r for r in report.replay}
    # every request of the B=4 log: its opening event plus 5 events per round it published
    rounds = (1 + 2) * 8
    assert (replays[4].requests, replays[4].events) == (4, 4 + 5 * rounds)
    assert (replays[1].requests, replays[1].events) == (1, 1 + 5 * rounds)  # B=1: one long request


def test_format_floor_serialises_the_events_the_log_stores() -> None:
    """The floor times the very bytes the log hashes: as many as the stored events' canonical form holds."""
    log = _TimedLog(MemoryEventLog())
    controller = RoundController(log)
    ids = [
        controller.open_request([1, 2], seed=b, max_new_tokens=64, vocab_size=8).request_id for b in range(3)
    ]
    gen = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(3, 2, 8, generator=gen, dtype=torch.float64), dim=-1)
    p = torch.softmax(torch.randn(3, 3, 8, generator=gen, dtype=torch.float64), dim=-1)
    drafts = torch.multinomial(q.reshape(6, 8), 1, generator=gen).reshape(3, 2)
    controller.step_batch(ids, drafts, torch.tensor([2, 1, 0]), q, p)
    floor = _format_floor(log.last, repeats=1)
    stored = [event for event in log.events() if event.kind != "request_opened"]
    assert floor.rounds == 3 and len(stored) == 15 and floor.us_per_round > 0
    assert floor.canonical_bytes_per_round == sum(len(canonical_bytes(e.payload)) for e in stored) / 3


@pytest.mark.postgres
def test_controller_bench_on_postgres() -> None:
    url = os.environ.get("SPECROUND_TEST_POSTGRES_URL")
    if not url:
        if os.environ.get("SPECROUND_REQUIRE_POSTGRES") == "1":
            pytest.fail("SPECROUND_TEST_POSTGRES_URL is required")
        pytest.skip("SPECROUND_TEST_POSTGRES_URL is not set")
    report = run_controller_bench(
        (2,), postgres_url=url, rounds_per_repetition=4, repeats=1, warmup=0, vocab=16
    )
    _check(report, {"memory", "sqlite", "postgresql"}, (2,), 4)


def test_bench_controller_command_prints_json() -> None:
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "controller",
            "--batch-sizes",
            "2",
            "--rounds",
            "2",
            "--repeats",
            "1",
            "--warmup",
            "0",
            "--forward-ms",
            "0",
        ],
        env={"SPECROUND_BENCH_POSTGRES_URL": None},
    )
    assert result.exit_code == 0, result.output
    report = ControllerBenchReport.model_validate(json.loads(result.stdout))
    assert report.benchmark == "controller"
    assert [(c.backend, c.api, c.batch_size) for c in report.cases] == [
        (backend, api, 2) for backend in ("memory", "sqlite") for api in ("batch", "pipelined")
    ]
    bad = CliRunner().invoke(app, ["bench", "controller", "--batch-sizes", "x"])
    assert bad.exit_code != 0


def test_controller_bench_freezes_the_start_up_heap_unless_told_not_to() -> None:
    import gc

    assert gc.get_freeze_count() == 0
    report = run_controller_bench((2,), rounds_per_repetition=2, repeats=1, warmup=0, vocab=16)
    assert report.gc_frozen
    _check(report, {"memory", "sqlite"}, (2,), 2)
    assert gc.get_freeze_count() == 0  # unfrozen again afterwards
    result = CliRunner().invoke(
        app,
        ["bench", "controller", "--batch-sizes", "2", "--rounds", "2", "--repeats", "1", "--no-gc-freeze"],
        env={"SPECROUND_BENCH_POSTGRES_URL": None},
    )
    assert result.exit_code == 0, result.output
    assert not ControllerBenchReport.model_validate(json.loads(result.stdout)).gc_frozen


def test_controller_bench_runs_both_step_apis_and_judges_its_targets() -> None:
    report = run_controller_bench(
        (1, 4), rounds_per_repetition=8, repeats=1, warmup=0, vocab=16, apis=("batch", "rounds")
    )
    assert {(c.api, c.batch_size) for c in report.cases if c.backend == "memory"} == {
        ("batch", 1),
        ("batch", 4),
        ("rounds", 1),
        ("rounds", 4),
    }
    for case in report.cases:
        assert case.critical_us_per_round == case.us_per_round
        assert case.durable_us_per_round == case.publish_us_per_round
    # at these sizes only the B = 1 step and the replay and size targets are measurable
    logs = [f"sqlite B={r.batch_size} log" for r in report.replay]
    assert sorted(logs) == ["sqlite B=1 log", "sqlite B=4 log"]
    assert [v.target for v in report.verdicts] == ["memory B=1 us/step (sampler included)"] + [
        f"{log}: {what}"
        for log in logs
        for what in ("replay events/s", "audit events/s", "bytes per round on disk")
    ]
    single = report.verdicts[0]
    for at, replayed in enumerate(report.replay):
        replay, audit, size = report.verdicts[1 + 3 * at : 4 + 3 * at]
        assert replay.measured == replayed.replay_events_per_s
        assert audit.measured == replayed.audit_events_per_s
        assert size.measured == replayed.bytes_per_round
        assert replay.limit == audit.limit == REPLAY_TARGET_EVENTS_PER_S
        assert size.limit == LOG_BYTES_TARGET
        for verdict in (replay, audit):
            assert verdict.met == (verdict.measured >= verdict.limit)
        assert size.met == (size.measured <= size.limit)
    memory_b1 = next(c for c in report.cases if (c.backend, c.api, c.batch_size) == ("memory", "batch", 1))
    assert single.measured == memory_b1.critical_us_per_round
    assert single.met == (single.measured <= single.limit)
    with pytest.raises(ValueError):
        run_controller_bench((1,), rounds_per_repetition=1, apis=("vectorised",))


def test_controller_bench_times_the_pipelined_step() -> None:
    report = run_controller_bench(
        (2,), rounds_per_repetition=4, repeats=1, warmup=0, vocab=16, apis=("pipelined",), forward_ms=0.0
    )
    piped = [c for c in report.cases if c.api == "pipelined"]
    assert {c.backend for c in piped} == {"memory", "sqlite"}
    for case in piped:
        assert case.forward_ms == 0.0
        assert case.durable_us_per_round > 0  # the writer's time in publish, off the critical path
        assert case.mean_emitted >= 1  # every pipelined round was waited for and published


def test_controller_bench_names_its_device_and_refuses_one_it_cannot_use() -> None:
    report = run_controller_bench((2,), rounds_per_repetition=2, repeats=1, warmup=0, vocab=16, device="cpu")
    assert report.device == "cpu"
    with pytest.raises(ValueError, match="'cpu' or"):
        run_controller_bench((2,), rounds_per_repetition=2, repeats=1, warmup=0, vocab=16, device="meta")
    if not torch.cuda.is_available():
        result = CliRunner().invoke(app, ["bench", "controller", "--device", "cuda", "--batch-sizes", "2"])
        assert result.exit_code != 0 and "no CUDA device" in result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_controller_bench_steps_on_cuda_tensors() -> None:
    report = run_controller_bench(
        (1, 4),
        rounds_per_repetition=8,
        repeats=1,
        warmup=0,
        vocab=16,
        device="cuda",
        apis=("batch", "pipelined"),
    )
    assert report.device.startswith("cuda:0")
    _check(report, {"memory", "sqlite"}, (1, 4), 8)
