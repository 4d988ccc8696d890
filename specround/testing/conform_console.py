"""The verdict table of a conformance report (rich), and its JSON."""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table
from rich.text import Text

from specround.testing.verdicts import ConformanceReport

__all__ = ["render_report", "report_json"]


def _number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "inf"
    return f"{value:.{digits}g}"


def render_report(report: ConformanceReport, console: Console) -> None:
    """Print one row per check, prompt and setting: statistic, p-value, TV with CI, verdict."""
    # Text, not a markup string: engine names such as ``specround:llama:...`` hold emoji codes.
    table = Table(
        title=Text(
            f"conformance of {report.engine}: N = {report.samples}, H = {report.horizon}, "
            f"alpha = {report.alpha:g}"
        )
    )
    for column in (
        "check",
        "prompt",
        "setting",
        "statistic",
        "p-value",
        "TV [CI]",
        "detectable TV",
        "verdict",
    ):
        table.add_column(column, overflow="fold")
    for r in report.results:
        tv = "-" if r.tv is None else f"{r.tv:.3f} [{r.tv_low or 0.0:.3f}, {r.tv_high or 0.0:.3f}]"
        style = {"PASS": "green", "FAIL": "bold red", "WARN": "yellow"}[r.verdict]
        table.add_row(
            Text(r.check),
            Text(str(r.prompt)),
            Text(r.setting),
            _number(r.statistic, 4),
            _number(r.p_value),
            tv,
            _number(r.detectable_tv),
            f"[{style}]{r.verdict}[/{style}]",
        )
    console.print(table)
    for r in report.results:
        if not r.passed:
            line = Text(r.check, style="bold")
            line.append(f" (prompt {r.prompt}, {r.setting}): {r.detail}")
            console.print(line)
    failed = report.failed()
    console.print(
        "verdict: "
        + (
            "[green]exact on every check[/green]"
            if not failed
            else f"[bold red]FAILED {', '.join(failed)}[/bold red]"
        )
    )


def report_json(report: ConformanceReport) -> str:
    """The report as one JSON document."""
    return json.dumps(report.to_json(), sort_keys=True)
