"""Rows that force a decision: p/q rows on which the exact sampler, fed known uniforms, must take a plan.

A request's uniforms are known in advance (``Philox(seed, stream, counter)``), so a witness's decision can be
forced on the real sampler. The rows are not one-hot: every acceptance ratio sits just above (or below) its
uniform and the terminal token's inverse-CDF bracket is narrow, so a sampler that reads another row,
another uniform or an unnormalised residual leaves the plan.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.errors import InputError
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream
from specround.statemachine.state import RequestState

__all__ = ["BRACKET_HALF_WIDTH", "bracket_row", "forced_rows", "round_uniforms", "spread"]

BRACKET_HALF_WIDTH = 0.1
"""Half the width of the forced terminal token's inverse-CDF bracket (as a fraction of the row's mass)."""


def bracket_row(vocab: int, token: int, u: float, *, excluded: int | None = None) -> torch.Tensor:
    """A distribution [V] whose inverse CDF at ``u`` is ``token``, with a narrow bracket around ``u``.

    Mass before ``token`` (in id order) is ``u - h`` and ``token`` holds ``2 h`` (``h`` =
    :data:`BRACKET_HALF_WIDTH`, clipped at 0 and 1), spread evenly over the other tokens; ``excluded`` gets
    no mass. Another uniform, or the same uniform against another row, mostly lands on another token.
    """
    if excluded == token or not 0 <= token < vocab or not 0.0 <= u < 1.0:
        raise InputError(f"no row can put token {token} at u = {u} (vocab {vocab}, excluded {excluded})")
    eligible = [j for j in range(vocab) if j != excluded]
    below = [j for j in eligible if j < token]
    above = [j for j in eligible if j > token]
    low = max(0.0, u - BRACKET_HALF_WIDTH) if below else 0.0
    high = min(1.0, u + BRACKET_HALF_WIDTH) if above else 1.0
    row = torch.zeros(vocab, dtype=torch.float64)  # [V]
    if below:
        row[below] = low / len(below)
    row[token] = high - low
    if above:
        row[above] = (1.0 - high) / len(above)
    return row


def spread(vocab: int, token: int, mass: float) -> torch.Tensor:
    """[V]: ``mass`` on ``token`` and the rest spread evenly over the other tokens."""
    row = torch.full((vocab,), (1.0 - mass) / (vocab - 1), dtype=torch.float64)
    row[token] = mass
    return row


def forced_rows(
    vocab: int,
    drafts: Sequence[int],
    accepted: int,
    terminal_token: int,
    accept_uniforms: Sequence[float],
    terminal_uniform: float,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Rows that force a decision: q [k, V] and p [k+1, V] for the exact sampler fed these uniforms.

    The sampler accepts ``d_1..d_accepted``, then rejects and corrects to ``terminal_token`` (``accepted <
    k``) or draws ``terminal_token`` as the bonus (``accepted == k``).

    Accepted test i: ``q_i(d_i) = 1/2`` and ``p_i(d_i) / q_i(d_i)`` halfway between ``u_i`` and 1. Rejected
    test: ``q = 1/2 e_d + 1/2 w`` and ``p = r/2 e_d + 1/2 w + Z rho`` with ``r = u/2`` (below the uniform),
    ``w`` uniform off ``d``, ``Z = (1 - r)/2``, so the normalised residual is exactly ``rho``, a
    :func:`bracket_row` around the TERMINAL uniform. The bonus row is such a bracket row itself. Rows of
    tests that are never reached are valid but arbitrary. q is None when there are no drafts.
    """
    k = len(drafts)
    if not 0 <= accepted <= k or len(accept_uniforms) < k:
        raise InputError(f"cannot force A = {accepted} with {k} drafts and {len(accept_uniforms)} uniforms")
    if vocab < 3:
        raise InputError("forced rows need a vocabulary of at least 3 tokens")
    q_rows: list[torch.Tensor] = []
    p_rows: list[torch.Tensor] = []
    for i, draft in enumerate(drafts):
        u = float(accept_uniforms[i])
        q = spread(vocab, draft, 0.5)
        q_rows.append(q)
        if i < accepted:
            ratio = u + (1.0 - u) / 2.0  # u < ratio < 1: accepted, and only just
            p_rows.append(spread(vocab, draft, 0.5 * ratio))
        elif i == accepted:
            if terminal_token == draft:
                raise InputError("a correction differs from the rejected draft")
            ratio = u / 2.0  # ratio <= u: rejected (u = 0 gives p(d) = 0)
            others = torch.full((vocab,), 0.5 / (vocab - 1), dtype=torch.float64)
            others[draft] = 0.0
            residual = (1.0 - ratio) / 2.0
            rho = bracket_row(vocab, terminal_token, terminal_uniform, excluded=draft)
            p = others + residual * rho
            p[draft] = 0.5 * ratio
            p_rows.append(p)
        else:
            p_rows.append(q.clone())
    if accepted == k:
        p_rows.append(bracket_row(vocab, terminal_token, terminal_uniform))
    else:
        p_rows.append(torch.full((vocab,), 1.0 / vocab, dtype=torch.float64))
    return (torch.stack(q_rows) if q_rows else None), torch.stack(p_rows)


def round_uniforms(seed: int, state: RequestState, k: int) -> tuple[list[float], float]:
    """The ACCEPT uniforms of tests 1..k and the TERMINAL uniform a round from ``state`` will be fed."""
    accept = uniforms(seed, Stream.ACCEPT, torch.arange(k, dtype=torch.int64) + state.rng.accept).tolist()
    terminal = float(uniforms(seed, Stream.TERMINAL, state.rng.terminal))
    return [float(u) for u in accept], terminal
