"""Every call :mod:`specround.hf` makes to the round controller, in one place.

The transformers path opens one request per batch row and hands each step's rounds to the controller as ONE
batch (one batched decision, one group commit). :meth:`ControllerBridge.submit` is the pipelined form
(``submit_batch``): the decisions come back at once and the group commit runs on the controller's writer
thread while the engine runs its next forwards; :meth:`ControllerBridge.settle` waits until every submitted
round is durable, so nothing is released before its round is in the log. Nothing else in
:mod:`specround.hf` touches the controller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from specround.errors import InvalidRequestError, SpecroundError
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.types import PAD_ID, Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.state import FinishReason, RequestState, TerminalName
from specround.statemachine.step_result import TERMINAL_CODES, PendingStep

__all__ = ["BRIDGE_LAYOUT", "ControllerBridge", "RoundRequest", "StagedRound"]

BRIDGE_LAYOUT = Layout.REPLAY_FRONTIER
"""The one layout the transformers path verifies in: its batch cache keeps no retained frontier row."""

_DELIVERED = (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)
_TERMINAL_NAMES: dict[int, TerminalName] = {
    code: cast(TerminalName, name) for name, code in TERMINAL_CODES.items()
}


class RoundRequest:
    """One row's round as the bridge hands it to the controller."""

    __slots__ = (
        "branch",
        "draft_ids",
        "p_rows",
        "proposal_draws",
        "q_rows",
        "request_id",
        "timings",
        "verify_rows",
    )

    def __init__(
        self,
        request_id: str,
        draft_ids: Sequence[int],
        q_rows: torch.Tensor | None,
        p_rows: torch.Tensor,
        *,
        proposal_draws: int,
        verify_rows: int,
        timings: RoundTimings | None = None,
        branch: Any = None,
    ) -> None:
        self.request_id = request_id
        """The row's request id."""
        self.draft_ids = tuple(int(t) for t in draft_ids)
        """The drafts verified."""
        self.q_rows = q_rows
        """[k, V] the distributions the drafts were drawn from (None when k = 0)."""
        self.p_rows = p_rows
        """[k + 1, V] the target's processed rows along the drafts."""
        self.proposal_draws = proposal_draws
        """PROPOSAL uniforms the drafts used."""
        self.verify_rows = verify_rows
        """Target rows computed for the round."""
        self.timings = timings
        """The round's share of the step's wall time."""
        self.branch = branch
        """An opaque handle echoed in the K/V instruction."""


@dataclass(frozen=True, slots=True)
class StagedRound:
    """One row's decided round as the engine needs it for its next forward (durable once settled)."""

    emitted_ids: tuple[int, ...]
    accepted: int
    terminal: TerminalName
    finished: bool
    keep: int
    """Branch K/V rows (of the round's ``[F, d_1..d_k]``) to commit."""
    state: RequestState
    """The request's staged successor state."""
    reached: int
    """Accept tests the round used."""

    @property
    def generation(self) -> int:
        """The generation the round publishes."""
        return self.state.generation

    @property
    def finish_reason(self) -> FinishReason | None:
        """Why the request finished (None while it runs)."""
        return self.state.finish_reason


class ControllerBridge:
    """A :class:`RoundController` over one event log, seen through the calls the transformers path needs."""

    def __init__(self, log: EventLog) -> None:
        self._controller = RoundController(log)
        self._pending: deque[PendingStep] = deque()

    def open_request(
        self,
        prompt_ids: Sequence[int],
        *,
        seed: int,
        max_new_tokens: int,
        chain: ProcessorChain,
        stop_token_ids: Iterable[int],
        coordinate: Mapping[str, Any],
        request_id: str | None = None,
    ) -> RequestState:
        """Open one row's request (replay layout) and log its ``request_opened``."""
        return self._controller.open_request(
            list(prompt_ids),
            seed=seed,
            max_new_tokens=max_new_tokens,
            processors=chain,
            layout=BRIDGE_LAYOUT,
            stop_token_ids=stop_token_ids,
            request_id=request_id,
            coordinate=coordinate,
        )

    def processors(self, request_id: str) -> ProcessorChain:
        """A clone of the request's published processor chain."""
        return self._controller.processors(request_id)

    def step(self, rounds: Sequence[RoundRequest]) -> list[RoundResult]:
        """Publish the rounds of one step as ONE batched controller step (results in input order).

        The rows are padded once into the batch tensors of
        :meth:`~specround.statemachine.controller.RoundController.step_batch` (drafts [B, K], q [B, K, V],
        p [B, K+1, V]); each row is bound to its request's current coordinate.
        """
        if not rounds:
            return []
        return self._controller.step_batch(*_batch_tensors(rounds), **_batch_keywords(rounds)).results()

    def submit(self, rounds: Sequence[RoundRequest]) -> list[StagedRound]:
        """Decide the rounds of one step as ONE batch and queue their group commit (pipelined).

        Returns each row's staged round in input order; every request moves on to its staged successor
        (:meth:`state`, :meth:`processors` and :meth:`remaining` answer for it). A row refused before
        staging, or an earlier submitted step that did not become durable, raises its error here; call
        :meth:`settle` before releasing any token.
        """
        if not rounds:
            return []
        before = [self._controller.state(r.request_id) for r in rounds]
        pending = self._controller.submit_batch(*_batch_tensors(rounds), **_batch_keywords(rounds))
        self._pending.append(pending)
        if not all(pending.submitted):
            self._raise_failure(pending.wait().results())
        keeps, accepted_counts = pending.keep.tolist(), pending.accepted.tolist()
        columns = zip(keeps, accepted_counts, pending.terminal.tolist(), strict=True)
        staged = []
        for r, previous, (keep, accepted, terminal) in zip(rounds, before, columns, strict=True):
            state = self._controller.state(r.request_id)
            staged.append(
                StagedRound(
                    emitted_ids=state.output[len(previous.output) :],
                    accepted=accepted,
                    terminal=_TERMINAL_NAMES[terminal],
                    finished=state.finished,
                    keep=keep,
                    state=state,
                    reached=state.rng.accept - previous.rng.accept,
                )
            )
        while self._pending and self._pending[0].done:  # writes already settled by the controller
            self._raise_failure(self._pending.popleft().wait().results())
        return staged

    def settle(self) -> None:
        """Wait until every submitted round is durable; raises the first round's error if one is not."""
        while self._pending:
            self._raise_failure(self._pending.popleft().wait().results())

    def close(self) -> None:
        """Wait for the submitted writes and stop the controller's writer thread (the log stays open)."""
        self._pending.clear()
        self._controller.close()

    @staticmethod
    def _raise_failure(results: Sequence[RoundResult]) -> None:
        for result in results:
            if result.status not in _DELIVERED:
                error: SpecroundError = result.error or InvalidRequestError(
                    f"round of request {result.request_id!r} was not published ({result.status})"
                )
                raise error

    def state(self, request_id: str) -> RequestState:
        """The request's published state."""
        return self._controller.state(request_id)

    def remaining(self, request_id: str) -> int:
        """Tokens the request may still emit."""
        return self._controller.remaining(request_id)


def _batch_tensors(
    rounds: Sequence[RoundRequest],
) -> tuple[list[str], torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(request ids, drafts [B, K], draft lengths [B], q [B, K, V], p [B, K+1, V]) of the rounds."""
    width = max(len(r.draft_ids) for r in rounds)
    first = rounds[0].p_rows
    n, vocab = len(rounds), first.shape[-1]
    if n == 1 and first.shape[0] == width + 1:  # one row: its own rows are the batch, no copy
        only = rounds[0]
        p = first[None]  # [1, K+1, V]
        q = (  # a drafter's rows may be on the host while p is on the target's device
            only.q_rows[None].to(device=first.device, dtype=first.dtype)
            if width and only.q_rows is not None
            else first.new_zeros((1, width, vocab))
        )
        draft_ids = torch.tensor([only.draft_ids], dtype=torch.int64).reshape(1, width)  # [1, K]
    else:
        p = first.new_zeros((n, width + 1, vocab))  # [B, K+1, V]
        q = first.new_zeros((n, width, vocab))  # [B, K, V]
        draft_ids = torch.full((n, width), PAD_ID, dtype=torch.int64)  # [B, K]
        for b, r in enumerate(rounds):
            k = len(r.draft_ids)
            p[b, : k + 1] = r.p_rows
            if k:
                assert r.q_rows is not None
                q[b, :k] = r.q_rows
                draft_ids[b, :k] = torch.tensor(r.draft_ids, dtype=torch.int64)
    lengths = torch.tensor([len(r.draft_ids) for r in rounds], dtype=torch.int64)  # [B]
    return [r.request_id for r in rounds], draft_ids, lengths, q, p


def _batch_keywords(rounds: Sequence[RoundRequest]) -> dict[str, Any]:
    """The per-row keyword sequences of ``step_batch`` / ``submit_batch``."""
    return {
        "proposal_draws": [r.proposal_draws for r in rounds],
        "branches": [r.branch for r in rounds],
        "verify_rows": [r.verify_rows for r in rounds],
        "timings": [r.timings for r in rounds],
    }
