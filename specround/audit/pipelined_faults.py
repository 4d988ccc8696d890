"""Fault cells of the pipelined publication: a write that fails, or loses the fence, while the next step runs.

:meth:`~specround.statemachine.controller.RoundController.submit_batch` hands step t's group commit to the
writer thread and lets the engine submit step t + 1 on t's staged successors before t is durable. Each cell
gates the log (:class:`GatedLog`) so that t's write runs only once t + 1 has been submitted, then checks the
guarantee of specs/faults.md ("Pipelined publication"):

``write fails``
    t's transaction fails: t and t + 1 (built on it) are ``ABORTED``, the request is back at its durable
    state (digest, events and head as before t), ``rollback_to`` names its durable cache length, and a retry
    from there publishes the reference successor.
``write conflicts``
    another writer publishes a different round of the request first: t loses the fence, t + 1 is aborted,
    and after :meth:`~specround.statemachine.controller.RoundController.refresh` the request is at the
    other writer's published state.
``F-5 in flight``
    t + 1 hits F-5 while t's write is running: t publishes, t + 1 alone is aborted, and its retry publishes.
``ack lost in flight``
    t hits F-6 (published, acknowledgement lost) with t + 1 in flight: t is ``UNACKNOWLEDGED`` but durable,
    so t + 1, built on it, publishes.

Every cell ends with the request's log auditing clean. Shapes and layouts are those of the fault matrix.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence

import torch

from specround.audit.fault_matrix import FAULT_MATRIX_SHAPES, FaultCell, RoundShape, scripted_round
from specround.audit.run import audit_request
from specround.errors import LogUnavailableError, SpecroundError
from specround.sampling.types import Layout
from specround.statemachine.controller import PendingStep, RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.forwarding_log import ForwardingLog
from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication
from specround.statemachine.rounds import RoundInput, RoundStatus

__all__ = ["PIPELINED_CELLS", "GatedLog", "run_pipelined_faults", "submit_round", "submit_rounds"]

PIPELINED_CELLS = ("write fails", "write conflicts", "F-5 in flight", "ack lost in flight")
"""The pipelined fault cells (the ``point`` column of their :class:`FaultCell`)."""

_V, _EOS, _PROMPT = 16, 15, (1, 2, 3)
_GATE_TIMEOUT_S = 60.0


class GatedLog(ForwardingLog):
    """An :class:`EventLog` whose next ``publish`` waits for :meth:`release` and may be told to fail."""

    def __init__(self, inner: EventLog) -> None:
        """Wrap ``inner``; publishes pass straight through until :meth:`hold` is called."""
        super().__init__(inner)
        self._gate: threading.Event | None = None
        self._held: threading.Event | None = None
        self._fail = False

    def hold(self, *, fail: bool = False) -> None:
        """Make the next publish wait for :meth:`release` (and then raise, if ``fail``)."""
        self._gate = self._held = threading.Event()
        self._fail = fail

    def release(self) -> None:
        """Let the held publish go on (whether or not it has reached the gate yet)."""
        if self._held is not None:
            self._held.set()
            self._held = None

    def disarm(self) -> None:
        """Drop a hold that no publish reached (the held step never wrote); the next publish passes.

        Call it only once every submitted write has settled.
        """
        self._gate, self._fail = None, False
        self.release()

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Wait at the gate if one is set; fail if told to; otherwise forward."""
        gate, fail = self._gate, self._fail
        self._gate, self._fail = None, False
        if gate is not None and not gate.wait(_GATE_TIMEOUT_S):
            raise LogUnavailableError("a held write was never released")
        if fail:
            raise LogUnavailableError("the write failed (injected)")
        return self.inner.publish(publications)

    def close(self) -> None:
        """Does not close the wrapped log (its owner does)."""


def submit_round(controller: RoundController, item: RoundInput) -> PendingStep:
    """Submit one per-request round as a pipelined batch of one."""
    return submit_rounds(controller, [item])


def submit_rounds(controller: RoundController, items: Sequence[RoundInput]) -> PendingStep:
    """Submit per-request rounds (one per request, rows of one dtype) as one pipelined batch.

    Drafts and rows are padded to the widest round; the controller reads no row beyond a round's own drafts
    and bonus row, so the padding (uniform rows, draft id 0) is never read.
    """
    width = max(len(item.draft_ids) for item in items)
    vocab = items[0].p_rows.shape[-1]
    pad = torch.full((vocab,), 1.0 / vocab, dtype=items[0].p_rows.dtype)
    draft_ids = torch.zeros(len(items), width, dtype=torch.int64)  # [B, K]
    q = pad.repeat(len(items), width, 1)  # [B, K, V]
    p = pad.repeat(len(items), width + 1, 1)  # [B, K+1, V]
    for b, item in enumerate(items):
        k = len(item.draft_ids)
        draft_ids[b, :k] = torch.tensor(list(item.draft_ids), dtype=torch.int64)
        if item.q_rows is not None:
            q[b, :k] = item.q_rows
        p[b, : k + 1] = item.p_rows
    return controller.submit_batch(
        [item.request_id for item in items],
        draft_ids,
        torch.tensor([len(item.draft_ids) for item in items]),
        q,
        p,
        coordinate_digests=[item.coordinate_digest for item in items],
        proposal_draws=[item.proposal_draws for item in items],
        round_ids=[item.round_id for item in items],
    )


def _fingerprint(log: EventLog, request_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.hash) for e in log.events(request_id)]


class _Cell:
    """One cell's request, controller and scripted rounds."""

    def __init__(
        self,
        log: EventLog,
        kind: str,
        layout: Layout,
        shape: RoundShape,
        run_id: str,
        faults: FaultPlan | None,
    ) -> None:
        self.rid = f"pipelined/{run_id}/{kind}/{layout.value}/{shape.name}"
        self.log = log
        self.gated = GatedLog(log)
        self.shape = shape
        self.layout = layout
        self.controller = RoundController(self.gated, faults=faults)
        self.open(self.controller)

    def open(self, controller: RoundController) -> None:
        controller.open_request(
            _PROMPT,
            seed=7,
            vocab_size=_V,
            layout=self.layout,
            request_id=self.rid,
            max_new_tokens=self.shape.max_new_tokens,
            stop_token_ids=[_EOS],
        )

    def first(self, controller: RoundController | None = None) -> RoundInput:
        ctl = controller or self.controller
        return scripted_round(
            ctl, self.rid, self.shape.drafts, self.shape.accepted, self.shape.terminal_token
        )

    def second(self) -> RoundInput | None:
        """Round t + 1 on the staged successor of t (None when t finished the request)."""
        if self.controller.state(self.rid).finished:
            return None
        return scripted_round(self.controller, self.rid, (4, 3), 1, 2)

    def reference(self, rounds: int) -> str:
        """The state digest a fault-free synchronous run reaches after ``rounds`` rounds."""
        controller = RoundController(_memory_log())
        self.open(controller)
        for index in range(rounds):
            if controller.state(self.rid).finished:
                break
            item = (
                self.first(controller) if index == 0 else scripted_round(controller, self.rid, (4, 3), 1, 2)
            )
            controller.run_round(item)
        return controller.state(self.rid).digest()


def _memory_log() -> EventLog:
    from specround.adapters.memory_log import MemoryEventLog

    return MemoryEventLog()


def _write_fails(cell: _Cell) -> str:
    ctl, rid = cell.controller, cell.rid
    durable, events, head = ctl.state(rid), _fingerprint(cell.log, rid), cell.log.head(rid)
    cell.gated.hold(fail=True)
    first = submit_round(ctl, cell.first())
    second_item = cell.second()
    second = submit_round(ctl, second_item) if second_item is not None else None
    cell.gated.release()
    lost = first.wait()
    if lost[0].status is not RoundStatus.ABORTED:
        return f"the failed write left round t {lost[0].status.value}"
    if int(lost.rollback_to[0]) != len(durable.cache):
        return f"rollback_to {int(lost.rollback_to[0])}, the durable cache holds {len(durable.cache)}"
    if second is not None and second.wait()[0].status is not RoundStatus.ABORTED:
        return "round t + 1, built on the failed write, was not aborted"
    if ctl.state(rid) != durable or _fingerprint(cell.log, rid) != events or cell.log.head(rid) != head:
        return "state, events or head changed after the failed write"
    retried = ctl.step([cell.first()])[0]
    if retried.state is None or retried.state.digest() != cell.reference(1):
        return "the retried round did not publish the reference successor"
    return ""


def _write_conflicts(cell: _Cell) -> str:
    ctl, rid = cell.controller, cell.rid
    other = RoundController(cell.log)  # a second writer of the same request
    rival = scripted_round(other, rid, (8,), 0, 10)
    cell.gated.hold()
    first = submit_round(ctl, cell.first())
    second_item = cell.second()
    second = submit_round(ctl, second_item) if second_item is not None else None
    won = other.step([rival])[0]
    cell.gated.release()
    if won.status is not RoundStatus.PUBLISHED:
        return f"the rival round was {won.status.value}"
    if first.wait()[0].status is not RoundStatus.ABORTED:
        return "round t published over the rival's round"
    if second is not None and second.wait()[0].status is not RoundStatus.ABORTED:
        return "round t + 1, built on the fenced-out round, was not aborted"
    if ctl.refresh(rid) != other.state(rid):
        return "after refresh the request is not at the rival's published state"
    return ""


def _f5_in_flight(cell: _Cell) -> str:
    ctl, rid = cell.controller, cell.rid
    cell.gated.hold()
    first = submit_round(ctl, cell.first())
    second_item = cell.second()
    if second_item is None:
        cell.gated.release()
        return "" if first.wait()[0].status is RoundStatus.PUBLISHED else "round t did not publish"
    second = submit_round(ctl, second_item)  # F-5 (generation 2) aborts it before its write is handed over
    cell.gated.release()
    if first.wait()[0].status is not RoundStatus.PUBLISHED:
        return "round t did not publish"
    failed = second.wait()[0]
    if failed.status is not RoundStatus.ABORTED or int(second.wait().rollback_to[0]) != -1:
        return f"round t + 1 was {failed.status.value} (expected aborted before its write, no rollback)"
    retried = ctl.step([scripted_round(ctl, rid, (4, 3), 1, 2)])[0]
    if retried.state is None or retried.state.digest() != cell.reference(2):
        return "the retried round t + 1 did not publish the reference successor"
    return ""


def _ack_lost_in_flight(cell: _Cell) -> str:
    ctl = cell.controller
    cell.gated.hold()
    first = submit_round(ctl, cell.first())
    second_item = cell.second()
    second = submit_round(ctl, second_item) if second_item is not None else None
    cell.gated.release()
    if first.wait()[0].status is not RoundStatus.UNACKNOWLEDGED:
        return "round t was not left unacknowledged by F-6"
    if second is not None:
        after = second.wait()[0]
        if after.status is not RoundStatus.PUBLISHED:
            return f"round t + 1, built on a durable round, was {after.status.value}"
        if after.state is None or after.state.digest() != cell.reference(2):
            return "round t + 1 did not publish the reference successor"
    return ""


_CHECKS: dict[str, tuple[Callable[[_Cell], str], FaultPoint | None, int]] = {
    "write fails": (_write_fails, None, 0),
    "write conflicts": (_write_conflicts, None, 0),
    "F-5 in flight": (_f5_in_flight, FaultPoint.BEFORE_PUBLICATION, 2),
    "ack lost in flight": (_ack_lost_in_flight, FaultPoint.AFTER_PUBLICATION, 1),
}


def run_pipelined_faults(
    log: EventLog,
    *,
    layouts: Sequence[Layout] = tuple(Layout),
    shapes: Sequence[RoundShape] = FAULT_MATRIX_SHAPES,
    progress: Callable[[FaultCell], None] | None = None,
) -> list[FaultCell]:
    """Run every pipelined cell against ``log`` (fresh request ids per run)."""
    run_id = uuid.uuid4().hex[:8]
    cells = []
    for kind in PIPELINED_CELLS:
        check, point, generation = _CHECKS[kind]
        for layout in layouts:
            for shape in shapes:
                rid_faults = None
                detail = ""
                cell: _Cell | None = None
                try:
                    if point is not None:
                        rid = f"pipelined/{run_id}/{kind}/{layout.value}/{shape.name}"
                        rid_faults = FaultPlan.at(point, request_ids=[rid], generations=[generation])
                    cell = _Cell(log, kind, layout, shape, run_id, rid_faults)
                    detail = check(cell)
                    cell.controller.close()
                except SpecroundError as exc:
                    detail = f"{type(exc).__name__}: {exc}"
                audit = audit_request(log, cell.rid) if cell is not None else None
                clean = audit is not None and audit.ok
                if audit is not None and not detail and not clean:
                    detail = "; ".join(str(f) for f in audit.findings)
                result = FaultCell(
                    point=kind,
                    layout=layout.value,
                    shape=shape.name,
                    verdict="FAILED" if detail else "held",
                    audit_clean=clean,
                    detail=detail,
                )
                cells.append(result)
                if progress is not None:
                    progress(result)
    return cells
