"""Rich rendering for ``specround generate``: the live progress display and the closing acceptance table."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from specround.serving.run_stats import RoundOutcome
from specround.serving.session import GenerationReport, GenerationSession
from specround.telemetry.observation import RoundRecorder

__all__ = ["acceptance_table", "generation_progress", "run_with_progress"]


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


def run_with_progress(
    session: GenerationSession, console: Console, total: int, recorders: Sequence[RoundRecorder] = ()
) -> GenerationReport:
    """Run ``session`` streaming its text to stdout under a progress bar on ``console`` (tokens of ``total``).

    The bar shows the tokens produced, the rate and the drafts accepted so far.
    """
    with generation_progress(console) as progress:
        task = progress.add_task("generate", total=total, rate="", accept="")
        produced = 0

        # On a terminal rich routes stdout above the live bar one complete line at a time (a flush would
        # print every piece on its own line); piped, the text streams piece by piece.
        line_buffered = sys.stdout.isatty()

        def on_text(piece: str) -> None:
            sys.stdout.write(piece)
            if not line_buffered:
                sys.stdout.flush()

        drafts = [0, 0]  # accepted, verified

        def on_round(outcome: RoundOutcome) -> None:
            nonlocal produced
            produced += outcome.emitted
            drafts[0] += outcome.accepted
            drafts[1] += outcome.drafted
            elapsed = progress.tasks[0].elapsed or 0.0
            rate = f"{produced / elapsed:.1f} tok/s" if elapsed > 0 else ""
            accept = f"accepted {drafts[0]}/{drafts[1]}" if drafts[1] else ""
            progress.update(task, completed=produced, rate=rate, accept=accept)

        report = session.run(on_text=on_text, on_round=on_round, recorders=recorders)
        sys.stdout.write("\n")  # completes the last line while the bar still routes stdout
    sys.stdout.flush()
    return report


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
