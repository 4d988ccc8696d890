"""Rich rendering of a ``specround check`` report.

Tables, each printed when its part ran: the check rows (fixture, check, result, max error), the z3 proofs
with the time of each, the conformance pairs that do not conform (with the successor the relation
expects), the mutation lab (each mutation with the checks that killed it), and the INV-n / F-n coverage;
then a verdict line with the mutation score and the wall time.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from specround.model_check.check_suite import CheckReport
from specround.model_check.check_suite import Progress as ProgressCallback

__all__ = ["progress_bar", "render_report"]

_PASS = "[green]PASS[/green]"
_FAIL = "[bold red]FAIL[/bold red]"


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


def _checks_table(report: CheckReport) -> Table:
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
        table.add_row(
            Text(fixture),
            Text(row.check),
            _PASS if row.passed else _FAIL,
            _number(row.error),
            _number(row.tolerance),
            Text(row.detail),
        )
    return table


def _proofs_table(report: CheckReport) -> Table:
    table = Table(title=f"z3 proofs ({len(report.proofs)})", header_style="bold")
    table.add_column("proof", overflow="fold", max_width=56)
    table.add_column("kind")
    table.add_column("status")
    table.add_column("ok", justify="center")
    table.add_column("wall s", justify="right")
    table.add_column("covers", overflow="fold", max_width=40)
    for proof in report.proofs:
        table.add_row(
            Text(proof.name),
            proof.kind.value,
            proof.status.value,
            _PASS if proof.ok else _FAIL,
            f"{proof.wall_s:.3f}",
            Text(", ".join(proof.covers)),
        )
    return table


def _nonconforming_table(report: CheckReport) -> Table | None:
    pairs = (report.conformance or {}).get("nonconforming", [])
    if not pairs:
        return None
    table = Table(title="conformance pairs the z3 relation refuses", header_style="bold")
    table.add_column("scenario", overflow="fold", max_width=28)
    table.add_column("attempt", overflow="fold", max_width=40)
    table.add_column("status")
    table.add_column("expected successor vs observed", overflow="fold", max_width=90)
    for pair in pairs[:20]:
        table.add_row(Text(pair["scenario"]), Text(pair["attempt"]), pair["status"], Text(pair["detail"]))
    return table


def _lab_table(report: CheckReport) -> Table | None:
    lab = report.lab
    if lab is None:
        return None
    table = Table(title=f"mutation lab: {lab.killed}/{len(lab.rows)} killed", header_style="bold")
    table.add_column("mutation", overflow="fold", max_width=40)
    table.add_column("family")
    table.add_column("verdict", justify="center")
    table.add_column("killed by", overflow="fold", max_width=60)
    table.add_column("changed", justify="right")
    table.add_column("s", justify="right")
    for row in lab.rows:
        verdict = "[green]killed[/green]" if row.killed else f"[bold red]{row.verdict}[/bold red]"
        table.add_row(
            Text(row.name),
            row.family,
            verdict,
            Text(", ".join(row.killed_by) or (row.error or "")),
            f"{len(row.changed)}/{len(lab.checks)}",
            f"{row.seconds:.1f}",
        )
    return table


def _coverage_table(report: CheckReport) -> Table:
    table = Table(title="coverage of INV-n and F-n", header_style="bold")
    table.add_column("item")
    table.add_column("what", overflow="fold", max_width=44)
    table.add_column("proofs", justify="right")
    table.add_column("tests", justify="right")
    table.add_column("mutations", overflow="fold", max_width=44)
    table.add_column("conformance", overflow="fold", max_width=30)
    table.add_column("covered", justify="center")
    for row in report.coverage:
        proofs = f"{len(row.proofs)}" + (
            "" if row.proofs_ok is None else (" ok" if row.proofs_ok else " FAIL")
        )
        table.add_row(
            row.item,
            Text(row.title),
            proofs,
            str(len(row.tests)),
            Text(", ".join(m.split(" (")[0] for m in row.mutations)),
            Text(", ".join(row.conformance)),
            _PASS if row.covered else _FAIL,
        )
    return table


def render_report(report: CheckReport, console: Console) -> None:
    """Print the report's tables and a one-line verdict."""
    console.print(_checks_table(report))
    if report.proofs:
        console.print(_proofs_table(report))
    for table in (_nonconforming_table(report), _lab_table(report)):
        if table is not None:
            console.print(table)
    if report.coverage:
        console.print(_coverage_table(report))
    failed = sum(1 for r in report.results if not r.passed)
    timing = ", ".join(f"{stage} {seconds:.1f} s" for stage, seconds in report.seconds.items())
    score = report.mutation_score
    score_text = f"mutation score {score:.0%}; " if score is not None else ""
    wall = f"wall {report.wall_s:.1f} s"
    if failed:
        console.print(
            f"[bold red]{failed} of {len(report.results)} checks failed[/bold red] "
            f"({score_text}{timing}; {wall})"
        )
    else:
        console.print(
            f"[bold green]all {len(report.results)} checks passed[/bold green] ({score_text}{timing}; {wall})"
        )


@contextmanager
def progress_bar(console: Console) -> Iterator[ProgressCallback]:
    """A rich progress display; yields the ``progress(stage, done, total)`` callback of :func:`run_checks`.

    The bar redraws only from the callback, on the calling thread: rich's auto-refresh thread would let the
    garbage collector run z3 finalizers (``Z3_dec_ref``) on that thread while the main thread is inside a z3
    call with the GIL released, and a z3 context is not thread-safe (seen as a crash and as a hang).
    """
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        auto_refresh=False,
    )
    tasks: dict[str, TaskID] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total, refresh=True)

    with bar:
        yield update
