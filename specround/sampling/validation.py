"""Input checks of the exact sampler: a malformed batch is refused with a named error before any decision.

Three groups of checks, in the order the sampler runs them:

1. **Structure** (:func:`check_batch_structure`, always): shapes, dtypes and devices agree; draft lengths lie
   in ``0..K``; draft ids lie in ``[0, V)`` within each draft length and are ``PAD_ID`` beyond it; stop ids
   are ``PAD_ID`` or in ``[0, V)``; budgets are ``>= 1``; counters are non-negative and leave room for the
   round's draws. These read only ``O(B * (K + S))`` integers.
2. **Values the decision reads** (:func:`check_draft_values`, :func:`check_row_statistics`): the gathered
   ``p_i(d_i)``, ``q_i(d_i)`` (finite, non-negative, ``q_i(d_i) > 0``) and the one terminal row (or two, for a
   correction: ``p`` and ``q`` at the rejected position), which must be finite, non-negative and normalised.
3. **Every row** (:func:`check_all_rows`, only with ``validate="full"``): every ``p`` row ``0..k_b`` and every
   ``q`` row ``0..k_b - 1`` of every request, a full pass over the batch. Rows beyond a request's draft
   length are padding: they are never read and never checked (zeros or NaN there are fine).

Normalisation tolerance (:func:`normalisation_tolerance`): a row passes when ``|sum - 1| <= tol`` with
``tol = 1e-4 * max(1, V / 1000)`` for float32 rows and ``tol = 1e-9 * max(1, V / 10**6)`` for float64 rows.
Why: a producer that normalises with a plain running sum in the row's own precision makes a relative error of
at most about ``V * u`` (``u`` the unit roundoff: ``2**-24`` for float32, ``2**-53`` for float64), i.e.
``6e-5 * V / 1000`` for float32 and ``1.1e-10 * V / 10**6`` for float64; the tolerances cover that worst case
with margin while still refusing rows that are off by a real amount (a forgotten renormalisation after
top-k/top-p, raw logits, a stale row). The checker's own sums are pairwise/cascaded (error about
``log2(V) * u``), far below the tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    InputError,
    InvalidRequestError,
    NegativeMassError,
    NonFiniteProbabilityError,
    NotNormalisedError,
    ShapeMismatchError,
    ZeroProposalProbabilityError,
)
from specround.sampling.types import PAD_ID, SamplerBatch

__all__ = [
    "PROBABILITY_DTYPES",
    "RowStatistics",
    "ValidationMode",
    "check_all_rows",
    "check_batch_shapes",
    "check_batch_structure",
    "check_draft_values",
    "check_reached_uniforms",
    "check_row_statistics",
    "check_uniform_shapes",
    "normalisation_tolerance",
    "row_statistics",
]

ValidationMode = Literal["read", "full"]
"""``"read"``: check every value the decision reads; ``"full"``: also check every row of the batch."""

PROBABILITY_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float64)
"""Dtypes accepted for ``p`` and ``q`` rows (both rows of a batch share one)."""

_INT64_MAX = 2**63 - 1

_Check = tuple[torch.Tensor, Callable[[], InputError]]
"""A 0-dim bool tensor that is True when the check *fails*, and the error to raise then (built lazily)."""


def normalisation_tolerance(dtype: torch.dtype, vocab_size: int) -> float:
    """Largest accepted ``|row sum - 1|`` for rows of ``dtype`` over ``vocab_size`` tokens (module doc)."""
    if dtype == torch.float32:
        return 1e-4 * max(1.0, vocab_size / 1000)
    if dtype == torch.float64:
        return 1e-9 * max(1.0, vocab_size / 1_000_000)
    raise ShapeMismatchError(f"probability rows must be float32 or float64, got {dtype}")


def _raise_first(checks: list[_Check]) -> None:
    """Raise the error of the first failing check; one host synchronisation for the whole list."""
    if not checks:
        return
    failed = torch.stack([flag if flag.dim() == 0 else flag.reshape(()) for flag, _ in checks]).tolist()
    for is_failed, (_, make_error) in zip(failed, checks, strict=True):
        if is_failed:
            raise make_error()


def _first_index(mask: torch.Tensor) -> tuple[int, ...]:
    """Index of the first True entry of ``mask`` (only called once a check has failed)."""
    return tuple(int(i) for i in mask.nonzero()[0].tolist())


def check_batch_structure(batch: SamplerBatch) -> None:
    """Shapes, dtypes, devices, draft ids and padding, stop ids, budgets and counters of ``batch``.

    Raises :class:`ShapeMismatchError` (shape, dtype, device, draft lengths outside ``0..K``, ``PAD_ID``
    missing beyond a draft length), :class:`DraftIdOutOfVocabError` (a draft id outside ``[0, V)`` within
    its draft length) and :class:`InvalidRequestError` (a budget below 1, a negative or exhausted counter, a
    stop id outside ``[0, V)`` that is not ``PAD_ID``).
    """
    check_batch_shapes(batch)
    _check_batch_values(batch)


_TENSOR_FIELDS = (
    "p",
    "q",
    "draft_ids",
    "draft_lens",
    "stop_ids",
    "remaining",
    "seeds",
    "accept_counters",
    "terminal_counters",
)
"""Every field of a :class:`SamplerBatch` (all tensors)."""


def check_batch_shapes(batch: SamplerBatch) -> None:
    """The shape, dtype and device part of :func:`check_batch_structure` (plain Python, no tensor op)."""
    for name in _TENSOR_FIELDS:
        value = getattr(batch, name)
        if not isinstance(value, torch.Tensor):
            raise ShapeMismatchError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    p, q = batch.p, batch.q
    if p.dim() != 3 or q.dim() != 3:
        raise ShapeMismatchError(
            f"p must be [B, K+1, V] and q [B, K, V]; got {tuple(p.shape)}, {tuple(q.shape)}"
        )
    n_batch, k_max, vocab = q.shape[0], q.shape[1], p.shape[2]
    if tuple(p.shape) != (n_batch, k_max + 1, vocab) or q.shape[2] != vocab:
        raise ShapeMismatchError(
            f"p {tuple(p.shape)} and q {tuple(q.shape)} disagree: need p [B, K+1, V] and q [B, K, V]"
        )
    if vocab < 1:
        raise ShapeMismatchError("the vocabulary must hold at least one token")
    if p.dtype not in PROBABILITY_DTYPES:
        raise ShapeMismatchError(f"p must be float32 or float64, got {p.dtype}")
    if q.dtype != p.dtype:
        raise ShapeMismatchError(f"p ({p.dtype}) and q ({q.dtype}) must share one dtype")
    shapes: dict[str, tuple[torch.Tensor, tuple[int, ...]]] = {
        "draft_ids": (batch.draft_ids, (n_batch, k_max)),
        "draft_lens": (batch.draft_lens, (n_batch,)),
        "remaining": (batch.remaining, (n_batch,)),
        "seeds": (batch.seeds, (n_batch,)),
        "accept_counters": (batch.accept_counters, (n_batch,)),
        "terminal_counters": (batch.terminal_counters, (n_batch,)),
    }
    stop_ids = batch.stop_ids
    if stop_ids.dim() == 2:
        shapes["stop_ids"] = (stop_ids, (n_batch, stop_ids.shape[1]))
    elif stop_ids.dim() == 3:
        shapes["stop_ids"] = (stop_ids, (n_batch, k_max + 1, stop_ids.shape[2]))
    else:
        raise ShapeMismatchError(f"stop_ids must be [B, S] or [B, K+1, S], got {tuple(stop_ids.shape)}")
    for name, (tensor, expected) in shapes.items():
        if tuple(tensor.shape) != expected:
            raise ShapeMismatchError(f"{name} must have shape {expected}, got {tuple(tensor.shape)}")
        if tensor.dtype != torch.int64:
            raise ShapeMismatchError(f"{name} must be int64, got {tensor.dtype}")
    for name, tensor in [("q", q), *((name, t) for name, (t, _) in shapes.items())]:
        if tensor.device != p.device:
            raise ShapeMismatchError(f"{name} is on {tensor.device} but p is on {p.device}")


def _check_batch_values(batch: SamplerBatch) -> None:
    """The integer-value part of :func:`check_batch_structure`, on a batch whose shapes were checked."""
    p, stop_ids = batch.p, batch.stop_ids
    k_max, vocab = batch.q.shape[1], p.shape[2]
    lens, ids = batch.draft_lens, batch.draft_ids
    positions = torch.arange(k_max, device=p.device)  # [K]
    within = positions[None, :] < lens[:, None]  # [B, K]
    bad_len = lens.clamp(0, k_max) != lens  # [B]
    # One comparison finds both kinds of bad id: out of [0, V) within the draft length, not PAD_ID beyond.
    misplaced = ids != torch.where(within, ids.clamp(0, vocab - 1), PAD_ID)  # [B, K]
    counters = torch.stack((batch.remaining, batch.accept_counters, batch.terminal_counters))  # [3, B]
    low = torch.tensor((1, 0, 0), dtype=torch.int64, device=p.device)[:, None]  # [3, 1]
    high = torch.tensor((_INT64_MAX, _INT64_MAX - k_max, _INT64_MAX - 1), device=p.device)[:, None]
    bad_counter = (counters < low) | (counters > high)  # [3, B]: budget, ACCEPT, TERMINAL
    # A stop id is valid when it is PAD_ID (-1) or in [0, V): exactly the integers in [PAD_ID, V - 1].
    bad_stop = stop_ids.clamp(PAD_ID, vocab - 1) != stop_ids  # [B, S] or [B, K+1, S]
    # The checks above are fused; the error functions below (run only on failure) tell the cases apart.

    def bad_len_error() -> InputError:
        (b,) = _first_index(bad_len)
        return ShapeMismatchError(f"draft_lens[{b}] = {int(lens[b])} is outside 0..K = 0..{k_max}")

    def bad_id_error() -> InputError:
        b, i = _first_index(within & misplaced)
        return DraftIdOutOfVocabError(
            f"draft id {int(ids[b, i])} of request {b} at position {i} is outside [0, {vocab})"
        )

    def missing_pad_error() -> InputError:
        b, i = _first_index(~within & misplaced)
        return ShapeMismatchError(
            f"request {b} drafted {int(lens[b])} tokens but holds id {int(ids[b, i])} at position {i}; "
            f"positions beyond the draft length must be PAD_ID = {PAD_ID}"
        )

    def bad_budget_error() -> InputError:
        (b,) = _first_index(bad_counter[0])
        return InvalidRequestError(
            f"remaining[{b}] = {int(batch.remaining[b])}: a round needs a budget of at least 1"
        )

    def bad_accept_error() -> InputError:
        (b,) = _first_index(bad_counter[1])
        return InvalidRequestError(
            f"accept_counters[{b}] = {int(batch.accept_counters[b])} is negative or leaves no room for "
            f"{k_max} draws"
        )

    def bad_terminal_error() -> InputError:
        (b,) = _first_index(bad_counter[2])
        return InvalidRequestError(
            f"terminal_counters[{b}] = {int(batch.terminal_counters[b])} is negative or exhausted"
        )

    def bad_counter_error() -> InputError:
        first = bad_counter.any(1).tolist()  # budget, ACCEPT, TERMINAL: report the first kind that failed
        return (bad_budget_error, bad_accept_error, bad_terminal_error)[first.index(True)]()

    def misplaced_error() -> InputError:
        return bad_id_error() if bool((within & misplaced).any()) else missing_pad_error()

    def bad_stop_error() -> InputError:
        where = _first_index(bad_stop)
        return InvalidRequestError(
            f"stop id {int(stop_ids[where])} at {where} is neither PAD_ID nor in [0, {vocab})"
        )

    _raise_first(
        [
            (bad_len.any(), bad_len_error),
            (misplaced.any(), misplaced_error),
            (bad_counter.any(), bad_counter_error),
            (bad_stop.any(), bad_stop_error),
        ]
    )


def check_uniform_shapes(
    batch: SamplerBatch, accept_uniforms: torch.Tensor, terminal_uniforms: torch.Tensor
) -> None:
    """Uniform tensors must be float64 ``[B, K]`` and ``[B]`` on the batch's device or on the host.

    Host uniforms for an accelerator's batch are what its fast path reads (no copy there and back).
    Raises :class:`ShapeMismatchError` otherwise.
    """
    n_batch, k_max = batch.draft_ids.shape
    for name, tensor, expected in (
        ("accept_uniforms", accept_uniforms, (n_batch, k_max)),
        ("terminal_uniforms", terminal_uniforms, (n_batch,)),
    ):
        if tuple(tensor.shape) != expected:
            raise ShapeMismatchError(f"{name} must have shape {expected}, got {tuple(tensor.shape)}")
        if tensor.dtype != torch.float64:
            raise ShapeMismatchError(f"{name} must be float64, got {tensor.dtype}")
        if tensor.device != batch.p.device and tensor.device.type != "cpu":
            raise ShapeMismatchError(f"{name} is on {tensor.device} but p is on {batch.p.device}")


def check_reached_uniforms(
    accept_uniforms: torch.Tensor,
    reached: torch.Tensor,
    terminal_uniforms: torch.Tensor,
    drawn: torch.Tensor,
) -> None:
    """Every uniform the decision used must lie in ``[0, 1)`` (InvalidRequestError).

    ``reached`` [B, K] marks the reached acceptance tests and ``drawn`` [B] the requests with a terminal
    draw. Unused entries are not checked: a replayed log legitimately holds NaN there.
    """
    # floor(u) == 0 exactly when 0 <= u < 1; NaN and infinities fail too.
    bad_accept = reached & (accept_uniforms.floor() != 0)  # [B, K]
    bad_terminal = drawn & (terminal_uniforms.floor() != 0)  # [B]

    def bad_accept_error() -> InputError:
        b, i = _first_index(bad_accept)
        return InvalidRequestError(
            f"ACCEPT uniform {float(accept_uniforms[b, i])!r} of request {b}, test {i}, is outside [0, 1)"
        )

    def bad_terminal_error() -> InputError:
        (b,) = _first_index(bad_terminal)
        return InvalidRequestError(
            f"TERMINAL uniform {float(terminal_uniforms[b])!r} of request {b} is outside [0, 1)"
        )

    _raise_first([(bad_accept.any(), bad_accept_error), (bad_terminal.any(), bad_terminal_error)])


def check_draft_values(p_draft: torch.Tensor, q_draft: torch.Tensor, within: torch.Tensor) -> None:
    """The gathered ``p_i(d_i)`` and ``q_i(d_i)`` [B, K] at drafted positions (``within`` [B, K]).

    Raises :class:`NonFiniteProbabilityError`, :class:`NegativeMassError`, and
    :class:`ZeroProposalProbabilityError` when ``q_i(d_i) = 0``: the proposal could not have sampled it.
    """
    # x - x is 0 for a finite x and NaN for NaN or an infinity: one sum tests both rows.
    non_finite = within & ((p_draft - p_draft) + (q_draft - q_draft) != 0)  # [B, K]
    negative = within & (torch.minimum(p_draft, q_draft) < 0)  # [B, K]
    zero_q = within & (q_draft == 0)  # [B, K]

    def describe(mask: torch.Tensor) -> str:
        b, i = _first_index(mask)
        p_value, q_value = float(p_draft[b, i]), float(q_draft[b, i])
        return f"request {b}, draft position {i}: p(d) = {p_value!r}, q(d) = {q_value!r}"

    _raise_first(
        [
            (non_finite.any(), lambda: NonFiniteProbabilityError(describe(non_finite))),
            (negative.any(), lambda: NegativeMassError(describe(negative))),
            (
                zero_q.any(),
                lambda: ZeroProposalProbabilityError(
                    describe(zero_q) + " (a token with q = 0 cannot have been proposed)"
                ),
            ),
        ]
    )


class RowStatistics:
    """Per-row sum and minimum of some probability rows, enough to check them without another pass."""

    __slots__ = ("minimum", "total")

    def __init__(self, total: torch.Tensor, minimum: torch.Tensor) -> None:
        self.total = total
        """[...] float64 row sums."""
        self.minimum = minimum
        """[...] row minima (NaN when the row holds a NaN)."""


def row_statistics(rows: torch.Tensor) -> RowStatistics:
    """Sum (float64 result; accumulated in the rows' dtype, pairwise) and minimum over the last dimension."""
    return RowStatistics(rows.sum(-1).to(torch.float64), rows.amin(-1))


def check_row_statistics(
    stats: RowStatistics,
    checked: torch.Tensor | None,
    *,
    dtype: torch.dtype,
    vocab_size: int,
    describe: Callable[[tuple[int, ...]], str],
    rows: Callable[[tuple[int, ...]], torch.Tensor],
) -> None:
    """Refuse non-finite, negative or unnormalised rows among those marked by ``checked``.

    ``stats`` holds each row's sum and minimum; ``checked`` marks the rows to check (None: every row);
    ``describe(index)`` names the row at ``index`` in messages and
    ``rows(index)`` returns it, to tell a true infinity from a sum that overflowed (only on failure).
    Raises :class:`NonFiniteProbabilityError`, :class:`NegativeMassError` or :class:`NotNormalisedError`.
    """
    tolerance = normalisation_tolerance(dtype, vocab_size)
    total, minimum = stats.total, stats.minimum
    # x - x is 0 for a finite x, NaN otherwise: a non-finite sum or a NaN minimum.
    non_finite = (total - total) + (minimum - minimum) != 0
    negative = minimum < 0
    off = (total - 1.0).abs() > tolerance
    if checked is not None:
        non_finite, negative, off = checked & non_finite, checked & negative, checked & off

    def non_finite_error() -> InputError:
        index = _first_index(non_finite)
        if bool(torch.isfinite(rows(index)).all()):  # finite entries whose sum overflowed
            return NotNormalisedError(f"{describe(index)} sums to {float(stats.total[index])!r}")
        return NonFiniteProbabilityError(f"{describe(index)} holds NaN or an infinity")

    def negative_error() -> InputError:
        index = _first_index(negative)
        return NegativeMassError(f"{describe(index)} holds a negative entry {float(stats.minimum[index])!r}")

    def off_error() -> InputError:
        index = _first_index(off)
        return NotNormalisedError(
            f"{describe(index)} sums to {float(stats.total[index])!r}; |sum - 1| must be <= {tolerance:.3g} "
            f"for {dtype} rows over V = {vocab_size}"
        )

    _raise_first(
        [(non_finite.any(), non_finite_error), (negative.any(), negative_error), (off.any(), off_error)]
    )


def check_all_rows(batch: SamplerBatch) -> None:
    """The ``validate="full"`` pass: every ``p`` row ``0..k_b`` and ``q`` row ``0..k_b - 1`` of every request.

    Reads the whole batch once per statistic; rows beyond a request's draft length are padding and are not
    checked. Raises like :func:`check_row_statistics`.
    """
    p, q = batch.p, batch.q
    k_max, vocab = q.shape[1], p.shape[2]
    rows_p = torch.arange(k_max + 1, device=p.device)  # [K+1]
    p_used = rows_p[None, :] <= batch.draft_lens[:, None]  # [B, K+1]
    check_row_statistics(
        row_statistics(p),
        p_used,
        dtype=p.dtype,
        vocab_size=vocab,
        describe=lambda index: f"p row {index[1]} of request {index[0]}",
        rows=lambda index: p[index],
    )
    if k_max > 0:
        q_used = rows_p[None, :k_max] < batch.draft_lens[:, None]  # [B, K]
        check_row_statistics(
            row_statistics(q),
            q_used,
            dtype=q.dtype,
            vocab_size=vocab,
            describe=lambda index: f"q row {index[1]} of request {index[0]}",
            rows=lambda index: q[index],
        )
