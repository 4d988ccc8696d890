"""A synthetic event log of many valid rounds, for the report's tests and ``specround bench report``.

Every round goes through the real :class:`~specround.statemachine.controller.RoundController` (one
batched decision and one group-committed publication per step of ``batch`` requests), so the log is valid by
construction: hash chains, generation fences, re-derivable decisions and replayable states (it audits
clean). Nothing about the events is faked except their inputs:

* **Rows.** A seeded pool of target rows ``p`` and proposal rows ``q`` over a small vocabulary; ``q`` is
  ``p``'s logits plus noise that grows with the draft position, so ``alpha_j^reach`` falls with ``j`` (a
  front-loaded profile, contract#acceptance-profiles). Drafts are sampled from ``q``.
* **Draft lengths.** Each request slot drafts ``K`` tokens, except every fourth slot (``K - 1``) and every
  seventh (``K - 2``), so rounds of different ``k`` are censored at different positions.
* **Budgets.** Requests finish at their output budget (some by a stop inside the accepted prefix) and their
  slot opens a fresh request, so the log holds many requests of different lengths.
* **Coordinates.** Slots alternate between two target model ids (:data:`SYNTHETIC_MODELS`) for the
  report's ``--model`` filter.
* **Timings.** :class:`~specround.statemachine.events.RoundTimings` come from a declared cost model with
  seeded noise (draft time per drafted token, verify time growing with the verified rows, state and queue
  terms); they are synthetic, not measured.

Cost: the controller's own per-round cost (a few hundred microseconds per round on a loaded 2-core machine,
see ``specround bench controller``); ``specround bench report`` writes its 1M-round log once and reuses it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from specround.statemachine.controller import RoundController
from specround.statemachine.events import RoundTimings
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput

__all__ = ["SYNTHETIC_MODELS", "SyntheticLogSummary", "write_synthetic_log"]

SYNTHETIC_MODELS: tuple[str, str] = ("synthetic-target-a", "synthetic-target-b")
"""Target model ids of the synthetic requests (even slots use the first, odd slots the second)."""

_POOL = 512
"""Distinct synthetic row sets, used cyclically."""
_DRAFT_COST_S = 0.0012
_VERIFY_BASE_S = 0.0060
_VERIFY_ROW_S = 0.0009
_STATE_S = 0.0004
_QUEUE_S = 0.0003


@dataclass(frozen=True, slots=True)
class SyntheticLogSummary:
    """What :func:`write_synthetic_log` wrote."""

    rounds: int
    requests: int
    emitted: int
    """Tokens emitted by all rounds."""


@dataclass(slots=True)
class _Rows:
    p: torch.Tensor  # [N, K+1, V]
    q: torch.Tensor  # [N, K, V]
    drafts: torch.Tensor  # [N, K]

    @classmethod
    def make(cls, draft_len: int, vocab: int, seed: int) -> _Rows:
        gen = torch.Generator().manual_seed(seed)
        logits = 2.5 * torch.randn(_POOL, draft_len + 1, vocab, generator=gen, dtype=torch.float64)
        scale = torch.linspace(0.4, 1.6, draft_len, dtype=torch.float64)[None, :, None]  # [1, K, 1]
        noise = scale * torch.randn(_POOL, draft_len, vocab, generator=gen, dtype=torch.float64)
        p = torch.softmax(logits, dim=-1)  # [N, K+1, V]
        q = torch.softmax(logits[:, :draft_len] + noise, dim=-1)  # [N, K, V]
        drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(_POOL, draft_len)
        return cls(p=p, q=q, drafts=drafts)


def _slot_draft_len(slot: int, draft_len: int) -> int:
    if slot % 7 == 6:
        return max(1, draft_len - 2)
    if slot % 4 == 3:
        return max(1, draft_len - 1)
    return draft_len


def write_synthetic_log(
    log: EventLog,
    rounds: int,
    *,
    batch: int = 1000,
    draft_len: int = 4,
    vocab: int = 32,
    max_new_tokens: int = 400,
    seed: int = 0,
    prefix: str = "synthetic",
    progress: Callable[[int], None] | None = None,
) -> SyntheticLogSummary:
    """Publish ``rounds`` valid rounds to ``log``, ``batch`` requests per controller step (one transaction).

    Request ids are ``{prefix}-{slot:05d}-{n:05d}`` (slot, then the how-many-th request of that slot).
    ``progress`` is called with the rounds written so far after every step.
    """
    if rounds < 1 or batch < 1 or draft_len < 2 or vocab < 2 or max_new_tokens < 2:
        raise ValueError("need rounds >= 1, batch >= 1, draft_len >= 2, vocab >= 2, max_new_tokens >= 2")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny rows: one thread avoids contention
    try:
        return _write(log, rounds, batch, draft_len, vocab, max_new_tokens, seed, prefix, progress)
    finally:
        torch.set_num_threads(previous_threads)


def _write(
    log: EventLog,
    rounds: int,
    batch: int,
    draft_len: int,
    vocab: int,
    max_new_tokens: int,
    seed: int,
    prefix: str,
    progress: Callable[[int], None] | None,
) -> SyntheticLogSummary:
    rows = _Rows.make(draft_len, vocab, seed)
    noise = random.Random(seed)
    controller = RoundController(log)
    slots = min(batch, rounds)
    opened = [0] * slots
    live: list[str] = []

    def open_slot(slot: int) -> str:
        request_id = f"{prefix}-{slot:05d}-{opened[slot]:05d}"
        opened[slot] += 1
        budget = max(2, max_new_tokens // 2 + noise.randrange(max_new_tokens // 2 + 1))
        controller.open_request(
            [1, 2, 3],
            seed=noise.getrandbits(63),
            max_new_tokens=budget,
            vocab_size=vocab,
            request_id=request_id,
            coordinate={"target_model_id": SYNTHETIC_MODELS[slot % 2], "draft_model_id": "synthetic-draft"},
        )
        return request_id

    live = [open_slot(slot) for slot in range(slots)]
    written = emitted = 0
    cursor = 0
    while written < rounds:
        inputs = []
        active = live[: rounds - written] if rounds - written < len(live) else live
        for slot, request_id in enumerate(active):
            index = cursor % _POOL
            cursor += 1
            k = min(_slot_draft_len(slot, draft_len), controller.remaining(request_id))
            k = max(0, k)
            jitter = 0.8 + 0.4 * noise.random()
            timings = RoundTimings(
                draft_s=_DRAFT_COST_S * k * jitter,
                verify_s=(_VERIFY_BASE_S + _VERIFY_ROW_S * (k + 1)) * jitter,
                state_s=_STATE_S * (0.5 + noise.random()),
                queue_s=_QUEUE_S * noise.random(),
            )
            inputs.append(
                RoundInput(
                    request_id,
                    controller.coordinate_digest(request_id),
                    rows.drafts[index, :k],
                    rows.q[index, :k] if k else None,
                    rows.p[index, : k + 1],
                    timings=timings,
                )
            )
        results = controller.step(inputs)
        for slot, result in enumerate(results):
            result.raise_for_error()
            written += 1
            emitted += len(result.emitted_ids)
            if result.finished:
                live[slot] = open_slot(slot)
        if progress is not None:
            progress(written)
    return SyntheticLogSummary(rounds=written, requests=sum(opened), emitted=emitted)
