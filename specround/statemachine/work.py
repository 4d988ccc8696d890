"""The controller's working records: the live projection of a request and the work of one round.

Mutable and internal to the controller and its steps; nothing here leaves them (callers get
:class:`~specround.statemachine.rounds.RoundResult` and frozen states).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specround.errors import SpecroundError
from specround.statemachine.events import RoundDecided, RoundTimings
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.ports import RoundPublication
from specround.statemachine.rounds import RoundResult
from specround.statemachine.staging import KvStaging, RequestSnapshot
from specround.statemachine.state import RequestConfig, SpeculativeCommit
from specround.statemachine.uniform_cache import UniformWindow

__all__ = ["LastRound", "LiveRequest", "RoundWork"]


@dataclass(slots=True)
class LastRound:
    """The most recently published round of a request (what a retry of it needs)."""

    start: RequestSnapshot
    coordinate_digest: str
    round_id: str


@dataclass(slots=True)
class LiveRequest:
    """The live projection of one request."""

    config: RequestConfig
    current: RequestSnapshot
    target_config_digest: str
    has_stop_automaton: bool
    last: LastRound | None = None
    coordinate_digest: str | None = None
    """Cached digest of ``current``'s coordinate (reset whenever ``current`` changes)."""
    in_flight: bool = False
    durable: RequestSnapshot | None = None
    """While pipelined writes are pending: the last durable snapshot (``current`` is staged ahead of it)."""
    durable_last: LastRound | None = None
    """``last`` as of ``durable``."""
    pending: int = 0
    """Pipelined rounds of this request submitted to the writer and not settled yet."""
    epoch: int = 0
    """Bumped whenever a failed pipelined write rolls ``current`` back to ``durable``."""
    tip: tuple[str, str] | None = None
    """(request id, round id) of the pending round whose staged successor ``current`` is, if any."""
    uniforms: UniformWindow | None = None
    """Precomputed ACCEPT/TERMINAL uniforms of this request (:mod:`.uniform_cache`)."""


@dataclass(slots=True)
class RoundWork:
    """The working record of one round inside a step (mutable; never leaves the controller)."""

    index: int
    request_id: str
    live: LiveRequest
    start: RequestSnapshot
    retry: bool
    coordinate_digest: str
    round_id: str
    draft_ids: tuple[int, ...]
    q_rows: torch.Tensor  # [k, V]
    proposal_draws: int
    timings: RoundTimings | None
    batch_row: int = -1
    """Row of the step's batch tensors (``step_batch``); -1 when the round carries its own rows."""
    pipelined: bool = False
    """Submitted to the writer ahead of its durable write (the request's ``current`` already moved on)."""
    epoch: int = 0
    """The request's epoch when the round was opened (the state it was built on)."""
    phase: RoundPhase = RoundPhase.ROUND_READY
    error: SpecroundError | None = None
    p_rows: torch.Tensor | None = None  # [k+1, V]
    branch: Any = None
    verify_rows: int = 0
    decided: RoundDecided | None = None
    p_draft: tuple[float, ...] = ()
    q_draft: tuple[float, ...] = ()
    kv: KvStaging | None = None
    successor: RequestSnapshot | None = None
    rng_after: tuple[int, int, int] | None = None
    """The staged RNG counters (proposal, accept, terminal)."""
    row_digests: tuple[str | None, str | None] | None = None
    """Digests of the round's q and p rows, when the controller logs them (read while staging)."""
    commit: SpeculativeCommit | None = None
    publication: RoundPublication | None = None
    result: RoundResult | None = None

    @property
    def generation(self) -> int:
        """The generation this round would publish."""
        return self.start.state.generation + 1
