"""The per-round input checks of a step: every field of a round, refused by name before any state moves.

A step drives many requests' rounds together, so one malformed round must never reach code that would
fail with a raw ``TypeError``/``AttributeError`` halfway through the step (leaving other requests in
flight). Every check here raises an :class:`~specround.errors.InputError` subclass naming the request and
the field, and reads nothing but the round's own input and its request's configuration:

* ``request_id`` and ``coordinate_digest``: ``str``; ``round_id``: None or a non-empty ``str`` of at most
  :data:`MAX_ROUND_ID_LENGTH` characters (the limit of the SQL logs' columns, applied on every backend);
* ``draft_ids``: a sequence of ``int`` (not ``bool``) or a 1-D integer tensor, every id in ``[0, V)``, at
  most :data:`MAX_DRAFT_LENGTH` of them (what the uniform cache and the sampler's one-pass decision hold);
* ``q_rows`` / ``p_rows``: dense (strided) floating-point tensors of shape ``[k, V]`` / ``[k + 1, V]``,
  q and p on one device with one dtype (``q_rows`` may be None when k = 0);
* ``proposal_draws`` and ``verify_rows``: ``int`` in ``[0, 2**63)`` (and the PROPOSAL counter must stay
  below 2**63); ``timings``: None or a :class:`~specround.statemachine.events.RoundTimings`.

Values inside the rows (NaN, negative mass, normalisation, q(d) = 0) are the sampler's to validate (its
:class:`~specround.errors.InputError` subclasses isolate a round the same way). :func:`check_round_input`
checks a whole :class:`~specround.statemachine.rounds.RoundInput`; the controller's phase-by-phase API uses
its two halves, :func:`check_proposal` and :func:`check_verification`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import torch

from specround.errors import DraftIdOutOfVocabError, InvalidRequestError, ShapeMismatchError
from specround.sampling.layouts import verify_row_count
from specround.sampling.types import Layout
from specround.statemachine.events import RoundTimings
from specround.statemachine.rounds import RoundInput, RoundProposal, RoundVerification
from specround.statemachine.uniform_cache import WINDOW

__all__ = [
    "INT64_END",
    "MAX_DRAFT_LENGTH",
    "MAX_ROUND_ID_LENGTH",
    "CheckedProposal",
    "CheckedRound",
    "CheckedVerification",
    "check_identity",
    "check_proposal",
    "check_round_input",
    "check_verification",
]

MAX_DRAFT_LENGTH = WINDOW
"""The longest draft a round may carry (the uniform cache serves at most this many ACCEPT draws)."""
MAX_ROUND_ID_LENGTH = 200
"""The longest round id (the SQL logs' identifier columns hold 200 characters)."""
INT64_END = 2**63
"""Counters and counts are int64 in the log and the sampler."""


@dataclass(frozen=True, slots=True)
class CheckedProposal:
    """The proposal half of a round, checked."""

    request_id: str
    coordinate_digest: str
    draft_ids: tuple[int, ...]
    q_rows: torch.Tensor
    """[k, V] floating point (an empty [0, V] float64 tensor when k = 0 and none was given)."""
    proposal_draws: int
    round_id: str | None
    timings: RoundTimings | None


@dataclass(frozen=True, slots=True)
class CheckedVerification:
    """The verification half of a round, checked against its proposal."""

    p_rows: torch.Tensor
    """[k + 1, V] floating point, on q's device with q's dtype (when k > 0)."""
    q_rows: torch.Tensor
    """The proposal's q rows, moved to p's dtype and device when k = 0."""
    branch: Any
    verify_rows: int


@dataclass(frozen=True, slots=True)
class CheckedRound:
    """A whole round input, checked."""

    proposal: CheckedProposal
    verification: CheckedVerification


def _count(value: object, name: str, request_id: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < INT64_END:
        raise InvalidRequestError(
            f"{name} of {request_id!r} must be an integer in [0, 2**63), got {_shown(value)}"
        )
    return value


def _shown(value: object) -> str:
    text = repr(value) if isinstance(value, (int, str, float, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def check_identity(item: RoundProposal | RoundVerification | RoundInput) -> str:
    """The round's request id, refused unless it is a ``str``."""
    request_id = item.request_id
    if not isinstance(request_id, str):
        raise InvalidRequestError(f"a round's request_id must be a str, got {_shown(request_id)}")
    return request_id


def _draft_ids(values: object, request_id: str, vocab: int) -> tuple[int, ...]:
    if isinstance(values, torch.Tensor):
        if values.dim() != 1 or values.dtype.is_floating_point or values.dtype.is_complex:
            raise ShapeMismatchError(
                f"draft_ids of {request_id!r} must be a 1-D integer tensor, got {values.dtype} "
                f"{tuple(values.shape)}"
            )
        if values.dtype == torch.bool:
            raise ShapeMismatchError(f"draft_ids of {request_id!r} must be integers, not booleans")
        if values.shape[0] > MAX_DRAFT_LENGTH:
            raise InvalidRequestError(
                f"{values.shape[0]} drafts for {request_id!r}: a round holds at most {MAX_DRAFT_LENGTH}"
            )
        out = tuple(int(v) for v in values.tolist())
    elif isinstance(values, (str, bytes, Mapping)) or not isinstance(values, Iterable):
        raise InvalidRequestError(
            f"draft_ids of {request_id!r} must be integers or a 1-D tensor, got {_shown(values)}"
        )
    else:
        try:
            items = tuple(islice(iter(values), MAX_DRAFT_LENGTH + 1))
        except Exception as exc:  # a custom iterable that fails to iterate
            raise InvalidRequestError(f"draft_ids of {request_id!r} cannot be read: {exc!r}") from None
        for value in items:
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequestError(
                    f"draft_ids of {request_id!r} must hold integers, got {_shown(value)}"
                )
        out = items
    if len(out) > MAX_DRAFT_LENGTH:
        raise InvalidRequestError(
            f"{len(out)} drafts for {request_id!r}: a round holds at most {MAX_DRAFT_LENGTH}"
        )
    for token in out:
        if not 0 <= token < vocab:
            raise DraftIdOutOfVocabError(f"draft id {token} outside [0, {vocab}) for {request_id!r}")
    return out


def _rows(value: object, name: str, request_id: str, shape: tuple[int, int]) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise ShapeMismatchError(
            f"{name} of {request_id!r} must be a torch.Tensor [{shape[0]}, {shape[1]}], got {_shown(value)}"
        )
    if value.layout != torch.strided:
        raise ShapeMismatchError(
            f"{name} of {request_id!r} must be a dense tensor, got layout {value.layout}"
        )
    if not value.dtype.is_floating_point:
        raise ShapeMismatchError(f"{name} of {request_id!r} must be floating point, got {value.dtype}")
    if value.is_meta:
        raise ShapeMismatchError(f"{name} of {request_id!r} are a meta tensor (no values)")
    if value.dim() != 2 or tuple(value.shape) != shape:
        raise ShapeMismatchError(
            f"{name} of {request_id!r} must be [{shape[0]}, {shape[1]}], got {tuple(value.shape)}"
        )
    return value


def check_proposal(
    item: RoundProposal | RoundInput, vocab_size: int, proposal_counter: int = 0
) -> CheckedProposal:
    """Check the proposal half of a round for a request with ``vocab_size`` tokens.

    ``proposal_counter`` is the request's PROPOSAL counter at round start (the draws must not carry it past
    the int64 end).
    """
    request_id = check_identity(item)
    digest = item.coordinate_digest
    if not isinstance(digest, str):
        raise InvalidRequestError(f"coordinate_digest of {request_id!r} must be a str, got {_shown(digest)}")
    round_id = item.round_id
    if round_id is not None and (
        not isinstance(round_id, str) or not 0 < len(round_id) <= MAX_ROUND_ID_LENGTH
    ):
        raise InvalidRequestError(
            f"round_id of {request_id!r} must be None or a str of 1..{MAX_ROUND_ID_LENGTH} characters, "
            f"got {_shown(round_id)}"
        )
    draft_ids = _draft_ids(item.draft_ids, request_id, vocab_size)
    k = len(draft_ids)
    q_rows = item.q_rows
    if q_rows is None:
        if k:
            raise ShapeMismatchError(f"{k} drafts of {request_id!r} need q rows [{k}, {vocab_size}]")
        q_rows = torch.empty(0, vocab_size, dtype=torch.float64)
    q_rows = _rows(q_rows, "q rows", request_id, (k, vocab_size))
    draws = _count(item.proposal_draws, "proposal_draws", request_id)
    if proposal_counter + draws >= INT64_END:
        raise InvalidRequestError(
            f"proposal_draws {draws} of {request_id!r} carry the PROPOSAL counter past 2**63"
        )
    timings = item.timings
    if timings is not None and not isinstance(timings, RoundTimings):
        raise InvalidRequestError(
            f"timings of {request_id!r} must be RoundTimings or None, got {_shown(timings)}"
        )
    return CheckedProposal(request_id, digest, draft_ids, q_rows, draws, round_id, timings)


def check_verification(
    item: RoundVerification | RoundInput, proposal: CheckedProposal, layout: Layout
) -> CheckedVerification:
    """Check the verification half of a round against its checked proposal."""
    request_id = proposal.request_id
    k, vocab = proposal.q_rows.shape
    p_rows = _rows(item.p_rows, "p rows", request_id, (k + 1, vocab))
    q_rows = proposal.q_rows
    if k and (q_rows.dtype != p_rows.dtype or q_rows.device != p_rows.device):
        raise ShapeMismatchError(
            f"q rows ({q_rows.dtype}, {q_rows.device}) and p rows ({p_rows.dtype}, {p_rows.device}) of "
            f"{request_id!r} must share dtype and device"
        )
    if not k:
        q_rows = q_rows.to(dtype=p_rows.dtype, device=p_rows.device)
    default_rows = verify_row_count(layout, k)
    rows = item.verify_rows if item.verify_rows is not None else default_rows
    rows = _count(rows, "verify_rows", request_id)
    return CheckedVerification(p_rows, q_rows, item.branch, rows)


def check_round_input(
    item: RoundInput, vocab_size: int, layout: Layout, proposal_counter: int = 0
) -> CheckedRound:
    """Check every field of a whole round input (what a batched step calls for each of its rounds)."""
    proposal = check_proposal(item, vocab_size, proposal_counter)
    return CheckedRound(proposal, check_verification(item, proposal, layout))
