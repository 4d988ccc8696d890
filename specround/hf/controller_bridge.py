"""Every call :mod:`specround.hf` makes to the round controller, in one place.

The transformers path opens one request per batch row and publishes each step's rounds as ONE controller
``step_batch`` (one batched decision, one group commit). Nothing else in :mod:`specround.hf` touches the
controller.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.types import PAD_ID, Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundResult
from specround.statemachine.state import RequestState

__all__ = ["BRIDGE_LAYOUT", "ControllerBridge", "RoundRequest"]

BRIDGE_LAYOUT = Layout.REPLAY_FRONTIER
"""The one layout the transformers path verifies in: its batch cache keeps no retained frontier row."""


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
        width = max(len(r.draft_ids) for r in rounds)
        first = rounds[0].p_rows
        n, vocab = len(rounds), first.shape[-1]
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
        return self._controller.step_batch(
            [r.request_id for r in rounds],
            draft_ids,
            torch.tensor([len(r.draft_ids) for r in rounds], dtype=torch.int64),
            q,
            p,
            proposal_draws=[r.proposal_draws for r in rounds],
            branches=[r.branch for r in rounds],
            verify_rows=[r.verify_rows for r in rounds],
            timings=[r.timings for r in rounds],
        ).results()

    def state(self, request_id: str) -> RequestState:
        """The request's published state."""
        return self._controller.state(request_id)

    def remaining(self, request_id: str) -> int:
        """Tokens the request may still emit."""
        return self._controller.remaining(request_id)
