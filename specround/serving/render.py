"""Rich rendering for ``specround generate``: the live progress display and the closing acceptance table."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specround.serving.session import GenerationReport

__all__ = ["acceptance_table", "generation_progress"]


def generation_progress(console: Console) -> Progress:
    """A transient progress bar on ``console`` (stderr); stdout is routed above it only on a terminal."""
    return Progress(
        TextColumn("[bold]generating"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.completed}/{task.total} tokens"),
        TextColumn("{task.fields[rate]}"),
        TextColumn("{task.fields[accept]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        redirect_stdout=sys.stdout.isatty(),
        redirect_stderr=False,
    )


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def acceptance_table(report: GenerationReport) -> Table:
    """The closing table: acceptance, alpha^reach by position, throughput, time split and the log."""
    stats = report.stats
    table = Table(title="specround generate", show_header=False, title_justify="left")
    table.add_column("quantity", style="bold")
    table.add_column("value", overflow="fold")
    table.add_row("model", report.model_id)
    table.add_row(
        "draft / K / layout", f"{report.draft} ({report.proposer_id}) / {report.policy} / {report.layout}"
    )
    table.add_row(
        "tokens", f"{len(report.generated_ids)} generated after {report.prompt_tokens} prompt tokens"
    )
    table.add_row("finish", str(report.finish_reason))
    table.add_row("rounds", str(stats.rounds))
    table.add_row(
        "accepted / proposed",
        f"{stats.accepted} / {stats.proposed} ({_fmt(stats.acceptance_rate)})",
    )
    table.add_row("mean accepted length", f"{_fmt(stats.mean_accepted)} per drafting round")
    table.add_row("tokens per round", _fmt(stats.tokens_per_round))
    reach = "  ".join(f"{c.position}: {_fmt(c.rate, '.2f')} ({c.accepted}/{c.reached})" for c in stats.reach)
    table.add_row("alpha^reach by position", reach or "-")
    table.add_row("tokens/s", f"{report.tokens_per_s:.2f} (wall {report.wall_s:.2f} s)")
    total = stats.logged_seconds
    if total > 0:
        split = ", ".join(
            f"{name} {100 * part / total:.0f}%"
            for name, part in (
                ("draft", stats.draft_s),
                ("verify", stats.verify_s),
                ("state", stats.state_s),
                ("queue", stats.queue_s),
            )
        )
        table.add_row("time split", split)
    table.add_row("log", report.log)
    return table
