"""The exact sampler's fast path: the same decision with a small, fixed number of tensor ops.

The decision of :mod:`specround.sampling.exact` has two kinds of work. Its *control* -- gathered draft
probabilities, acceptance tests, the accepted run, stops and budgets, RNG accounting, the output layout --
reads ``O(B * (K + S))`` numbers; done with torch it is hundreds of tiny kernels whose dispatch is the whole
cost of a small batch. Its *terminal pass* reads one ``p`` row (and one ``q`` row for a correction) of ``V``
entries per request. Here the control runs with numpy on the tensors' own memory (zero-copy views, no
tensor op). The terminal pass also runs on the host (:mod:`specround.sampling.host_terminal`), row by
row on views for few or long rows, else in cache-sized column chunks, reading each input entry once (row
checks, residual, exact widening into the float64 mass), whose block sums are then one torch reduction
(long rows at a large B: one per cache-sized group of rows, at most 16); the acceptance test is the one
written rule on numpy arrays (:func:`~specround.sampling.exact.accepts_host`). What remains as tensor ops
is the block sums and the zero-copy wrapping of host arrays: about 20 dispatched operators (under 40 with
the groups), whatever B, nine of them the decision's fields (:mod:`specround.sampling.host_decision`).
The inverse-CDF search runs on the host over the block sums.

Every value is computed with the same floating-point operations as the reference path (the acceptance
ratio by the rule ``accepts`` applies, the residual as a correctly rounded subtraction in the rows' dtype
and a clamp that keeps a zero's sign as torch's does, block sums by the same torch reduction over the
same float64 values, cumulative sums sequentially in float64), so the decision is identical bit for bit;
``tests/sampling/test_decision_fixture.py`` and ``tests/sampling/test_fast_path.py`` hold it to that.

A batch on an accelerator takes the same control on the host: :func:`device_host_batch` copies its integers
in one transfer, the draft probabilities are gathered on the device and copied back in one, and the terminal
pass runs there (``HostSeams.device_blocks``) with the reference's operations, returning the float64 block
sums and row statistics in one copy; the search then reads one block per row from the device.

With ``SPECROUND_SAMPLER_COMPILE=1`` the terminal pass runs as torch ops instead (two gathers, then the row
checks and the residual fused by ``torch.compile``), with the same values.

The fast path never raises an input error itself. Whenever a value it reads fails a check -- or lands
close enough to a tolerance that a different summation order could decide it -- or a correction's residual
is degenerate, it returns ``None`` and the caller runs the reference path, which raises the named error (or
handles the rare case) exactly as before. Callers check the batch's structure first.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from specround.sampling.host_decision import host_decision
from specround.sampling.host_terminal import (
    ROW_BY_ROW_VOCAB,
    TerminalBlocks,
    host_block_sums,
    mass_reader,
    takes_rows_one_by_one,
    terminal_blocks_host,
    terminal_blocks_rows,
)
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from specround.sampling.validation import ValidationMode, normalisation_tolerance

__all__ = [
    "COMPILE_ENV",
    "HostBatch",
    "HostDraw",
    "HostSeams",
    "decide_on_host",
    "device_host_batch",
    "few_terminal_draws",
    "host_array",
    "host_batch",
    "host_floats",
    "search_host",
    "structure_is_valid_on_host",
    "terminal_draws",
]

_F64 = np.float64
_NAN = float("nan")
_TOLERANCE_MARGIN = 0.5
"""A terminal row whose ``|sum - 1|`` exceeds this fraction of the tolerance goes to the reference check."""

FloatArray = npt.NDArray[Any]
"""A float64 numpy array."""
IntArray = npt.NDArray[Any]
"""An int64 numpy array."""
BoolArray = npt.NDArray[Any]
"""A bool numpy array."""


def host_array(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy view of a CPU tensor's memory (no copy, no tensor op)."""
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


@dataclass(frozen=True, slots=True)
class HostBatch:
    """Numpy views of a CPU batch's tensors (made once per decision), or host copies of an accelerator's.

    For a batch on an accelerator (:func:`device_host_batch`) ``p`` and ``q`` are ``None``: its rows stay
    where they are and the decision reads them there, while its integers come to the host in one copy.
    """

    p: npt.NDArray[Any] | None
    """[B, K+1, V] view of a CPU batch's p; None when the rows are on an accelerator."""
    q: npt.NDArray[Any] | None
    """[B, K, V] view of a CPU batch's q; None when the rows are on an accelerator."""
    vocab: int
    draft_ids: IntArray
    draft_lens: IntArray
    stop_ids: IntArray
    remaining: IntArray
    accept_counters: list[int]
    terminal_counters: list[int]
    seeds: list[int] | None = None
    """The request seeds (read only for an accelerator's batch, whose uniforms are drawn on the host)."""


def host_batch(batch: SamplerBatch) -> HostBatch:
    """:class:`HostBatch` of a CPU ``batch`` whose shapes were checked."""
    return HostBatch(
        p=host_array(batch.p),
        q=host_array(batch.q),
        vocab=batch.p.shape[2],
        draft_ids=batch.draft_ids.numpy(),
        draft_lens=batch.draft_lens.numpy(),
        stop_ids=batch.stop_ids.numpy(),
        remaining=batch.remaining.numpy(),
        accept_counters=batch.accept_counters.tolist(),
        terminal_counters=batch.terminal_counters.tolist(),
    )


def device_host_batch(batch: SamplerBatch) -> HostBatch:
    """:class:`HostBatch` of a batch on an accelerator whose shapes were checked: its integers in ONE copy.

    The draft ids, lengths, stop ids, budgets, seeds and RNG counters (all int64 there) are joined into one
    flat tensor on the device and copied to the host once; ``p`` and ``q`` stay on the device (``None``).
    """
    parts = (
        batch.draft_ids,
        batch.draft_lens,
        batch.stop_ids,
        batch.remaining,
        batch.seeds,
        batch.accept_counters,
        batch.terminal_counters,
    )
    flat_parts = [part if part.dim() == 1 else part.reshape(-1) for part in parts]
    flat = torch.cat(flat_parts).cpu().numpy()  # one device-to-host copy
    ends = np.cumsum([part.numel() for part in parts])
    ids, lens, stops, remaining, seeds, accept, terminal = np.split(flat, ends[:-1])
    return HostBatch(
        p=None,
        q=None,
        vocab=batch.p.shape[2],
        draft_ids=ids.reshape(batch.draft_ids.shape),
        draft_lens=lens,
        stop_ids=stops.reshape(batch.stop_ids.shape),
        remaining=remaining,
        accept_counters=accept.tolist(),
        terminal_counters=terminal.tolist(),
        seeds=seeds.tolist(),
    )


def host_floats(tensor: torch.Tensor) -> npt.NDArray[Any]:
    """A numpy array of a tensor's values: a view on the CPU, a copy of an accelerator's."""
    if tensor.device.type == "cpu":
        return host_array(tensor)
    return tensor.detach().cpu().numpy()


_INT64_MAX = 2**63 - 1


def structure_is_valid_on_host(host: HostBatch) -> bool:
    """Whether the integer values pass :func:`~specround.sampling.validation.check_batch_structure`.

    The same conditions evaluated with numpy (no tensor op); ``False`` means the caller runs the full
    check, which raises the named error.
    """
    k_max, vocab = host.draft_ids.shape[1], host.vocab
    lens, ids, stop_ids = host.draft_lens, host.draft_ids, host.stop_ids
    if lens.size == 0:
        return True
    within = np.arange(k_max)[None, :] < lens[:, None]  # [B, K]
    # Within the draft length an id lies in [0, V); beyond it, it is PAD_ID.
    misplaced = ids != np.where(within, np.minimum(np.maximum(ids, 0), vocab - 1), PAD_ID)
    return not (
        lens.min() < 0
        or lens.max() > k_max
        or misplaced.any()
        or host.remaining.min() < 1
        or min(host.accept_counters) < 0
        or max(host.accept_counters) > _INT64_MAX - k_max
        or min(host.terminal_counters) < 0
        or max(host.terminal_counters) > _INT64_MAX - 1
        or (stop_ids.size > 0 and (stop_ids.min() < PAD_ID or stop_ids.max() > vocab - 1))
    )


@dataclass(frozen=True, slots=True)
class HostDraw:
    """One inverse-CDF draw per row as numpy arrays (:class:`~specround.sampling.exact.InverseCdfDraw`)."""

    tokens: IntArray
    mass_before: FloatArray
    token_mass: FloatArray
    total: FloatArray


def _last_true(mask: BoolArray) -> IntArray:
    """[N] index of the last True entry of each row of ``mask`` [N, M] (M - 1 when a row has none)."""
    return np.asarray((mask.shape[1] - 1) - mask[:, ::-1].argmax(1))


def search_host(
    block_sums: FloatArray, u: FloatArray, block_values: Callable[[IntArray], FloatArray]
) -> HostDraw:
    """Two-level inverse-CDF search over rows given by their float64 block sums and a block reader.

    ``block_sums`` [N, nB] (the last block zero-padded to the block width), ``u`` [N] and
    ``block_values(block [N]) -> [N, BS]`` returning the values the sums were taken over. The first block
    whose cumulative mass exceeds ``u * total`` is the number of cumulative values ``<= u * total`` (the
    cumulative masses are non-decreasing), then the same inside the block; a target at or above the last
    cumulative value (only through rounding) falls back to the last positive-mass entry.
    """
    n_rows, n_blocks = block_sums.shape
    if n_rows == 1:
        return _search_one_row(block_sums[0], float(u[0]), block_values)
    rows = np.arange(n_rows)
    cumulative = np.cumsum(block_sums, axis=1)  # [N, nB] sequential float64 sums
    total = cumulative[:, -1]
    target = u * total  # [N]
    block = (cumulative <= target[:, None]).sum(1)  # [N] first cumulative value > target
    if (block >= n_blocks).any():  # rounding put the target at the top: the last block with mass
        block = np.where(block < n_blocks, block, _last_true(block_sums > 0))
    prefix = np.where(block > 0, cumulative[rows, np.maximum(block - 1, 0)], 0.0)  # [N] <= target
    values = block_values(block)  # [N, BS]
    inside = prefix[:, None] + np.cumsum(values, axis=1)  # [N, BS]
    offset = (inside <= target[:, None]).sum(1)
    width = values.shape[1]
    if (offset >= width).any():  # the block's own cumsum ended below its sum: its last positive entry
        offset = np.where(offset < width, offset, _last_true(values > 0))
    mass_before = np.where(offset > 0, inside[rows, np.maximum(offset - 1, 0)], prefix)
    token_mass = values[rows, offset]
    return HostDraw(block * width + offset, mass_before, token_mass, total)


def _search_one_row(
    block_sums: FloatArray, u: float, block_values: Callable[[IntArray], FloatArray]
) -> HostDraw:
    """:func:`search_host` for a single row, on Python floats: the same operations, bit for bit.

    ``np.cumsum`` over float64 adds sequentially, as :func:`itertools.accumulate` does on Python floats
    (IEEE doubles). Where every entry is ``>= 0`` and the target is not NaN, the cumulative values do not
    decrease, so the count of those ``<= target`` is a bisection, at both levels; any other row is counted
    entry by entry, as the vectorised search counts. At one row numpy's per-call cost was most of the
    search's.
    """
    sums = block_sums.tolist()
    cumulative = list(accumulate(sums))  # [nB] sequential float64 sums
    total = cumulative[-1]
    target = u * total
    n_blocks = len(cumulative)
    monotone = target == target  # no NaN target: every comparison with it is an order
    if monotone and bool((block_sums >= 0).all()):
        block = bisect_right(cumulative, target)  # first cumulative value > target
    else:
        block = sum(1 for value in cumulative if value <= target)
    if block >= n_blocks:  # rounding put the target at the top: the last block with mass
        block = _last_positive(sums)
    prefix = cumulative[block - 1] if block > 0 else 0.0
    row = block_values(np.array([block], dtype=np.int64))[0]  # [BS]
    values = row.tolist()
    running = list(accumulate(values))  # [BS]; inside the block the cumulative mass is prefix + running
    width = len(values)
    if monotone and bool((row >= 0).all()):  # non-decreasing: the first value above the target
        offset = bisect_right(running, target, key=lambda partial: prefix + partial)
    else:
        offset = sum(1 for partial in running if prefix + partial <= target)
    if offset >= width:  # the block's own cumsum ended below its sum: its last positive entry
        offset = _last_positive(values)
    mass_before = prefix + running[offset - 1] if offset > 0 else prefix
    return HostDraw(
        np.array([block * width + offset], dtype=np.int64),
        np.array([mass_before], dtype=_F64),
        np.array([values[offset]], dtype=_F64),
        np.array([total], dtype=_F64),
    )


def _last_positive(values: list[float]) -> int:
    """Index of the last entry ``> 0`` of ``values`` (the last index when none is), as :func:`_last_true`."""
    for index in range(len(values) - 1, -1, -1):
        if values[index] > 0:
            return index
    return len(values) - 1


@dataclass(frozen=True, slots=True)
class HostSeams:
    """The functions of :mod:`specround.sampling.exact` the fast path calls, looked up there at call time."""

    accepts: Callable[[FloatArray, FloatArray, FloatArray], BoolArray]
    """:func:`~specround.sampling.exact.accepts_host`, the acceptance rule on float64 numpy arrays."""
    search: Callable[[FloatArray, FloatArray, Callable[[IntArray], FloatArray]], HostDraw]
    check_all_rows: Callable[[SamplerBatch], None]
    block_width: Callable[[int], int]
    degenerate_tolerance: Callable[[torch.dtype], float]
    device_blocks: Callable[[SamplerBatch, IntArray, IntArray, bool], TerminalBlocks]
    """The terminal pass of an accelerator's batch, on the device (see :class:`TerminalBlocks`)."""


def _in_stop_set(tokens: IntArray, stop_sets: IntArray) -> BoolArray:
    """[B, N] bool: ``tokens`` [B, N] is a (non-PAD) member of ``stop_sets`` [B, N, S]."""
    return np.asarray(((tokens[:, :, None] == stop_sets) & (stop_sets != PAD_ID)).any(-1))


def _first(mask: BoolArray) -> IntArray:
    """[B] index of the first True entry of each row of ``mask`` [B, K] (K when none)."""
    return np.asarray((np.cumsum(mask, axis=1) == 0).sum(1))


def decide_on_host(
    batch: SamplerBatch,
    host: HostBatch,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
    seams: HostSeams,
) -> SamplerDecision | None:
    """The decision of a CPU batch whose structure was checked, or ``None`` for the reference path."""
    if mode == "full":
        seams.check_all_rows(batch)
    n_batch, k_max = batch.draft_ids.shape
    ids, lens, remaining, stop_ids = host.draft_ids, host.draft_lens, host.remaining, host.stop_ids
    u = host_floats(accept_uniforms)  # [B, K]
    u_terminal = host_floats(terminal_uniforms)  # [B]
    positions = np.arange(k_max)
    within = positions[None, :] < lens[:, None]  # [B, K]

    # Gathered draft probabilities p_i(d_i), q_i(d_i) in float64 (widening is exact).
    if host.p is None or host.q is None:  # rows on an accelerator: gathered there, one copy back
        p_at, q_at = _gathered_on_device(batch)
    else:
        batch_index = np.arange(n_batch)[:, None]
        safe_ids = np.maximum(ids, 0)
        p_at = host.p[batch_index, positions[None, :], safe_ids].astype(_F64)  # [B, K]
        q_at = host.q[batch_index, positions[None, :], safe_ids].astype(_F64)  # [B, K]
    p_draft = np.where(within, p_at, 0.0)
    q_draft = np.where(within, q_at, 1.0)
    # Padding holds 0 and 1, which pass: every drafted p(d) in [0, inf) and q(d) in (0, inf), NaN failing.
    if p_draft.size and not (
        p_draft.min() >= 0 and p_draft.max() < np.inf and q_draft.min() > 0 and q_draft.max() < np.inf
    ):
        return None

    # Acceptance tests (the one written rule, on float64 host arrays) and the leading accepted run A.
    accepted_tests = seams.accepts(u, p_draft, q_draft) & within
    n_accepted = np.cumprod(accepted_tests, axis=1, dtype=np.int64).sum(1)  # [B] A

    # A stop token or the length cap inside the accepted prefix.
    ordinal = positions + 1
    hit = (ordinal[None, :] <= n_accepted[:, None]) & (ordinal[None, :] == remaining[:, None])  # at cap
    has_stop_ids = stop_ids.shape[-1] > 0
    if has_stop_ids:
        sets = stop_ids[:, None, :] if stop_ids.ndim == 2 else stop_ids[:, :k_max, :]
        draft_stops = within & _in_stop_set(ids, sets)  # sets broadcast over positions when 2-D
        hit |= (ordinal[None, :] <= n_accepted[:, None]) & draft_stops
    first_hit = _first(hit)  # [B]
    stopped = first_hit < k_max
    stop_len = first_hit + 1
    by_token = (
        (draft_stops & (positions[None, :] == first_hit[:, None])).any(1) if has_stop_ids else stopped & False
    )

    needs_terminal = ~stopped
    accept_draws = np.where(stopped, stop_len, np.minimum(n_accepted + 1, lens))
    reached = positions[None, :] < accept_draws[:, None]
    if (reached & (np.floor(u) != 0)).any() or (needs_terminal & (np.floor(u_terminal) != 0)).any():
        return None

    tokens = np.full(n_batch, PAD_ID, dtype=np.int64)
    masses = np.full((3, n_batch), _NAN)  # total, before, token
    drawing = np.flatnonzero(needs_terminal)
    if drawing.size:
        draw = terminal_draws(batch, host, n_accepted, lens, drawing, u_terminal, mode, seams)
        if draw is None:
            return None
        rows, drawn = draw
        tokens[rows] = drawn.tokens
        masses[:, rows] = (drawn.total, drawn.mass_before, drawn.token_mass)

    # Finish rules for the terminal token at 1-based position A + 1.
    at_cap = needs_terminal & (n_accepted + 1 == remaining)
    if has_stop_ids:
        terminal_sets = (
            stop_ids[:, None, :] if stop_ids.ndim == 2 else stop_ids[np.arange(n_batch), n_accepted][:, None]
        )
        terminal_stop = needs_terminal & _in_stop_set(tokens[:, None], terminal_sets)[:, 0]
        finished = stopped | terminal_stop | at_cap
        stopped_by_token = np.where(stopped, by_token, terminal_stop)
    else:
        finished = stopped | at_cap
        stopped_by_token = by_token

    columns = np.arange(k_max + 1)
    prefix_len = np.where(stopped, stop_len, n_accepted)
    output_ids = np.full((n_batch, k_max + 1), PAD_ID, dtype=np.int64)
    output_ids[:, :k_max] = np.where(columns[None, :k_max] < prefix_len[:, None], ids, PAD_ID)
    at_terminal = needs_terminal[:, None] & (columns[None, :] == n_accepted[:, None])
    output_ids = np.where(at_terminal, tokens[:, None], output_ids)
    terminal_kind = np.where(n_accepted < lens, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS))
    terminal_kind = np.where(stopped, int(TerminalKind.STOP), terminal_kind).astype(np.int64)

    counts = np.empty((6, n_batch), dtype=np.int64)  # host_decision.COUNT_FIELDS
    counts[0] = np.where(stopped, stop_len, n_accepted + 1)
    counts[1], counts[2], counts[3] = prefix_len, terminal_kind, accept_draws
    counts[4] = needs_terminal
    counts[5] = np.where(needs_terminal, n_accepted, PAD_ID)
    flags = np.zeros((3, n_batch), dtype=np.bool_)  # FLAG_FIELDS; no degenerate correction here
    flags[0], flags[1] = finished, stopped_by_token
    per_draft = np.empty((3, n_batch, k_max))  # PER_DRAFT_FIELDS
    per_draft[0], per_draft[1] = p_draft, q_draft
    per_draft[2] = np.where(reached, u, _NAN)
    per_request = np.empty((4, n_batch))  # PER_REQUEST_FIELDS: the three masses, then the uniform
    per_request[:3] = masses
    per_request[3] = np.where(needs_terminal, u_terminal, _NAN)
    return host_decision(output_ids, counts, flags, per_draft, per_request)


def _gathered_on_device(batch: SamplerBatch) -> tuple[FloatArray, FloatArray]:
    """``p_i(d_i)`` and ``q_i(d_i)`` [B, K] in float64, gathered on the rows' device and copied back once."""
    k_max = batch.draft_ids.shape[1]
    safe_ids = batch.draft_ids.clamp_min(0).unsqueeze(2)  # [B, K, 1]
    p_at, q_at = batch.p.narrow(1, 0, k_max).gather(2, safe_ids), batch.q.gather(2, safe_ids)  # [B, K, 1]
    both = torch.cat((p_at, q_at), dim=1)  # [B, 2K, 1]
    values = both.to(device="cpu", dtype=torch.float64).numpy()[:, :, 0]  # one copy; widening is exact
    return values[:, :k_max], values[:, k_max:]


COMPILE_ENV = "SPECROUND_SAMPLER_COMPILE"
"""Set to ``1`` to run the terminal pass with torch ops, its elementwise work and row checks fused by
``torch.compile`` (by default the pass runs on the host, see :mod:`specround.sampling.host_terminal`)."""

_compiled_pass: Callable[..., tuple[torch.Tensor, list[torch.Tensor]]] | None = None


def _residual_functional(
    terminal: torch.Tensor, q_rows: torch.Tensor, *, with_stats: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Row sums and minima of the gathered rows, and the residual, in the form ``torch.compile`` fuses.

    ``terminal`` [N, V] holds the corrections' p rows first, ``q_rows`` [C, V] their q rows. Returns the
    terminal mass [N, V] in the rows' dtype and ``[p sums, p minima, q sums, q minima]`` (the q pair only
    when C > 0; empty without ``with_stats``). The residual is elementwise (a correctly rounded
    subtraction and a clamp), so compiled values are those of the eager ops; the sums only feed the
    tolerance check, which keeps a margin for their order.
    """
    n_correction = q_rows.shape[0]
    stats = [terminal.sum(1), terminal.amin(1)] if with_stats else []
    if with_stats and n_correction:
        stats += [q_rows.sum(1), q_rows.amin(1)]
    if not n_correction:
        return terminal, stats
    residual = (terminal[:n_correction] - q_rows).clamp_min(0.0)
    return torch.cat((residual, terminal[n_correction:])), stats


def _terminal_pass(
    terminal: torch.Tensor, q_rows: torch.Tensor, *, with_stats: bool
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The row checks and the residual as torch ops fused by ``torch.compile`` (compiled on first use)."""
    global _compiled_pass
    if _compiled_pass is None:
        _compiled_pass = torch.compile(_residual_functional, dynamic=True)
    return _compiled_pass(terminal, q_rows, with_stats=with_stats)


def _terminal_blocks_torch(
    batch: SamplerBatch, p_index: IntArray, q_index: IntArray, width: int, *, with_stats: bool
) -> TerminalBlocks:
    """The host terminal pass with torch ops: two gathers, then :func:`_terminal_pass` (compiled)."""
    vocab = batch.p.shape[2]
    terminal = batch.p.reshape(-1, vocab).index_select(0, torch.from_numpy(p_index))  # [N, V]
    if q_index.shape[0]:
        q_rows = batch.q.reshape(-1, vocab).index_select(0, torch.from_numpy(q_index))  # [C, V]
    else:
        q_rows = terminal[:0]  # [0, V]
    terminal, stats = _terminal_pass(terminal, q_rows, with_stats=with_stats)
    extra = -vocab % width
    mass = host_array(F.pad(terminal, (0, extra)) if extra else terminal)  # [N, nB * BS] rows' dtype
    n_rows, n_correction = p_index.shape[0], q_index.shape[0]
    row_stats = None
    if stats:
        # [p sums, p minima] then, with corrections, [q sums, q minima]: N, N, C, C entries.
        values = host_array(torch.cat(stats)).astype(_F64)
        totals = np.concatenate((values[:n_rows], values[2 * n_rows : 2 * n_rows + n_correction]))
        minima = np.concatenate((values[n_rows : 2 * n_rows], values[2 * n_rows + n_correction :]))
        row_stats = (totals, minima)
    return TerminalBlocks(host_block_sums(mass, width), row_stats, mass_reader(mass, width))


def terminal_draws(
    batch: SamplerBatch,
    host: HostBatch,
    n_accepted: IntArray,
    lens: IntArray,
    drawing: IntArray,
    u_terminal: FloatArray,
    mode: ValidationMode,
    seams: HostSeams,
) -> tuple[IntArray, HostDraw] | None:
    """The correction or bonus draws of the ``drawing`` requests from row ``A``; ``None``: reference path.

    The terminal pass (:mod:`specround.sampling.host_terminal`, the device's for an accelerator's rows, or
    the torch pass when compiling) gives float64 block sums of each row's terminal mass (the residual
    ``max(p - q, 0)`` of a correction, taken in the rows' dtype; ``p`` itself for a bonus) and, in read
    mode, the rows' sums and minima; then the host search.
    """
    p = batch.p
    k_max, vocab = batch.q.shape[1], p.shape[2]
    is_correction = n_accepted[drawing] < lens[drawing]
    rows = np.concatenate((drawing[is_correction], drawing[~is_correction]))  # corrections first
    a_rows = n_accepted[rows]
    n_correction = int(is_correction.sum())
    p_index = rows * (k_max + 1) + a_rows  # [N] flat rows of p
    q_index = rows[:n_correction] * k_max + a_rows[:n_correction]  # [C] flat rows of q
    width = seams.block_width(vocab)
    with_stats = mode == "read"
    if host.p is None or host.q is None:  # rows on an accelerator: the pass runs there
        blocks = seams.device_blocks(batch, p_index, q_index, with_stats)
    elif os.environ.get(COMPILE_ENV) == "1":
        blocks = _terminal_blocks_torch(batch, p_index, q_index, width, with_stats=with_stats)
    elif vocab >= ROW_BY_ROW_VOCAB:  # long rows: views, no gathered copies
        block_sums, row_stats, reader = terminal_blocks_rows(
            host.p, host.q, p_index.tolist(), q_index.tolist(), width, with_stats=with_stats
        )
        stats = None if row_stats is None else (np.array(row_stats[0]), np.array(row_stats[1]))
        blocks = TerminalBlocks(block_sums, stats, reader)
    else:
        blocks = terminal_blocks_host(host.p, host.q, p_index, q_index, width, with_stats=with_stats)
    if blocks.stats is not None:
        totals, minima = blocks.stats
        tolerance = normalisation_tolerance(p.dtype, vocab) * _TOLERANCE_MARGIN
        # A NaN minimum or a non-finite sum fails its test; the reference path then names the error.
        if not (np.abs(totals - 1.0).max() <= tolerance and minima.min() >= 0):
            return None
    u_rows = u_terminal[rows]
    draw = _draw_from_blocks(blocks.block_sums, blocks.block_values, n_correction, p.dtype, u_rows, seams)
    return None if draw is None else (rows, draw)


def _draw_from_blocks(
    block_sums: FloatArray,
    block_values: Callable[[IntArray], FloatArray],
    n_correction: int,
    dtype: torch.dtype,
    u_rows: FloatArray,
    seams: HostSeams,
) -> HostDraw | None:
    """The degenerate test of the checked terminal mass's block sums [N, nB], then the host search.

    ``None`` when a correction's residual is degenerate (the reference path redraws it from p).
    """
    if n_correction:
        residual = np.cumsum(block_sums[:n_correction], axis=1)[:, -1]  # summed as the search sums it
        if (residual <= seams.degenerate_tolerance(dtype)).any():
            return None  # a degenerate correction: the reference path redraws it from p
    return seams.search(block_sums, u_rows, block_values)


def few_terminal_draws(
    batch: SamplerBatch,
    p: npt.NDArray[Any],
    q: npt.NDArray[Any],
    accepted: list[int],
    lens: list[int],
    drawing: list[int],
    u_terminal: list[float],
    mode: ValidationMode,
    seams: HostSeams,
) -> tuple[list[int], HostDraw] | None:
    """:func:`terminal_draws` for a small batch given as Python lists; ``p`` and ``q`` its host arrays.

    The same rows in the same order (corrections first), the same checks and the same values, with the
    row bookkeeping in Python and the terminal rows taken one by one
    (:func:`~specround.sampling.host_terminal.terminal_blocks_rows`) when they fit one chunk or are long
    (:func:`~specround.sampling.host_terminal.takes_rows_one_by_one`).
    """
    k_max, vocab = q.shape[1], p.shape[2]
    rows = [b for b in drawing if accepted[b] < lens[b]]  # corrections first
    n_correction = len(rows)
    rows += [b for b in drawing if accepted[b] >= lens[b]]
    n_rows = len(rows)
    p_index = [b * (k_max + 1) + accepted[b] for b in rows]  # flat rows of p
    q_index = [b * k_max + accepted[b] for b in rows[:n_correction]]  # flat rows of q
    width = seams.block_width(vocab)
    with_stats = mode == "read"
    compiled = os.environ.get(COMPILE_ENV) == "1"
    stats: tuple[list[float], list[float]] | None
    if compiled or not takes_rows_one_by_one(n_rows, vocab):
        index_p, index_q = np.array(p_index, dtype=np.int64), np.array(q_index, dtype=np.int64)
        if compiled:
            blocks = _terminal_blocks_torch(batch, index_p, index_q, width, with_stats=with_stats)
        else:
            blocks = terminal_blocks_host(p, q, index_p, index_q, width, with_stats=with_stats)
        block_sums, block_values = blocks.block_sums, blocks.block_values
        stats = None if blocks.stats is None else (blocks.stats[0].tolist(), blocks.stats[1].tolist())
    else:
        block_sums, stats, block_values = terminal_blocks_rows(
            p, q, p_index, q_index, width, with_stats=with_stats
        )
    if stats is not None:
        totals, minima = stats
        tolerance = normalisation_tolerance(batch.p.dtype, vocab) * _TOLERANCE_MARGIN
        # A NaN minimum or a non-finite sum fails its test; the reference path then names the error.
        if not (all(abs(t - 1.0) <= tolerance for t in totals) and all(m >= 0 for m in minima)):
            return None
    u_rows = np.array([u_terminal[b] for b in rows], dtype=np.float64)
    draw = _draw_from_blocks(block_sums, block_values, n_correction, batch.p.dtype, u_rows, seams)
    return None if draw is None else (rows, draw)
