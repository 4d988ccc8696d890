"""Assembling one sampler batch from a step's rounds, and turning the batched decision into events.

The step calls :func:`build_batch` once per group of rounds that share vocabulary size, dtype and device,
runs ONE :func:`~specround.sampling.exact.decide` on it, and hands the decision to
:func:`record_decisions`, which extracts every field with one ``tolist`` per tensor (terminal probabilities
of host rows read in numpy) and builds each round's ``round_decided`` event.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from specround.statemachine.events import EVENT_SCHEMA_VERSION, RoundDecided
from specround.statemachine.records import assemble
from specround.statemachine.state import TerminalName
from specround.statemachine.work import RoundWork

__all__ = [
    "TERMINAL_NAMES",
    "batch_from_tensors",
    "build_batch",
    "finite_or_none",
    "record_decisions",
    "rows_digest",
    "signed64",
    "terminal_probabilities",
]

TERMINAL_NAMES: dict[int, TerminalName] = {
    int(TerminalKind.CORRECTION): "correction",
    int(TerminalKind.BONUS): "bonus",
    int(TerminalKind.STOP): "stop",
}
"""Terminal kinds by their sampler code."""


def signed64(value: int) -> int:
    """Read any integer modulo 2**64 as a signed int64 (the bit pattern a seed tensor stores)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= (1 << 63) else value


def finite_or_none(value: float) -> float | None:
    """None for NaN (canonical JSON refuses NaN), the value otherwise."""
    return None if value != value else value


def build_batch(group: Sequence[RoundWork]) -> SamplerBatch:
    """Pad a group's rows into one :class:`SamplerBatch` (rows never read are uniform, hence valid)."""
    first = group[0]
    assert first.p_rows is not None
    vocab, dtype, device = first.p_rows.shape[-1], first.p_rows.dtype, first.p_rows.device
    lens = [len(r.draft_ids) for r in group]
    k_max = max(lens)
    n = len(group)
    if all(k == k_max for k in lens):
        p = torch.stack([r.p_rows for r in group if r.p_rows is not None])  # [B, K+1, V]
        q = torch.stack([r.q_rows for r in group])  # [B, K, V]
    else:
        p = torch.full((n, k_max + 1, vocab), 1.0 / vocab, dtype=dtype, device=device)  # [B, K+1, V]
        q = torch.full((n, k_max, vocab), 1.0 / vocab, dtype=dtype, device=device)  # [B, K, V]
        for b, rnd in enumerate(group):
            assert rnd.p_rows is not None
            k = lens[b]
            p[b, : k + 1] = rnd.p_rows
            if k:
                q[b, :k] = rnd.q_rows
    draft_ids = [[*r.draft_ids, *[PAD_ID] * (k_max - len(r.draft_ids))] for r in group]
    draft_t = torch.tensor(draft_ids, dtype=torch.int64, device=device).reshape(n, k_max)  # [B, K]
    return batch_from_tensors(group, p, q, draft_t)


def batch_from_tensors(
    group: Sequence[RoundWork], p: torch.Tensor, q: torch.Tensor, draft_ids: torch.Tensor
) -> SamplerBatch:
    """A :class:`SamplerBatch` over already padded rows: p [B, K+1, V], q [B, K, V], draft ids [B, K].

    Row ``b`` belongs to ``group[b]``; the per-request scalars (budget, seed, RNG counters, draft length)
    and the stop sets are read from the rounds, the rows are used as they are (no copy).
    """
    n, k_max = draft_ids.shape
    device = p.device
    if any(r.live.has_stop_automaton for r in group):
        stop_rows: list[list[list[int]]] = []
        width = 1
        for rnd in group:
            if rnd.live.has_stop_automaton:
                sets = [sorted(s) for s in rnd.start.chain.stop_sets_along(rnd.draft_ids)]
            else:
                sets = [[] for _ in range(len(rnd.draft_ids) + 1)]
            sets += [[] for _ in range(k_max + 1 - len(sets))]
            width = max(width, *(len(s) for s in sets))
            stop_rows.append(sets)
        stop_ids = torch.tensor(
            [[s + [PAD_ID] * (width - len(s)) for s in sets] for sets in stop_rows],
            dtype=torch.int64,
            device=device,
        )  # [B, K+1, S]
    else:
        stop_ids = torch.empty((n, 0), dtype=torch.int64, device=device)  # [B, 0]: no stop tokens
    # remaining, seeds, ACCEPT and TERMINAL counters, draft lengths: one tensor, one op.
    scalars = torch.tensor(
        [
            [r.live.config.max_new_tokens - r.start.state.generated_count for r in group],
            [signed64(r.live.config.seed) for r in group],
            [r.start.state.rng.accept for r in group],
            [r.start.state.rng.terminal for r in group],
            [len(r.draft_ids) for r in group],
        ],
        dtype=torch.int64,
        device=device,
    )  # [5, B]
    remaining, seeds, accept_counters, terminal_counters, draft_lens = scalars.unbind(0)
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=draft_ids,  # [B, K]
        draft_lens=draft_lens,  # [B]
        stop_ids=stop_ids,
        remaining=remaining,
        seeds=seeds,
        accept_counters=accept_counters,
        terminal_counters=terminal_counters,
    )


def record_decisions(group: Sequence[RoundWork], batch: SamplerBatch, decision: SamplerDecision) -> None:
    """Turn one batched decision into each round's ``round_decided`` event (plain Python values)."""
    n = len(group)
    output_ids = decision.output_ids.tolist()
    # One ``tolist`` per field: cheaper than stacking them first at small B, and the same values.
    emitted = decision.emitted.tolist()
    terminal = decision.terminal.tolist()
    terminal_row = decision.terminal_row.tolist()
    per_draft = torch.cat((decision.p_draft, decision.q_draft, decision.accept_uniforms), dim=1).tolist()
    terminal_p, terminal_q = _terminal_pq(batch, decision, output_ids, emitted, terminal_row, terminal)
    accepted, accept_draws, terminal_draws = (
        decision.accepted.tolist(),
        decision.accept_draws.tolist(),
        decision.terminal_draws.tolist(),
    )
    finished, by_token, degenerate = (
        decision.finished.tolist(),
        decision.stopped_by_token.tolist(),
        decision.degenerate_correction.tolist(),
    )
    terminal_uniform, residual_mass, mass_before, token_mass = (
        decision.terminal_uniform.tolist(),
        decision.residual_mass.tolist(),
        decision.terminal_mass_before.tolist(),
        decision.terminal_token_mass.tolist(),
    )
    k_max = batch.draft_ids.shape[1]
    for b in range(n):
        rnd = group[b]
        k = len(rnd.draft_ids)
        row = per_draft[b]
        done = finished[b]
        draws = accept_draws[b]
        has_terminal = terminal_draws[b] == 1
        rnd.p_draft = tuple(row[:k])
        rnd.q_draft = tuple(row[k_max : k_max + k])
        rng = rnd.start.state.rng
        rnd.decided = assemble(
            RoundDecided,
            {
                "schema_version": EVENT_SCHEMA_VERSION,
                "request_id": rnd.request_id,
                "kind": "round_decided",
                "round_id": rnd.round_id,
                "accepted": accepted[b],
                "terminal": TERMINAL_NAMES[terminal[b]],
                "emitted_ids": tuple(output_ids[b][: emitted[b]]),
                "accept_counter": rng.accept,
                "accept_draws": draws,
                "accept_uniforms": tuple(row[2 * k_max : 2 * k_max + draws]),
                "terminal_counter": rng.terminal,
                "terminal_draws": terminal_draws[b],
                "terminal_uniform": terminal_uniform[b] if has_terminal else None,
                "terminal_row": terminal_row[b] if has_terminal else None,
                "residual_mass": finite_or_none(residual_mass[b]) if has_terminal else None,
                "terminal_mass_before": finite_or_none(mass_before[b]) if has_terminal else None,
                "terminal_token_mass": finite_or_none(token_mass[b]) if has_terminal else None,
                "terminal_p": terminal_p[b] if has_terminal else None,
                "terminal_q": terminal_q[b] if has_terminal else None,
                "degenerate_correction": degenerate[b],
                "finished": done,
                "finish_reason": ("stop" if by_token[b] else "length") if done else None,
            },
        )


_HOST_FLOATS = (torch.float32, torch.float64)
_FEW_ROWS = 8
"""Batches up to this size read their terminal p/q element by element (the same elements, the same values)."""


def _terminal_pq(
    batch: SamplerBatch,
    decision: SamplerDecision,
    output_ids: list[list[int]],
    emitted: list[int],
    terminal_row: list[int],
    terminal: list[int],
) -> tuple[list[float], list[float]]:
    """:func:`terminal_probabilities` as Python floats, read from the decision's lists already extracted.

    Host rows numpy can view are indexed in numpy (a few microseconds, where torch's advanced indexing
    costs tens); any other rows go through :func:`terminal_probabilities`. Both read the same elements.
    """
    p, q = batch.p, batch.q
    if p.device.type != "cpu" or p.dtype not in _HOST_FLOATS or q.dtype not in _HOST_FLOATS:
        p_t, q_t = terminal_probabilities(batch, decision)
        return p_t.tolist(), q_t.tolist()
    n, k_max = batch.draft_ids.shape
    last_ids = [max(ids[max(count, 1) - 1], 0) for ids, count in zip(output_ids, emitted, strict=True)]
    if n <= _FEW_ROWS:  # element by element: numpy's per-call cost would be most of the work
        p_host, q_host = p.detach().numpy(), q.detach().numpy()
        correction = int(TerminalKind.CORRECTION)
        p_few, q_few = [], []
        for b in range(n):
            row = max(terminal_row[b], 0)
            p_few.append(float(p_host[b, row, last_ids[b]]))  # widening a float32 to float64 is exact
            correct = k_max > 0 and terminal[b] == correction
            q_few.append(float(q_host[b, min(row, k_max - 1), last_ids[b]]) if correct else 0.0)
        return p_few, q_few
    index = np.arange(n)
    last = np.array(last_ids)
    rows = np.maximum(np.array(terminal_row, dtype=np.int64), 0)
    p_t = p.detach().numpy()[index, rows, last].astype(np.float64)
    if k_max == 0:
        return p_t.tolist(), [0.0] * n
    q_t = q.detach().numpy()[index, np.minimum(rows, k_max - 1), last].astype(np.float64)
    correction = np.array(terminal) == int(TerminalKind.CORRECTION)
    return p_t.tolist(), np.where(correction, q_t, 0.0).tolist()


def terminal_probabilities(
    batch: SamplerBatch, decision: SamplerDecision
) -> tuple[torch.Tensor, torch.Tensor]:
    """P of each terminal token in its row, and q in the rejected position's row (0 for a bonus or stop).

    Returns two float64 [B] tensors.
    """
    n, k_max = batch.draft_ids.shape
    device = batch.p.device  # a decision taken on the host for an accelerator's rows is indexed there
    index = torch.arange(n, device=device)  # [B]
    counts = decision.emitted.clamp_min(1)  # [B]
    last = decision.output_ids.gather(1, (counts - 1)[:, None]).squeeze(1).clamp_min(0).to(device)  # [B]
    rows = decision.terminal_row.clamp_min(0).to(device)  # [B]
    p_t = batch.p[index, rows, last].to(torch.float64)  # [B]
    if k_max == 0:
        return p_t, torch.zeros_like(p_t)
    q_t = batch.q[index, rows.clamp_max(k_max - 1), last].to(torch.float64)  # [B]
    q_t = torch.where(decision.terminal.to(device) == int(TerminalKind.CORRECTION), q_t, 0.0)
    return p_t, q_t


def rows_digest(rows: torch.Tensor | None) -> str | None:
    """SHA-256 over the dtype, shape and bytes of full probability rows (None for no rows)."""
    if rows is None:
        return None
    data = rows.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{data.dtype}|{tuple(data.shape)}|".encode("ascii"))
    h.update(data.numpy().tobytes())
    return h.hexdigest()
