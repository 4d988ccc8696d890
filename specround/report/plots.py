"""The report's figures as PNG files, drawn with matplotlib's Agg backend (no display, no pyplot state).

Each function takes :class:`~specround.report.aggregate.ReportData` and a path, draws one figure and
returns the file name it wrote. Figures are built with :class:`matplotlib.figure.Figure` directly, so they
never touch pyplot's global figure registry (safe in a server process and in tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import matplotlib
import numpy as np
import numpy.typing as npt

matplotlib.use("Agg")

from matplotlib.figure import Figure

from specround.report.aggregate import ReportData

__all__ = ["FIGURES", "draw_all"]

_DPI = 110
_SIZE = (7.2, 3.6)
_COLOURS = {"draft": "#4c78a8", "verify": "#f58518", "state": "#54a24b", "queue": "#b279a2"}


def _times(data: ReportData, timed_only: bool = False) -> npt.NDArray[np.datetime64]:
    """Bucket centres as datetime64 (UTC) for the x axis."""
    buckets = [b for b in data.buckets if b.timed_rounds or not timed_only]
    centres = [round((b.start + b.width / 2) * 1e3) for b in buckets]
    return np.array(centres, dtype="datetime64[ms]")


def _values(values: list[float | None]) -> npt.NDArray[np.float64]:
    """Floats with NaN for missing values (a gap in the line)."""
    return np.array([math.nan if v is None else v for v in values], dtype=np.float64)


def _empty(fig: Figure, message: str) -> None:
    ax = fig.add_subplot()
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def survival(data: ReportData, fig: Figure) -> None:
    """s_j = Pr(A >= j) with its Kaplan-Meier band, and the directly counted Pr(A >= j | k >= j)."""
    if not data.survival:
        _empty(fig, "no acceptance test was reached")
        return
    ax = fig.add_subplot()
    js = [0] + [p.position for p in data.survival]
    s = [1.0] + [p.survival for p in data.survival]
    low = [1.0] + [p.low for p in data.survival]
    high = [1.0] + [p.high for p in data.survival]
    ax.fill_between(js, low, high, color="#4c78a8", alpha=0.25, label="95% band (Greenwood, log-log)")
    ax.plot(js, s, "o-", color="#4c78a8", label="s_j (reach-conditioned product)")
    direct = [(p.position, p.unconditioned) for p in data.positions if p.unconditioned is not None]
    if direct:
        ax.plot(
            [j for j, _ in direct],
            [v for _, v in direct],
            "x--",
            color="#888888",
            label="Pr(A >= j | k >= j), counted",
        )
    ax.set_xlabel("draft position j")
    ax.set_ylabel("Pr(A >= j)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(js)
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("Survival of the accepted prefix")


def accepted_pmf(data: ReportData, fig: Figure) -> None:
    """Pr(A = a) from the survival tail, with the observed frequencies per draft length."""
    ax = fig.add_subplot()
    values = list(data.accepted_pmf)
    ax.bar(range(len(values)), values, color="#4c78a8", alpha=0.8, label="Pr(A = a) = s_a - s_{a+1}")
    for k, counts in data.accepted_counts.items():
        total = sum(counts.values())
        if k == 0 or total == 0:
            continue
        xs = list(range(k + 1))
        ax.plot(xs, [counts.get(a, 0) / total for a in xs], "o:", ms=4, label=f"observed, k = {k}")
    ax.set_xlabel("accepted drafts a")
    ax.set_ylabel("probability")
    ax.set_xticks(range(len(values)))
    ax.legend(fontsize=8)
    ax.set_title("Accepted-prefix law")


def reach_rates(data: ReportData, fig: Figure) -> None:
    """alpha_j^reach with Wilson intervals, beside the rate over all proposed rows (not reach-conditioned)."""
    rated = [p for p in data.positions if p.rate is not None]
    if not rated:
        _empty(fig, "no acceptance test was reached")
        return
    ax = fig.add_subplot()
    js = [p.position for p in rated]
    rates = [p.rate or 0.0 for p in rated]
    errors = [
        [r - p.low for r, p in zip(rates, rated, strict=True)],
        [p.high - r for r, p in zip(rates, rated, strict=True)],
    ]
    ax.errorbar(
        js, rates, yerr=errors, fmt="o-", capsize=4, color="#4c78a8", label="alpha_j^reach (Wilson 95%)"
    )
    naive = _values([p.unconditioned for p in rated])
    ax.plot(
        js, naive, "x:", color="#888888", label="accepted / all proposed rows at j (not reach-conditioned)"
    )
    ax.set_xticks(js)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("draft position j")
    ax.set_ylabel("acceptance rate")
    ax.legend(loc="lower left", fontsize=8)
    ax.set_title("Reach-conditioned acceptance by position")


def requests(data: ReportData, fig: Figure) -> None:
    """Distribution of per-request acceptance (accepted / drafted) and its relation to request length."""
    rated = [r for r in data.per_request if r.acceptance is not None]
    if not rated:
        _empty(fig, "no request drafted a token")
        return
    left, right = fig.subplots(1, 2)
    left.hist([r.acceptance for r in rated], bins=min(40, max(5, len(rated) // 3)), color="#4c78a8")
    left.set_xlabel("accepted / drafted")
    left.set_ylabel("requests")
    left.set_title("Acceptance by request", fontsize=10)
    right.scatter([r.rounds for r in rated], [r.acceptance for r in rated], s=6, alpha=0.5, color="#f58518")
    right.set_xlabel("rounds of the request")
    right.set_ylabel("accepted / drafted")
    right.set_ylim(0, 1.02)
    right.set_title("... against request length", fontsize=10)


def over_time(data: ReportData, fig: Figure) -> None:
    """Acceptance and mean accepted prefix per time bucket."""
    if not data.buckets:
        _empty(fig, "no rounds")
        return
    ax = fig.add_subplot()
    times = _times(data)
    ax.plot(
        times, _values([b.acceptance for b in data.buckets]), "-", color="#4c78a8", label="accepted / drafted"
    )
    ax.set_ylabel("accepted / drafted")
    ax.set_ylim(0, 1.02)
    twin = ax.twinx()
    twin.plot(times, [b.accepted / b.rounds for b in data.buckets], "-", color="#f58518", label="mean A")
    twin.set_ylabel("mean A per round")
    ax.set_xlabel("published at (UTC)")
    fig.autofmt_xdate()
    lines = ax.get_lines() + twin.get_lines()
    ax.legend(lines, [str(line.get_label()) for line in lines], loc="lower left", fontsize=8)
    ax.set_title("Acceptance over time")


def time_ledger(data: ReportData, fig: Figure) -> None:
    """Mean draft / verify / state / queue seconds per round over time, and time per committed token."""
    timed = [b for b in data.buckets if b.timed_rounds]
    if not timed:
        _empty(fig, "no round carries timings")
        return
    top, bottom = fig.subplots(2, 1, sharex=True)
    times = _times(data, timed_only=True)
    parts = {
        "draft": [b.draft_s / b.timed_rounds * 1e3 for b in timed],
        "verify": [b.verify_s / b.timed_rounds * 1e3 for b in timed],
        "state": [b.state_s / b.timed_rounds * 1e3 for b in timed],
        "queue": [b.queue_s / b.timed_rounds * 1e3 for b in timed],
    }
    top.stackplot(
        times, *parts.values(), labels=list(parts), colors=[_COLOURS[name] for name in parts], alpha=0.85
    )
    top.set_ylabel("ms per round")
    fig.legend(loc="outside upper center", fontsize=8, ncols=4)
    top.set_title("Time ledger per round (T_D + T_V + T_S + T_Q)", fontsize=10)
    bottom.plot(times, _values([b.time_per_token for b in timed]) * 1e3, "-", color="#333333")
    bottom.set_ylabel("ms per token")
    bottom.set_xlabel("published at (UTC)")
    bottom.set_title("Time per committed token (sum T / sum G)", fontsize=10)
    fig.autofmt_xdate()


def kv_rows(data: ReportData, fig: Figure) -> None:
    """Temporary verification rows against committed K/V rows: per round over time, and in total."""
    if not data.buckets:
        _empty(fig, "no rounds")
        return
    left, right = fig.subplots(1, 2, width_ratios=[3, 1])
    times = _times(data)
    left.plot(times, [b.verify_rows / b.rounds for b in data.buckets], color="#f58518", label="verify rows")
    left.plot(
        times, [b.committed_rows / b.rounds for b in data.buckets], color="#54a24b", label="committed rows"
    )
    left.set_ylabel("rows per round")
    left.set_xlabel("published at (UTC)")
    left.legend(fontsize=8)
    left.set_title("Per round", fontsize=10)
    right.bar(["verify", "committed"], [data.verify_rows, data.committed_rows], color=["#f58518", "#54a24b"])
    right.set_title("Total rows", fontsize=10)
    right.ticklabel_format(axis="y", style="sci", scilimits=(0, 3))
    fig.autofmt_xdate()


FIGURES: dict[str, tuple[str, Callable[[ReportData, Figure], None]]] = {
    "survival": ("survival.png", survival),
    "accepted_pmf": ("accepted_pmf.png", accepted_pmf),
    "reach_rates": ("reach_rates.png", reach_rates),
    "requests": ("requests.png", requests),
    "over_time": ("over_time.png", over_time),
    "time_ledger": ("time_ledger.png", time_ledger),
    "kv_rows": ("kv_rows.png", kv_rows),
}
"""Figure name -> (file name, drawing function)."""


def draw_all(data: ReportData, directory: Path) -> dict[str, str]:
    """Draw every figure into ``directory``; returns figure name -> file name."""
    written: dict[str, str] = {}
    for name, (filename, draw) in FIGURES.items():
        size = (_SIZE[0], _SIZE[1] * 1.5) if name == "time_ledger" else _SIZE
        fig = Figure(figsize=size, dpi=_DPI, layout="constrained")
        draw(data, fig)
        fig.savefig(directory / filename, format="png")
        written[name] = filename
    return written
