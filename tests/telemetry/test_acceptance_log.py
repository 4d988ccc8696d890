"""The acceptance log (contract#acceptance-log) read back from the event log, and ``specround log``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.cli import app
from specround.report.synthetic import write_synthetic_log
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream
from specround.telemetry import AcceptanceEntry, acceptance_log


@pytest.fixture(scope="module")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("acceptance") / "log.sqlite"
    with SqlEventLog.open(path) as log:
        write_synthetic_log(log, 240, batch=8, max_new_tokens=40, seed=5)
    return path


def _rounds(entries: list[AcceptanceEntry]) -> dict[str, list[AcceptanceEntry]]:
    out: dict[str, list[AcceptanceEntry]] = {}
    for entry in entries:
        out.setdefault(entry.round_id, []).append(entry)
    return out


def test_entries_rederive_from_the_logged_values(small_log: Path) -> None:
    """INV-10 through the acceptance log: accepted iff u < p/q, u = Philox(seed, ACCEPT, counter + i)."""
    with SqlEventLog.open(small_log, create=False) as log:
        request_ids = log.request_ids()[:6]
        seen_outcomes: set[str] = set()
        for request_id in request_ids:
            config = next(iter(log.events(request_id))).payload["config"]
            decided = {e.round_id: e.payload for e in log.events(request_id) if e.kind == "round_decided"}
            entries = list(acceptance_log(log, request_id))
            rounds = _rounds(entries)
            assert list(rounds) == list(decided)  # every published round, in order
            for round_id, group in rounds.items():
                d = decided[round_id]
                drafts = [e for e in group if e.kind == "draft"]
                terminal = [e for e in group if e.kind == "terminal"]
                assert all(e.committed_tokens == len(d["emitted_ids"]) for e in group)
                tested = [e for e in drafts if e.uniform is not None]
                assert len(tested) == d["accept_draws"]  # INV-3: one uniform per reached test
                for i, e in enumerate(tested):
                    fresh = float(
                        uniforms(
                            torch.tensor([config["seed"]]),
                            Stream.ACCEPT,
                            torch.tensor([d["accept_counter"] + i]),
                        )[0]
                    )
                    assert e.uniform == fresh
                    assert e.accept_ratio == pytest.approx(min(1.0, e.p_prob / e.q_prob))  # type: ignore[operator]
                    assert (e.outcome == "accepted") == (e.uniform < e.p_prob / e.q_prob)  # type: ignore[operator]
                assert sum(e.outcome == "accepted" for e in drafts) == d["accepted"]
                if d["terminal"] == "stop":
                    assert terminal == [] and all(e.outcome in ("accepted", "after_stop") for e in drafts)
                else:
                    [t] = terminal
                    assert t.outcome == d["terminal"] and t.token == d["emitted_ids"][-1]
                    assert t.uniform == d["terminal_uniform"]
                    if t.outcome == "correction":
                        assert t.position == d["accepted"] + 1
                        assert t.distribution == f"residual(p_{t.position}-q_{t.position})+"
                        assert drafts[d["accepted"]].outcome == "rejected"
                        assert all(e.outcome == "unreached" for e in drafts[d["accepted"] + 1 :])
                    else:
                        assert t.position == len(drafts) + 1 and t.distribution == f"p_{t.position}"
                seen_outcomes.update(e.outcome for e in group)
        assert {"accepted", "rejected", "unreached", "correction", "bonus"} <= seen_outcomes
        first = next(iter(acceptance_log(log, request_ids[0], since_generation=3)))
        assert first.generation == 4
        assert len(list(acceptance_log(log, request_ids[0], limit=5))) == 5


def test_log_command_table_and_json(small_log: Path) -> None:
    with SqlEventLog.open(small_log, create=False) as log:
        request_id = log.request_ids()[0]
        expected = [e.as_json() for e in acceptance_log(log, request_id)]
    runner = CliRunner()
    result = runner.invoke(app, ["log", str(small_log), "--request", request_id, "--json"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.output.splitlines()]
    assert lines == expected
    table = runner.invoke(app, ["log", str(small_log), "--request", request_id, "--limit", "4"])
    assert table.exit_code == 0, table.output
    assert f"acceptance log of {request_id}" in table.output and "accepted" in table.output
    missing = runner.invoke(app, ["log", str(small_log), "--request", "nobody"])
    assert missing.exit_code == 2
    none = runner.invoke(app, ["log", str(small_log)])
    assert none.exit_code == 2
