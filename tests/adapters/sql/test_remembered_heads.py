"""The SQL log publishes on the head it left itself, and reads the head when another writer moved it.

A log remembers the head it committed last for each request (and the head it wrote when it opened one).
A publication that extends every remembered head is written without reading the ``requests`` rows; a head
that another writer has moved since makes the first attempt lose (the round's unique key, or the
compare-and-swap), and the call is decided again on the heads read inside its transaction.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import event

from specround.adapters.sql import SqlEventLog
from specround.statemachine.ports import PublishStatus
from tests.adapters.eventlog_contract import PUBLISHED, assert_chains_verify, opened
from tests.adapters.synthetic_rounds import build_round, run_rounds


class _HeadReads:
    """Counts the statements that read the ``requests`` table while publishing."""

    def __init__(self, log: SqlEventLog) -> None:
        self.count = 0
        event.listen(log.engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        text = " ".join(statement.split()).upper()
        if text.startswith("SELECT") and " FROM REQUESTS" in text:
            self.count += 1


def test_a_log_publishes_on_the_heads_it_left_without_reading_them(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg_a, state_a = opened(log, "req-a", max_new_tokens=60)
    cfg_b, state_b = opened(log, "req-b", max_new_tokens=60)
    reads = _HeadReads(log)
    pairs = zip(run_rounds(cfg_a, state_a, 3), run_rounds(cfg_b, state_b, 3), strict=True)
    for (first, _), (second, _) in pairs:
        assert [o.status for o in log.publish([first, second])] == [PUBLISHED, PUBLISHED]
    assert reads.count == 0
    assert log.head("req-a").generation == 3  # type: ignore[union-attr]
    assert assert_chains_verify(log) == {"req-a": 16, "req-b": 16}
    log.close()


def test_a_head_moved_by_another_writer_is_read_again(log_url: str) -> None:
    ours = SqlEventLog.open(log_url)
    theirs = SqlEventLog.open(log_url, create=False)
    cfg, state = opened(ours, "req-a", max_new_tokens=60)
    first, after_first = build_round(cfg, state)
    assert ours.publish([first])[0].status is PUBLISHED
    second, after_second = build_round(cfg, after_first)
    assert theirs.publish([second])[0].status is PUBLISHED  # the head moves behind our back
    reads = _HeadReads(ours)

    # Our remembered head says generation 1: a different round 2 would win there, but the log is at 2.
    rival, _ = build_round(cfg, after_first, variant=1)
    [outcome] = ours.publish([rival])
    assert (outcome.status, outcome.generation) == (PublishStatus.STALE_GENERATION, 2)
    assert reads.count >= 1  # decided on the head read in the transaction

    # A round built on their round 2 loses on our remembered head, and wins on the one read.
    third, _ = build_round(cfg, after_second)
    [outcome] = ours.publish([third])
    assert (outcome.status, outcome.generation) == (PUBLISHED, 3)
    assert ours.head("req-a").generation == 3  # type: ignore[union-attr]
    assert assert_chains_verify(ours) == {"req-a": 16}
    ours.close()
    theirs.close()
