"""Audit reports people can look at: the speedup ledger of a real log, streamed, plotted and rendered.

``write_report(log, DIR)`` makes one streaming pass over the log's published rounds
(:mod:`specround.report.extract`, :mod:`specround.report.aggregate`), draws the figures with matplotlib's
Agg backend (:mod:`specround.report.plots`) and writes ``DIR/index.html`` (:mod:`specround.report.html`):
the survival tail with its confidence band, ``Pr(A = a)``, ``alpha_j^reach`` by position, acceptance by
request and over time, the time ledger, temporary versus committed K/V rows, and the audit's verdicts.
:mod:`specround.report.synthetic` writes large valid logs for tests and ``specround bench report``.
"""

from specround.report.aggregate import (
    PositionRate,
    ReportData,
    RequestTotals,
    RoundFold,
    TimeBucket,
    fold_rounds,
)
from specround.report.build import ReportResult, write_report
from specround.report.extract import (
    ReportFilter,
    RoundRow,
    matching_request_ids,
    parse_time,
    port_round_rows,
    round_rows,
    sql_round_rows,
)
from specround.report.intervals import SurvivalPoint, kaplan_meier, wilson_interval

__all__ = [
    "PositionRate",
    "ReportData",
    "ReportFilter",
    "ReportResult",
    "RequestTotals",
    "RoundFold",
    "RoundRow",
    "SurvivalPoint",
    "TimeBucket",
    "fold_rounds",
    "kaplan_meier",
    "matching_request_ids",
    "parse_time",
    "port_round_rows",
    "round_rows",
    "sql_round_rows",
    "wilson_interval",
    "write_report",
]
