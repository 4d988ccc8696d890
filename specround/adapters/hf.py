"""A Hugging Face transformers bridge: any ``AutoModelForCausalLM`` as a target model (and the parity oracle).

Each request keeps its own ``DynamicCache`` and runs batch 1: :meth:`HFTarget.verify` loops over the requests
of a call (transformers cannot pack requests with different caches into one forward). Commit and discard
crop the cache with negative counts (``DynamicCache.crop(-k)`` removes the last ``k`` rows). The contract is
the one of :class:`~specround.statemachine.model_ports.TargetModel`, layouts included.

transformers is an optional dependency (the ``hf`` extra); it is imported only when a model is loaded here.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from specround.adapters.target_checks import (
    check_commit,
    check_distinct,
    check_room,
    check_token_ids,
    verified_branch,
)
from specround.errors import (
    CacheProtocolError,
    DraftIdOutOfVocabError,
    InvalidRequestError,
    ModelLoadError,
)
from specround.sampling.layouts import (
    VerificationInputs,
    parse_layout,
    replays_frontier,
    retains_frontier,
    verification_inputs,
    verify_row_count,
)
from specround.statemachine.model_ports import BranchHandle, VerifyRequest, VerifyResult

__all__ = ["HFTarget"]


@dataclass(slots=True)
class _Request:
    cache: Any
    """transformers ``DynamicCache``: committed rows, then a retained row and branch rows if any."""
    token_ids: list[int] = field(default_factory=list)
    retained_token: int | None = None
    retained_logits: torch.Tensor | None = None
    branch: BranchHandle | None = None

    def cached_rows(self) -> int:
        return int(self.cache.get_seq_length())


class HFTarget:
    """Per-request ``DynamicCache`` target over a transformers causal LM (fp32, batch 1 per forward)."""

    def __init__(self, model: Any, *, model_id: str | None = None) -> None:
        model.eval()
        self.model = model
        """The transformers model."""
        config = model.config
        self._model_id = model_id or f"hf:{getattr(config, '_name_or_path', type(model).__name__)}"
        self._vocab = int(model.get_output_embeddings().weight.shape[0])
        self._context = int(getattr(config, "max_position_embeddings", 1 << 30))
        self._requests: dict[str, _Request] = {}
        self._next_branch = 0
        # transformers >= 5.24 renamed ``past_key_values`` to ``cache``; older releases know only the former.
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | Path,
        *,
        gguf_file: str | None = None,
        dtype: torch.dtype = torch.float32,
        model_id: str | None = None,
    ) -> HFTarget:
        """Load with ``AutoModelForCausalLM.from_pretrained`` (``gguf_file`` for a GGUF in that directory)."""
        try:
            from transformers import AutoModelForCausalLM
        except ImportError as exc:  # pragma: no cover - depends on the installed extras
            raise ModelLoadError("transformers is not installed: pip install 'specround[hf]'") from exc
        kwargs: dict[str, Any] = {"dtype": dtype}
        if gguf_file is not None:
            kwargs["gguf_file"] = gguf_file
        try:
            model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **kwargs)
        except (OSError, ValueError, KeyError, RuntimeError) as exc:
            raise ModelLoadError(f"transformers could not load {name_or_path}: {exc}") from exc
        ident = model_id or f"hf:{Path(str(name_or_path)).name}/{gguf_file or ''}".rstrip("/")
        return cls(model, model_id=ident)

    # --- identity -------------------------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        """``hf:<name>`` unless given."""
        return self._model_id

    @property
    def vocab_size(self) -> int:
        """Rows of the output embedding."""
        return self._vocab

    @property
    def context_length(self) -> int:
        """``max_position_embeddings``."""
        return self._context

    # --- helpers --------------------------------------------------------------------------------------

    def _get(self, request_id: str) -> _Request:
        try:
            return self._requests[request_id]
        except KeyError:
            raise CacheProtocolError(f"request {request_id!r} is not open") from None

    def _check_ids(self, ids: Sequence[int], what: str, error: type[Exception]) -> None:
        check_token_ids(ids, self._vocab, what, error)

    def _check_room(self, request_id: str, positions: int) -> None:
        check_room(request_id, positions, self._context)

    @torch.no_grad()
    def _run(self, req: _Request, tokens: Sequence[int], start: int) -> torch.Tensor:
        """Forward ``tokens`` at positions ``start..`` on the request's cache; logits [n, V] float32."""
        if req.cached_rows() != start:
            raise CacheProtocolError(f"cache holds {req.cached_rows()} rows, expected {start}")
        positions = torch.arange(start, start + len(tokens))  # [n]
        out = self.model(
            input_ids=torch.tensor([list(tokens)], dtype=torch.int64),  # [1, n]
            position_ids=positions[None],
            cache_position=positions,
            use_cache=True,
            **{self._cache_kwarg: req.cache},
        )
        logits: torch.Tensor = out.logits[0].to(torch.float32)  # [n, V]
        return logits

    def _crop(self, req: _Request, rows: int) -> None:
        if rows > 0:
            req.cache.crop(-rows)

    def _live_branch(self, request_id: str, branch: BranchHandle) -> _Request:
        req = self._get(request_id)
        if branch.request_id != request_id or req.branch is None or req.branch != branch:
            raise CacheProtocolError(f"branch {branch.branch_id} is not the live branch of {request_id!r}")
        return req

    # --- TargetModel ----------------------------------------------------------------------------------

    def prefill(self, requests: Mapping[str, Sequence[int]]) -> None:
        """Open requests with committed rows for the given tokens (one forward per request)."""
        from transformers import DynamicCache

        for request_id, ids in requests.items():
            if request_id in self._requests:
                raise CacheProtocolError(f"request {request_id!r} is already open")
            self._check_ids(ids, "token", InvalidRequestError)
            self._check_room(request_id, len(ids) + 1)
        for request_id, ids in requests.items():
            try:
                cache = DynamicCache(config=self.model.config)
            except TypeError:  # transformers releases before the config argument
                cache = DynamicCache()
            req = _Request(cache=cache)
            if ids:
                self._run(req, [int(t) for t in ids], 0)
            req.token_ids.extend(int(t) for t in ids)
            self._requests[request_id] = req

    def materialize_frontier(self, frontiers: Mapping[str, int]) -> dict[str, torch.Tensor]:
        """Compute and retain each frontier's row; a frontier already retained is not recomputed."""
        for request_id, token in frontiers.items():
            req = self._get(request_id)
            self._check_ids([token], "frontier", DraftIdOutOfVocabError)
            if req.retained_token is not None and req.retained_token != token:
                raise CacheProtocolError(f"request {request_id!r} retains frontier {req.retained_token}")
            if req.retained_token is None and req.branch is not None:
                raise CacheProtocolError(f"request {request_id!r} has a live branch")
            self._check_room(request_id, len(req.token_ids) + 1)
        out: dict[str, torch.Tensor] = {}
        for request_id, token in frontiers.items():
            req = self._requests[request_id]
            if req.retained_token is None:
                req.retained_logits = self._run(req, [int(token)], len(req.token_ids))[0].clone()
                req.retained_token = int(token)
            assert req.retained_logits is not None
            out[request_id] = req.retained_logits.clone()
        return out

    def verify(self, requests: Sequence[VerifyRequest]) -> list[VerifyResult]:
        """Score each request's path (one batch-1 forward per request); logits [K+1, V] per request."""
        check_distinct(requests)
        plan: list[tuple[VerifyRequest, _Request, VerificationInputs]] = []
        for r in requests:
            plan.append((r, *self._planned_verification(r)))
        results = []
        for r, req, inputs in plan:
            rows = len(inputs.input_ids)
            computed = torch.empty(0, self._vocab)  # [0, V]: no drafts to score past a retained row
            if rows:
                computed = self._run(req, inputs.input_ids, inputs.first_position)  # [rows, V]
            result = verified_branch(
                r,
                inputs,
                computed,
                req.retained_logits,
                branch_id=self._next_branch,
                base_len=len(req.token_ids),
            )
            self._next_branch += 1
            req.branch = result.branch
            results.append(result)
        return results

    def _planned_verification(self, r: VerifyRequest) -> tuple[_Request, VerificationInputs]:
        """Check one request of a verification against its cache; its input rows by absolute position."""
        req = self._get(r.request_id)
        if req.branch is not None:
            raise CacheProtocolError(f"request {r.request_id!r} has a live branch")
        layout = parse_layout(r.layout)
        self._check_ids([r.frontier], "frontier", DraftIdOutOfVocabError)
        self._check_ids(r.draft_ids, "draft token", DraftIdOutOfVocabError)
        self._check_room(r.request_id, len(req.token_ids) + 1 + len(r.draft_ids))
        if replays_frontier(layout) and req.retained_token is not None:
            raise CacheProtocolError(f"request {r.request_id!r} retains its frontier row")
        if retains_frontier(layout) and req.retained_token != r.frontier:
            raise CacheProtocolError(f"request {r.request_id!r} has no retained row for {r.frontier}")
        drafts = [int(t) for t in r.draft_ids]
        return req, verification_inputs(layout, int(r.frontier), drafts, len(req.token_ids))

    def commit(self, request_id: str, branch: BranchHandle, keep: int) -> None:
        """Keep the first ``keep`` logical rows of the live branch: crop the rest off the cache."""
        req = self._live_branch(request_id, branch)
        check_commit(branch, keep, len(req.token_ids))
        retained = retains_frontier(branch.layout)
        rows_kept = max(keep, 1) if retained else keep  # a retained row stays retained when keep == 0
        self._crop(req, len(branch.token_ids) - rows_kept)
        req.token_ids.extend(branch.token_ids[:keep])
        if retained and keep >= 1:
            req.retained_token = None
            req.retained_logits = None
        req.branch = None

    def discard(self, request_id: str, branch: BranchHandle) -> None:
        """Crop the branch rows; committed rows and a retained frontier stay."""
        req = self._live_branch(request_id, branch)
        self._crop(req, verify_row_count(branch.layout, len(branch.token_ids) - 1))  # the rows it computed
        req.branch = None

    def release(self, request_id: str) -> None:
        """Forget a request; unknown ids are ignored."""
        self._requests.pop(request_id, None)

    def committed_token_ids(self, request_id: str) -> tuple[int, ...]:
        """C."""
        return tuple(self._get(request_id).token_ids)

    def retained_frontier(self, request_id: str) -> int | None:
        """The retained frontier token, or None."""
        return self._get(request_id).retained_token

    # --- beyond the port ------------------------------------------------------------------------------

    def is_open(self, request_id: str) -> bool:
        """Whether the request has a cache."""
        return request_id in self._requests

    def truncate(self, request_id: str, length: int) -> None:
        """Drop committed rows at positions ``>= length`` (a proposer rolling back its own cache)."""
        req = self._get(request_id)
        if req.branch is not None:
            raise CacheProtocolError(f"request {request_id!r} has a live branch")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= len(req.token_ids):
            raise InvalidRequestError(f"length must lie in 0..{len(req.token_ids)}, got {length!r}")
        if length < len(req.token_ids):
            self._crop(req, req.cached_rows() - length)
            del req.token_ids[length:]
            req.retained_token = None
            req.retained_logits = None
