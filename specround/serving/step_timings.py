"""The time ledger of one step (contract#time-ledger): the step's shared calls split among its rounds.

A step makes a few calls that serve every round at once (one proposer call, one packed verification, under
``retained_frontier`` one frontier call) and some work per round (its p rows, the closing work of its
request's previous round). :func:`share_out` gives each round its :class:`RoundTimings`: proposer time in
proportion to the drafts it asked for, target time in proportion to the rows it computed in each call, its
own work as measured, and the gap since the previous step evenly. :func:`verify_calls` states the same
step's target calls as the (rows, seconds) pairs the draft-length policy learns its cost model from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specround.statemachine.events import RoundTimings, whole_microseconds

__all__ = ["RoundWork", "StepTimes", "share_out", "verify_calls"]


@dataclass(frozen=True, slots=True)
class StepTimes:
    """Seconds measured for the calls one step shares among its rounds."""

    draft_s: float = 0.0
    """The proposer call."""
    verify_s: float = 0.0
    """The packed verification call."""
    frontier_s: float = 0.0
    """The frontier call (``retained_frontier`` only)."""
    gap_s: float = 0.0
    """Time since the previous step ended (the caller's callbacks, admission of new requests)."""


@dataclass(frozen=True, slots=True)
class RoundWork:
    """What one round of a step used of the shared calls, and the work measured for it alone."""

    asked: int
    """Drafts the round asked the proposer for (its K)."""
    computed_rows: int
    """Rows the verification computed for the round."""
    frontier_rows: int = 0
    """Rows the frontier call computed for the round (0 or 1)."""
    own_s: float = 0.0
    """Seconds spent on this round alone (reported as its ``state_s``)."""


def _part(seconds: float, used: int, total: int) -> float:
    return seconds * used / total if total else 0.0


def share_out(times: StepTimes, work: Sequence[RoundWork]) -> list[RoundTimings]:
    """Each round's share of the step's shared calls plus its own work, in the order of ``work``."""
    asked_total = sum(w.asked for w in work)
    computed_total = sum(w.computed_rows for w in work)
    frontier_total = sum(w.frontier_rows for w in work)
    share = 1.0 / len(work) if work else 0.0
    return [
        RoundTimings(
            draft_s=whole_microseconds(_part(times.draft_s, w.asked, asked_total)),
            verify_s=whole_microseconds(
                _part(times.verify_s, w.computed_rows, computed_total)
                + _part(times.frontier_s, w.frontier_rows, frontier_total)
            ),
            state_s=whole_microseconds(w.own_s),
            queue_s=whole_microseconds(times.gap_s * share),
        )
        for w in work
    ]


def verify_calls(times: StepTimes, work: Sequence[RoundWork]) -> tuple[tuple[int, float], ...]:
    """The step's target calls as ``(rows, seconds)``: frontier call first, calls without rows left out."""
    calls: list[tuple[int, float]] = []
    frontier_total = sum(w.frontier_rows for w in work)
    computed_total = sum(w.computed_rows for w in work)
    if frontier_total:
        calls.append((frontier_total, times.frontier_s))
    if computed_total:
        calls.append((computed_total, times.verify_s))
    return tuple(calls)
