"""Processor and proposal-row failure classes.

Contract: contract#degenerate-cases, contract#reached-events, contract#processed-rows, contract#failure-lab.

* G advanced over a rejected draft: the controller's staging advances the processor state over the round's
  first discarded draft before the emitted tokens (seams: the step's ``stage_kv``, which names the
  discarded drafts, and ``stage_successor``, called with a start state advanced over them).
* Penalties applied over the last token only: a token-count penalty forgets every earlier token when it
  is advanced (seam: ``TokenCountPenalty.advance``), so serial rows and ``rows_along`` disagree.
* Raw logits used as q: the model proposer samples its drafts from the processed row but hands the
  controller the softmax of the raw logits as q (seams: ``ModelProposer._step``, whose logits are
  remembered, and ``ModelProposer.propose``, whose q rows are replaced).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from specround.adapters.proposers.model_draft import ModelProposer
from specround.model_check.mutants.mutation import Mutation, Scratch, Seam
from specround.sampling.processors.penalties import TokenCountPenalty
from specround.statemachine import step as step_module
from specround.statemachine.staging import stage_kv, stage_successor

__all__ = ["PROCESSOR_MUTATIONS"]


def _note_discarded(original: Any, scratch: Scratch) -> Any:
    def stage_kv(start: Any, draft_ids: Any, emitted: Any) -> Any:
        staged = original(start, draft_ids, emitted)
        scratch["discarded"] = tuple(staged.discarded_token_ids[:1])
        return staged

    return stage_kv


def _advance_over_discarded(original: Any, scratch: Scratch) -> Any:
    def stage_successor(
        start: Any, emitted: Any, committed: Any, rng_after: Any, *, finished: bool, finish_reason: Any
    ) -> Any:
        discarded = scratch.pop("discarded", ())
        if discarded and start.chain.stateful:
            chain = start.chain.clone()
            chain.advance_many(discarded)
            start = replace(start, chain=chain)
        return original(start, emitted, committed, rng_after, finished=finished, finish_reason=finish_reason)

    return stage_successor


def _last_token_only(original: Any, _scratch: Scratch) -> Any:
    def advance(self: Any, token: int) -> None:
        self.counts.clear()
        original(self, token)

    return advance


def _remember_raw_logits(original: Any, scratch: Scratch) -> Any:
    def step(self: Any, feeds: dict[str, list[int]]) -> dict[str, torch.Tensor]:
        last: dict[str, torch.Tensor] = original(self, feeds)
        for request_id, logits in last.items():
            scratch.setdefault(f"raw:{id(self)}:{request_id}", []).append(logits)
        return last

    return step


def _raw_q_rows(original: Any, scratch: Scratch) -> Any:
    def propose(self: Any, requests: Any) -> Any:
        for req in requests:
            scratch.pop(f"raw:{id(self)}:{req.request_id}", None)
        proposals = original(self, requests)
        out = []
        for proposal in proposals:
            raw = scratch.pop(f"raw:{id(self)}:{proposal.request_id}", [])[: proposal.draft_ids.numel()]
            if raw:
                q = torch.softmax(torch.stack(raw).to(torch.float64), dim=-1).to(
                    proposal.q_rows.dtype
                )  # [k, V]
                proposal = replace(proposal, q_rows=q)
            out.append(proposal)
        return out

    return propose


PROCESSOR_MUTATIONS = (
    Mutation(
        "processors advanced over a rejected draft",
        "processors",
        "the staged processor state G_1 is G_0 advanced over the rejected (first discarded) draft as well "
        "as the emitted tokens",
        ("INV-4", "contract#reached-events"),
        (
            Seam(step_module, stage_kv, _note_discarded),
            Seam(step_module, stage_successor, _advance_over_discarded),
        ),
    ),
    Mutation(
        "penalties over the last token only",
        "processors",
        "repetition/frequency/presence penalties count only the most recent token",
        ("INV-4", "contract#processed-rows"),
        (Seam(TokenCountPenalty, TokenCountPenalty.advance, _last_token_only),),
    ),
    Mutation(
        "raw logits as q",
        "processors",
        "drafts are sampled from the processed q row, but q = softmax(raw draft logits) is handed to the "
        "controller",
        ("INV-10", "contract#degenerate-cases", "contract#processed-rows"),
        (
            Seam(ModelProposer, ModelProposer._step, _remember_raw_logits),
            Seam(ModelProposer, ModelProposer.propose, _raw_q_rows),
        ),
    ),
)
"""Failure classes of processor state and processed rows."""
