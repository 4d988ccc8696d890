"""White-box round checks: every recorded round re-derived from the models, by name.

Each check takes the traces of some requests (:class:`~specround.testing.engine_contract.RoundTrace`, one per
round) and returns the violations it found as readable strings:

* ``q-sampled`` (:func:`check_q_sampled`): the q rows the engine reported are the distributions that
  sampled the drafts, within :data:`ROW_ATOL`: compared with the rows read at the sampling call when the
  trace has them, else with the draft model's row recomputed independently (its raw logits at each
  prefix, processed by the kit's chain advanced over the prompt, the published output and the earlier
  drafts); every draft has q > 0. The advisory ``q-declared`` compares q with that recomputed row in any
  case. A proposer with no q rows (prompt lookup) is one-hot, which needs nothing recomputed.
* ``processor-state`` (:func:`check_processor_state`): the p rows the engine decided with are the
  target's rows processed at the state advanced over the *published* tokens (then along the drafts), within
  :data:`ROW_ATOL`: a state advanced over rejected drafts, a stale state or a missing processor shows here.
* ``decisions`` (:func:`check_decisions`): the round's outcome re-derives. With the engine's uniforms, the
  emitted tokens must equal what specround's exact sampler
  (:func:`specround.sampling.exact.decide_from_uniforms`) decides from the same rows, drafts and
  uniforms. Without them (an engine that hides its RNG) the outcome must be possible: the emitted tokens are
  accepted drafts and then one correction or bonus, the accepted drafts have p > 0, a correction has a
  positive residual ``p - q > 0`` (so never the rejected draft of a one-hot q), and a bonus has p > 0.
* ``stop`` (:func:`check_stop_rounds`): no round emits a token after EOS and no round follows one that
  emitted EOS.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.errors import InputError
from specround.sampling.exact import decide_from_uniforms
from specround.sampling.types import SamplerBatch
from specround.testing.engine_contract import EngineRequest, RoundTrace
from specround.testing.models import LogitsModel, logits_after

__all__ = [
    "ROW_ATOL",
    "Traced",
    "check_decisions",
    "check_processor_state",
    "check_q_sampled",
    "check_stop_rounds",
]

ROW_ATOL = 1e-4
"""Largest accepted entrywise difference between a reported and a recomputed probability row: float32
engines compute their rows with errors of about 1e-7; a processor left out or applied at the wrong state
moves entries by far more (for the same reason the sampler's float32 normalisation tolerance is 1e-4)."""

Traced = tuple[EngineRequest, Sequence[RoundTrace]]
"""A request and the rounds that generated it."""


def _context(request: EngineRequest, trace: RoundTrace) -> list[int]:
    return list(request.prompt) + list(trace.prefix)


def _rows(model: LogitsModel, request: EngineRequest, trace: RoundTrace, n: int) -> torch.Tensor:
    """``[n, V]`` the model's processed rows at ``prompt + prefix + drafts[:i]`` for ``i < n``.

    The chain is advanced over the prompt and the published prefix, then along the drafts.
    """
    context = _context(request, trace)
    drafts = list(trace.draft_ids)
    raw = logits_after(model, [context + drafts[:i] for i in range(n)])  # [n, V]
    chain = request.settings.chain(model.vocab_size)
    chain.advance_many(context)
    return chain.rows_along(raw, drafts)


def check_q_sampled(traced: Sequence[Traced], draft: LogitsModel | None) -> tuple[list[str], list[str], int]:
    """Violations of ``q-sampled``, of the advisory ``q-declared``, and the number of rounds checked.

    ``q-sampled`` (the exactness contract): the reported q rows are the rows that sampled the drafts. When
    the trace holds the rows read at the sampling call (``sampling_rows``) q is compared with them;
    otherwise with the draft model's row recomputed under the declared settings. Every draft needs q > 0.
    ``q-declared`` (advisory): q equals that recomputed declared row. A proposer that samples from some
    other row and reports it faithfully stays exact but drafts worse tokens than it was asked to.
    """
    found: list[str] = []
    advisory: list[str] = []
    checked = 0
    for request, traces in traced:
        for r, trace in enumerate(traces):
            k = len(trace.draft_ids)
            if k == 0 or trace.q_rows is None:
                continue
            checked += 1
            where = f"seed {request.seed} round {r}"
            q = trace.q_rows.to(torch.float64)  # [k, V]
            zero = [i for i, d in enumerate(trace.draft_ids) if float(q[i, d]) <= 0.0]
            if zero:
                found.append(f"{where}: drafts at {zero} have q = 0")
            declared_gap = None
            if draft is not None:
                declared_gap = float((q - _rows(draft, request, trace, k)).abs().max())  # [k, V] rows
                if declared_gap > ROW_ATOL:
                    advisory.append(
                        f"{where}: q differs from the draft's declared processed row by {declared_gap:.3g}"
                    )
            if trace.sampling_rows is not None:
                gap = float((q - trace.sampling_rows.to(torch.float64)).abs().max())
                if gap > ROW_ATOL:
                    found.append(f"{where}: q differs from the row that sampled the drafts by {gap:.3g}")
            elif declared_gap is not None and declared_gap > ROW_ATOL:
                found.append(f"{where}: q differs from the draft's processed row by {declared_gap:.3g}")
    return found, advisory, checked


def check_processor_state(traced: Sequence[Traced], target: LogitsModel) -> tuple[list[str], int]:
    """Violations of ``processor-state`` and the number of rounds checked."""
    found: list[str] = []
    checked = 0
    for request, traces in traced:
        for r, trace in enumerate(traces):
            checked += 1
            n = trace.p_rows.shape[0]
            expected = _rows(target, request, trace, n)  # [n, V]
            gap = (trace.p_rows.to(torch.float64) - expected).abs().amax(dim=-1)  # [n]
            bad = [i for i in range(n) if float(gap[i]) > ROW_ATOL]
            if bad:
                found.append(
                    f"seed {request.seed} round {r}: p rows {bad} differ from the target's rows at the "
                    f"published state by up to {float(gap.max()):.3g}"
                )
    return found, checked


def _q_full(trace: RoundTrace, vocab: int) -> torch.Tensor:
    """``[k, V]`` the round's q rows, one-hot at the drafts when the engine reported none."""
    if trace.q_rows is not None:
        return trace.q_rows
    q = torch.zeros(len(trace.draft_ids), vocab, dtype=trace.p_rows.dtype)
    for i, d in enumerate(trace.draft_ids):
        q[i, d] = 1.0
    return q


def _rederive(request: EngineRequest, trace: RoundTrace, vocab: int) -> str | None:
    """Re-decide the round with the engine's uniforms; a message when the outcome differs."""
    k = len(trace.draft_ids)
    p = trace.p_rows.to(torch.float64)  # [k+1, V]
    q = _q_full(trace, vocab).to(torch.float64)  # [k, V]
    eos = request.settings.eos_token_id
    accept = torch.full((1, k), float("nan"), dtype=torch.float64)
    given = list(trace.accept_uniforms or ())[:k]
    accept[0, : len(given)] = torch.tensor(given, dtype=torch.float64)
    terminal = torch.tensor(
        [trace.terminal_uniform if trace.terminal_uniform is not None else float("nan")], dtype=torch.float64
    )
    batch = SamplerBatch(
        p=p[None],
        q=q[None],
        draft_ids=torch.tensor([list(trace.draft_ids)], dtype=torch.int64).reshape(1, k),
        draft_lens=torch.tensor([k]),
        stop_ids=torch.tensor([[eos]] if eos is not None else [[]], dtype=torch.int64).reshape(1, -1),
        remaining=torch.tensor([request.horizon - len(trace.prefix)]),
        seeds=torch.zeros(1, dtype=torch.int64),
        accept_counters=torch.zeros(1, dtype=torch.int64),
        terminal_counters=torch.zeros(1, dtype=torch.int64),
    )
    try:
        decision = decide_from_uniforms(batch, accept, terminal)
    except InputError as exc:
        return f"the exact rule cannot decide the round from its own values: {exc}"
    n = int(decision.emitted[0])
    expected = tuple(int(t) for t in decision.output_ids[0, :n])
    if expected != trace.emitted:
        return f"emitted {list(trace.emitted)}, the exact rule with the same uniforms emits {list(expected)}"
    return None


def _possible(request: EngineRequest, trace: RoundTrace, vocab: int) -> str | None:
    """A message when the round's outcome is impossible under the exact rule (no uniforms needed)."""
    drafts, emitted = trace.draft_ids, trace.emitted
    k = len(drafts)
    p = trace.p_rows.to(torch.float64)
    q = _q_full(trace, vocab).to(torch.float64)
    if not emitted or len(emitted) > k + 1:
        return f"emitted {len(emitted)} tokens from {k} drafts (a round emits 1..k+1)"
    eos = request.settings.eos_token_id
    accepted = 0
    while accepted < min(k, len(emitted)) and emitted[accepted] == drafts[accepted]:
        if float(p[accepted, drafts[accepted]]) <= 0.0:
            return f"accepted draft {drafts[accepted]} at {accepted} has p = 0"
        accepted += 1
        if emitted[accepted - 1] == eos:
            break
    rest = emitted[accepted:]
    full = len(trace.prefix) + len(emitted) >= request.horizon
    if not rest:
        if accepted < k and not (emitted[-1] == eos or full):
            return f"the round ended after {accepted} accepted drafts with no correction"
        return None
    if len(rest) > 1:
        return f"{len(rest) - 1} tokens emitted after the correction or bonus at position {accepted}"
    t = rest[0]
    if accepted < k:
        residual = float(p[accepted, t] - q[accepted, t])
        if (
            residual <= -ROW_ATOL
            or (trace.q_rows is None and t == drafts[accepted])
            or float(p[accepted, t]) <= 0
        ):
            return f"correction {t} at {accepted} has no residual mass (p - q = {residual:.3g})"
    elif float(p[k, t]) <= 0.0:
        return f"bonus {t} has p = 0 in the target row"
    return None


def check_decisions(traced: Sequence[Traced], vocab: int) -> tuple[list[str], int]:
    """Violations of ``decisions`` and the number of rounds checked."""
    found: list[str] = []
    checked = 0
    for request, traces in traced:
        for r, trace in enumerate(traces):
            checked += 1
            if trace.accept_uniforms is not None:
                message = _rederive(request, trace, vocab)
            else:
                message = _possible(request, trace, vocab)
            if message is not None:
                found.append(f"seed {request.seed} round {r}: {message}")
    return found, checked


def check_stop_rounds(traced: Sequence[Traced]) -> tuple[list[str], int]:
    """Violations of ``stop`` in the rounds and the number of rounds checked."""
    found: list[str] = []
    checked = 0
    for request, traces in traced:
        eos = request.settings.eos_token_id
        stopped = False
        for r, trace in enumerate(traces):
            checked += 1
            if stopped:
                found.append(f"seed {request.seed} round {r} ran after EOS was emitted")
            if eos is not None and eos in trace.emitted:
                if trace.emitted.index(eos) != len(trace.emitted) - 1:
                    found.append(
                        f"seed {request.seed} round {r} emitted {list(trace.emitted)}: tokens after EOS"
                    )
                stopped = True
    return found, checked
