"""Model-based proposers: a separate draft model, or the target's own first layers (self-speculation).

:class:`ModelProposer` drives any *draft engine* (a target-model adapter that can also truncate its own
committed rows: :class:`~specround.adapters.llama.LlamaTarget`, :class:`~specround.adapters.hf.HFTarget`)
autoregressively, all requests of a batch in one packed forward per draft step:

1. its per-request cache follows the published output: rows that are not a prefix of ``O[:-1]`` are
   truncated, and the tokens the cache lacks (at least the frontier) are fed in the first step;
2. each step's last logits row is processed by the request's processor chain at the state advanced over
   the drafts so far (the q row that actually samples the draft; raw logits never stand in), and the
   draft is drawn by inverse CDF from one PROPOSAL uniform ``(seed, PROPOSAL, counter + i)``;
3. each draft is committed into the engine's cache as it is fed; :meth:`ModelProposer.on_published`
   truncates whatever the published output did not keep.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from specround.adapters.proposers.cache_prefix import rows_to_keep
from specround.adapters.proposers.draws import draw_proposals
from specround.errors import InvalidRequestError
from specround.sampling.types import Layout
from specround.statemachine.model_ports import (
    Proposal,
    ProposalRequest,
    TargetModel,
    VerifyRequest,
)

__all__ = ["DraftEngine", "ModelProposer"]


class DraftEngine(TargetModel, Protocol):
    """A target-model adapter that a proposer may also roll back."""

    def is_open(self, request_id: str) -> bool:
        """Whether the engine holds a cache for the request."""
        ...

    def truncate(self, request_id: str, length: int) -> None:
        """Drop committed rows at positions ``>= length``."""
        ...


class ModelProposer:
    """Autoregressive drafts from a draft engine, with processed q rows and counted PROPOSAL draws."""

    def __init__(self, engine: DraftEngine, *, proposer_id: str | None = None) -> None:
        self.engine = engine
        """The model that drafts (its cache is private to this proposer)."""
        self._proposer_id = proposer_id or f"model:{engine.model_id}"

    @property
    def proposer_id(self) -> str:
        """``model:<engine model id>`` unless given."""
        return self._proposer_id

    def _sync(self, requests: Sequence[ProposalRequest]) -> dict[str, list[int]]:
        """Align each engine cache with ``O[:-1]``; return the tokens to feed (ending with the frontier)."""
        feeds: dict[str, list[int]] = {}
        fresh: dict[str, list[int]] = {}
        for req in requests:
            context = list(req.context_ids)
            if self.engine.is_open(req.request_id):
                committed = self.engine.committed_token_ids(req.request_id)
                keep = rows_to_keep(committed, context)
                self.engine.truncate(req.request_id, keep)
                feeds[req.request_id] = context[keep:]
            else:
                fresh[req.request_id] = context[:-1]
                feeds[req.request_id] = context[-1:]
        if fresh:
            self.engine.prefill(fresh)
        return feeds

    def _step(self, feeds: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        """Feed tokens (replay layout), commit them all; return each request's last logits row [V]."""
        results = self.engine.verify(
            [
                VerifyRequest(rid, Layout.REPLAY_FRONTIER, tokens[0], tuple(tokens[1:]))
                for rid, tokens in feeds.items()
            ]
        )
        last = {}
        for res in results:
            self.engine.commit(res.request_id, res.branch, len(res.branch.token_ids))
            last[res.request_id] = res.logits[-1]  # [V]
        return last

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        """Draft ``k`` tokens per request (fewer never: a model always has a next-token distribution)."""
        seen: set[str] = set()
        for req in requests:
            if req.k < 0 or not req.context_ids or req.proposal_counter < 0 or req.request_id in seen:
                raise InvalidRequestError(
                    f"request {req.request_id!r}: need k >= 0, a context, a counter >= 0 and a unique id"
                )
            seen.add(req.request_id)
        active = [req for req in requests if req.k > 0]
        drafts: dict[str, list[int]] = {req.request_id: [] for req in requests}
        q_rows: dict[str, list[torch.Tensor]] = {req.request_id: [] for req in requests}
        feeds = self._sync(active) if active else {}
        step = 0
        while active:
            logits = self._step({req.request_id: feeds[req.request_id] for req in active})
            rows = torch.stack(
                [req.processors.distribution(logits[req.request_id]) for req in active]
            )  # [B, V]
            tokens = draw_proposals(
                rows, [req.seed for req in active], [req.proposal_counter + step for req in active]
            )  # [B]
            for index, req in enumerate(active):
                token = int(tokens[index])
                drafts[req.request_id].append(token)
                q_rows[req.request_id].append(rows[index])
                req.processors.advance(token)
                feeds[req.request_id] = [token]
            step += 1
            active = [req for req in active if len(drafts[req.request_id]) < req.k]
        out = []
        for req in requests:
            ids = torch.tensor(drafts[req.request_id], dtype=torch.int64)  # [k]
            rows_k = (
                torch.stack(q_rows[req.request_id])
                if q_rows[req.request_id]
                else torch.empty(0, self.engine.vocab_size)
            )  # [k, V]
            out.append(Proposal(req.request_id, ids, rows_k, proposal_draws=len(drafts[req.request_id])))
        return out

    def on_published(self, request_id: str, output_ids: Sequence[int], cache_len: int) -> None:
        """Truncate the engine's rows to the longest prefix of ``O[:-1]`` they share."""
        del cache_len  # the draft cache follows token identities, not the target's row count
        if self.engine.is_open(request_id):
            committed = self.engine.committed_token_ids(request_id)
            keep = rows_to_keep(committed, output_ids)
            self.engine.truncate(request_id, keep)

    def release(self, request_id: str) -> None:
        """Forget the request's draft cache."""
        self.engine.release(request_id)
