"""The time ledger of one step: the shared calls split among the rounds by what each used."""

from __future__ import annotations

import pytest

from specround.serving.step_timings import RoundWork, StepTimes, share_out, verify_calls
from specround.statemachine.events import RoundTimings


def test_shares_follow_drafts_asked_and_rows_computed() -> None:
    times = StepTimes(draft_s=0.6, verify_s=1.0, frontier_s=0.2, gap_s=0.4)
    work = [
        RoundWork(asked=2, computed_rows=3, frontier_rows=1, own_s=0.05),
        RoundWork(asked=0, computed_rows=1, frontier_rows=0, own_s=0.01),
        RoundWork(asked=4, computed_rows=4, frontier_rows=1, own_s=0.0),
    ]
    timings = share_out(times, work)
    assert [t.draft_s for t in timings] == pytest.approx([0.2, 0.0, 0.4])
    assert [t.verify_s for t in timings] == pytest.approx([0.375 + 0.1, 0.125, 0.5 + 0.1])
    assert [t.state_s for t in timings] == [0.05, 0.01, 0.0]
    # Recorded at whole microseconds: 0.4 s / 3 is 133 333 µs each.
    assert [t.queue_s for t in timings] == [0.133333] * 3
    # Nothing is lost or invented: the shares add up to the step's shared seconds, up to half a
    # microsecond of rounding per round.
    slack = 0.5e-6 * len(work)
    assert sum(t.draft_s for t in timings) == pytest.approx(times.draft_s, abs=slack)
    assert sum(t.verify_s for t in timings) == pytest.approx(times.verify_s + times.frontier_s, abs=slack)
    assert sum(t.queue_s for t in timings) == pytest.approx(times.gap_s, abs=slack)


def test_calls_nobody_used_are_shared_as_zero() -> None:
    times = StepTimes(draft_s=0.3, verify_s=0.5, frontier_s=0.0, gap_s=0.0)
    work = [RoundWork(asked=0, computed_rows=0), RoundWork(asked=0, computed_rows=0)]
    assert share_out(times, work) == [RoundTimings()] * 2
    assert share_out(times, []) == []
    assert verify_calls(times, work) == ()


def test_verify_calls_list_the_frontier_call_first() -> None:
    times = StepTimes(verify_s=0.5, frontier_s=0.1)
    work = [RoundWork(asked=1, computed_rows=1, frontier_rows=1), RoundWork(2, 2, 1)]
    assert verify_calls(times, work) == ((2, 0.1), (3, 0.5))
    assert verify_calls(times, [RoundWork(1, 2), RoundWork(0, 1)]) == ((3, 0.5),)
