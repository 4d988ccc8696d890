"""What ``specround audit`` prints: its rich tables and closing line, or its JSON summary."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table

from specround.audit.audit_report import AuditReport

__all__ = ["audit_json", "findings_table", "print_audit", "requests_table"]


def audit_json(report: AuditReport, index_path: Path | None = None) -> dict[str, object]:
    """The ``--json`` object: the report's summary, the HTML report's path if written, and each request."""
    summary = report.summary()
    if index_path is not None:
        summary["report"] = str(index_path)
    summary["per_request"] = [
        {
            "request_id": r.request_id,
            "ok": r.ok,
            "events": r.events,
            "rounds": r.rounds,
            "generation": r.generation,
        }
        for r in report.requests
    ]
    return summary


def requests_table(report: AuditReport, log_name: str) -> Table:
    """One row per audited request: its events, rounds, generation, whether it finished, and its verdict."""
    table = Table(title=f"audit of {log_name}")
    for column in ("request", "events", "rounds", "generation", "finished", "result"):
        table.add_column(column)
    for r in report.requests:
        verdict = "[green]clean[/green]" if r.ok else f"[red]{len(r.findings)} finding(s)[/red]"
        table.add_row(r.request_id, str(r.events), str(r.rounds), str(r.generation), str(r.finished), verdict)
    return table


def findings_table(report: AuditReport) -> Table:
    """One row per finding: the invariant, its kind, where it was found, and its message."""
    table = Table(title="findings")
    for column in ("invariant", "kind", "request", "seq", "round", "message"):
        table.add_column(column)
    for f in report.findings:
        table.add_row(
            f.invariant,
            f.kind,
            f.request_id,
            str(f.seq if f.seq is not None else "-"),
            f.round_id or "-",
            f.message,
        )
    return table


def print_audit(console: Console, report: AuditReport, log_name: str, index_path: Path | None = None) -> None:
    """The requests table, the findings table (when there are findings), the verdict and the report path."""
    console.print(requests_table(report, log_name))
    if report.findings:
        console.print(findings_table(report))
    verdict = "clean" if report.ok else f"{len(report.findings)} finding(s) {report.counts()}"
    console.print(
        f"{len(report.requests)} requests, {report.events} events, {report.rounds} rounds: {verdict}"
    )
    if index_path is not None:
        console.print(f"report: {index_path}")
