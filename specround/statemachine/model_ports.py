"""The model ports: what the round controller needs from a target model and from a proposer.

``specround.adapters`` implements them (a compact Llama in torch, a Hugging Face bridge, n-gram / early-exit
/ draft-model proposers); the controller drives them and decides, the adapters execute.

Target cache contract (the same for both layouts, contract#frontier-layouts, contract#staging). Between rounds
a request's authoritative state has committed cache ``C == O[:-1]`` and frontier ``F == O[-1]``:

* :meth:`TargetModel.prefill` commits the rows of ``O[:-1]`` (the prompt minus its last token).
* ``replay_frontier``: :meth:`TargetModel.verify` feeds ``[F, d_1..d_K]`` at positions ``P..P+K``.
* ``retained_frontier``: :meth:`TargetModel.materialize_frontier` first computes F's K/V row and the logits
  of ``p_1`` in a one-row call; the row is *retained* beside the cache (it is not committed yet, survives an
  aborted round and is never recomputed). :meth:`TargetModel.verify` then feeds ``[d_1..d_K]`` at positions
  ``P+1..P+K``.
* In both layouts a verification returns the *logical* rows: logits ``[K+1, V]`` where row ``i`` scores the
  token after ``F, d_1..d_i`` (``p_1..p_K`` and the bonus row ``p_{K+1}``), and a :class:`BranchHandle`
  whose logical token rows are ``[F, d_1..d_K]``.
* :meth:`TargetModel.commit` keeps the first ``keep`` logical rows and discards the rest. ``keep`` is the
  number of tokens the round emitted: ``A + 1`` (the frontier plus the A accepted drafts, in both layouts)
  when a correction or bonus is emitted, or ``h`` when a stop at the h-th accepted draft ends the request,
  so that ``C == O[:-1]`` holds after publication in every case. :meth:`TargetModel.discard` drops a
  branch entirely (an aborted round), leaving committed rows and any retained frontier untouched.

Proposer contract: a proposer returns, for each request, draft ids and the *processed* q rows that actually
sampled them (one-hot rows for a point-mass proposer), plus the number of PROPOSAL uniforms it consumed.
Raw logits never stand in for a q row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Self

import torch

from specround.sampling.types import Layout

__all__ = [
    "BranchHandle",
    "ProcessorChainLike",
    "Proposal",
    "ProposalRequest",
    "Proposer",
    "TargetModel",
    "VerifyRequest",
    "VerifyResult",
]


@dataclass(frozen=True, slots=True)
class VerifyRequest:
    """One request's part of a packed verification call."""

    request_id: str
    layout: Layout
    frontier: int
    """F = O[-1]: the emitted token that has no committed K/V row."""
    draft_ids: tuple[int, ...]
    """d_1..d_K (K may be 0: a plain one-token decode step)."""


@dataclass(frozen=True, slots=True)
class BranchHandle:
    """Temporary K/V rows of one request produced by one verification call (or a retained frontier).

    ``token_ids`` are the branch's *logical* rows ``[F, d_1..d_K]`` at absolute positions
    ``base_len .. base_len + K``; under ``retained_frontier`` row 0 is the retained frontier row.
    """

    request_id: str
    branch_id: int
    """Unique per adapter instance; a handle of a committed or discarded branch is stale."""
    layout: Layout
    base_len: int
    """Committed cache length when the branch was created (the position of row 0)."""
    token_ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """One request's result of a packed verification call."""

    request_id: str
    logits: torch.Tensor
    """[K+1, V] float32 raw target logits: row i scores the token after F, d_1..d_i."""
    branch: BranchHandle
    computed_rows: int
    """Input rows this call computed for the request (K+1 under replay, K under retained)."""


class TargetModel(Protocol):
    """A target model with per-request K/V, packed multi-request verification and explicit commit/discard."""

    @property
    def model_id(self) -> str:
        """Stable identity of the weights and code (part of the round coordinate)."""
        ...

    @property
    def vocab_size(self) -> int:
        """V: the number of logit columns."""
        ...

    @property
    def context_length(self) -> int:
        """The largest number of positions one request may occupy."""
        ...

    def prefill(self, requests: Mapping[str, Sequence[int]]) -> None:
        """Open each request with committed rows for the given tokens (``O[:-1]``; may be empty).

        Refuses a request id that is already open.
        """
        ...

    def materialize_frontier(self, frontiers: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Compute and retain each frontier's K/V row at the next free position; return its logits [V].

        Idempotent: a frontier already retained for the same token returns the stored logits without
        computing anything.
        """
        ...

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        """Score every request's draft path in ONE packed forward; results in request order.

        At most one live branch per request: a new verification of a request with a live branch refuses.
        """
        ...

    def commit(self, request_id: str, branch: BranchHandle, keep: int) -> None:
        """Commit the first ``keep`` logical rows of ``branch`` and discard the rest (0 <= keep <= K+1)."""
        ...

    def discard(self, request_id: str, branch: BranchHandle) -> None:
        """Drop ``branch`` entirely; committed rows and a retained frontier are unchanged."""
        ...

    def release(self, request_id: str) -> None:
        """Forget a request (committed rows, retained frontier, live branch). Unknown ids are ignored."""
        ...

    def committed_token_ids(self, request_id: str) -> tuple[int, ...]:
        """Token ids whose K/V rows are committed, in position order (C)."""
        ...

    def retained_frontier(self, request_id: str) -> int | None:
        """The token whose row is retained beside the cache, or None."""
        ...


class ProcessorChainLike(Protocol):
    """What a proposer needs of a request's processor chain.

    The implementation is :class:`~specround.sampling.processors.processor_chain.ProcessorChain`.
    """

    def clone(self) -> Self:
        """An independent copy."""
        ...

    def advance(self, token: int) -> None:
        """Consume one token."""
        ...

    def advance_many(self, tokens: Sequence[int]) -> None:
        """Consume tokens in order."""
        ...

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed probabilities of logits [V] or [N, V], every row at the current state."""
        ...

    def rows_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Processed probabilities [n, V] where row i is processed at the state advanced over path[:i]."""
        ...


@dataclass(frozen=True, slots=True)
class ProposalRequest:
    """One request's part of a batched proposal."""

    request_id: str
    context_ids: Sequence[int]
    """O: every emitted token of the request, prompt included (the last one is the frontier)."""
    k: int
    """The largest draft length wanted (a proposer may return fewer drafts)."""
    processors: ProcessorChainLike
    """A clone of the request's chain at its published state; the proposer may advance it."""
    seed: int
    proposal_counter: int
    """The next unused PROPOSAL counter of the request."""


@dataclass(frozen=True, slots=True)
class Proposal:
    """Drafts of one request and the processed q rows that sampled them."""

    request_id: str
    draft_ids: torch.Tensor
    """[k] int64, 0 <= k <= the requested K."""
    q_rows: torch.Tensor
    """[k, V] float probabilities; q_rows[i, draft_ids[i]] > 0."""
    proposal_draws: int
    """PROPOSAL uniforms consumed: counters ``proposal_counter + [0, proposal_draws)``."""


class Proposer(Protocol):
    """A source of draft tokens with their exact proposal distributions."""

    @property
    def proposer_id(self) -> str:
        """Stable identity of the proposer and its configuration (part of the round coordinate)."""
        ...

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        """Draft for a batch of requests; results in request order."""
        ...

    def on_published(self, request_id: str, output_ids: Sequence[int], cache_len: int) -> None:
        """A round of the request published ``output_ids`` (O) with ``cache_len`` committed target rows.

        Stateful proposers roll back draft state that the published output does not contain.
        """
        ...

    def release(self, request_id: str) -> None:
        """Forget a request. Unknown ids are ignored."""
        ...
