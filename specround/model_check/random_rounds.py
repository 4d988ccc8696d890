"""Seeded random round inputs for checkers and tests: random proposals with random target rows, no model.

The conformance walk of ``specround check`` (:mod:`specround.model_check.conformance`) and the controller
tests draw their rounds here, so that both exercise the controller with the same kind of input.
"""

from __future__ import annotations

import torch

from specround.statemachine.controller import RoundController
from specround.statemachine.rounds import RoundInput

__all__ = ["random_input", "random_rows", "seeded_random_input"]


def random_rows(n: int, vocab: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` strictly positive random distributions [n, V] in float64 (softmax of Gaussian logits times 2)."""
    logits = torch.randn(n, vocab, generator=generator, dtype=torch.float64) * 2.0  # [n, V]
    return torch.softmax(logits, dim=-1)  # [n, V]


def random_input(
    controller: RoundController,
    request_id: str,
    k: int,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float64,
    coordinate_digest: str | None = None,
    branch: object | None = None,
) -> RoundInput:
    """A valid round of ``k`` drafts on the controller's current view of ``request_id``.

    The drafts are sampled from seeded random q rows (drawn in float64, handed in as ``dtype``) and the
    ``k + 1`` p rows are independent seeded random rows. ``coordinate_digest`` overrides the controller's
    current coordinate (to offer a round bound to another one); ``branch`` is the adapter's branch handle.
    """
    vocab = controller.config(request_id).vocab_size
    q_rows = random_rows(k, vocab, generator)  # [k, V]
    drafts = torch.multinomial(q_rows, 1, generator=generator).squeeze(1).tolist() if k else []
    p_rows = random_rows(k + 1, vocab, generator)  # [k+1, V]
    return RoundInput(
        request_id=request_id,
        coordinate_digest=coordinate_digest or controller.coordinate_digest(request_id),
        draft_ids=tuple(int(d) for d in drafts),
        q_rows=q_rows.to(dtype) if k else None,
        p_rows=p_rows.to(dtype),
        branch=branch,
        proposal_draws=k,
    )


def seeded_random_input(
    controller: RoundController, request_id: str, k: int, seed: int, *, dtype: torch.dtype = torch.float64
) -> RoundInput:
    """:func:`random_input` from a fresh generator seeded with ``seed`` (one seed, one round)."""
    return random_input(controller, request_id, k, torch.Generator().manual_seed(seed), dtype=dtype)
