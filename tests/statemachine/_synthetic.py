"""Synthetic rounds for controller tests: scripted outcomes and seeded random distributions (no model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.model_check import random_rounds
from specround.statemachine.controller import RoundController
from specround.statemachine.invariants import log_fingerprint
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput

__all__ = [
    "Branch",
    "log_fingerprint",
    "one_hot",
    "random_input",
    "run_random_steps",
    "scripted_input",
    "uniform",
]


@dataclass(frozen=True)
class Branch:
    """A stand-in for a model adapter's branch handle."""

    request_id: str
    generation: int


def one_hot(token: int, vocab: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    row = torch.zeros(vocab, dtype=dtype)  # [V]
    row[token] = 1.0
    return row


def uniform(vocab: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.full((vocab,), 1.0 / vocab, dtype=dtype)  # [V]


def scripted_input(
    controller: RoundController,
    request_id: str,
    drafts: Sequence[int],
    accepted: int,
    terminal_token: int,
    *,
    dtype: torch.dtype = torch.float64,
    proposal_draws: int = 0,
    round_id: str | None = None,
) -> RoundInput:
    """A round whose outcome does not depend on the uniforms.

    q rows are one-hot on the drafts. p rows 1..accepted equal q (ratio 1: always accepted); p row
    ``accepted + 1`` (when a draft is left) is one-hot on ``terminal_token`` != that draft (ratio 0: always
    rejected, and the residual is one-hot on ``terminal_token``: the correction); when every draft is
    accepted the bonus row ``p_{k+1}`` is one-hot on ``terminal_token``.
    """
    vocab = controller.config(request_id).vocab_size
    k = len(drafts)
    assert 0 <= accepted <= k
    if accepted < k:
        assert terminal_token != drafts[accepted], "a correction differs from the rejected draft"
    q_rows = torch.stack([one_hot(d, vocab, dtype) for d in drafts]) if k else None  # [k, V]
    p_list = [one_hot(d, vocab, dtype) for d in drafts[:accepted]]
    p_list.append(one_hot(terminal_token, vocab, dtype))
    p_list += [uniform(vocab, dtype) for _ in range(k + 1 - len(p_list))]
    p_rows = torch.stack(p_list)  # [k+1, V]
    state = controller.state(request_id)
    return RoundInput(
        request_id=request_id,
        coordinate_digest=controller.coordinate_digest(request_id),
        draft_ids=tuple(drafts),
        q_rows=q_rows,
        p_rows=p_rows,
        branch=Branch(request_id, state.generation),
        proposal_draws=proposal_draws,
        round_id=round_id,
    )


def random_input(
    controller: RoundController,
    request_id: str,
    k: int,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float64,
    coordinate_digest: str | None = None,
) -> RoundInput:
    """:func:`specround.model_check.random_rounds.random_input` with a stand-in branch handle."""
    branch = Branch(request_id, controller.state(request_id).generation)
    return random_rounds.random_input(
        controller, request_id, k, generator, dtype=dtype, coordinate_digest=coordinate_digest, branch=branch
    )


def run_random_steps(
    log: EventLog,
    request_ids: Sequence[str],
    *,
    steps: int,
    vocab: int,
    generator_seed: int,
    request_seed: int = 9,
    k: int = 3,
    max_new_tokens: int = 40,
) -> None:
    """Open ``request_ids`` on a controller over ``log`` and run ``steps`` seeded random steps of them all."""
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(generator_seed)
    for rid in request_ids:
        controller.open_request(
            (1, 2, 3), seed=request_seed, vocab_size=vocab, request_id=rid, max_new_tokens=max_new_tokens
        )
    for _ in range(steps):
        controller.step([random_input(controller, rid, k, generator) for rid in request_ids])
