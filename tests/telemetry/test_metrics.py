"""Prometheus telemetry: a short serving run on the tiny model scraped over loopback, values checked against
the event log; abort, conflict and acknowledgement accounting; structured logs carry request and round ids."""

from __future__ import annotations

import io
import json
import logging
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import NGramProposer
from specround.errors import ReportOptionError
from specround.report import port_round_rows
from specround.sampling.processors import sampling_chain
from specround.serving import FixedDraftLength, GenerationRequest, ServingLoop
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.telemetry import (
    RoundObservation,
    SpecroundMetrics,
    configure_logging,
    kv_row_bytes,
    log_context,
    serve_metrics,
)

V = 8
PROMPT = (1, 2, 3, 1, 2, 3, 1, 2)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """GET the exposition over loopback and index samples by (name, labels without model_name)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode("utf-8")
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model_name"))
            samples[(sample.name, labels)] = sample.value
    return samples


def value(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_scraped_metrics_match_the_event_log(tiny: LlamaBundle) -> None:
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    row_bytes = kv_row_bytes(target)
    cfg = tiny.model.config
    assert row_bytes == 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4
    metrics = SpecroundMetrics(model_name=tiny.model_id, kv_row_bytes=row_bytes)
    log = MemoryEventLog()
    faults = FaultPlan.at(FaultPoint.AFTER_DECISION, generations=[2], times=1)
    loop = ServingLoop(
        RoundController(log, faults=faults),
        target,
        NGramProposer(V, max_ngram=2),
        policy=FixedDraftLength(3),
        recorders=[metrics],
    )
    chain = sampling_chain(V, temperature=0.8)
    ids = [loop.submit(GenerationRequest(PROMPT, 14, seed=s, processors=chain)) for s in (1, 2)]
    loop.run()
    server = serve_metrics(metrics.registry, 0)
    try:
        assert server.host == "127.0.0.1" and server.port > 0
        samples = scrape(server.url)
    finally:
        server.close()

    rows = list(port_round_rows(log))
    assert {r.request_id for r in rows} == set(ids)
    drafted = [r for r in rows if r.drafted > 0]
    p = "specround:"
    # vLLM's speculative-decoding counters, same suffixes under the specround: prefix.
    assert value(samples, f"{p}spec_decode_num_drafts_total") == len(drafted)
    assert value(samples, f"{p}spec_decode_num_draft_tokens_total") == sum(r.drafted for r in rows)
    accepted = sum(r.accepted for r in rows)
    assert value(samples, f"{p}spec_decode_num_accepted_tokens_total") == accepted
    per_pos = [
        value(samples, f"{p}spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)
    ]
    assert sum(per_pos) == accepted
    assert per_pos == [sum(1 for r in rows if r.accepted > i) for i in range(3)]
    # Our own: rounds by terminal kind, the injected fault, K/V rows and bytes, output tokens and TPOT.
    for terminal in ("correction", "bonus", "stop"):
        expected = sum(1 for r in rows if r.terminal == terminal)
        assert value(samples, f"{p}rounds_published_total", terminal=terminal) == expected
    assert len(faults.fired) == 1
    assert value(samples, f"{p}rounds_aborted_total", reason="InjectedFaultError", fault_point="F-2") == 1
    emitted = sum(r.emitted for r in rows)
    assert value(samples, f"{p}generation_tokens_total") == emitted
    committed = sum(r.committed_rows for r in rows)
    assert value(samples, f"{p}kv_committed_rows_total") == committed
    assert value(samples, f"{p}kv_committed_bytes_total") == committed * row_bytes
    temporary = value(samples, f"{p}kv_temporary_rows_total")
    assert temporary >= sum(r.verify_rows for r in rows)  # the aborted round verified too
    assert value(samples, f"{p}kv_temporary_bytes_total") == temporary * row_bytes
    on = value(samples, f"{p}time_per_output_token_seconds_count", speculation="on")
    off = value(samples, f"{p}time_per_output_token_seconds_count", speculation="off")
    assert on + off == emitted
    assert on == sum(r.emitted for r in drafted)
    total_s = sum(r.round_s or 0.0 for r in rows)
    tpot_sum = value(samples, f"{p}time_per_output_token_seconds_sum", speculation="on") + value(
        samples, f"{p}time_per_output_token_seconds_sum", speculation="off"
    )
    assert tpot_sum == pytest.approx(total_s, rel=1e-6)  # sum/count is sum T / sum G (contract#time-ledger)
    assert value(samples, f"{p}round_verify_seconds_count") == len(rows)
    assert value(samples, f"{p}round_verify_seconds_sum") == pytest.approx(sum(r.verify_s or 0 for r in rows))


def _observation(status: str, error: str | None = None, point: str | None = None) -> RoundObservation:
    return RoundObservation(
        request_id="r",
        round_id="g1",
        status=status,
        generation=1,
        drafted=2,
        accepted=1 if status == "published" else 0,
        emitted=2 if status == "published" else 0,
        terminal="correction" if status == "published" else None,
        finished=False,
        verify_rows=3,
        committed_rows=2 if status == "published" else 0,
        timings=RoundTimings(draft_s=0.001, verify_s=0.002) if status == "published" else None,
        error=error,
        fault_point=point,
    )


def test_conflicts_refusals_and_acknowledgements_are_counted_apart() -> None:
    metrics = SpecroundMetrics(model_name="m")
    metrics.observe_round(_observation("published"))
    metrics.observe_round(_observation("acknowledged"))
    metrics.observe_round(_observation("aborted", "StaleGenerationError"))
    metrics.observe_round(_observation("aborted", "DuplicateRoundError"))
    metrics.observe_round(_observation("aborted", "StaleCoordinateError"))
    metrics.observe_round(_observation("aborted", "RequestFinishedError"))
    metrics.observe_round(_observation("unacknowledged", "InjectedFaultError", "F-6"))
    get = metrics.registry.get_sample_value
    labels = {"model_name": "m"}
    assert get("specround:rounds_published_total", {**labels, "terminal": "correction"}) == 1
    assert get("specround:rounds_acknowledged_total", labels) == 1
    assert (
        get("specround:spec_decode_num_draft_tokens_total", labels) == 2
    )  # the acknowledgement adds nothing
    assert get("specround:publish_conflicts_total", {**labels, "kind": "stale_generation"}) == 1
    assert get("specround:publish_conflicts_total", {**labels, "kind": "duplicate_round"}) == 1
    assert get("specround:fence_refusals_total", {**labels, "reason": "stale_coordinate"}) == 1
    assert get("specround:fence_refusals_total", {**labels, "reason": "finished"}) == 1
    assert get("specround:rounds_unacknowledged_total", {**labels, "fault_point": "F-6"}) == 1
    aborted = {**labels, "reason": "StaleGenerationError", "fault_point": "none"}
    assert get("specround:rounds_aborted_total", aborted) == 1
    assert get("specround:kv_committed_rows_total", labels) == 2
    assert get("specround:kv_temporary_rows_total", labels) == 3 * 5  # published + four aborted rounds
    assert get("specround:kv_temporary_bytes_total", labels) is None  # no row size declared: no bytes


def test_json_logs_carry_request_and_round_ids() -> None:
    stream = io.StringIO()
    logger = configure_logging("json", "DEBUG", stream=stream)
    try:
        metrics = SpecroundMetrics(model_name="m")
        metrics.observe_round(_observation("published"))
        metrics.observe_round(_observation("aborted", "InjectedFaultError", "F-3"))
        with log_context(request_id="ctx-req", round_id="ctx-round"):
            logging.getLogger("specround.test").info("inside %s", "context", extra={"note": 7})
        lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        configure_logging("text", "WARNING", stream=io.StringIO())
        logger.setLevel(logging.WARNING)
    published, aborted, inside = lines
    assert published["message"] == "round published" and published["level"] == "DEBUG"
    assert (published["request_id"], published["round_id"], published["generation"]) == ("r", "g1", 1)
    assert aborted["level"] == "WARNING" and aborted["fault_point"] == "F-3"
    assert inside["message"] == "inside context" and inside["note"] == 7
    assert (inside["request_id"], inside["round_id"]) == ("ctx-req", "ctx-round")
    with pytest.raises(ReportOptionError):
        configure_logging("xml")
    with pytest.raises(ReportOptionError):
        configure_logging("json", "LOUD")


@pytest.mark.real_model
def test_generate_serves_metrics_on_loopback(tmp_path: Path) -> None:
    """``specround generate --metrics-port N``: the endpoint answers a GET over 127.0.0.1 after a run."""
    import socket

    from typer.testing import CliRunner

    from specround.cli import app
    from specround.telemetry import running_servers

    with socket.socket() as probe:  # a free port; the command binds it right after
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    before = set(map(id, running_servers()))
    log = tmp_path / "run.sqlite"
    result = CliRunner().invoke(
        app,
        ["generate", "one two three, one two three,", "--raw", "--temperature", "0", "--max-tokens", "8",
         "--k", "3", "--threads", "1", "--log", str(log), "--json", "--metrics-port", str(port)],
    )  # fmt: skip
    started = [s for s in running_servers() if id(s) not in before]
    try:
        assert result.exit_code == 0, result.stderr
        assert f"metrics: http://127.0.0.1:{port}/metrics" in result.stderr
        report = json.loads(result.stdout)
        [server] = started
        samples = scrape(server.url)
    finally:
        for server in started:
            server.close()
    assert value(samples, "specround:generation_tokens_total") == report["generated_tokens"]
    assert value(samples, "specround:spec_decode_num_draft_tokens_total") == report["proposed"]
    assert value(samples, "specround:spec_decode_num_accepted_tokens_total") == report["accepted"]
    published = sum(v for (name, _), v in samples.items() if name == "specround:rounds_published_total")
    assert published == report["rounds"]
    assert value(samples, "specround:kv_committed_bytes_total") > 0
