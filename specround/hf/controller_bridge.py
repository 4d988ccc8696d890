"""Every call :mod:`specround.hf` makes to the round controller, in one place.

The transformers path opens one request per batch row and publishes each step's rounds as ONE controller
``step`` (one batched decision, one group commit). Nothing else in :mod:`specround.hf` touches the
controller, so a batched step API can replace :meth:`ControllerBridge.step` here alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from specround.sampling.processors.chain import ProcessorChain
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundResult
from specround.statemachine.state import RequestState

__all__ = ["ControllerBridge", "RoundRequest"]


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


class ControllerBridge:
    """A :class:`RoundController` over one event log, seen through the calls the transformers path needs."""

    def __init__(self, log: EventLog) -> None:
        self._controller = RoundController(log)

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
            layout=Layout.REPLAY_FRONTIER,
            stop_token_ids=stop_token_ids,
            request_id=request_id,
            coordinate=coordinate,
        )

    def processors(self, request_id: str) -> ProcessorChain:
        """A clone of the request's published processor chain."""
        return self._controller.processors(request_id)

    def step(self, rounds: Sequence[RoundRequest]) -> list[RoundResult]:
        """Publish the rounds of one step as ONE controller step (results in input order)."""
        inputs = [
            RoundInput(
                request_id=r.request_id,
                coordinate_digest=self._controller.coordinate_digest(r.request_id),
                draft_ids=r.draft_ids,
                q_rows=r.q_rows.to(r.p_rows.dtype) if r.q_rows is not None and r.draft_ids else None,
                p_rows=r.p_rows,
                branch=r.branch,
                proposal_draws=r.proposal_draws,
                verify_rows=r.verify_rows,
                timings=r.timings,
            )
            for r in rounds
        ]
        return self._controller.step(inputs)

    def state(self, request_id: str) -> RequestState:
        """The request's published state."""
        return self._controller.state(request_id)

    def remaining(self, request_id: str) -> int:
        """Tokens the request may still emit."""
        return self._controller.remaining(request_id)
