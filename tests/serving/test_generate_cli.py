"""``specround generate``: refusals (message, status, no log left behind), a real run that audits clean, and
the ``--json`` shape."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specround.cli import app
from specround.errors import InvalidRequestError, ModelLoadError, UnknownProposerError
from specround.serving.drafts import parse_draft_spec
from specround.serving.loop import ServingLoop
from specround.serving.session import GenerateOptions, TextStream, parse_draft_length, prepare_session
from specround.statemachine.state import RequestState

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["", "--draft", "ngram"], "the prompt is empty"),
        (["   "], "the prompt is empty"),
        (["hi", "--draft", "lookahead:3"], "unknown draft"),
        (["hi", "--draft", "early-exit:x"], "not an integer"),
        (["hi", "--draft", "model:/nonexistent/draft.gguf"], "draft model file not found"),
        (["hi", "--model", "/nonexistent/model.gguf"], "model file not found"),
        (["hi", "--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
        (["hi", "--top-p", "1.5"], "top_p"),
        (["hi", "--top-k", "0"], "top_k"),
        (["hi", "--min-p", "2"], "min_p"),
        (["hi", "--repetition-penalty", "0"], "repetition_penalty"),
        (["hi", "--k", "9"], "--k must lie in 0..8"),
        (["hi", "--k", "many"], "--k must be 'auto' or an integer"),
        (["hi", "--layout", "sideways"], "--layout must be one of"),
        (["hi", "--max-tokens", "0"], "--max-tokens must be >= 1"),
        (["hi", "--stop", ""], "--stop string must not be empty"),
    ],
)
def test_bad_input_is_refused_before_any_file_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "run.sqlite"
    result = runner.invoke(app, ["generate", *args, "--log", str(log)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert not log.exists()
    assert not (tmp_path / "specround-logs").exists()
    assert result.stdout == ""


def test_draft_specifications_parse() -> None:
    assert parse_draft_spec("ngram").ngram == 3
    assert parse_draft_spec("ngram:5").ngram == 5
    assert parse_draft_spec("early-exit:8").layers == 8
    assert parse_draft_spec("model:smollm2-bf16").kind == "copy"
    assert parse_draft_spec("model:fp16").kind == "copy"
    assert parse_draft_spec("none").kind == "none"
    with pytest.raises(UnknownProposerError):
        parse_draft_spec("ngram:0")
    with pytest.raises(UnknownProposerError):
        parse_draft_spec("early-exit")
    with pytest.raises(ModelLoadError):
        parse_draft_spec("model:missing-file.gguf")
    assert parse_draft_length("auto") is None and parse_draft_length(" 3 ") == 3
    with pytest.raises(InvalidRequestError):
        parse_draft_length("-1")


def test_text_stream_holds_back_incomplete_characters() -> None:
    data = "héllo".encode()
    stream = TextStream(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    pieces = [stream.push([b]) for b in data]
    assert "".join(pieces) + stream.flush() == "héllo"
    assert pieces[1] == ""  # the first byte of "é" alone is not emitted


@pytest.mark.real_model
def test_early_exit_depth_is_checked_against_the_model(tmp_path: Path) -> None:
    with pytest.raises(UnknownProposerError, match=r"early exit needs 1\.\.29"):
        prepare_session(GenerateOptions(prompt="hi", draft="early-exit:30", log=str(tmp_path / "x.sqlite")))
    assert not (tmp_path / "x.sqlite").exists()


@pytest.mark.real_model
def test_json_run_audits_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "logs" / "run.sqlite"
    frozen_while_serving: list[int] = []
    serve = ServingLoop.run

    def run(loop: ServingLoop, max_steps: int | None = None) -> dict[str, RequestState]:
        frozen_while_serving.append(gc.get_freeze_count())
        return serve(loop, max_steps)

    monkeypatch.setattr(ServingLoop, "run", run)
    assert gc.get_freeze_count() == 0
    result = runner.invoke(
        app,
        [
            "generate",
            "Repeat after me: one two three, one two three.",
            "--temperature",
            "0",
            "--max-tokens",
            "12",
            "--k",
            "auto",
            "--stop",
            "four",
            "--threads",
            "1",
            "--log",
            str(log),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.stderr
    # The loaded model and libraries were out of the collector's way while the loop ran, and only then.
    assert len(frozen_while_serving) == 1 and frozen_while_serving[0] > 0
    assert gc.get_freeze_count() == 0
    report = json.loads(result.stdout)
    expected = {
        "request_id", "log", "text", "model", "draft", "proposer", "k", "layout", "seed", "finish_reason",
        "prompt_tokens", "generated_tokens", "rounds", "proposed", "accepted", "acceptance_rate",
        "mean_accepted", "tokens_per_round", "alpha_reach", "tokens_per_s", "wall_s", "time_split_s",
    }  # fmt: skip
    assert set(report) == expected
    assert report["log"] == str(log) and log.is_file()
    assert 1 <= report["generated_tokens"] <= 12 and report["rounds"] >= 1
    assert report["k"] == "auto" and report["draft"] == "ngram"
    assert set(report["time_split_s"]) == {"draft", "verify", "state", "queue"}
    for row in report["alpha_reach"]:
        assert set(row) == {"position", "reached", "accepted", "rate"}
    audited = runner.invoke(app, ["audit", str(log), "--json"])
    assert audited.exit_code == 0, audited.stdout
    assert json.loads(audited.stdout)["ok"] is True


@pytest.mark.real_model
def test_text_run_streams_to_stdout_and_logs_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(
        app,
        ["generate", "Say hello.", "--max-tokens", "6", "--seed", "3", "--k", "2", "--threads", "1"],
    )
    assert result.exit_code == 0, result.stderr
    logs = list((tmp_path / "specround-logs").glob("generate-*.sqlite"))
    assert len(logs) == 1
    assert result.stdout.strip()  # the generated text
    flat = "".join(line.strip(" │┃") for line in result.stderr.splitlines())
    assert "accepted / proposed" in result.stderr and logs[0].name in flat
    audited = runner.invoke(app, ["audit", str(logs[0])])
    assert audited.exit_code == 0


def test_draft_cost_hints_follow_the_weights_streamed(tiny) -> None:  # type: ignore[no-untyped-def]
    from specround.adapters.llama import LlamaTarget
    from specround.serving.drafts import build_proposer, draft_cost_hint

    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    weights = tiny.model.weights
    block = sum(t.numel() for t in weights.layers[0].tensors().values())
    head = weights.norm.numel() + weights.lm_head.numel()
    layers = tiny.model.config.num_layers

    def hint(text: str) -> float | None:
        spec = parse_draft_spec(text)
        return draft_cost_hint(spec, target, build_proposer(spec, target))

    assert hint("ngram") == 0.0
    assert hint("none") is None
    assert hint("early-exit:1") == pytest.approx((block + head) / (layers * block + head))
    assert hint("model:bf16") == 1.0


@pytest.mark.real_model
def test_a_pipelined_run_writes_the_same_text_and_rounds(tmp_path: Path) -> None:
    """``--pipelined`` changes when each round is written, never what is generated or logged."""
    reports = []
    for mode in ("--synchronous", "--pipelined"):
        log = tmp_path / f"run{mode}.sqlite"
        args = ["generate", "Count: one, two, three,", "--temperature", "0.8", "--seed", "3"]
        result = runner.invoke(app, [*args, "--max-tokens", "16", mode, "--log", str(log), "--json"])
        assert result.exit_code == 0, result.stderr
        reports.append(json.loads(result.stdout))
        audited = runner.invoke(app, ["audit", str(log), "--json"])
        assert audited.exit_code == 0 and json.loads(audited.stdout)["ok"] is True
    sync, piped = reports
    assert piped["text"] == sync["text"] and piped["rounds"] == sync["rounds"]
    assert piped["accepted"] == sync["accepted"]
