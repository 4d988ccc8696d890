"""The fast path's control for a small batch, on Python scalars: the same decision, no numpy call per rule.

For a batch of a few requests (``B * (K + 1) <=`` :data:`SCALAR_LIMIT`), the numpy control of
:func:`~specround.sampling.fast_path.decide_on_host` costs about a hundred small array calls, each of which
takes longer than the rule it evaluates. Here the same rules run on Python numbers: the gathered draft
probabilities, the accepted run, stops and the length cap, RNG accounting and the output layout. The
acceptance test is :func:`~specround.sampling.exact.accepts_scalar` (the one written rule on floats), and
the terminal draws are the fast path's own host pass (:func:`~specround.sampling.fast_path.terminal_draws`),
so the values are those of the reference path bit for bit; ``tests/sampling/test_fast_path.py`` compares
all three paths field by field.

As on the fast path, any value that fails a check returns ``None``: the reference path then names the error.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from specround.sampling.fast_path import HostSeams, few_terminal_draws, host_array
from specround.sampling.host_decision import host_decision
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from specround.sampling.validation import ValidationMode

__all__ = [
    "SCALAR_LIMIT",
    "ScalarBatch",
    "decide_with_scalars",
    "scalar_batch",
    "structure_is_valid_on_scalars",
]

SCALAR_LIMIT = 32
"""Largest ``B * (K + 1)`` decided on Python scalars (beyond it numpy's per-call cost is amortised)."""

_NAN = float("nan")
_INF = math.inf
_INT64_MAX = 2**63 - 1
_CORRECTION, _BONUS, _STOP = int(TerminalKind.CORRECTION), int(TerminalKind.BONUS), int(TerminalKind.STOP)


@dataclass(frozen=True, slots=True)
class ScalarBatch:
    """A small CPU batch's integers as Python lists and its rows as numpy views (made once per decision)."""

    p: npt.NDArray[Any]
    """[B, K+1, V] a view of ``p``."""
    q: npt.NDArray[Any]
    """[B, K, V] a view of ``q``."""
    draft_ids: list[list[int]]
    draft_lens: list[int]
    stop_ids: list[Any]
    """``stop_ids.tolist()``: [B][S] or [B][K+1][S]."""
    stop_dim: int
    """2 (one stop set per request) or 3 (one per position)."""
    stop_width: int
    """S, the entries of one stop set (0: no stop tokens)."""
    remaining: list[int]
    accept_counters: list[int]
    terminal_counters: list[int]


def scalar_batch(batch: SamplerBatch) -> ScalarBatch:
    """:class:`ScalarBatch` of a CPU ``batch`` whose shapes were checked (one ``tolist`` per tensor)."""
    return ScalarBatch(
        p=host_array(batch.p),
        q=host_array(batch.q),
        draft_ids=batch.draft_ids.tolist(),
        draft_lens=batch.draft_lens.tolist(),
        stop_ids=batch.stop_ids.tolist(),
        stop_dim=batch.stop_ids.dim(),
        stop_width=batch.stop_ids.shape[-1],
        remaining=batch.remaining.tolist(),
        accept_counters=batch.accept_counters.tolist(),
        terminal_counters=batch.terminal_counters.tolist(),
    )


def _flat_stop_ids(host: ScalarBatch) -> list[int]:
    """Every stop id of the batch in one list."""
    if host.stop_dim == 2:
        return [t for row in host.stop_ids for t in row]
    return [t for row in host.stop_ids for cell in row for t in cell]


def structure_is_valid_on_scalars(host: ScalarBatch) -> bool:
    """Whether the integer values pass :func:`~specround.sampling.validation.check_batch_structure`.

    The conditions of :func:`~specround.sampling.fast_path.structure_is_valid_on_host` on Python lists;
    ``False`` means the caller runs the full check, which raises the named error.
    """
    k_max, vocab = host.q.shape[1], host.p.shape[2]
    if not host.draft_lens:
        return True
    for length, row in zip(host.draft_lens, host.draft_ids, strict=True):
        if not 0 <= length <= k_max:
            return False
        # Within the draft length an id lies in [0, V); beyond it, it is PAD_ID.
        if not all(0 <= d < vocab for d in row[:length]) or any(d != PAD_ID for d in row[length:]):
            return False
    stops = _flat_stop_ids(host)
    return not (
        min(host.remaining) < 1
        or min(host.accept_counters) < 0
        or max(host.accept_counters) > _INT64_MAX - k_max
        or min(host.terminal_counters) < 0
        or max(host.terminal_counters) > _INT64_MAX - 1
        or (stops and (min(stops) < PAD_ID or max(stops) > vocab - 1))
    )


def _stop_sets(host: ScalarBatch, n_batch: int, k_max: int) -> list[list[frozenset[int]]]:
    """Per request, the stop set of each 1-based position ``1..K+1`` (PAD entries dropped)."""
    if host.stop_width == 0:
        return [[frozenset()] * (k_max + 1) for _ in range(n_batch)]
    if host.stop_dim == 2:  # one set per request, for every position
        return [[frozenset(t for t in row if t != PAD_ID)] * (k_max + 1) for row in host.stop_ids]
    return [[frozenset(t for t in cell if t != PAD_ID) for cell in row] for row in host.stop_ids]


def decide_with_scalars(
    batch: SamplerBatch,
    host: ScalarBatch,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
    seams: HostSeams,
    accepts: Callable[[float, float, float], bool],
) -> SamplerDecision | None:
    """The decision of a small CPU batch whose structure was checked, or ``None`` for the reference path.

    ``accepts`` is :func:`~specround.sampling.exact.accepts_scalar`, the acceptance rule on Python floats.
    """
    if mode == "full":
        seams.check_all_rows(batch)
    ids, lens, remaining = host.draft_ids, host.draft_lens, host.remaining
    n_batch, k_max = len(ids), host.q.shape[1]
    u: list[list[float]] = accept_uniforms.tolist()
    u_terminal: list[float] = terminal_uniforms.tolist()
    p, q = host.p, host.q

    # Gathered draft probabilities p_i(d_i), q_i(d_i) (item() widens exactly); padding holds 0 and 1.
    p_draft = [
        [p.item(b, i, ids[b][i]) if i < lens[b] else 0.0 for i in range(k_max)] for b in range(n_batch)
    ]
    q_draft = [
        [q.item(b, i, ids[b][i]) if i < lens[b] else 1.0 for i in range(k_max)] for b in range(n_batch)
    ]
    for b in range(n_batch):
        for i in range(lens[b]):  # p(d) in [0, inf) and q(d) in (0, inf); NaN fails both
            if not (0.0 <= p_draft[b][i] < _INF and 0.0 < q_draft[b][i] < _INF):
                return None

    # Acceptance tests (the one written rule) and the leading accepted run A; a stop in the accepted prefix.
    sets = _stop_sets(host, n_batch, k_max)
    accepted, stop_len, by_token = [0] * n_batch, [0] * n_batch, [False] * n_batch
    for b in range(n_batch):
        run, u_b, p_b, q_b = 0, u[b], p_draft[b], q_draft[b]
        while run < lens[b] and accepts(u_b[run], p_b[run], q_b[run]):
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
        drawn = few_terminal_draws(batch, p, q, accepted, lens, drawing, u_terminal, mode, seams)
        if drawn is None:
            return None
        rows, draw = drawn
        found = (
            draw.tokens.tolist(),
            draw.total.tolist(),
            draw.mass_before.tolist(),
            draw.token_mass.tolist(),
        )
        for j, row in enumerate(rows):
            tokens[row] = found[0][j]
            masses[0][row], masses[1][row], masses[2][row] = found[1][j], found[2][j], found[3][j]

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
    counts = np.array(  # host_decision.COUNT_FIELDS
        [
            emitted,
            prefix,
            kinds,
            draws,
            [int(n) for n in needs],
            [accepted[b] if needs[b] else PAD_ID for b in range(n_batch)],
        ],
        dtype=np.int64,
    ).reshape(6, n_batch)
    flags = np.zeros((3, n_batch), dtype=np.bool_)  # FLAG_FIELDS; no degenerate correction here
    flags[0], flags[1] = finished, stopped_by_token
    reached_uniforms = [[u[b][i] if i < draws[b] else _NAN for i in range(k_max)] for b in range(n_batch)]
    per_draft = np.array([p_draft, q_draft, reached_uniforms], dtype=np.float64).reshape(3, n_batch, k_max)
    terminal_uniform = [u_terminal[b] if needs[b] else _NAN for b in range(n_batch)]
    per_request = np.array([*masses, terminal_uniform], dtype=np.float64).reshape(4, n_batch)
    output = np.array(output_ids, dtype=np.int64).reshape(n_batch, k_max + 1)
    return host_decision(output, counts, flags, per_draft, per_request)
