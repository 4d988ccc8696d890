"""Build the audit report: one streaming pass over the log, the figures, and ``index.html``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from specround.audit.audit_report import AuditReport
from specround.errors import ReportOptionError
from specround.report.aggregate import ReportData, fold_rounds
from specround.report.extract import ReportFilter, round_rows
from specround.report.html import render_html
from specround.report.plots import draw_all
from specround.statemachine.ports import EventLog

__all__ = ["ReportResult", "write_report"]


@dataclass(frozen=True)
class ReportResult:
    """What :func:`write_report` wrote, and how long each part took."""

    index: Path
    """The page (``DIR/index.html``)."""
    figures: dict[str, Path]
    data: ReportData
    extract_s: float
    """Seconds of the streaming pass over the log (query and fold)."""
    render_s: float
    """Seconds spent drawing the figures and writing the page."""


def write_report(
    log: EventLog,
    directory: str | Path,
    *,
    filters: ReportFilter | None = None,
    audit: AuditReport | None = None,
    log_name: str = "log",
) -> ReportResult:
    """Write ``directory/index.html`` and its PNG figures for the rounds of ``log`` that pass ``filters``.

    ``audit`` (from :func:`specround.audit.audit_log`) fills the verdict section. The directory is created
    if needed; a path that exists and is not a directory is refused with :class:`ReportOptionError`.
    """
    filters = filters or ReportFilter()
    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise ReportOptionError(f"report directory {out} exists and is not a directory")
    if filters.since is not None and filters.until is not None and filters.until <= filters.since:
        raise ReportOptionError(f"--until ({filters.until}) must be after --since ({filters.since})")
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    data = fold_rounds(round_rows(log, filters))
    extracted = time.perf_counter()
    figures = draw_all(data, out)
    page = render_html(data, figures, log=log_name, filters=filters.describe(), audit=audit)
    index = out / "index.html"
    index.write_text(page, encoding="utf-8")
    return ReportResult(
        index=index,
        figures={name: out / filename for name, filename in figures.items()},
        data=data,
        extract_s=extracted - start,
        render_s=time.perf_counter() - extracted,
    )
