"""The fast path's terminal pass on the host: float64 block sums of the terminal rows, and a block reader.

A request that draws a terminal token reads one row of ``V`` entries: ``max(p - q, 0)`` for a correction
(its p and q rows at the first rejection), ``p`` itself for a bonus. The inverse-CDF search needs that row's
float64 sums over blocks of ``BS`` columns (zero past ``V``), then the float64 values of the one block it
lands in. This module computes both with the reference's operations (:mod:`specround.sampling.exact`):

- the residual is a correctly rounded subtraction in the rows' dtype and a clamp that keeps a zero's sign,
  as torch's ``clamp_min`` does;
- the mass is that row widened exactly to float64, and the block sums are one torch reduction over it.

The rows are read once -- as views, row by row, for a few rows or long ones
(:func:`takes_rows_one_by_one`), else gathered in cache-sized column chunks -- checked by their sums and
minima in read mode, turned into their residual and widened into the float64 mass. Row by row, the mass
is widened and block-summed a few rows at a time (:func:`rows_per_group`), so at a large B it is never
written out to memory and read back (the search then forms its one block per row again from the input
rows). The mass buffer is kept for the thread's next decision (a fresh large allocation costs page faults);
its padding past ``V`` is zeroed on every use, since another vocabulary may have written it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

__all__ = [
    "GROUP_BYTES",
    "HOST_CHUNK_ELEMENTS",
    "MAX_GROUPS",
    "ROW_BY_ROW_VOCAB",
    "RowStats",
    "TerminalBlocks",
    "host_block_sums",
    "mass_reader",
    "recomputing_reader",
    "rows_per_group",
    "takes_rows_one_by_one",
    "terminal_blocks_host",
    "terminal_blocks_rows",
]

FloatArray = npt.NDArray[Any]
"""A float64 numpy array."""
IntArray = npt.NDArray[Any]
"""An int64 numpy array."""
RowStats = tuple[FloatArray, FloatArray]
"""Sums and minima of the terminal p rows followed by the corrections' q rows (float64)."""

HOST_CHUNK_ELEMENTS = 1 << 18
"""Entries per row set of one column chunk of the host terminal pass (a few such arrays stay in L2)."""

GROUP_BYTES = 3 << 19
"""Float64 mass widened and block-summed at a time (1.5 MiB, four rows at V = 49,152), so that it is summed
from the caches rather than from memory. Where a core's L2 is smaller it is summed partly from L3: on a
1 MiB-L2 host, groups of 1, 2, 4 and 8 rows at B = 64 timed alike (7.8-8.1 ms a decision)."""

MAX_GROUPS = 16
"""At most this many groups per row-by-row pass, whatever B: the fast path's tensor ops stay bounded."""

ROW_BY_ROW_VOCAB = 16384
"""From this vocabulary size on, the host pass takes its rows one by one whatever their number.

A row of that many entries is work enough to hide numpy's per-call cost, and its views need no gathered
copy: at V = 49,152 and 64 rows the row-by-row pass takes 55-70 % of the chunked pass's time (whose
gathers copy every entry once more), at 256 rows about half; at V = 4,096 and below the chunked pass is
the faster one.
"""

_F64 = torch.float64
_workspace = threading.local()


@dataclass(frozen=True, slots=True)
class TerminalBlocks:
    """The terminal pass of a decision's drawing rows, as the host search needs it.

    ``block_sums`` [N, nB] float64 (the last block zero-padded), the row statistics (read mode, else
    ``None``), and ``block_values(block [N]) -> [N, BS]``, the float64 terminal mass of one block of each
    row. For rows on an accelerator the sums and statistics come back in one copy and the reader reads the
    device; for host rows both are computed here.
    """

    block_sums: FloatArray
    stats: RowStats | None
    block_values: Callable[[IntArray], FloatArray]


def _zeros(dtype: np.dtype[Any], length: int) -> npt.NDArray[Any]:
    """A read-only zero array of ``dtype`` holding at least ``length`` entries, kept for this thread.

    The residual's clamp takes ``np.maximum(zeros, residual)``: the same values (a zero's sign and NaN
    included) as with a scalar zero, through numpy's vectorised array loop, several times faster.
    """
    kept: dict[np.dtype[Any], npt.NDArray[Any]] | None = getattr(_workspace, "zeros", None)
    if kept is None:
        kept = _workspace.zeros = {}
    cached = kept.get(dtype)
    if cached is None or cached.shape[0] < length:
        cached = np.zeros(length, dtype=dtype)
        cached.flags.writeable = False
        kept[dtype] = cached
    return cached[:length]


def _mass_buffer(n_rows: int, vocab: int, width: int) -> FloatArray:
    """A float64 [n_rows, V rounded up to ``width``] buffer whose columns past V are zero.

    One buffer per row width is kept for this thread, grown to the most rows asked for; the caller writes
    the first V columns of every row.
    """
    columns = vocab + (-vocab % width)
    kept: dict[int, FloatArray] | None = getattr(_workspace, "mass", None)
    if kept is None:
        kept = _workspace.mass = {}
    cached = kept.get(columns)
    if cached is None or cached.shape[0] < n_rows:
        if len(kept) >= 4:
            kept.clear()
        cached = kept[columns] = np.empty((n_rows, columns), dtype=np.float64)
    mass = cached[:n_rows]
    mass[:, vocab:] = 0.0
    return mass


def _residual_buffer(dtype: np.dtype[Any], length: int) -> npt.NDArray[Any]:
    """A writable [length] buffer of ``dtype`` for one residual row, reused by this thread's next decision."""
    kept: dict[np.dtype[Any], npt.NDArray[Any]] | None = getattr(_workspace, "residual", None)
    if kept is None:
        kept = _workspace.residual = {}
    cached = kept.get(dtype)
    if cached is None or cached.shape[0] < length:
        cached = kept[dtype] = np.empty(length, dtype=dtype)
    return cached[:length]


def takes_rows_one_by_one(n_rows: int, vocab: int) -> bool:
    """Whether a small batch's terminal pass (rows given as Python lists) of ``n_rows`` rows runs row by row.

    :func:`terminal_blocks_rows` when the rows fit one chunk or are long (:data:`ROW_BY_ROW_VOCAB`),
    :func:`terminal_blocks_host` otherwise; both give the same block sums and mass. A larger batch, whose
    rows come as arrays, takes the rows one by one only when they are long: many short rows cost numpy's
    per-call price once per row (ten times the chunked pass at 256 rows of 256 entries).
    """
    return vocab >= ROW_BY_ROW_VOCAB or n_rows * vocab <= HOST_CHUNK_ELEMENTS


def host_block_sums(mass: npt.NDArray[Any], width: int) -> FloatArray:
    """[N, nB] float64 sums of the BS-wide blocks of ``mass`` [N, nB * BS] (one torch reduction).

    A float32 mass (the compiled pass's) is widened by torch before it reduces, which gives the sums of its
    float64 copy.
    """
    blocks = torch.from_numpy(mass).view(mass.shape[0], -1, width)
    return blocks.sum(-1, dtype=_F64).numpy()


def mass_reader(mass: npt.NDArray[Any], width: int) -> Callable[[IntArray], FloatArray]:
    """``block [N] -> [N, BS]``: that block of each row of ``mass`` [N, nB * BS], widened to float64."""
    blocks = mass.reshape(mass.shape[0], -1, width)  # [N, nB, BS]
    index = np.arange(mass.shape[0])

    def read(block: IntArray) -> FloatArray:
        return np.asarray(blocks[index, block].astype(np.float64))  # [N, BS]

    return read


def _clamped_residual(target: npt.NDArray[Any], draft: npt.NDArray[Any], out: npt.NDArray[Any]) -> None:
    """``out = max(target - draft, 0)`` in the rows' dtype; equal operands of the clamp keep ``-0.0``."""
    np.subtract(target, draft, out=out)
    np.maximum(_zeros(out.dtype, out.shape[-1]), out, out=out)


def terminal_blocks_host(
    p: npt.NDArray[Any],
    q: npt.NDArray[Any],
    p_index: IntArray,
    q_index: IntArray,
    width: int,
    *,
    with_stats: bool,
) -> TerminalBlocks:
    """The terminal pass of many rows, one cache-sized column chunk at a time.

    ``p`` [B, K+1, V] and ``q`` [B, K, V] host arrays; ``p_index`` [N] and ``q_index`` [C] flat rows (the
    first C rows are corrections). Each chunk of the rows is gathered (a copy in the rows' dtype), checked,
    turned into its residual in place and widened into the mass; each input entry is read from memory once
    and the mass written once, ready for the block sums.
    """
    n_rows, n_correction = p_index.shape[0], q_index.shape[0]
    vocab = p.shape[2]
    p_flat, q_flat = p.reshape(-1, vocab), q.reshape(-1, vocab)
    mass = _mass_buffer(n_rows, vocab, width)
    totals = np.zeros(n_rows + n_correction)
    minima = np.full(n_rows + n_correction, np.inf)
    step = max(width, (HOST_CHUNK_ELEMENTS // max(n_rows, 1)) // width * width)
    for start in range(0, vocab, step):
        stop = min(start + step, vocab)
        target = p_flat[p_index, start:stop]  # [N, c] a copy in the rows' dtype
        if with_stats:
            totals[:n_rows] += target.sum(1)
            np.minimum(minima[:n_rows], target.min(1), out=minima[:n_rows])
        if n_correction:
            draft = q_flat[q_index, start:stop]  # [C, c]
            if with_stats:
                totals[n_rows:] += draft.sum(1)
                np.minimum(minima[n_rows:], draft.min(1), out=minima[n_rows:])
            residual = target[:n_correction]
            _clamped_residual(residual, draft, residual)
        mass[:, start:stop] = target  # exact widening
    stats = (totals, minima) if with_stats else None
    return TerminalBlocks(host_block_sums(mass, width), stats, mass_reader(mass, width))


def terminal_blocks_rows(
    p: npt.NDArray[Any],
    q: npt.NDArray[Any],
    p_index: Sequence[int],
    q_index: Sequence[int],
    width: int,
    *,
    with_stats: bool,
) -> tuple[FloatArray, tuple[list[float], list[float]] | None, Callable[[IntArray], FloatArray]]:
    """:func:`terminal_blocks_host` row by row on views of the rows (few rows, or long ones).

    The same values: a correction's residual is formed in a reused buffer, a bonus row is widened straight
    from the input. The rows are widened a group at a time (:func:`rows_per_group`) into a float64 buffer
    of that group's rows only, whose block sums are taken while it is still in cache; so no mass of the
    whole batch is written to memory and read back. A batch of one group keeps its mass for the search's
    block reader; a larger one reads a block by forming it again from the input rows
    (:func:`recomputing_reader`, the same operations). Returns the block sums, the statistics as Python
    floats (p rows, then the corrections' q rows) and the block reader.
    """
    vocab = p.shape[2]
    p_flat, q_flat = p.reshape(-1, vocab), q.reshape(-1, vocab)
    n_rows, n_correction = len(p_index), len(q_index)
    group = rows_per_group(n_rows, vocab + (-vocab % width))
    mass = _mass_buffer(group, vocab, width)
    block_sums: FloatArray | None = None
    if n_rows > group:  # each full group summed by one tensor op into one reused buffer
        block_sums = np.empty((n_rows, mass.shape[1] // width))
        group_blocks = torch.from_numpy(mass).view(group, -1, width)  # [G, nB, BS]
        group_sums = torch.empty(group_blocks.shape[:2], dtype=_F64)  # [G, nB]
        group_sums_host = group_sums.numpy()
    totals: list[float] = []
    minima: list[float] = []
    q_totals: list[float] = []
    q_minima: list[float] = []
    for row, flat in enumerate(p_index):
        target = widened = p_flat[flat]  # [V] a view
        if row < n_correction:
            draft = q_flat[q_index[row]]  # [V] a view
            widened = _residual_buffer(p_flat.dtype, vocab)
            _clamped_residual(target, draft, widened)  # first: one pass brings both rows into cache
            if with_stats:
                q_totals.append(float(draft.sum()))
                q_minima.append(float(draft.min()))
        if with_stats:
            totals.append(float(target.sum()))
            minima.append(float(target.min()))
        at = row % group
        mass[at, :vocab] = widened  # exact widening
        if block_sums is None:
            continue
        if at == group - 1:  # a full group: no slice of the buffers, no further tensor op
            torch.sum(group_blocks, -1, dtype=_F64, out=group_sums)
            block_sums[row - at : row + 1] = group_sums_host
        elif row == n_rows - 1:  # a last, partial group
            block_sums[row - at : row + 1] = host_block_sums(mass[: at + 1], width)
    stats = (totals + q_totals, minima + q_minima) if with_stats else None
    if block_sums is None:  # one group: its mass is the whole batch's
        return host_block_sums(mass, width), stats, mass_reader(mass, width)
    return block_sums, stats, recomputing_reader(p_flat, q_flat, p_index, q_index, width)


def rows_per_group(n_rows: int, columns: int) -> int:
    """Rows of ``columns`` float64 entries widened together by :func:`terminal_blocks_rows`.

    As many as :data:`GROUP_BYTES` hold (at least one; all of them when they fit), more when that would
    make over :data:`MAX_GROUPS` groups (each group's block sums are a tensor op).
    """
    fit = max(1, GROUP_BYTES // (8 * columns))
    return min(n_rows, max(fit, -(-n_rows // MAX_GROUPS)))


def recomputing_reader(
    p_flat: npt.NDArray[Any],
    q_flat: npt.NDArray[Any],
    p_index: Sequence[int],
    q_index: Sequence[int],
    width: int,
) -> Callable[[IntArray], FloatArray]:
    """``block [N] -> [N, BS]``: that block of each row's terminal mass, formed again from the input rows.

    The values :func:`mass_reader` reads from a kept mass: the columns of the block gathered from each
    ``p`` row (and a correction's ``q`` row), the residual by :func:`_clamped_residual`, widened exactly to
    float64, zero past ``V``.
    """
    vocab = p_flat.shape[1]
    p_rows = np.asarray(p_index, dtype=np.int64)[:, None]  # [N, 1]
    q_rows = np.asarray(q_index, dtype=np.int64)[:, None]  # [C, 1]
    n_correction = q_rows.shape[0]
    offsets = np.arange(width)

    def read(block: IntArray) -> FloatArray:
        columns = np.asarray(block, dtype=np.int64)[:, None] * width + offsets  # [N, BS]
        inside = columns < vocab
        safe = np.minimum(columns, vocab - 1)
        target = p_flat[p_rows, safe]  # [N, BS] a copy in the rows' dtype
        if n_correction:
            residual = target[:n_correction]
            _clamped_residual(residual, q_flat[q_rows, safe[:n_correction]], residual)
        values: FloatArray = target.astype(np.float64)
        values[~inside] = 0.0
        return values

    return read
