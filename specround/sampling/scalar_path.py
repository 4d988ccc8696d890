"""The fast path's control for a small batch, on Python scalars: the same decision, no numpy call per rule.

For a batch of a few requests (``B * (K + 1) <=`` :data:`SCALAR_LIMIT`), the numpy control of
:func:`~specround.sampling.fast_path.decide_on_host` costs about a hundred small array calls, each of which
takes longer than the rule it evaluates. Here the same rules run on Python numbers: the gathered draft
probabilities, the accepted run, stops and the length cap, RNG accounting and the output layout. The
acceptance test is still :func:`~specround.sampling.exact.accepts` (one call for the whole batch), and
the terminal draws are the fast path's own host pass (:func:`~specround.sampling.fast_path.terminal_draws`),
so the values are those of the reference path bit for bit; ``tests/sampling/test_fast_path.py`` compares
all three paths field by field.

As on the fast path, any value that fails a check returns ``None``: the reference path then names the error.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from specround.sampling.fast_path import HostBatch, HostSeams, host_array, terminal_draws
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from specround.sampling.validation import ValidationMode

__all__ = ["SCALAR_LIMIT", "decide_with_scalars"]

SCALAR_LIMIT = 32
"""Largest ``B * (K + 1)`` decided on Python scalars (beyond it numpy's per-call cost is amortised)."""

_NAN = float("nan")
_INF = math.inf
_CORRECTION, _BONUS, _STOP = int(TerminalKind.CORRECTION), int(TerminalKind.BONUS), int(TerminalKind.STOP)


def _stop_sets(stop_ids: np.ndarray[Any, Any], n_batch: int, k_max: int) -> list[list[frozenset[int]]]:
    """Per request, the stop set of each 1-based position ``1..K+1`` (PAD entries dropped)."""
    if stop_ids.shape[-1] == 0:
        return [[frozenset()] * (k_max + 1) for _ in range(n_batch)]
    if stop_ids.ndim == 2:  # one set per request, for every position
        return [[frozenset(t for t in row if t != PAD_ID)] * (k_max + 1) for row in stop_ids.tolist()]
    return [[frozenset(t for t in cell if t != PAD_ID) for cell in row] for row in stop_ids.tolist()]


def decide_with_scalars(
    batch: SamplerBatch,
    host: HostBatch,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
    seams: HostSeams,
) -> SamplerDecision | None:
    """The decision of a small CPU batch whose structure was checked, or ``None`` for the reference path."""
    if mode == "full":
        seams.check_all_rows(batch)
    n_batch, k_max = host.draft_ids.shape
    ids: list[list[int]] = host.draft_ids.tolist()
    lens: list[int] = host.draft_lens.tolist()
    remaining: list[int] = host.remaining.tolist()
    u: list[list[float]] = host_array(accept_uniforms).tolist()
    u_terminal: list[float] = host_array(terminal_uniforms).tolist()
    p, q = host.p, host.q

    # Gathered draft probabilities p_i(d_i), q_i(d_i) (float() widens exactly); padding holds 0 and 1.
    p_draft = [
        [float(p[b, i, ids[b][i]]) if i < lens[b] else 0.0 for i in range(k_max)] for b in range(n_batch)
    ]
    q_draft = [
        [float(q[b, i, ids[b][i]]) if i < lens[b] else 1.0 for i in range(k_max)] for b in range(n_batch)
    ]
    for b in range(n_batch):
        for i in range(lens[b]):  # p(d) in [0, inf) and q(d) in (0, inf); NaN fails both
            if not (0.0 <= p_draft[b][i] < _INF and 0.0 < q_draft[b][i] < _INF):
                return None

    # Acceptance tests (the one written rule) and the leading accepted run A.
    tested: list[list[bool]] = seams.accepts(
        accept_uniforms,
        torch.tensor(p_draft, dtype=torch.float64),
        torch.tensor(q_draft, dtype=torch.float64),
    ).tolist()
    sets = _stop_sets(host.stop_ids, n_batch, k_max)
    accepted, stop_len, by_token = [0] * n_batch, [0] * n_batch, [False] * n_batch
    for b in range(n_batch):
        run = 0
        while run < lens[b] and tested[b][run]:
            run += 1
        accepted[b] = run
        # A stop token or the length cap inside the accepted prefix (1-based position i + 1 <= A).
        for i in range(run):
            token_stop = ids[b][i] in sets[b][i]
            if token_stop or i + 1 == remaining[b]:
                stop_len[b], by_token[b] = i + 1, token_stop
                break

    draws = [stop_len[b] if stop_len[b] else min(accepted[b] + 1, lens[b]) for b in range(n_batch)]
    for b in range(n_batch):  # every uniform the decision uses lies in [0, 1)
        if not all(0.0 <= u[b][i] < 1.0 for i in range(draws[b])):
            return None
        if not stop_len[b] and not 0.0 <= u_terminal[b] < 1.0:
            return None

    tokens = [PAD_ID] * n_batch
    masses = [[_NAN] * n_batch for _ in range(3)]  # total, before, token
    drawing = [b for b in range(n_batch) if not stop_len[b]]
    if drawing:
        drawn = terminal_draws(
            batch,
            host,
            np.array(accepted, dtype=np.int64),
            host.draft_lens,
            np.array(drawing, dtype=np.int64),
            np.array(u_terminal, dtype=np.float64),
            mode,
            seams,
        )
        if drawn is None:
            return None
        rows, draw = drawn
        for j, row in enumerate(rows.tolist()):
            tokens[row] = int(draw.tokens[j])
            masses[0][row] = float(draw.total[j])
            masses[1][row] = float(draw.mass_before[j])
            masses[2][row] = float(draw.token_mass[j])

    return _decision(
        k_max,
        ids,
        lens,
        remaining,
        u,
        u_terminal,
        p_draft,
        q_draft,
        sets,
        accepted,
        stop_len,
        by_token,
        draws,
        tokens,
        masses,
    )


def _decision(
    k_max: int,
    ids: list[list[int]],
    lens: list[int],
    remaining: list[int],
    u: list[list[float]],
    u_terminal: list[float],
    p_draft: list[list[float]],
    q_draft: list[list[float]],
    sets: list[list[frozenset[int]]],
    accepted: list[int],
    stop_len: list[int],
    by_token: list[bool],
    draws: list[int],
    tokens: list[int],
    masses: list[list[float]],
) -> SamplerDecision:
    """The finish rules of the terminal token at position A + 1, and the decision's tensors."""
    n_batch = len(ids)
    output_ids, emitted, prefix, kinds, finished, stopped_by_token = [], [], [], [], [], []
    for b in range(n_batch):
        run = accepted[b]
        if stop_len[b]:
            prefix.append(stop_len[b])
            emitted.append(stop_len[b])
            kinds.append(_STOP)
            finished.append(True)
            stopped_by_token.append(by_token[b])
            row = ids[b][: stop_len[b]] + [PAD_ID] * (k_max + 1 - stop_len[b])
        else:
            terminal_stop = tokens[b] in sets[b][run]
            prefix.append(run)
            emitted.append(run + 1)
            kinds.append(_CORRECTION if run < lens[b] else _BONUS)
            finished.append(terminal_stop or run + 1 == remaining[b])
            stopped_by_token.append(terminal_stop)
            row = ids[b][:run] + [tokens[b]] + [PAD_ID] * (k_max - run)
        output_ids.append(row)
    needs = [not s for s in stop_len]

    def ints(values: list[Any]) -> torch.Tensor:
        return torch.from_numpy(np.array(values, dtype=np.int64))

    def floats(values: list[Any]) -> torch.Tensor:
        return torch.from_numpy(np.array(values, dtype=np.float64))

    def flags(values: list[bool]) -> torch.Tensor:
        return torch.from_numpy(np.array(values, dtype=np.bool_))

    return SamplerDecision(
        output_ids=ints(output_ids).reshape(n_batch, k_max + 1),
        emitted=ints(emitted),
        accepted=ints(prefix),
        terminal=ints(kinds),
        finished=flags(finished),
        accept_draws=ints(draws),
        terminal_draws=ints([int(n) for n in needs]),
        p_draft=floats(p_draft).reshape(n_batch, k_max),
        q_draft=floats(q_draft).reshape(n_batch, k_max),
        accept_uniforms=floats(
            [[u[b][i] if i < draws[b] else _NAN for i in range(k_max)] for b in range(n_batch)]
        ).reshape(n_batch, k_max),
        terminal_uniform=floats([u_terminal[b] if needs[b] else _NAN for b in range(n_batch)]),
        terminal_row=ints([accepted[b] if needs[b] else PAD_ID for b in range(n_batch)]),
        residual_mass=floats(masses[0]),
        terminal_mass_before=floats(masses[1]),
        terminal_token_mass=floats(masses[2]),
        stopped_by_token=flags(stopped_by_token),
        degenerate_correction=flags([False] * n_batch),
    )
