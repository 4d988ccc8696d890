"""K/V failure classes: the model adapter keeps the wrong rows.

Contract: contract#terminal-paths, contract#staging, contract#failure-lab.

The seams are methods of :class:`~specround.adapters.llama.LlamaTarget`, the adapter that executes the
controller's K/V instruction; each wrong variant calls the real method. They leave the controller's
published state alone, so only checks that look at the model's cache (its committed token ids, and the
logits its rows produce) can see them.
"""

from __future__ import annotations

from typing import Any

import torch

from specround.adapters.llama.target import LlamaTarget
from specround.model_check.mutants.mutation import Mutation, Scratch, Seam
from specround.sampling.types import Layout
from specround.statemachine.model_ports import BranchHandle, VerifyRequest, VerifyResult

__all__ = ["KV_MUTATIONS"]


def _commit_rejected_row(original: Any, _scratch: Scratch) -> Any:
    """Commit one row more than the instruction says when the branch has a row after it (the rejected one)."""

    def commit(self: Any, request_id: str, branch: BranchHandle, keep: int) -> None:
        if 0 < keep < len(branch.token_ids):
            keep += 1
        original(self, request_id, branch, keep)

    return commit


def _remember_logits(original: Any, scratch: Scratch) -> Any:
    """Verification as usual, remembering each branch's logits (for the commit that follows)."""

    def verify(self: Any, requests: list[VerifyRequest]) -> list[VerifyResult]:
        results: list[VerifyResult] = original(self, requests)
        for result in results:
            scratch[f"logits:{id(self)}:{result.branch.branch_id}"] = result.logits
        return results

    return verify


def _note_rejected_row(original: Any, scratch: Scratch) -> Any:
    """After a retained-layout commit that left the rejected draft's row just past the cache, remember it."""

    def commit(self: Any, request_id: str, branch: BranchHandle, keep: int) -> None:
        logits = scratch.pop(f"logits:{id(self)}:{branch.branch_id}", None)
        original(self, request_id, branch, keep)
        if branch.layout is Layout.RETAINED_FRONTIER and logits is not None and keep < len(branch.token_ids):
            scratch[f"rejected:{id(self)}:{request_id}"] = logits[keep]  # scores the token after d_{A+1}

    return commit


def _frontier_on_rejected_row(original: Any, scratch: Scratch) -> Any:
    """Take the row the rejected draft left at the frontier's position as the new frontier's row."""

    def materialize_frontier(self: Any, frontiers: dict[str, int]) -> dict[str, torch.Tensor]:
        from specround.adapters.llama.kv_cache import RetainedFrontier

        for request_id, token in frontiers.items():
            logits = scratch.pop(f"rejected:{id(self)}:{request_id}", None)
            cache = self._store.get(request_id)
            if logits is not None and cache.retained is None and cache.branch is None:
                cache.retained = RetainedFrontier(token=int(token), logits=logits.clone())
        result: dict[str, torch.Tensor] = original(self, frontiers)
        return result

    return materialize_frontier


def _replay_over_committed_frontier(original: Any, _scratch: Scratch) -> Any:
    """Under replay_frontier, commit the frontier's row first, then replay it again: position P twice."""

    def verify(self: Any, requests: list[VerifyRequest]) -> list[VerifyResult]:
        for req in requests:
            if Layout(req.layout) is not Layout.REPLAY_FRONTIER:
                continue
            cache = self._store.get(req.request_id)
            if cache.retained is None and cache.branch is None:
                self.materialize_frontier({req.request_id: req.frontier})
                cache.token_ids.append(int(req.frontier))  # the cache now holds F's row
                cache.retained = None
        results: list[VerifyResult] = original(self, requests)
        return results

    return verify


KV_MUTATIONS = (
    Mutation(
        "rejected draft K/V committed",
        "K/V",
        "the adapter commits the rejected draft's row along with [F] + the accepted drafts",
        ("INV-5", "INV-1", "contract#staging"),
        (Seam(LlamaTarget, LlamaTarget.commit, _commit_rejected_row),),
    ),
    Mutation(
        "correction on the rejected token's K/V row",
        "K/V",
        "under retained_frontier the correction token is given the row the rejected draft left at its "
        "position (same shape, wrong token) instead of a row of its own",
        ("INV-5", "contract#staging"),
        (
            Seam(LlamaTarget, LlamaTarget.verify, _remember_logits),
            Seam(LlamaTarget, LlamaTarget.commit, _note_rejected_row),
            Seam(LlamaTarget, LlamaTarget.materialize_frontier, _frontier_on_rejected_row),
        ),
    ),
    Mutation(
        "frontier row duplicated",
        "K/V",
        "replay_frontier verification replays the frontier into a cache that already holds its row",
        ("INV-5", "INV-1", "contract#staging"),
        (Seam(LlamaTarget, LlamaTarget.verify, _replay_over_committed_frontier),),
    ),
)
"""Failure classes of the target's K/V rows."""
