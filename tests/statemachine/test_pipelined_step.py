"""``submit_batch``: decisions before durability, writes in order, failed writes undo what was built on them.

The log is gated with :class:`threading.Event` so that a test decides when each write may run: no sleeps,
no timing.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.audit import audit_log
from specround.errors import LogUnavailableError
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import PublishOutcome, RoundPublication
from specround.statemachine.rounds import RoundStatus
from tests.statemachine._synthetic import log_fingerprint

V, K = 16, 3


class GatedLog(MemoryEventLog):
    """A memory log whose n-th publish waits for its gate and may be told to fail."""

    def __init__(self) -> None:
        super().__init__(clock=lambda: 0.0)
        self.gates: dict[int, threading.Event] = {}
        self.fail: set[int] = set()
        self.calls = 0

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        call = self.calls
        self.calls += 1
        gate = self.gates.get(call)
        if gate is not None:
            assert gate.wait(timeout=60), "a gated write was never released"
        if call in self.fail:
            raise LogUnavailableError(f"write {call} failed (injected)")
        return super().publish(publications)


def _rows(n: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(n, K, V, generator=gen, dtype=torch.float64), dim=-1)  # [B, K, V]
    p = torch.softmax(torch.randn(n, K + 1, V, generator=gen, dtype=torch.float64), dim=-1)  # [B, K+1, V]
    draft_ids = torch.multinomial(q.reshape(n * K, V), 1, generator=gen).reshape(n, K)  # [B, K]
    return draft_ids, torch.full((n,), K, dtype=torch.int64), q, p


def _open(ctl: RoundController, n: int) -> list[str]:
    return [
        ctl.open_request([1, 2], seed=i, max_new_tokens=64, vocab_size=V, request_id=f"r{i}").request_id
        for i in range(n)
    ]


def test_pipelined_steps_publish_exactly_what_synchronous_steps_publish() -> None:
    sync, piped = RoundController(MemoryEventLog(clock=lambda: 0.0)), RoundController(GatedLog())
    ids = _open(sync, 3)
    _open(piped, 3)
    pending = []
    for step in range(6):
        rows = _rows(3, step)
        expected = sync.step_batch(ids, *rows)
        handed = piped.submit_batch(ids, *rows)  # opened on the staged successors of the step before
        assert handed.emitted_ids.tolist() == expected.emitted_ids.tolist()
        assert handed.keep.tolist() == expected.keep.tolist()
        assert handed.new_frontier.tolist() == expected.new_frontier.tolist()
        pending.append((handed, expected))
    for handed, expected in pending:
        durable = handed.wait()
        assert [r.state for r in durable] == [r.state for r in expected]
        assert durable.published.all() and (durable.rollback_to == -1).all()
    assert log_fingerprint(piped.log) == log_fingerprint(sync.log)
    assert audit_log(piped.log).ok


def test_the_engine_gets_the_decision_before_the_write_is_durable() -> None:
    log = GatedLog()
    log.gates[0] = threading.Event()
    ctl = RoundController(log)
    ids = _open(ctl, 2)
    first = ctl.submit_batch(ids, *_rows(2, 0))
    assert not first.done and first.submitted == [True, True]
    assert len(list(log.events())) == 2  # the two request_opened events: nothing of the round is durable yet
    staged = [ctl.state(rid) for rid in ids]
    assert [s.generation for s in staged] == [1, 1]  # the next round opens on the staged successor
    second = ctl.submit_batch(ids, *_rows(2, 1))
    log.gates[0].set()
    assert second.wait().published.all() and first.done
    assert [ctl.state(rid).generation for rid in ids] == [2, 2]
    assert audit_log(log).ok


def test_a_failed_write_aborts_the_rounds_built_on_it_and_rolls_their_requests_back() -> None:
    log = GatedLog()
    ctl = RoundController(log)
    ids = _open(ctl, 3)
    ctl.step_batch(ids, *_rows(3, 0))  # write 0: generation 1 for all, durable
    durable = {rid: ctl.state(rid) for rid in ids}
    log.gates[1] = threading.Event()
    log.fail.add(1)
    failing = ctl.submit_batch(ids[:2], *_rows(2, 1))  # write 1 will fail
    built_on_it = ctl.submit_batch(ids, *_rows(3, 2))  # write 2: r0, r1 on the failed round; r2 on durable
    log.gates[1].set()
    lost = failing.wait()
    assert [r.status for r in lost] == [RoundStatus.ABORTED, RoundStatus.ABORTED]
    assert lost.rollback_to.tolist() == [len(durable[r].cache) for r in ids[:2]]
    after = built_on_it.wait()
    assert [r.status for r in after] == [RoundStatus.ABORTED, RoundStatus.ABORTED, RoundStatus.PUBLISHED]
    assert after.rollback_to.tolist()[:2] == [len(durable[r].cache) for r in ids[:2]]
    assert int(after.rollback_to[2]) == -1
    assert [ctl.state(r) for r in ids[:2]] == [durable[r] for r in ids[:2]]  # back to the durable state
    assert ctl.state(ids[2]).generation == 2
    again = ctl.submit_batch(ids, *_rows(3, 3)).wait()  # the rolled-back requests continue from there
    assert again.published.all()
    assert [ctl.state(r).generation for r in ids] == [2, 2, 3]
    assert audit_log(log).ok
    fresh = RoundController(log)  # and a controller rebuilt from the log agrees
    assert [fresh.state(r) for r in ids] == [ctl.state(r) for r in ids]


def test_a_synchronous_step_waits_for_the_submitted_ones() -> None:
    log = GatedLog()
    ctl = RoundController(log)
    ids = _open(ctl, 2)
    handed = ctl.submit_batch(ids, *_rows(2, 0))
    out = ctl.step_batch(ids, *_rows(2, 1))  # drains the writer first: its write comes second
    assert handed.done and handed.wait().published.all() and out.published.all()
    assert [ctl.state(r).generation for r in ids] == [2, 2]
    ctl.close()


def test_a_round_aborted_at_f5_hands_the_engine_no_decision() -> None:
    """F-5 fires while the write is handed over: that row must carry no K/V instruction to act on."""
    from specround.statemachine.faults import FaultPlan, FaultPoint

    plan = FaultPlan.at(FaultPoint.BEFORE_PUBLICATION, request_ids=["r1"])
    ctl = RoundController(MemoryEventLog(), faults=plan)
    ids = _open(ctl, 3)
    pending = ctl.submit_batch(ids, *_rows(3, seed=4))
    assert plan.fired
    assert pending.submitted == [True, False, True]
    assert pending.decisions[1] is None and pending.decisions[0] is not None
    assert int(pending.keep[1]) == 0
    results = pending.wait()
    assert [r.status for r in results] == [RoundStatus.PUBLISHED, RoundStatus.ABORTED, RoundStatus.PUBLISHED]
    assert ctl.state("r1").generation == 0


def test_a_step_whose_every_round_aborts_at_f5_hands_over_nothing() -> None:
    from specround.statemachine.faults import FaultPlan, FaultPoint

    plan = FaultPlan.at(FaultPoint.BEFORE_PUBLICATION, times=None)
    ctl = RoundController(MemoryEventLog(), faults=plan)
    ids = _open(ctl, 2)
    pending = ctl.submit_batch(ids, *_rows(2, seed=5))
    assert pending.done and pending.decisions == (None, None)
    assert [r.status for r in pending.wait()] == [RoundStatus.ABORTED, RoundStatus.ABORTED]


def test_a_retried_round_that_becomes_durable_is_a_parent_again() -> None:
    """Round ids are derived, so a retry reuses the failed round's id; once durable, rounds built on it
    are written, not dropped as built on a failure."""
    log = GatedLog()
    log.fail = {0}
    ctl = RoundController(log)
    ids = _open(ctl, 2)
    rows = _rows(2, seed=6)
    first = ctl.submit_batch(ids, *rows).wait()
    assert [r.status for r in first] == [RoundStatus.ABORTED, RoundStatus.ABORTED]
    gate = log.gates[1] = threading.Event()  # the retry's write waits until the child is submitted
    retry = ctl.submit_batch(ids, *rows)  # the same rows from the same state: the same round ids
    child = ctl.submit_batch(ids, *_rows(2, seed=7))  # built on the retry while its write is pending
    gate.set()
    assert [r.round_id for r in retry.wait()] == [r.round_id for r in first]
    assert all(r.status is RoundStatus.PUBLISHED for r in retry.wait())
    assert all(r.status is RoundStatus.PUBLISHED for r in child.wait())
    assert audit_log(log).ok
