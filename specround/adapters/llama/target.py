"""The compact Llama as a :class:`~specround.statemachine.model_ports.TargetModel`.

One forward serves a whole batch: every request's new rows are packed together and attend only to their
own request's rows (:mod:`specround.adapters.llama.packed`). The adapter executes what the controller
decides: verification writes branch rows past each request's committed rows, :meth:`LlamaTarget.commit`
keeps a prefix of them, :meth:`LlamaTarget.discard` forgets them. With ``num_layers`` the same weights run
only their first layers (an early-exit view with its own K/V, for self-speculation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from specround.adapters.llama.kv_cache import KVStore, RequestCache, RetainedFrontier
from specround.adapters.llama.model import LlamaModel
from specround.adapters.llama.packed import PackedRows, Segment
from specround.adapters.target_checks import (
    check_commit,
    check_distinct,
    check_room,
    check_token_ids,
    verified_branch,
)
from specround.errors import CacheProtocolError, DraftIdOutOfVocabError, InvalidRequestError
from specround.sampling.layouts import (
    VerificationInputs,
    parse_layout,
    replays_frontier,
    retains_frontier,
    verification_inputs,
)
from specround.statemachine.model_ports import BranchHandle, VerifyRequest, VerifyResult

__all__ = ["LlamaTarget"]


class LlamaTarget:
    """Per-request K/V, packed multi-request verification and both layouts over a :class:`LlamaModel`."""

    def __init__(
        self,
        model: LlamaModel,
        *,
        model_id: str,
        num_layers: int | None = None,
        initial_capacity: int = 64,
    ) -> None:
        depth = model.config.num_layers if num_layers is None else num_layers
        if not 1 <= depth <= model.config.num_layers:
            raise InvalidRequestError(f"num_layers must lie in 1..{model.config.num_layers}, got {depth}")
        self.model = model
        """The decoder (its weights may be shared with other targets)."""
        self.num_layers = depth
        """Layers this target runs (fewer than the model's for an early-exit view)."""
        full = depth == model.config.num_layers
        self._model_id = model_id if full else f"{model_id}#exit{depth}"
        self._store = KVStore(
            num_layers=depth,
            kv_heads=model.config.num_kv_heads,
            head_dim=model.config.head_dim,
            max_positions=model.config.context_length,
            initial_capacity=initial_capacity,
        )
        self._next_branch = 0

    # --- identity -------------------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        """Weights identity, with ``#exit<N>`` for an early-exit view."""
        return self._model_id

    @property
    def vocab_size(self) -> int:
        """V."""
        return self.model.config.vocab_size

    @property
    def context_length(self) -> int:
        """Positions one request may occupy."""
        return self.model.config.context_length

    def early_exit(self, num_layers: int) -> LlamaTarget:
        """A target over the first ``num_layers`` layers of the same weights, with its own K/V."""
        base = self._model_id.split("#exit")[0]
        return LlamaTarget(self.model, model_id=base, num_layers=num_layers)

    # --- validation helpers ---------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int], what: str, error: type[Exception]) -> None:
        check_token_ids(ids, self.vocab_size, what, error)

    def _check_room(self, request_id: str, positions: int) -> None:
        check_room(request_id, positions, self.context_length)

    def _live_branch(self, request_id: str, branch: BranchHandle) -> RequestCache:
        cache = self._store.get(request_id)
        if branch.request_id != request_id or cache.branch is None or cache.branch != branch:
            raise CacheProtocolError(
                f"branch {branch.branch_id} is not the live branch of request {request_id!r} "
                "(already committed or discarded, or another request's)"
            )
        return cache

    # --- forward --------------------------------------------------------------------------------------

    def _forward(self, tokens: list[int], segments: list[Segment], *, logits: bool = True) -> torch.Tensor:
        for seg in segments:
            seg.cache.reserve(seg.start + seg.rows, self.context_length)
        packed = PackedRows(segments)
        token_ids = torch.tensor(tokens, dtype=torch.int64)  # [Q]
        head_rows = None if logits else torch.empty(0, dtype=torch.int64)
        return self.model.forward(
            token_ids, packed.positions, packed, num_layers=self.num_layers, head_rows=head_rows
        )  # [Q, V], or [0, V] without logits

    # --- TargetModel ----------------------------------------------------------------------------------

    def prefill(self, requests: Mapping[str, Sequence[int]]) -> None:
        """Open requests with committed rows for the given tokens (one packed forward, no logits)."""
        for request_id, ids in requests.items():
            if request_id in self._store:
                raise CacheProtocolError(f"request {request_id!r} is already open")
            self._check_ids(ids, "token", InvalidRequestError)
            self._check_room(request_id, len(ids) + 1)
        opened = {rid: self._store.open(rid, len(ids) + 1) for rid, ids in requests.items()}
        try:
            tokens = [int(t) for ids in requests.values() for t in ids]
            segments = [Segment(opened[rid], 0, len(ids)) for rid, ids in requests.items()]
            if tokens:
                self._forward(tokens, segments, logits=False)
        except BaseException:
            for rid in opened:
                self._store.release(rid)
            raise
        for rid, ids in requests.items():
            opened[rid].token_ids.extend(int(t) for t in ids)

    def materialize_frontier(self, frontiers: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Compute and retain each frontier's row at the next free position; return its logits [V].

        A frontier already retained for the same token returns its stored logits (nothing is recomputed).
        """
        todo: list[tuple[str, RequestCache, int]] = []
        for request_id, token in frontiers.items():
            cache = self._store.get(request_id)
            self._check_ids([token], "frontier", DraftIdOutOfVocabError)
            if cache.retained is not None:
                if cache.retained.token != token:
                    raise CacheProtocolError(
                        f"request {request_id!r} retains frontier {cache.retained.token}, not {token}"
                    )
                continue
            if cache.branch is not None:
                raise CacheProtocolError(f"request {request_id!r} has a live branch; commit or discard it")
            self._check_room(request_id, cache.length + 1)
            todo.append((request_id, cache, int(token)))
        if todo:
            logits = self._forward(
                [token for _, _, token in todo], [Segment(cache, cache.length, 1) for _, cache, _ in todo]
            )  # [n, V]
            for row, (_, cache, token) in enumerate(todo):
                cache.retained = RetainedFrontier(token=token, logits=logits[row].clone())
        out: dict[str, torch.Tensor] = {}
        for request_id in frontiers:
            retained = self._store.get(request_id).retained
            assert retained is not None
            out[request_id] = retained.logits.clone()
        return out

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        """Score every request's draft path in one packed forward (see the model ports for the contract)."""
        check_distinct(requests)
        plan: list[tuple[VerifyRequest, RequestCache, VerificationInputs]] = []
        for req in requests:
            plan.append((req, *self._planned_verification(req)))
        tokens = [t for *_, inputs in plan for t in inputs.input_ids]
        segments = [Segment(cache, inputs.first_position, len(inputs.input_ids)) for _, cache, inputs in plan]
        logits = self._forward(tokens, segments) if tokens else torch.empty(0, self.vocab_size)  # [Q, V]
        results: list[VerifyResult] = []
        offset = 0
        for req, cache, inputs in plan:
            rows = len(inputs.input_ids)
            retained = None if cache.retained is None else cache.retained.logits  # [V]
            own = logits[offset : offset + rows]  # [n_b, V]
            if retained is not None and not rows:
                own = retained.new_empty(0, self.vocab_size)  # nothing computed: the retained row's dtype
            offset += rows
            result = verified_branch(
                req, inputs, own, retained, branch_id=self._next_branch, base_len=cache.length
            )
            self._next_branch += 1
            cache.branch = result.branch
            results.append(result)
        return results

    def _planned_verification(self, req: VerifyRequest) -> tuple[RequestCache, VerificationInputs]:
        """Check one request of a verification against its cache; its input rows by absolute position."""
        cache = self._store.get(req.request_id)
        if cache.branch is not None:
            raise CacheProtocolError(
                f"request {req.request_id!r} has a live branch; commit or discard it first"
            )
        layout = parse_layout(req.layout)
        self._check_ids([req.frontier], "frontier", DraftIdOutOfVocabError)
        self._check_ids(req.draft_ids, "draft token", DraftIdOutOfVocabError)
        self._check_room(req.request_id, cache.length + 1 + len(req.draft_ids))
        if replays_frontier(layout) and cache.retained is not None:
            raise CacheProtocolError(
                f"request {req.request_id!r} retains its frontier row; replaying it would duplicate "
                "position P (verify with retained_frontier)"
            )
        if retains_frontier(layout) and (cache.retained is None or cache.retained.token != req.frontier):
            raise CacheProtocolError(
                f"request {req.request_id!r} has no retained row for frontier {req.frontier}: "
                "call materialize_frontier first"
            )
        drafts = [int(t) for t in req.draft_ids]
        return cache, verification_inputs(layout, int(req.frontier), drafts, cache.length)

    def commit(self, request_id: str, branch: BranchHandle, keep: int) -> None:
        """Commit the first ``keep`` logical rows ``[F, d_1..]`` of the live branch; discard the rest."""
        cache = self._live_branch(request_id, branch)
        check_commit(branch, keep, cache.length)
        cache.token_ids.extend(branch.token_ids[:keep])
        if retains_frontier(branch.layout) and keep >= 1:
            cache.retained = None  # its row, at position base_len, is committed now
        cache.branch = None

    def discard(self, request_id: str, branch: BranchHandle) -> None:
        """Forget the live branch; committed rows and a retained frontier stay."""
        cache = self._live_branch(request_id, branch)
        cache.branch = None

    def release(self, request_id: str) -> None:
        """Forget a request entirely; unknown ids are ignored."""
        self._store.release(request_id)

    def committed_token_ids(self, request_id: str) -> tuple[int, ...]:
        """C: committed token ids in position order."""
        return tuple(self._store.get(request_id).token_ids)

    def retained_frontier(self, request_id: str) -> int | None:
        """The token whose row is retained beside the cache, or None."""
        retained = self._store.get(request_id).retained
        return None if retained is None else retained.token

    # --- beyond the port ------------------------------------------------------------------------------

    def is_open(self, request_id: str) -> bool:
        """Whether the request has a cache."""
        return request_id in self._store

    def truncate(self, request_id: str, length: int) -> None:
        """Drop committed rows at positions ``>= length`` (a proposer rolling back its own draft cache).

        The controller never calls this on a target: committed target rows are authoritative. Refused while
        a branch is live; a retained frontier is dropped when rows are removed.
        """
        cache = self._store.get(request_id)
        if cache.branch is not None:
            raise CacheProtocolError(f"request {request_id!r} has a live branch; commit or discard it first")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= cache.length:
            raise InvalidRequestError(f"length must lie in 0..{cache.length}, got {length!r}")
        if length < cache.length:
            del cache.token_ids[length:]
            cache.retained = None
