"""``specround audit --report`` with filters, and ``specround bench report`` on a small log."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.cli import app
from specround.report import parse_time, port_round_rows
from specround.report.synthetic import SYNTHETIC_MODELS, SyntheticLogSummary

runner = CliRunner()


def test_audit_writes_a_filtered_report(
    synthetic_log: tuple[Path, SyntheticLogSummary], tmp_path: Path
) -> None:
    path = synthetic_log[0]
    with SqlEventLog.open(path, create=False) as log:
        rows = list(port_round_rows(log))
    times = sorted(r.recorded_at for r in rows)
    since = times[len(times) // 2]
    since_iso = dt.datetime.fromtimestamp(since, tz=dt.UTC).isoformat()
    since = parse_time(since_iso)  # ISO 8601 keeps microseconds: compare with what the command parses
    out = tmp_path / "report"
    result = runner.invoke(
        app,
        [
            "audit",
            str(path),
            "--json",
            "--report",
            str(out),
            "--model",
            SYNTHETIC_MODELS[0],
            "--since",
            since_iso,
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["ok"] is True and summary["report"] == str(out / "index.html")
    audited = {r["request_id"] for r in summary["per_request"]}
    with SqlEventLog.open(path, create=False) as log:
        models = {
            rid: next(iter(log.events(rid))).payload["config"]["coordinate"]["target_model_id"]
            for rid in log.request_ids()
        }
    assert audited == {rid for rid, model in models.items() if model == SYNTHETIC_MODELS[0]}
    page = (out / "index.html").read_text(encoding="utf-8")
    assert f"target_model = {SYNTHETIC_MODELS[0]}" in page and "since = " in page
    expected = sum(1 for r in rows if models[r.request_id] == SYNTHETIC_MODELS[0] and r.recorded_at >= since)
    assert f"<th>rounds</th><td>{expected:,}</td>" in page

    bad = runner.invoke(app, ["audit", str(path), "--report", str(out), "--since", "yesterday-ish"])
    assert bad.exit_code == 2 and "ReportOptionError" in bad.stderr
    text = runner.invoke(
        app, ["audit", str(path), "--request", rows[0].request_id, "--report", str(tmp_path / "one")]
    )
    assert text.exit_code == 0 and "report:" in text.stdout


def test_bench_report_reuses_its_log(tmp_path: Path) -> None:
    log = tmp_path / "bench.sqlite"
    first = runner.invoke(app, ["bench", "report", "--rounds", "120", "--log", str(log)])
    assert first.exit_code == 0, first.output
    written = json.loads(first.stdout)
    assert written["generated"] is True and written["rounds"] == 120 and written["extract_s"] > 0
    again = json.loads(runner.invoke(app, ["bench", "report", "--rounds", "100", "--log", str(log)]).stdout)
    assert again["generated"] is False and again["rounds"] == 120 and again["generate_s"] is None
    assert set(again) >= {"total_s", "render_s", "rounds_per_s", "peak_rss_mib", "meets_target"}
