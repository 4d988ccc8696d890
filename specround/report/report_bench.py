"""``specround bench report``: seconds to build the audit report of a large log (1M rounds by default).

The log is a synthetic valid log (:mod:`specround.report.synthetic`) written once at ``--log PATH`` and
reused by later runs when it already holds at least the requested number of rounds (writing 1M rounds
through the real controller takes minutes; the report must take well under a minute). The timed part is
:func:`~specround.report.build.write_report` without an audit: one streaming query and fold over every
round (``extract_s``) and the figures and page (``render_s``). The peak resident memory of the process is
reported beside it to show that the pass does not load the log.
"""

from __future__ import annotations

import os
import platform
import resource
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from specround.adapters.sql import SqlEventLog
from specround.report.build import write_report
from specround.report.synthetic import write_synthetic_log

__all__ = ["REPORT_TARGET_S", "ReportBenchResult", "run_report_bench"]

REPORT_TARGET_S = 60.0
"""Target: the report of a 1M-round log within a minute."""


class ReportBenchResult(BaseModel):
    """The JSON printed by ``specround bench report``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    benchmark: str = "report"
    log: str
    log_bytes: int
    rounds: int
    requests: int
    generated: bool
    """Whether this run wrote the log (False: an existing log was reused)."""
    generate_s: float | None
    extract_s: float
    render_s: float
    total_s: float
    rounds_per_s: float
    peak_rss_mib: float
    target_s: float
    meets_target: bool
    machine: str
    load_average: tuple[float, float, float]


def _count_rounds(log: SqlEventLog) -> int:
    with log.engine.connect() as connection:
        value = connection.exec_driver_sql("SELECT count(*) FROM rounds").scalar()
    return int(value or 0)


def run_report_bench(
    rounds: int = 1_000_000, *, log_path: str | None = None, out_dir: str | None = None, batch: int = 1000
) -> ReportBenchResult:
    """Write (or reuse) a synthetic log of ``rounds`` rounds and time its report."""
    scratch = tempfile.TemporaryDirectory(prefix="specround-bench-report-")
    try:
        path = Path(log_path) if log_path else Path(scratch.name) / "report-bench.sqlite"
        generated, generate_s = False, None
        with SqlEventLog.open(path) as log:
            have = _count_rounds(log)
            if have < rounds:
                start = time.perf_counter()
                write_synthetic_log(log, rounds - have, batch=batch, prefix=f"synthetic{have}")
                generate_s = time.perf_counter() - start
                generated = True
        with SqlEventLog.open(path, create=False) as log:
            start = time.perf_counter()
            result = write_report(log, out_dir or Path(scratch.name) / "report", log_name=str(path))
            total = time.perf_counter() - start
        peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return ReportBenchResult(
            log=str(path),
            log_bytes=path.stat().st_size,
            rounds=result.data.rounds,
            requests=result.data.requests,
            generated=generated,
            generate_s=generate_s,
            extract_s=result.extract_s,
            render_s=result.render_s,
            total_s=total,
            rounds_per_s=result.data.rounds / total if total > 0 else 0.0,
            peak_rss_mib=peak_kib / 1024,
            target_s=REPORT_TARGET_S,
            meets_target=total <= REPORT_TARGET_S,
            machine=platform.machine() or "unknown",
            load_average=os.getloadavg(),
        )
    finally:
        scratch.cleanup()
