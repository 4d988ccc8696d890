"""Synthetic rounds for controller tests: scripted outcomes and seeded random distributions (no model)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.statemachine.controller import RoundController
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput


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


def random_rows(n: int, vocab: int, generator: torch.Generator, dtype: torch.dtype) -> torch.Tensor:
    """``n`` strictly positive random distributions [n, V] (softmax of Gaussian logits, seeded)."""
    logits = torch.randn(n, vocab, generator=generator, dtype=torch.float64) * 2.0
    return torch.softmax(logits, dim=-1).to(dtype)  # [n, V]


def random_input(
    controller: RoundController,
    request_id: str,
    k: int,
    generator: torch.Generator,
    *,
    dtype: torch.dtype = torch.float64,
    coordinate_digest: str | None = None,
) -> RoundInput:
    """Drafts sampled from seeded random q rows, with independent seeded random p rows."""
    vocab = controller.config(request_id).vocab_size
    q_rows = random_rows(k, vocab, generator, dtype)  # [k, V]
    drafts = torch.multinomial(q_rows.to(torch.float64), 1, generator=generator).squeeze(1) if k else []
    p_rows = random_rows(k + 1, vocab, generator, dtype)  # [k+1, V]
    state = controller.state(request_id)
    return RoundInput(
        request_id=request_id,
        coordinate_digest=coordinate_digest or controller.coordinate_digest(request_id),
        draft_ids=tuple(int(d) for d in drafts),
        q_rows=q_rows if k else None,
        p_rows=p_rows,
        branch=Branch(request_id, state.generation),
        proposal_draws=k,
    )


def log_fingerprint(log: EventLog) -> list[tuple[str, int, str]]:
    """(request, seq, hash) of every stored event: equal fingerprints mean an unchanged log."""
    return [(e.request_id, e.seq, e.hash) for e in log.events()]
