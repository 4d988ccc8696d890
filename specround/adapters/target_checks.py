"""What every target adapter checks and builds the same way, whatever model runs underneath.

Token ids against the vocabulary, positions against the context, one verification per request, the
:class:`~specround.statemachine.model_ports.BranchHandle` and
:class:`~specround.statemachine.model_ports.VerifyResult` of a scored path, and the ``keep`` of a commit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.errors import CacheProtocolError, InvalidRequestError
from specround.sampling.layouts import VerificationInputs, extract_verification
from specround.statemachine.model_ports import BranchHandle, VerifyRequest, VerifyResult

__all__ = ["check_commit", "check_distinct", "check_room", "check_token_ids", "verified_branch"]


def check_token_ids(ids: Sequence[int], vocab: int, what: str, error: type[Exception]) -> None:
    """Raise ``error`` for the first of ``ids`` that is not an integer in ``[0, vocab)``."""
    for token in ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise error(f"{what} {token!r} outside [0, {vocab})")


def check_room(request_id: str, positions: int, context: int) -> None:
    """Refuse a request that would need more than ``context`` positions."""
    if positions > context:
        raise InvalidRequestError(
            f"request {request_id!r} would need {positions} positions; the context holds {context}"
        )


def check_distinct(requests: Sequence[VerifyRequest]) -> None:
    """Refuse a verification that names a request twice."""
    seen: set[str] = set()
    for r in requests:
        if r.request_id in seen:
            raise InvalidRequestError(f"request {r.request_id!r} appears twice in one verification")
        seen.add(r.request_id)


def verified_branch(
    request: VerifyRequest,
    inputs: VerificationInputs,
    computed: torch.Tensor,
    retained: torch.Tensor | None,
    *,
    branch_id: int,
    base_len: int,
) -> VerifyResult:
    """The result of one scored path: its p rows and the new live branch ``[F, d_1..d_K]`` on ``base_len``.

    ``computed`` [rows, V] are the logits of the request's input rows; ``retained`` [V] its retained
    frontier row, if any.
    """
    verification = extract_verification(
        inputs.layout, computed, inputs.positions, len(request.draft_ids), retained_p1=retained
    )
    branch = BranchHandle(
        request_id=request.request_id,
        branch_id=branch_id,
        layout=inputs.layout,
        base_len=base_len,
        token_ids=(int(request.frontier), *(int(t) for t in request.draft_ids)),
    )
    return VerifyResult(
        request_id=request.request_id,
        logits=verification.p_rows,
        branch=branch,
        computed_rows=len(inputs.input_ids),
    )


def check_commit(branch: BranchHandle, keep: int, committed_len: int) -> None:
    """Refuse a ``keep`` outside ``0..len(branch)`` and a branch built on another committed length."""
    if isinstance(keep, bool) or not isinstance(keep, int) or not 0 <= keep <= len(branch.token_ids):
        raise InvalidRequestError(f"keep must lie in 0..{len(branch.token_ids)}, got {keep!r}")
    if branch.base_len != committed_len:
        raise CacheProtocolError(f"branch {branch.branch_id} was built on a different committed length")
