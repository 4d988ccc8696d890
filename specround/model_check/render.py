"""Rich rendering of a ``specround check`` report: one table (fixture, check, result, max error)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specround.model_check.report import CheckReport
from specround.model_check.report import Progress as ProgressCallback

__all__ = ["progress_bar", "render_report"]


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf"
    if value == 0.0:
        return "0"
    if value.is_integer() and abs(value) < 1e6:
        return f"{int(value)}"
    return f"{value:.3g}"


def render_report(report: CheckReport, console: Console) -> None:
    """Print the report's table and a one-line verdict."""
    table = Table(title="specround check", show_lines=False, header_style="bold")
    table.add_column("fixture", overflow="fold", max_width=34)
    table.add_column("check", overflow="fold", max_width=58)
    table.add_column("result", justify="center")
    table.add_column("max error", justify="right")
    table.add_column("tolerance", justify="right")
    table.add_column("detail", overflow="fold", max_width=70)
    previous = None
    for row in report.results:
        fixture = row.fixture if row.fixture != previous else ""
        previous = row.fixture
        verdict = "[green]PASS[/green]" if row.passed else "[bold red]FAIL[/bold red]"
        table.add_row(
            Text(fixture),
            Text(row.check),
            verdict,
            _number(row.error),
            _number(row.tolerance),
            Text(row.detail),
        )
    console.print(table)
    failed = sum(1 for r in report.results if not r.passed)
    timing = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in report.seconds.items())
    if failed:
        console.print(f"[bold red]{failed} of {len(report.results)} checks failed[/bold red] ({timing})")
    else:
        console.print(f"[bold green]all {len(report.results)} checks passed[/bold green] ({timing})")


@contextmanager
def progress_bar(console: Console) -> Iterator[ProgressCallback]:
    """A rich progress display; yields the ``progress(stage, done, total)`` callback of :func:`run_checks`."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    with bar:
        yield update
