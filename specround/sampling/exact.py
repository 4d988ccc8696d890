"""The batched exact speculative sampler: accept/reject, correction or bonus, stops, RNG accounting.

For request ``b`` with draft length ``k = draft_lens[b] <= K`` and budget ``R = remaining[b] >= 1``
(contract#sampler-law, contract#verification, contract#round-progress, contract#reached-events):

1. Test ``i`` (1-based) accepts iff ``u_i < p_i(d_i) / q_i(d_i)`` (:func:`accepts`, the one place this
   predicate is written). ``A`` is the length of the leading run of accepted tests: the first rejection ends
   the round (contract#first-rejection-stops).
2. A stop inside the accepted prefix: ``s`` = the smallest ``i <= A`` with ``d_i`` in the stop set of
   position ``i`` or ``i == R``. Then ``d_1..d_s`` are emitted, terminal STOP, ``accept_draws = s`` (later
   tests are never reached), no terminal draw, and the request is finished.
3. Otherwise one TERMINAL uniform draws the terminal token by inverse CDF (:func:`inverse_cdf`) from row
   ``A``: the residual ``max(p_{A+1} - q_{A+1}, 0)`` after a rejection (``A < k``, a correction), or the
   target row ``p_{k+1}`` when every draft was accepted (``A == k``, a bonus; for ``k < K`` that is row
   ``k``, not the last padded row). ``accept_draws = min(A + 1, k)``, ``terminal_draws = 1``; the request is
   finished when the terminal token is in the stop set of position ``A + 1`` or ``A + 1 == R``.
   With ``k = 0`` the round is plain target sampling from ``p_1``.

Degenerate cases (contract#degenerate-cases): ``q_i(d_i) = 0`` for a drafted token is refused
(:class:`~specround.errors.ZeroProposalProbabilityError`); the residual ``p - q`` is taken in the rows' dtype,
its negative entries (tiny negative rounding residue included) are clamped to zero, and it is summed in
float64 (:func:`terminal_mass`). A rejection is only possible when ``p(d) < q(d)``, so for normalised rows
the residual mass ``Z`` is at least ``q(d) - p(d) > 0``. When a
rejection nevertheless meets ``Z <= degenerate_residual_tolerance(dtype)`` (16 units of roundoff of the rows'
dtype), ``p`` and ``q`` are equal up to rounding, the correction branch is mathematically unreachable and
the rejection is a floating-point artefact: the correction is then drawn from the target row ``p_{A+1}``
itself and flagged in ``SamplerDecision.degenerate_correction``. The output law differs from the exact one
by at most ``Z`` in total variation, i.e. by less than the rows' own rounding.

Greedy rows (one-hot ``p`` and ``q``) reproduce greedy decoding exactly: a draft is accepted iff it is the
target's argmax, and the residual of a rejection is the target's one-hot row.

Performance: the sampler reads the gathered ``p_i(d_i)``, ``q_i(d_i)`` and only the one terminal row per
request (two for a correction). On CPU the decision takes the fast path of
:mod:`specround.sampling.fast_path`: the control (acceptance, stops, budgets, RNG accounting, output layout)
runs with numpy on the tensors' memory (on Python scalars for a batch of a few requests,
:mod:`specround.sampling.scalar_path`), the round's uniforms come from one host Philox call, the terminal
rows are read once in cache-sized chunks, and the tensor ops left are the acceptance predicate and the
float64 block sums (three compute ops, about 40 dispatched operators per decision, whatever B). It
returns the same decision bit for bit; any refused value, or a degenerate correction, sends the batch to
the reference path below (torch ops on the batch's device, computing the residual and its block sums in
vocabulary chunks), which raises the named error or handles the case. A batch on an accelerator takes the
same fast path with its rows left on the device: its integers are copied to the host once, the control runs
there, and the gathers and the terminal pass run on the device with the reference's own operations (about
30 kernels and six copies, four of them back to the host, per decision, whatever B, against some 370
kernels for the reference there). The token is found by a two-level search (block sums, then a cumulative
sum inside one block), run on the host by both paths. There is no
Python loop over the batch or the draft positions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from specround.errors import (
    InvalidRequestError,
    NegativeMassError,
    NonFiniteProbabilityError,
    NotNormalisedError,
    ShapeMismatchError,
)
from specround.sampling.fast_path import (
    HostBatch,
    HostSeams,
    IntArray,
    decide_on_host,
    device_host_batch,
    host_batch,
    structure_is_valid_on_host,
)
from specround.sampling.fast_path import search_host as _search
from specround.sampling.host_terminal import TerminalBlocks
from specround.sampling.rng import round_uniforms_host, uniforms
from specround.sampling.scalar_path import (
    SCALAR_LIMIT,
    ScalarBatch,
    decide_with_scalars,
    scalar_batch,
    structure_is_valid_on_scalars,
)
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, Stream, TerminalKind
from specround.sampling.validation import (
    PROBABILITY_DTYPES,
    RowStatistics,
    ValidationMode,
    check_all_rows,
    check_batch_shapes,
    check_batch_structure,
    check_draft_values,
    check_reached_uniforms,
    check_row_statistics,
    check_uniform_shapes,
)

__all__ = [
    "BLOCK_SIZE",
    "DEGENERATE_RESIDUAL_ULPS",
    "InverseCdfDraw",
    "accepts",
    "accepts_host",
    "accepts_scalar",
    "block_width",
    "decide",
    "decide_from_uniforms",
    "degenerate_residual_tolerance",
    "inverse_cdf",
    "round_uniforms",
    "terminal_mass",
]

BLOCK_SIZE = 256
"""Vocabulary block of the two-level inverse-CDF search: block sums first, then a cumsum inside one block
(``min(BLOCK_SIZE, V)`` columns wide: see :func:`block_width`)."""

DEGENERATE_RESIDUAL_ULPS = 16
"""A residual mass of at most this many roundoff units of the dtype is zero (contract#degenerate-cases)."""

_CPU_CHUNK_ELEMENTS = 1 << 18
"""Elements per vocabulary chunk of the terminal pass on CPU (a few float64 copies stay in a 2 MiB L2)."""

_F64 = torch.float64
_NAN = float("nan")


def degenerate_residual_tolerance(dtype: torch.dtype) -> float:
    """Residual mass ``Z`` at or below which a rejection is a rounding artefact: ``16 * eps(dtype)``.

    Why 16 ulps: rows that are roundings of the same distribution differ entrywise by a few units of
    roundoff relative to each entry, so their positive-part difference sums to a few ``eps`` at most; 16
    leaves margin for two softmax implementations (contract#backend-parity) while staying far below any real
    difference.
    """
    return DEGENERATE_RESIDUAL_ULPS * float(torch.finfo(dtype).eps)


@dataclass(frozen=True, slots=True)
class InverseCdfDraw:
    """One inverse-CDF draw per row: the token and the bracket an audit re-checks (INV-10)."""

    tokens: torch.Tensor
    """[N] int64 the smallest index whose cumulative mass exceeds ``u * total`` (never a zero-mass token)."""
    mass_before: torch.Tensor
    """[N] float64 cumulative row mass strictly before the token."""
    token_mass: torch.Tensor
    """[N] float64 the token's own mass: ``mass_before <= u * total < mass_before + token_mass``, up to the
    rounding clamp described in :func:`inverse_cdf`."""
    total: torch.Tensor
    """[N] float64 total row mass (summed block by block, in float64)."""


def _accept_rule(uniform: Any, p_draft: Any, q_draft: Any) -> Any:
    """``u < p(d) / q(d)`` on float64 operands: tensors or Python floats (IEEE division and comparison)."""
    return uniform < p_draft / q_draft


def accepts(uniforms: torch.Tensor, p_draft: torch.Tensor, q_draft: torch.Tensor) -> torch.Tensor:
    """The acceptance predicate, in float64: accept iff ``u < p(d) / q(d)`` (contract#accept-rule).

    With ``u`` in ``[0, 1)``: ``p >= q`` always accepts (so ``p == q`` never corrects), ``p = 0`` always
    rejects, and ``P(accept) = min(1, p / q)``. Inputs broadcast; returns a bool tensor. The sampler and the
    audit both call this function (or :func:`accepts_scalar` and :func:`accepts_host`, the same rule on
    Python floats and on numpy arrays), so the rule is written in one place.
    """
    verdict: torch.Tensor = _accept_rule(uniforms.to(_F64), p_draft.to(_F64), q_draft.to(_F64))
    return verdict


def accepts_host(
    uniforms: npt.NDArray[np.float64], p_draft: npt.NDArray[np.float64], q_draft: npt.NDArray[np.float64]
) -> npt.NDArray[np.bool_]:
    """:func:`accepts` on float64 numpy arrays: the same verdicts bit for bit, without a tensor op.

    numpy's float64 division and comparison are the IEEE operations torch's are. Used by the fast path's
    host control (:func:`~specround.sampling.fast_path.decide_on_host`), whose callers have checked that
    every drafted ``q(d)`` is positive and finite (padding holds ``p = 0``, ``q = 1``).
    """
    return np.asarray(_accept_rule(uniforms, p_draft, q_draft), dtype=np.bool_)


def accepts_scalar(uniform: float, p_draft: float, q_draft: float) -> bool:
    """:func:`accepts` on Python floats (float64): the same verdict bit for bit, without a tensor op.

    A Python float is an IEEE binary64 number and its division and comparison are IEEE operations, as
    torch's float64 ones are, so the quotient and the comparison are the same. Used by the scalar control
    of small batches (:mod:`specround.sampling.scalar_path`).
    """
    return bool(_accept_rule(uniform, p_draft, q_draft))


def terminal_mass(
    p_rows: torch.Tensor, q_rows: torch.Tensor | None, correction: torch.Tensor
) -> torch.Tensor:
    """Unnormalised float64 mass the terminal token is drawn from, per row (contract#positive-residual).

    ``p_rows`` [N, C] and ``q_rows`` [N, C] (``None`` when no row is a correction) hold the same columns of
    the terminal rows, in one dtype; ``correction`` [N] bool selects the residual ``max(p - q, 0)``,
    otherwise the row is ``p`` itself (a bonus, or a degenerate correction). The difference is taken in
    the rows' dtype (correctly rounded; exact whenever ``q/2 <= p <= 2q``), negative entries -- including
    tiny negative rounding residue -- are clamped to zero, and the result is widened to float64 for
    summation. Returns [N, C] float64; the sampler computes exactly these values.
    """
    if q_rows is None:
        return p_rows.clamp_min(0.0).to(_F64)
    diff = torch.where(correction[:, None], p_rows - q_rows, p_rows)  # [N, C]
    return diff.clamp_min(0.0).to(_F64)


def _search_tensors(
    block_sums: torch.Tensor,
    u: torch.Tensor,
    block_values: Callable[[torch.Tensor], torch.Tensor],
) -> InverseCdfDraw:
    """:func:`_search` (the host search) for tensors on any device: the same draw, as tensors there.

    ``block_sums`` [N, nB] float64, ``u`` [N] float64 and ``block_values(block [N]) -> [N, BS]`` float64
    returning the same values the sums were taken over.
    """
    device = block_sums.device

    def values(block: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        return block_values(torch.from_numpy(block).to(device)).cpu().numpy()

    host = _search(block_sums.cpu().numpy(), u.cpu().numpy(), values)
    tokens, mass_before, token_mass, total = (
        torch.from_numpy(np.ascontiguousarray(a)).to(device)
        for a in (host.tokens, host.mass_before, host.token_mass, host.total)
    )
    return InverseCdfDraw(tokens=tokens, mass_before=mass_before, token_mass=token_mass, total=total)


def block_width(vocab: int) -> int:
    """Columns per block of the two-level search over a vocabulary of ``vocab`` tokens."""
    return min(BLOCK_SIZE, vocab)


def _pad_to_blocks(values: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the last dimension of ``values`` [N, C] to a multiple of ``width``."""
    extra = -values.shape[1] % width
    return F.pad(values, (0, extra)) if extra else values


def inverse_cdf(row_mass: torch.Tensor, uniforms: torch.Tensor) -> InverseCdfDraw:
    """Draw one token per row by inverse CDF from one uniform (the sampler's terminal draw, and the audit's).

    ``row_mass`` [N, V] holds non-negative, finite, not necessarily normalised masses (float32 or float64);
    ``uniforms`` [N] float64 in ``[0, 1)``. The token is the smallest index whose cumulative mass exceeds
    ``u * total``; cumulative masses are float64, summed two-level (block sums over :func:`block_width`
    columns, then a cumulative sum within the block), so
    ``mass_before <= u * total < mass_before + token_mass``. A zero-mass token is never chosen.
    Rounding clamp: when ``u * total`` lands at or above the last cumulative value (possible only through
    rounding, by a few ulps of ``total``), the last positive-mass token of the selected block (or of the
    row) is returned and the bracket holds up to those ulps.

    Raises :class:`ShapeMismatchError` for bad shapes or dtypes, :class:`NonFiniteProbabilityError`,
    :class:`NegativeMassError`, :class:`NotNormalisedError` for a row without positive mass, and
    :class:`InvalidRequestError` for a uniform outside ``[0, 1)``.
    """
    if row_mass.dim() != 2 or row_mass.shape[1] < 1 or row_mass.dtype not in PROBABILITY_DTYPES:
        raise ShapeMismatchError(f"row_mass must be [N, V] float32/float64, got {tuple(row_mass.shape)}")
    if tuple(uniforms.shape) != (row_mass.shape[0],) or not uniforms.is_floating_point():
        raise ShapeMismatchError(f"uniforms must be a float [N] tensor, got {tuple(uniforms.shape)}")
    if uniforms.device != row_mass.device:
        raise ShapeMismatchError(f"uniforms are on {uniforms.device} but row_mass is on {row_mass.device}")
    u = uniforms.to(_F64)
    with torch.no_grad():
        width = block_width(row_mass.shape[1])
        padded = _pad_to_blocks(row_mass.to(_F64), width)  # [N, nB * BS]
        n_rows = padded.shape[0]
        block_sums = padded.view(n_rows, -1, width).sum(-1)  # [N, nB]
        totals = block_sums.sum(1)  # [N]: non-finite iff an entry is (or float64 entries overflow)
        flags = torch.stack(
            [
                ~torch.isfinite(totals).all(),
                (padded.amin(1) < 0).any(),
                (totals <= 0).any(),
                ~((u >= 0) & (u < 1)).all(),
            ]
        ).tolist()
        if flags[0]:
            if not bool(torch.isfinite(row_mass).all()):
                raise NonFiniteProbabilityError("row_mass holds NaN or an infinity")
            raise NotNormalisedError("row_mass sums overflow float64")
        if flags[1]:
            raise NegativeMassError("row_mass holds a negative entry")
        if flags[2]:
            raise NotNormalisedError("an inverse-CDF row has no positive mass")
        if flags[3]:
            raise InvalidRequestError("inverse-CDF uniforms must lie in [0, 1)")
        columns = torch.arange(width, device=padded.device)  # [BS]

        def block_values(block: torch.Tensor) -> torch.Tensor:
            return padded.gather(1, block[:, None] * width + columns[None, :])  # [N, BS]

        return _search_tensors(block_sums, u, block_values)


def round_uniforms(batch: SamplerBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """The round's uniforms from the counter-based RNG, in one Philox call (INV-3, INV-10).

    Test ``i`` (0-based) of request ``b`` uses ``(seeds[b], ACCEPT, accept_counters[b] + i)`` and the terminal
    draw ``(seeds[b], TERMINAL, terminal_counters[b])``. Returns accept uniforms [B, K] and terminal uniforms
    [B], float64. Computing a uniform consumes nothing: only reached tests are accounted by the decision.
    """
    k_max = batch.draft_ids.shape[1]
    device = batch.p.device
    if device.type == "cpu":  # the same Philox values computed on the host: no tensor op
        return _host_round_uniforms(
            batch.seeds.tolist(), batch.accept_counters.tolist(), batch.terminal_counters.tolist(), k_max
        )
    positions = torch.arange(k_max, device=device)  # [K]
    counters = torch.cat(
        [batch.accept_counters[:, None] + positions[None, :], batch.terminal_counters[:, None]], dim=1
    )  # [B, K+1]
    streams = torch.tensor(
        [int(Stream.ACCEPT)] * k_max + [int(Stream.TERMINAL)], dtype=torch.int64, device=device
    )  # [K+1]
    drawn = uniforms(batch.seeds[:, None], streams[None, :], counters)  # [B, K+1]
    return drawn[:, :k_max], drawn[:, k_max]


def _host_round_uniforms(
    seeds: list[int], accept_counters: list[int], terminal_counters: list[int], k_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`round_uniforms` computed on the host (the same Philox values): accept [B, K], terminal [B]."""
    drawn = round_uniforms_host(seeds, accept_counters, terminal_counters, k_max)  # [B, K+1]
    return torch.from_numpy(drawn[:, :k_max].copy()), torch.from_numpy(drawn[:, k_max].copy())


def _chunk_columns(n_rows: int, vocab: int, device: torch.device) -> int:
    """Vocabulary columns per chunk of the terminal pass: cache-sized on CPU, the whole row elsewhere."""
    width = block_width(vocab)
    whole = vocab + (-vocab % width)
    if device.type != "cpu":
        return whole
    columns = (_CPU_CHUNK_ELEMENTS // max(n_rows, 1)) // width * width
    return min(whole, max(width, columns))


@dataclass(frozen=True, slots=True)
class _TerminalRows:
    """The terminal rows of the requests that draw a terminal token, corrections first.

    Rows are addressed in the flattened ``p`` [B * (K+1), V] and ``q`` [B * K, V]; the first ``C`` rows are
    corrections (their residual needs ``q``), the rest draw from ``p`` alone (bonus or degenerate).
    """

    batch_rows: torch.Tensor
    """[N] int64 request index b of each terminal row."""
    p_index: torch.Tensor
    """[N] int64 flat row of p: ``b * (K + 1) + A``."""
    q_index: torch.Tensor
    """[C] int64 flat row of q of the first C rows: ``b * K + A``."""

    @property
    def n_correction(self) -> int:
        """C, the number of leading rows drawn from the residual."""
        return int(self.q_index.shape[0])

    def reordered(self, order: torch.Tensor, n_correction: int) -> _TerminalRows:
        """The rows in ``order``, of which the first ``n_correction`` (still corrections) keep their q row."""
        kept = order[:n_correction]
        return _TerminalRows(self.batch_rows[order], self.p_index[order], self.q_index[kept])


def _terminal_mass_(p_part: torch.Tensor, q_part: torch.Tensor) -> torch.Tensor:
    """Float64 terminal mass of rows ``p_part`` [N, C] whose first ``len(q_part)`` rows are corrections.

    Overwrites ``p_part`` (a fresh copy made by the caller) with ``max(p - q, 0)`` in the corrections' rows.
    Bit-identical to :func:`terminal_mass` on the same rows; bonus rows are ``p`` itself (validated
    non-negative before it is used).
    """
    n_correction = q_part.shape[0]
    if n_correction:
        p_part[:n_correction].sub_(q_part).clamp_min_(0.0)
    return p_part.to(_F64)  # [N, C]


def _block_sums_pass(
    p_flat: torch.Tensor, q_flat: torch.Tensor, rows: _TerminalRows, *, with_stats: bool
) -> tuple[torch.Tensor, RowStatistics | None, RowStatistics | None]:
    """One chunked pass over the terminal rows: float64 block sums of the terminal mass, and row statistics.

    Returns block sums [N, nB], and (when ``with_stats``) sum/minimum of the N p rows and of the C q rows.
    """
    n_rows, vocab = rows.p_index.shape[0], p_flat.shape[1]
    n_correction = rows.n_correction
    device, dtype = p_flat.device, p_flat.dtype
    width = block_width(vocab)
    sums = torch.empty(n_rows, -(-vocab // width), dtype=_F64, device=device)  # [N, nB]
    p_total = torch.zeros(n_rows, dtype=_F64, device=device)
    q_total = torch.zeros(n_correction, dtype=_F64, device=device)
    p_min = torch.full((n_rows,), float("inf"), dtype=dtype, device=device)
    q_min = torch.full((n_correction,), float("inf"), dtype=dtype, device=device)
    step = _chunk_columns(n_rows, vocab, device)
    for start in range(0, vocab, step):  # vocabulary chunks, not batch rows
        stop = min(start + step, vocab)
        p_part = p_flat[:, start:stop].index_select(0, rows.p_index)  # [N, C]
        q_part = q_flat[:, start:stop].index_select(0, rows.q_index)  # [C', C]
        if with_stats:
            p_total += p_part.sum(1)
            p_min = torch.minimum(p_min, p_part.amin(1))
            if n_correction:
                q_total += q_part.sum(1)
                q_min = torch.minimum(q_min, q_part.amin(1))
        mass = _pad_to_blocks(_terminal_mass_(p_part, q_part), width)  # [N, C''] (p_part overwritten)
        first = start // width
        sums[:, first : first + mass.shape[1] // width] = mass.view(n_rows, -1, width).sum(-1)
    if not with_stats:
        return sums, None, None
    return sums, RowStatistics(p_total, p_min), RowStatistics(q_total, q_min)


def _block_reader(
    p_flat: torch.Tensor, q_flat: torch.Tensor, rows: _TerminalRows
) -> Callable[[torch.Tensor], torch.Tensor]:
    """``block [N] -> [N, BS]`` float64 terminal mass of that block of each terminal row (zero past V)."""
    vocab = p_flat.shape[1]
    width = block_width(vocab)
    columns = torch.arange(width, device=p_flat.device)  # [BS]

    def read(block: torch.Tensor) -> torch.Tensor:
        cols = block[:, None] * width + columns[None, :]  # [N, BS]
        safe = cols.clamp(max=vocab - 1)
        p_vals = p_flat[rows.p_index[:, None], safe]  # [N, BS]
        q_vals = q_flat[rows.q_index[:, None], safe[: rows.n_correction]]  # [C, BS]
        return _terminal_mass_(p_vals, q_vals).masked_fill_(cols >= vocab, 0.0)

    return read


def _device_terminal_blocks(
    batch: SamplerBatch, p_index: IntArray, q_index: IntArray, with_stats: bool
) -> TerminalBlocks:
    """The terminal pass of the fast path for rows on an accelerator, as the reference takes it there.

    ``p_index`` [N] and ``q_index`` [C] are flat rows of p and q (the first C rows are corrections). One
    copy brings the indices to the device; there the rows are gathered whole (the reference's single chunk
    off the CPU), their sums and minima taken, the residual formed by :func:`_terminal_mass_` and summed in
    float64 blocks of :func:`block_width` columns, as :func:`_block_sums_pass` sums them; one copy brings
    the block sums and statistics back. The row sums are accumulated in float64 here: they only gate the
    fast path, whose tolerance keeps a margin for the order of a sum. The search then reads one block per
    row (:func:`_device_block_reader`).
    """
    p, device = batch.p, batch.p.device
    vocab, n_rows = p.shape[2], p_index.shape[0]
    width = block_width(vocab)
    index = torch.from_numpy(np.concatenate((p_index, q_index))).to(device)  # [N + C], one copy
    p_flat, q_flat = p.reshape(-1, vocab), batch.q.reshape(-1, vocab)
    p_rows, q_rows = torch.split(index, [n_rows, int(q_index.shape[0])])
    p_part = p_flat.index_select(0, p_rows)  # [N, V] a fresh copy
    q_part = q_flat.index_select(0, q_rows)  # [C, V]
    parts = []
    if with_stats:  # N + C sums, then N + C minima (widened exactly by the concatenation below)
        parts = [p_part.sum(1, dtype=_F64), q_part.sum(1, dtype=_F64), p_part.amin(1), q_part.amin(1)]
    mass = _pad_to_blocks(_terminal_mass_(p_part, q_part), width)  # [N, nB * BS] (p_part overwritten)
    sums = mass.view(n_rows, -1, width).sum(-1)  # [N, nB] float64
    host = torch.cat([sums.view(-1), *parts]).cpu().numpy()  # one copy
    n_sums = n_rows * sums.shape[1]
    stats = None
    if with_stats:
        totals, minima_host = np.split(host[n_sums:], 2)
        stats = (totals, minima_host)  # p rows then q rows, as the host pass orders them
    block_values = _device_block_reader(p_flat, q_flat, p_index, q_index, width)
    return TerminalBlocks(host[:n_sums].reshape(n_rows, -1), stats, block_values)


def _device_block_reader(
    p_flat: torch.Tensor, q_flat: torch.Tensor, p_index: IntArray, q_index: IntArray, width: int
) -> Callable[[IntArray], npt.NDArray[np.float64]]:
    """``block [N] -> [N, BS]`` float64 terminal mass of that block of each row, read on the rows' device.

    The values of :func:`_block_reader` (the residual by :func:`_terminal_mass_`, zero past V): the
    element indices are formed on the host, copied over once, and the entries taken there as flat rows.
    """
    vocab = p_flat.shape[1]
    n_correction = q_index.shape[0]
    columns = np.arange(width)

    def read(block: IntArray) -> npt.NDArray[np.float64]:
        cols = block[:, None] * width + columns[None, :]  # [N, BS]
        safe = np.minimum(cols, vocab - 1)
        flat = np.concatenate(
            (
                (p_index[:, None] * vocab + safe).ravel(),
                (q_index[:, None] * vocab + safe[:n_correction]).ravel(),
            )
        )
        at_p, at_q = torch.split(
            torch.from_numpy(flat).to(p_flat.device), [int(cols.size), n_correction * width]
        )
        p_vals, q_vals = p_flat.take(at_p), q_flat.take(at_q)  # [N * BS], [C * BS]: rows one after another
        # The corrections' rows come first, so the flat entries line up as the rows would.
        values = _terminal_mass_(p_vals, q_vals).cpu().numpy().reshape(cols.shape)  # [N, BS] float64
        return np.where(cols < vocab, values, 0.0)

    return read


def _check_terminal_rows(
    batch: SamplerBatch, rows: _TerminalRows, p_stats: RowStatistics, q_stats: RowStatistics
) -> None:
    """Read-mode checks of the terminal rows (p rows, and q rows of corrections).

    Each must be finite, non-negative and normalised; raises like :func:`check_row_statistics`.
    """
    vocab = batch.p.shape[2]
    p_rows_per_request = batch.p.shape[1]
    q_rows_per_request = max(batch.q.shape[1], 1)
    n_p = rows.p_index.shape[0]
    # One check over the N p rows followed by the C q rows.
    stats = RowStatistics(
        torch.cat((p_stats.total, q_stats.total)), torch.cat((p_stats.minimum, q_stats.minimum))
    )

    def locate(index: tuple[int, ...]) -> tuple[str, torch.Tensor, int, int]:
        """(kind, source rows, flat row, rows per request) of entry ``index`` of the joint statistics."""
        (i,) = index
        if i < n_p:
            return "p", batch.p, int(rows.p_index[i]), p_rows_per_request
        return "q", batch.q, int(rows.q_index[i - n_p]), q_rows_per_request

    def describe(index: tuple[int, ...]) -> str:
        kind, _, flat, per_request = locate(index)
        b, row = divmod(flat, per_request)
        return f"{kind} row {row} of request {b} (a terminal row)"

    def read(index: tuple[int, ...]) -> torch.Tensor:
        _, source, flat, _ = locate(index)
        return source.reshape(-1, vocab)[flat]

    check_row_statistics(stats, None, dtype=batch.p.dtype, vocab_size=vocab, describe=describe, rows=read)


def _draw_terminal(
    batch: SamplerBatch, rows: _TerminalRows, u: torch.Tensor, mode: ValidationMode
) -> tuple[_TerminalRows, InverseCdfDraw, torch.Tensor]:
    """Check (read mode) and draw the terminal tokens of ``rows`` with TERMINAL uniforms ``u`` [B].

    Returns the rows in the order of the draw (a degenerate correction -- residual mass at or below the
    tolerance -- is moved behind the corrections and redrawn from its target row), the draw, and [N] flags
    marking the degenerate corrections.
    """
    vocab = batch.p.shape[2]
    p_flat = batch.p.reshape(-1, vocab)  # [B * (K+1), V], a view for contiguous p
    q_flat = batch.q.reshape(-1, vocab)  # [B * K, V]
    sums, p_stats, q_stats = _block_sums_pass(p_flat, q_flat, rows, with_stats=mode == "read")
    if p_stats is not None and q_stats is not None:
        _check_terminal_rows(batch, rows, p_stats, q_stats)

    n_rows, n_correction = rows.p_index.shape[0], rows.n_correction
    degenerate = torch.zeros(n_rows, dtype=torch.bool, device=sums.device)
    residual_total = sums[:n_correction].cumsum(1)[:, -1]  # [C], summed as the search sums it
    stale = residual_total <= degenerate_residual_tolerance(batch.p.dtype)  # [C]
    if n_correction and bool(stale.any()):
        positions = torch.arange(n_rows, device=sums.device)
        order = torch.cat(
            [positions[:n_correction][~stale], positions[:n_correction][stale], positions[n_correction:]]
        )
        kept = n_correction - int(stale.sum())
        rows = rows.reordered(order, kept)
        sums = sums[order]
        redo = torch.arange(kept, n_correction, device=sums.device)
        target_only = _TerminalRows(rows.batch_rows[redo], rows.p_index[redo], rows.q_index[:0])
        sums[redo] = _block_sums_pass(p_flat, q_flat, target_only, with_stats=False)[0]
        degenerate[redo] = True
    draw = _search_tensors(sums, u[rows.batch_rows], _block_reader(p_flat, q_flat, rows))
    return rows, draw, degenerate


def _stop_rows(stop_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Stop sets [B, N, S] at 0-based output positions [B, N] (``stop_ids`` [B, S] or [B, K+1, S])."""
    if stop_ids.dim() == 2:
        return stop_ids[:, None, :].expand(-1, positions.shape[1], -1)
    index = positions[:, :, None].expand(-1, -1, stop_ids.shape[2])  # [B, N, S]
    return stop_ids.gather(1, index)


def _in_stop_set(tokens: torch.Tensor, stop_sets: torch.Tensor) -> torch.Tensor:
    """[B, N] bool: ``tokens`` [B, N] is a (non-PAD) member of ``stop_sets`` [B, N, S]."""
    return ((tokens[:, :, None] == stop_sets) & (stop_sets != PAD_ID)).any(-1)


def _prefix_stops(
    batch: SamplerBatch, n_accepted: torch.Tensor, within: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A stop token or the length cap inside the accepted prefix (1-based positions ``1..A``).

    Returns ``stopped`` [B] bool, the stop distance ``s`` [B] (meaningful where stopped) and whether the
    stop at ``s`` is a stop token [B] bool (a token wins over the cap at the same position).
    """
    n_batch, k_max = batch.draft_ids.shape
    positions = torch.arange(k_max, device=n_accepted.device)  # [K] 0-based
    ordinal = positions + 1  # [K] 1-based position i
    at_cap = ordinal[None, :] == batch.remaining[:, None]  # [B, K]
    if batch.stop_ids.shape[-1] == 0:  # no stop tokens at all: only the length cap can end the prefix
        hit = (ordinal[None, :] <= n_accepted[:, None]) & at_cap  # [B, K]
        first_hit = (hit.to(torch.int64).cumsum(1) == 0).sum(1)  # [B]
        return first_hit < k_max, first_hit + 1, torch.zeros_like(first_hit, dtype=torch.bool)
    stop_sets = _stop_rows(batch.stop_ids, positions[None, :].expand(n_batch, -1))  # [B, K, S]
    draft_stops = within & _in_stop_set(batch.draft_ids, stop_sets)  # [B, K]
    hit = (ordinal[None, :] <= n_accepted[:, None]) & (draft_stops | at_cap)  # [B, K]
    first_hit = (hit.to(torch.int64).cumsum(1) == 0).sum(1)  # [B] 0-based index of the first hit, K if none
    by_token = (draft_stops & (positions[None, :] == first_hit[:, None])).any(1)  # [B]
    return first_hit < k_max, first_hit + 1, by_token


@dataclass(frozen=True, slots=True)
class _TerminalOutcome:
    """Per-request results of the terminal draws; PAD_ID / NaN / False where no draw happened."""

    tokens: torch.Tensor
    """[B] int64 terminal token."""
    total: torch.Tensor
    """[B] float64 mass of the row drawn from."""
    mass_before: torch.Tensor
    """[B] float64 inverse-CDF bracket low."""
    token_mass: torch.Tensor
    """[B] float64 the token's own mass."""
    degenerate: torch.Tensor
    """[B] bool degenerate correction drawn from p."""


def _terminal_draws(
    batch: SamplerBatch,
    n_accepted: torch.Tensor,
    needs_terminal: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
) -> _TerminalOutcome:
    """Draw the correction or bonus token of every request that needs one, from row ``A``.

    Contract: contract#positive-residual, contract#bonus-token.
    """
    n_batch, k_max = batch.draft_ids.shape
    device = n_accepted.device
    tokens = torch.full((n_batch,), PAD_ID, dtype=torch.int64, device=device)  # [B]
    masses = torch.full((3, n_batch), _NAN, dtype=_F64, device=device)  # [3, B] total, before, token
    degenerate = torch.zeros(n_batch, dtype=torch.bool, device=device)  # [B]
    drawing = needs_terminal.nonzero().squeeze(1)  # [N]
    if drawing.numel():
        is_correction = n_accepted[drawing] < batch.draft_lens[drawing]  # [N]
        drawing = drawing[torch.argsort((~is_correction).to(torch.int8), stable=True)]  # corrections first
        n_correction = int(is_correction.sum())
        a_rows = n_accepted[drawing]  # [N]
        rows = _TerminalRows(
            batch_rows=drawing,
            p_index=drawing * (k_max + 1) + a_rows,
            q_index=drawing[:n_correction] * k_max + a_rows[:n_correction],
        )
        rows, draw, degenerate_rows = _draw_terminal(batch, rows, terminal_uniforms, mode)
        tokens[rows.batch_rows] = draw.tokens
        masses[:, rows.batch_rows] = torch.stack((draw.total, draw.mass_before, draw.token_mass))
        degenerate[rows.batch_rows] = degenerate_rows
    total, mass_before, token_mass = masses.unbind(0)
    return _TerminalOutcome(tokens, total, mass_before, token_mass, degenerate)


def _check_mode(validate: str) -> ValidationMode:
    if validate == "read":
        return "read"
    if validate == "full":
        return "full"
    raise InvalidRequestError(f"validate must be 'read' or 'full', got {validate!r}")


def decide(batch: SamplerBatch, *, validate: ValidationMode = "read") -> SamplerDecision:
    """Decide a batch of speculative rounds with uniforms drawn from the counter-based RNG.

    The uniforms are :func:`round_uniforms` of the batch; the decision is :func:`decide_from_uniforms`.

    Validation (named :class:`~specround.errors.InputError` subclasses, raised before anything is returned):
    ``validate="read"`` (default) checks the batch's structure and every value the decision reads: the
    gathered ``p_i(d_i)``, ``q_i(d_i)`` and the terminal rows; rows the decision never reads cannot change
    the output and are not checked. ``validate="full"`` also checks every ``p`` row ``0..k_b`` and ``q`` row
    ``0..k_b - 1`` (a full pass over the batch). See :mod:`specround.sampling.validation`.
    """
    mode = _check_mode(validate)
    host = _check_structure(batch)
    with torch.no_grad():
        if isinstance(host, HostBatch) and host.seeds is not None:  # an accelerator's batch, on the host
            accept_uniforms, terminal_uniforms = _host_round_uniforms(
                host.seeds, host.accept_counters, host.terminal_counters, batch.draft_ids.shape[1]
            )
        else:
            accept_uniforms, terminal_uniforms = round_uniforms(batch)
        return _decide(batch, host, accept_uniforms, terminal_uniforms, mode)


def decide_from_uniforms(
    batch: SamplerBatch,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    *,
    validate: ValidationMode = "read",
) -> SamplerDecision:
    """The deterministic core: decide a batch from given uniforms (replays and audits use it directly).

    ``accept_uniforms`` [B, K] float64 (entry ``i`` is test ``i + 1``) and ``terminal_uniforms`` [B] float64.
    Only the uniforms the decision uses are checked to lie in ``[0, 1)``: unreached tests may hold anything
    (a logged round stores NaN there). Validation as in :func:`decide`.
    """
    mode = _check_mode(validate)
    host = _check_structure(batch)
    check_uniform_shapes(batch, accept_uniforms, terminal_uniforms)
    with torch.no_grad():
        return _decide(batch, host, accept_uniforms, terminal_uniforms, mode)


def _check_structure(batch: SamplerBatch) -> HostBatch | ScalarBatch | None:
    """:func:`check_batch_structure`, with its integer checks done on the host for a CPU batch.

    A CPU batch whose values pass the host check is accepted without a tensor op: a small batch (``B * (K
    + 1) <= SCALAR_LIMIT``) gets its Python lists for the scalar control, a larger one its numpy views for
    the fast path. A batch on an accelerator copies its integers to the host once
    (:func:`~specround.sampling.fast_path.device_host_batch`) and, when they pass, takes the fast path's
    control on the host with its rows read on the device. Any other batch goes through the full check,
    which raises the named error, and gets ``None``.
    """
    check_batch_shapes(batch)
    if batch.p.device.type == "cpu":
        n_batch, k_max = batch.draft_ids.shape
        if 0 < n_batch * (k_max + 1) <= SCALAR_LIMIT:
            scalars = scalar_batch(batch)
            if structure_is_valid_on_scalars(scalars):
                return scalars
        else:
            host = host_batch(batch)
            if structure_is_valid_on_host(host):
                return host
    else:
        on_device = device_host_batch(batch)
        if structure_is_valid_on_host(on_device):
            return on_device
    check_batch_structure(batch)
    return None


def _decide(
    batch: SamplerBatch,
    host: HostBatch | ScalarBatch | None,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
) -> SamplerDecision:
    """:func:`decide_from_uniforms` after the structural checks: the CPU fast path, else the reference."""
    if host is not None:
        seams = HostSeams(
            accepts=accepts_host,
            search=_search,
            check_all_rows=check_all_rows,
            block_width=block_width,
            degenerate_tolerance=degenerate_residual_tolerance,
            device_blocks=_device_terminal_blocks,
        )
        if isinstance(host, ScalarBatch):
            decision = decide_with_scalars(
                batch, host, accept_uniforms, terminal_uniforms, mode, seams, accepts_scalar
            )
        else:
            decision = decide_on_host(batch, host, accept_uniforms, terminal_uniforms, mode, seams)
        if decision is not None:
            return decision
    device = batch.p.device  # uniforms drawn on the host for an accelerator's batch are read there
    return _decide_reference(batch, accept_uniforms.to(device), terminal_uniforms.to(device), mode)


def _decide_reference(
    batch: SamplerBatch,
    accept_uniforms: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    mode: ValidationMode,
) -> SamplerDecision:
    """The reference decision with torch ops on the batch's device (every check raises its named error)."""
    p, q = batch.p, batch.q
    n_batch, k_max = batch.draft_ids.shape
    device = p.device
    lens = batch.draft_lens  # [B]
    positions = torch.arange(k_max, device=device)  # [K]
    within = positions[None, :] < lens[:, None]  # [B, K]
    if mode == "full":
        check_all_rows(batch)

    # Gathered draft probabilities p_i(d_i), q_i(d_i).
    safe_ids = batch.draft_ids.clamp_min(0)[:, :, None]  # [B, K, 1]
    p_at = p[:, :k_max, :].gather(2, safe_ids).squeeze(2).to(_F64)  # [B, K]
    q_at = q.gather(2, safe_ids).squeeze(2).to(_F64)  # [B, K]
    check_draft_values(p_at, q_at, within)
    p_draft = torch.where(within, p_at, 0.0)  # [B, K]
    q_draft = torch.where(within, q_at, 1.0)  # [B, K]

    # Acceptance tests and the leading accepted run A.
    accepted_tests = accepts(accept_uniforms, p_draft, q_draft) & within  # [B, K]
    n_accepted = accepted_tests.to(torch.int64).cumprod(1).sum(1)  # [B] A

    stopped, stop_len, stop_by_token_in_prefix = _prefix_stops(batch, n_accepted, within)

    needs_terminal = ~stopped  # [B]
    accept_draws = torch.where(stopped, stop_len, torch.minimum(n_accepted + 1, lens))  # [B]
    reached = positions[None, :] < accept_draws[:, None]  # [B, K]
    check_reached_uniforms(accept_uniforms, reached, terminal_uniforms, needs_terminal)

    # The terminal draw (correction or bonus) for the requests that did not stop inside the prefix.
    terminal = _terminal_draws(batch, n_accepted, needs_terminal, terminal_uniforms, mode)

    # Finish rules for the terminal token at 1-based position A + 1.
    at_cap = needs_terminal & (n_accepted + 1 == batch.remaining)  # [B]
    if batch.stop_ids.shape[-1] == 0:  # no stop tokens: only the length cap finishes a request
        finished = stopped | at_cap  # [B]
        stopped_by_token = stop_by_token_in_prefix  # [B] all False
    else:
        terminal_stop = needs_terminal & _in_stop_set(
            terminal.tokens[:, None], _stop_rows(batch.stop_ids, n_accepted[:, None])
        ).squeeze(1)  # [B]
        finished = stopped | terminal_stop | at_cap  # [B]
        stopped_by_token = torch.where(stopped, stop_by_token_in_prefix, terminal_stop)  # [B]

    # Output ids [B, K+1]: the emitted drafts, then the terminal token, PAD_ID after.
    columns = torch.arange(k_max + 1, device=device)  # [K+1]
    prefix_len = torch.where(stopped, stop_len, n_accepted)  # [B] emitted drafts
    pad_column = torch.full((n_batch, 1), PAD_ID, dtype=torch.int64, device=device)
    drafts_padded = torch.cat([batch.draft_ids, pad_column], dim=1)  # [B, K+1]
    output_ids = torch.where(columns[None, :] < prefix_len[:, None], drafts_padded, PAD_ID)  # [B, K+1]
    at_terminal = needs_terminal[:, None] & (columns[None, :] == n_accepted[:, None])  # [B, K+1]
    output_ids = torch.where(at_terminal, terminal.tokens[:, None], output_ids)

    terminal_kind = torch.where(
        n_accepted < lens, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)
    )  # [B]
    terminal_kind = torch.where(stopped, int(TerminalKind.STOP), terminal_kind)
    return SamplerDecision(
        output_ids=output_ids,
        emitted=torch.where(stopped, stop_len, n_accepted + 1),
        accepted=prefix_len,
        terminal=terminal_kind,
        finished=finished,
        accept_draws=accept_draws,
        terminal_draws=needs_terminal.to(torch.int64),
        p_draft=p_draft,
        q_draft=q_draft,
        accept_uniforms=torch.where(reached, accept_uniforms, _NAN),
        terminal_uniform=torch.where(needs_terminal, terminal_uniforms, _NAN),
        terminal_row=torch.where(needs_terminal, n_accepted, PAD_ID),
        residual_mass=terminal.total,
        terminal_mass_before=terminal.mass_before,
        terminal_token_mass=terminal.token_mass,
        stopped_by_token=stopped_by_token,
        degenerate_correction=terminal.degenerate,
    )
