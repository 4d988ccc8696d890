"""The fault matrix: F-1..F-6 x both layouts x five round shapes, each cell checked by digests and audited.

Every cell opens a fresh request in the given log, injects one fault at its point with a
:class:`~specround.statemachine.faults.FaultPlan`, and checks the guarantee of specs/faults.md:

* F-1..F-5: the round is ``ABORTED``, the request's state digest, events and head are exactly as before
  (INV-7); the retried round publishes the same successor as a fault-free reference run.
* F-6: the round is published but ``UNACKNOWLEDGED``; a fresh controller over the same log (the process
  died before the acknowledgement) acknowledges the retried round with the already-published successor and
  appends nothing (INV-6).

Then the request's log audits clean (:func:`specround.audit.run.audit_request`). Round shapes are scripted
so that their outcome does not depend on the uniforms: A = 0, partial acceptance, full acceptance with a
bonus, EOS inside the accepted prefix, and the length cap inside the accepted prefix.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence

import torch
from pydantic import BaseModel, ConfigDict

from specround.adapters.memory_log import MemoryEventLog
from specround.audit.run import audit_request
from specround.errors import InjectedFaultError, SpecroundError
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundStatus

__all__ = [
    "FAULT_MATRIX_SHAPES",
    "FaultCell",
    "FaultMatrixReport",
    "RoundShape",
    "run_fault_matrix",
    "scripted_round",
]

_V = 16
_EOS = 15
_PROMPT = (1, 2, 3)


class RoundShape(BaseModel):
    """A scripted round: drafts, how many are accepted, the terminal token, and the request's budget."""

    model_config = ConfigDict(frozen=True)

    name: str
    drafts: tuple[int, ...]
    accepted: int
    terminal_token: int
    max_new_tokens: int


FAULT_MATRIX_SHAPES: tuple[RoundShape, ...] = (
    RoundShape(name="A=0", drafts=(5, 6, 7), accepted=0, terminal_token=9, max_new_tokens=32),
    RoundShape(name="partial", drafts=(5, 6, 7), accepted=2, terminal_token=9, max_new_tokens=32),
    RoundShape(name="full", drafts=(5, 6, 7), accepted=3, terminal_token=9, max_new_tokens=32),
    RoundShape(name="eos-in-prefix", drafts=(5, _EOS, 7), accepted=3, terminal_token=9, max_new_tokens=32),
    RoundShape(name="length-cap", drafts=(5, 6, 7), accepted=3, terminal_token=9, max_new_tokens=2),
)
"""The round shapes of the matrix (vocabulary 16, EOS = 15)."""


def scripted_round(
    controller: RoundController,
    request_id: str,
    drafts: Sequence[int],
    accepted: int,
    terminal_token: int,
    *,
    dtype: torch.dtype = torch.float64,
    round_id: str | None = None,
) -> RoundInput:
    """A round whose outcome does not depend on the uniforms.

    q rows are one-hot on the drafts; p rows ``1..accepted`` equal them (ratio 1: accepted); p row
    ``accepted + 1`` is one-hot on ``terminal_token`` (ratio 0 for the draft: rejected, and the residual is
    one-hot on ``terminal_token``: the correction); after full acceptance the bonus row is one-hot on it.
    """
    vocab = controller.config(request_id).vocab_size
    k = len(drafts)
    if not 0 <= accepted <= k or (accepted < k and terminal_token == drafts[accepted]):
        raise ValueError("accepted must be in 0..k and a correction must differ from the rejected draft")
    eye = torch.eye(vocab, dtype=dtype)  # [V, V]
    q_rows = eye[list(drafts)] if k else None  # [k, V]
    p_rows = torch.full((k + 1, vocab), 1.0 / vocab, dtype=dtype)  # [k+1, V]
    if accepted:
        p_rows[:accepted] = eye[list(drafts[:accepted])]
    p_rows[accepted] = eye[terminal_token]
    return RoundInput(
        request_id=request_id,
        coordinate_digest=controller.coordinate_digest(request_id),
        draft_ids=tuple(drafts),
        q_rows=q_rows,
        p_rows=p_rows,
        round_id=round_id,
    )


class FaultCell(BaseModel):
    """The outcome of one cell of the matrix."""

    model_config = ConfigDict(frozen=True)

    point: str
    layout: str
    shape: str
    verdict: str
    """``unchanged`` (F-1..F-5 held), ``acknowledged`` (F-6 recovered), or ``FAILED``."""
    audit_clean: bool
    detail: str = ""

    @property
    def ok(self) -> bool:
        """Whether the cell passed."""
        return self.verdict != "FAILED" and self.audit_clean


class FaultMatrixReport(BaseModel):
    """Every cell of the matrix."""

    model_config = ConfigDict(frozen=True)

    log: str
    cells: tuple[FaultCell, ...]

    @property
    def ok(self) -> bool:
        """Whether every cell passed."""
        return all(cell.ok for cell in self.cells)


def _fingerprint(log: EventLog, request_id: str) -> list[tuple[int, str]]:
    return [(e.seq, e.hash) for e in log.events(request_id)]


def _open(controller: RoundController, request_id: str, layout: Layout, shape: RoundShape) -> None:
    controller.open_request(
        _PROMPT,
        seed=7,
        vocab_size=_V,
        layout=layout,
        request_id=request_id,
        max_new_tokens=shape.max_new_tokens,
        stop_token_ids=[_EOS],
    )


def _reference_digest(request_id: str, layout: Layout, shape: RoundShape) -> str:
    controller = RoundController(MemoryEventLog())
    _open(controller, request_id, layout, shape)
    item = scripted_round(controller, request_id, shape.drafts, shape.accepted, shape.terminal_token)
    state = controller.run_round(item).state
    assert state is not None
    return state.digest()


def _run_cell(log: EventLog, point: FaultPoint, layout: Layout, shape: RoundShape, run_id: str) -> FaultCell:
    rid = f"faults/{run_id}/{point.value}/{layout.value}/{shape.name}"
    reference = _reference_digest(rid, layout, shape)
    plan = FaultPlan.at(point, request_ids=[rid], generations=[1])
    controller = RoundController(log, faults=plan)
    _open(controller, rid, layout, shape)
    item = scripted_round(controller, rid, shape.drafts, shape.accepted, shape.terminal_token)
    digest_before = controller.state(rid).digest()
    events_before = _fingerprint(log, rid)
    head_before = log.head(rid)
    [result] = controller.step([item])

    def cell(verdict: str, detail: str = "") -> FaultCell:
        audit = audit_request(log, rid)
        detail = detail or "; ".join(str(f) for f in audit.findings)
        return FaultCell(
            point=point.value,
            layout=layout.value,
            shape=shape.name,
            verdict=verdict,
            audit_clean=audit.ok,
            detail=detail,
        )

    if not isinstance(result.error, InjectedFaultError) or result.error.point != point.value:
        return cell(
            "FAILED",
            f"expected an injected fault at {point.value}, got {result.status.value}: {result.error}",
        )
    if point.before_publication:
        unchanged = (
            result.status is RoundStatus.ABORTED
            and controller.state(rid).digest() == digest_before
            and _fingerprint(log, rid) == events_before
            and log.head(rid) == head_before
        )
        if not unchanged:
            return cell("FAILED", "state, events or head changed after a fault before publication")
        retried = controller.run_round(item)
        if (
            retried.status is not RoundStatus.PUBLISHED
            or retried.state is None
            or retried.state.digest() != reference
        ):
            return cell("FAILED", "the retried round did not publish the reference successor")
        return cell("unchanged")
    if result.status is not RoundStatus.UNACKNOWLEDGED:
        return cell("FAILED", f"F-6 left the round {result.status.value}")
    published = controller.state(rid)
    if published.digest() != reference:
        return cell("FAILED", "the published successor differs from the reference")
    events_published = _fingerprint(log, rid)
    restarted = RoundController(log)  # the acknowledgement never reached the caller; the process restarts
    ack = restarted.run_round(item)
    if (
        ack.status is not RoundStatus.ACKNOWLEDGED
        or ack.state != published
        or _fingerprint(log, rid) != events_published
    ):
        return cell("FAILED", "the retried round was not acknowledged idempotently")
    return cell("acknowledged")


def run_fault_matrix(
    log: EventLog,
    *,
    log_name: str = "log",
    points: Sequence[FaultPoint] = tuple(FaultPoint),
    layouts: Sequence[Layout] = tuple(Layout),
    shapes: Sequence[RoundShape] = FAULT_MATRIX_SHAPES,
    progress: Callable[[FaultCell], None] | None = None,
) -> FaultMatrixReport:
    """Run every cell against ``log`` (fresh request ids per run, so a shared database can be reused)."""
    run_id = uuid.uuid4().hex[:8]
    cells = []
    for point in points:
        for layout in layouts:
            for shape in shapes:
                try:
                    cell = _run_cell(log, point, layout, shape, run_id)
                except SpecroundError as exc:
                    cell = FaultCell(
                        point=point.value,
                        layout=layout.value,
                        shape=shape.name,
                        verdict="FAILED",
                        audit_clean=False,
                        detail=f"{type(exc).__name__}: {exc}",
                    )
                cells.append(cell)
                if progress is not None:
                    progress(cell)
    return FaultMatrixReport(log=log_name, cells=tuple(cells))
