"""What a caller hands the controller for a round, and what it gets back (the embedding API's records).

A round's inputs arrive in two parts, matching the lifecycle: a :class:`RoundProposal` (drafts and the q rows
that sampled them, bound to the round coordinate's digest) opens the round in ``ROUND_READY``; a
:class:`RoundVerification` (the target's processed p rows and an opaque branch-K/V handle) moves it to
``VERIFIED_TEMPORARY``. :class:`RoundInput` carries both for the one-call ``step``.

A :class:`RoundResult` says what happened and, for a published round, exactly what the model adapter must do
with the branch K/V (:class:`KvInstruction`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import torch

from specround.errors import SpecroundError
from specround.sampling.types import Layout
from specround.statemachine.events import RoundTimings
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.state import FinishReason, RequestState, SpeculativeCommit, TerminalName

__all__ = [
    "KvInstruction",
    "RoundInput",
    "RoundProposal",
    "RoundResult",
    "RoundStatus",
    "RoundVerification",
]


@dataclass(frozen=True, slots=True)
class RoundProposal:
    """Open a round: drafts d_1..d_k and the processed q rows that actually sampled them."""

    request_id: str
    coordinate_digest: str
    """Digest of the round coordinate the proposal was made for (``RoundController.coordinate``)."""
    draft_ids: Sequence[int] | torch.Tensor
    """[k] draft token ids (k may be 0: plain target sampling)."""
    q_rows: torch.Tensor | None
    """[k, V] float probabilities; ``q_rows[i, d_i] > 0``. May be None when k = 0."""
    proposal_draws: int = 0
    """PROPOSAL uniforms the proposer consumed (counters ``R.proposal + [0, proposal_draws)``)."""
    round_id: str | None = None
    """Caller-chosen round id; by default derived from the coordinate digest and the drafts, so that
    re-submitting the same round (a retry) names the same transaction. Ids of the derived form
    (``g<generation>-<16 hex>``, :mod:`specround.statemachine.round_ids`) are reserved: one that is not
    this round's derived id is refused."""
    timings: RoundTimings | None = None
    """Optional wall-time ledger of the round (contract#time-ledger), logged with the publication."""


@dataclass(frozen=True, slots=True)
class RoundVerification:
    """Hand in the target side of a round: the processed p rows and the branch K/V handle."""

    request_id: str
    p_rows: torch.Tensor
    """[k+1, V] float probabilities: p_1..p_k along the drafts and the bonus row p_{k+1}."""
    branch: Any = None
    """Opaque handle of the branch K/V rows (returned in the :class:`KvInstruction`)."""
    verify_rows: int | None = None
    """Target input rows the verification computed; default k+1 (replay_frontier) or k (retained)."""


@dataclass(frozen=True, slots=True)
class RoundInput:
    """Both halves of a round, for :meth:`RoundController.step` and :meth:`RoundController.run_round`."""

    request_id: str
    coordinate_digest: str
    draft_ids: Sequence[int] | torch.Tensor
    """[k] draft token ids."""
    q_rows: torch.Tensor | None
    """[k, V] processed proposal rows (None when k = 0)."""
    p_rows: torch.Tensor
    """[k+1, V] processed target rows."""
    branch: Any = None
    proposal_draws: int = 0
    verify_rows: int | None = None
    round_id: str | None = None
    timings: RoundTimings | None = None

    def proposal(self) -> RoundProposal:
        """The proposal half."""
        return RoundProposal(
            request_id=self.request_id,
            coordinate_digest=self.coordinate_digest,
            draft_ids=self.draft_ids,
            q_rows=self.q_rows,
            proposal_draws=self.proposal_draws,
            round_id=self.round_id,
            timings=self.timings,
        )

    def verification(self) -> RoundVerification:
        """The verification half."""
        return RoundVerification(
            request_id=self.request_id, p_rows=self.p_rows, branch=self.branch, verify_rows=self.verify_rows
        )


class RoundStatus(StrEnum):
    """The outcome of one round as the caller sees it."""

    PUBLISHED = "published"
    """This call published the round: the successor is authoritative."""
    ACKNOWLEDGED = "acknowledged"
    """The same transaction had already been published; nothing was appended and the already-published
    successor is returned (idempotent acknowledgement, INV-6)."""
    ABORTED = "aborted"
    """Nothing was published; the round-start state S_0 remains authoritative (INV-7). ``error`` says why."""
    UNACKNOWLEDGED = "unacknowledged"
    """The round was published but a failure after publication (F-6) kept the acknowledgement from the
    caller: retry the same round to receive it (``error`` holds the failure)."""


@dataclass(frozen=True, slots=True)
class KvInstruction:
    """What the model adapter must do with a round's branch K/V rows.

    The branch's *logical* rows are ``[F_0, d_1..d_k]`` in both layouts (row 0 is the replayed frontier
    under ``replay_frontier`` and the retained frontier row under ``retained_frontier``). Commit the first
    ``keep`` rows, discard the rest (INV-5). ``keep == 0`` means: discard the branch, commit nothing (an
    aborted round; a retained frontier row stays retained).
    """

    layout: Layout
    branch: Any
    """The handle handed in with the verification."""
    keep: int
    """Leading logical rows to commit: the frontier row plus the accepted drafts that are not the final
    emitted token (``len(emitted)`` for a published round)."""
    committed_token_ids: tuple[int, ...]
    """Token ids of rows ``0 .. keep-1``."""
    discarded_rows: tuple[int, ...]
    """Logical row indices ``keep .. k`` that must never be committed."""
    discarded_token_ids: tuple[int, ...]
    """Their token ids (the rejected draft and every later one, or the rows after a stop)."""
    new_frontier: int | None
    """The emitted token that has no row yet (None for an aborted round)."""
    new_frontier_position: int | None
    """Its absolute position, ``len(C)`` after the round."""
    materialize_frontier: bool
    """Under ``retained_frontier`` for an unfinished request: compute and retain the new frontier's row
    before the next round (``TargetModel.materialize_frontier``)."""


@dataclass(frozen=True, slots=True)
class RoundResult:
    """The outcome of one round."""

    request_id: str
    round_id: str | None
    """None when the round was refused before an id was assigned."""
    status: RoundStatus
    phase: RoundPhase
    """The round's last lifecycle phase (``PUBLISHED`` or ``ABORTED``)."""
    generation: int
    """The request's generation the caller should now hold (the published one, or the unchanged one);
    -1 when the proposal named a request the controller could not resolve."""
    state: RequestState | None
    """The published successor (PUBLISHED/ACKNOWLEDGED), else None."""
    emitted_ids: tuple[int, ...] = ()
    accepted: int = 0
    """Drafts emitted as accepted (A, or the stop distance when a stop inside the prefix ended it)."""
    terminal: TerminalName | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    kv: KvInstruction | None = None
    commit: SpeculativeCommit | None = None
    error: SpecroundError | None = None

    @property
    def ok(self) -> bool:
        """Whether the caller holds a published successor (PUBLISHED or ACKNOWLEDGED)."""
        return self.status in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)

    def raise_for_error(self) -> RoundResult:
        """Return self when ok; raise the recorded error otherwise."""
        if self.error is not None:
            raise self.error
        return self
