"""Sampler failure classes: wrong decisions built around the real sampler.

Contract: contract#sampler-law, contract#failure-lab.

Two kinds of seams:

* **Decision wrappers.** A wrong decision function with the signature of
  :func:`~specround.sampling.exact.decide_from_uniforms` (the ones of :mod:`.decisions`
  and a few more here) replaces the real one where the code path binds it: the controller's step (both
  ``decide_from_uniforms`` and ``decide``), the exact oracle and Monte Carlo. Every wrapper calls the real
  function; it changes only what the real function is given or how its answer is spliced.
* **Internals of the sampler.** A module function of :mod:`specround.sampling.exact` (the inverse-CDF
  search, the draft-value validation, the round's uniforms) replaced by a wrapper that feeds the original a
  wrong argument, so every caller of the sampler sees the failure.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np
import torch

from specround.model_check import enumeration as enumeration_module
from specround.model_check import montecarlo as montecarlo_module
from specround.model_check.mutants import decisions as decision_mutations
from specround.model_check.mutants.decisions import DecisionFn
from specround.model_check.mutants.mutation import Mutation, Scratch, Seam
from specround.sampling import exact as exact_module
from specround.sampling.exact import decide, decide_from_uniforms, round_uniforms
from specround.sampling.fast_path import search_host
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision, TerminalKind
from specround.sampling.validation import check_draft_values
from specround.statemachine import step as step_module
from specround.statemachine.uniform_cache import batch_uniforms

__all__ = [
    "BONUS_FROM_Q",
    "CONTINUE_AFTER_REJECTION",
    "CORRECTION_FROM_P",
    "DECISION_BINDINGS",
    "ORACLE_MUTATIONS",
    "SAMPLER_MUTATIONS",
    "SHIFTED_LOGIT_ROW",
    "STOPS_IGNORED",
    "STOP_MUTATIONS",
    "bonus_after_accepted_eos",
    "bonus_from_stale_row",
    "decision_seams",
    "extra_draw_after_stop",
    "tokens_after_stop",
]

DECISION_BINDINGS: tuple[tuple[Any, Any], ...] = (
    (step_module, decide_from_uniforms),
    (enumeration_module, decide_from_uniforms),
)
"""Where the real code path binds ``decide_from_uniforms`` (the controller's step and the exact oracle)."""
DECIDE_BINDINGS: tuple[tuple[Any, Any], ...] = (
    (step_module, decide),
    (montecarlo_module, decide),
)
"""Where it binds ``decide`` (the controller near the int64 counter end, and Monte Carlo)."""

_F64 = torch.float64


def decision_seams(wrong: DecisionFn) -> tuple[Seam, ...]:
    """Seams that route every sampler decision of the code path through ``wrong``."""

    def from_uniforms(_original: Any, _scratch: Scratch) -> Any:
        def decide_from_uniforms_(
            batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor, *, validate: str = "read"
        ) -> SamplerDecision:
            return wrong(batch, accept, terminal)

        return decide_from_uniforms_

    def with_rng(_original: Any, _scratch: Scratch) -> Any:
        def decide_(batch: SamplerBatch, *, validate: str = "read") -> SamplerDecision:
            accept, terminal = round_uniforms(batch)
            return wrong(batch, accept, terminal)

        return decide_

    return tuple(Seam(owner, target, from_uniforms) for owner, target in DECISION_BINDINGS) + tuple(
        Seam(owner, target, with_rng) for owner, target in DECIDE_BINDINGS
    )


def _splice(mask: torch.Tensor, chosen: SamplerDecision, base: SamplerDecision) -> SamplerDecision:
    """Per request ``b``: every field of ``chosen`` where ``mask[b]``, else of ``base``."""
    values: dict[str, torch.Tensor] = {}
    for f in fields(SamplerDecision):
        a, b = getattr(chosen, f.name), getattr(base, f.name)
        shape = (-1,) + (1,) * (a.dim() - 1)
        values[f.name] = torch.where(mask.reshape(shape), a, b)
    return SamplerDecision(**values)


def _without_stop_tokens(batch: SamplerBatch) -> SamplerBatch:
    return replace(batch, stop_ids=torch.full_like(batch.stop_ids, PAD_ID))


def bonus_from_stale_row(
    batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor
) -> SamplerDecision:
    """Draw the bonus from p_k (the row that tested d_k, conditioned before it) instead of p_{k+1}."""
    rows = torch.arange(batch.p.shape[0])  # [B]
    lens = batch.draft_lens
    has_draft = lens > 0
    p = batch.p.clone()  # [B, K+1, V]
    p[rows[has_draft], lens[has_draft]] = batch.p[rows[has_draft], lens[has_draft] - 1]
    return decide_from_uniforms(replace(batch, p=p), accept, terminal)


def extra_draw_after_stop(
    batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor
) -> SamplerDecision:
    """Count the acceptance test after a stop inside the prefix as reached (one ACCEPT draw too many)."""
    decision = decide_from_uniforms(batch, accept, terminal)
    extra = (decision.terminal == int(TerminalKind.STOP)) & (decision.accept_draws < batch.draft_lens)  # [B]
    draws = decision.accept_draws + extra.to(torch.int64)  # [B]
    reached = torch.arange(accept.shape[1])[None, :] < draws[:, None]  # [B, K]
    return replace(
        decision, accept_draws=draws, accept_uniforms=torch.where(reached, accept.to(_F64), float("nan"))
    )


def tokens_after_stop(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    """A stop token inside the accepted prefix finishes the request, but the rest of the round is published.

    Where a stop token cut the accepted prefix short, the decision taken without stop tokens (every
    accepted draft and the terminal token) is published, still marked finished by the stop.
    """
    decision = decide_from_uniforms(batch, accept, terminal)
    free = decide_from_uniforms(_without_stop_tokens(batch), accept, terminal)
    cut = (decision.terminal == int(TerminalKind.STOP)) & decision.stopped_by_token  # [B]
    longer = cut & (free.emitted > decision.emitted)
    spliced = _splice(longer, free, decision)
    return replace(
        spliced,
        finished=decision.finished | spliced.finished,
        stopped_by_token=decision.stopped_by_token | spliced.stopped_by_token,
    )


def bonus_after_accepted_eos(
    batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor
) -> SamplerDecision:
    """When the last draft is an accepted EOS, still draw and emit the bonus after it (counted and drawn)."""
    decision = decide_from_uniforms(batch, accept, terminal)
    free = decide_from_uniforms(_without_stop_tokens(batch), accept, terminal)
    eos_last = (
        (decision.terminal == int(TerminalKind.STOP))
        & decision.stopped_by_token
        & (decision.accepted == batch.draft_lens)
        & (batch.draft_lens > 0)
    )  # [B]
    spliced = _splice(eos_last, free, decision)
    return replace(
        spliced,
        finished=decision.finished | spliced.finished,
        stopped_by_token=decision.stopped_by_token | spliced.stopped_by_token,
    )


# --- internals of the sampler ---------------------------------------------------------------------------


def _unnormalised_search(original: Any, _scratch: Scratch) -> Any:
    """Inverse CDF against the unnormalised cumulative mass: target ``u`` instead of ``u * Z``."""
    top = 1.0 - 2.0**-53

    def search(block_sums: Any, u: Any, block_values: Any) -> Any:
        total = block_sums.sum(1)  # [N] (host arrays: the search runs on the host)
        return original(block_sums, np.minimum(u / total, top), block_values)

    return search


def _zero_q_passes(original: Any, _scratch: Scratch) -> Any:
    """Validate the draft values as if every q(d) = 0 were 1: the ratio p/0 = inf then accepts."""

    def check(p_at: torch.Tensor, q_at: torch.Tensor, within: torch.Tensor) -> Any:
        return original(p_at, torch.where(q_at > 0, q_at, 1.0), within)

    return check


SHIFTED_LOGIT_ROW = Mutation(
    "shifted logit row",
    "sampler",
    "draft i is verified against p_{i+1}, the next position's target row (off by one)",
    ("INV-10", "contract#prefix-induction", "contract#failure-lab"),
    decision_seams(decision_mutations.shifted_p_row),
)
"""Off-by-one target rows."""

CONTINUE_AFTER_REJECTION = Mutation(
    "continue after rejection",
    "sampler",
    "after the first rejection the round keeps testing the stale drafts against rows conditioned on "
    "the rejected token",
    ("INV-2", "INV-10", "contract#first-rejection-stops"),
    decision_seams(decision_mutations.continue_after_rejection),
)
"""Acceptance tests continue past the first rejection."""

BONUS_FROM_Q = Mutation(
    "bonus from q",
    "sampler",
    "the all-accepted branch draws its bonus from the drafter's row q_K instead of p_{K+1}",
    ("INV-10", "contract#bonus-token"),
    decision_seams(decision_mutations.bonus_from_q),
)
"""The bonus drawn from the drafter's row."""

CORRECTION_FROM_P = Mutation(
    "correction from p",
    "sampler",
    "after a rejection the token is drawn from p_{A+1} instead of the normalised residual",
    ("INV-10", "contract#positive-residual"),
    decision_seams(decision_mutations.correction_from_p),
)
"""The correction drawn from the target row instead of the residual."""

SAMPLER_MUTATIONS = (
    SHIFTED_LOGIT_ROW,
    CONTINUE_AFTER_REJECTION,
    BONUS_FROM_Q,
    Mutation(
        "bonus from a stale row",
        "sampler",
        "the bonus is drawn from p_K (conditioned before d_K) instead of p_{K+1}",
        ("INV-10", "contract#bonus-token"),
        decision_seams(bonus_from_stale_row),
    ),
    CORRECTION_FROM_P,
    Mutation(
        "residual not renormalised",
        "sampler",
        "the correction's inverse CDF compares u with the unnormalised residual's cumulative mass",
        ("INV-10", "contract#positive-residual", "contract#degenerate-cases"),
        (Seam(exact_module, search_host, _unnormalised_search),),
    ),
    Mutation(
        "q = 0 proposal accepted",
        "sampler",
        "a draft with q(d) = 0 is not refused; its ratio p/0 = inf accepts it",
        ("INV-7", "contract#degenerate-cases"),
        (Seam(exact_module, check_draft_values, _zero_q_passes),),
    ),
)
"""Failure classes of the accept/reject decision and the terminal draw."""


def _batch_stream(original: Any, _scratch: Scratch) -> Any:
    """Uniforms from one stream per batch: request b reads the batch's first seed at counters offset by b."""

    def batch_uniforms(
        windows: Any,
        seeds: Any,
        accept_counters: Any,
        terminal_counters: Any,
        draft_lens: Any,
        k_max: int,
        device: Any,
    ) -> Any:
        n = len(seeds)
        stride = max(k_max, 1)
        return original(
            windows,
            [seeds[0]] * n,
            [accept_counters[0] + b * stride for b in range(n)],
            [terminal_counters[0] + b for b in range(n)],
            draft_lens,
            k_max,
            device,
        )

    return batch_uniforms


def _batch_round_uniforms(original: Any, _scratch: Scratch) -> Any:
    def round_uniforms_(batch: SamplerBatch) -> Any:
        n, stride = batch.seeds.shape[0], max(batch.draft_ids.shape[1], 1)
        offsets = torch.arange(n, device=batch.seeds.device)
        shared = replace(
            batch,
            seeds=batch.seeds[:1].expand(n),
            accept_counters=batch.accept_counters[:1] + offsets * stride,
            terminal_counters=batch.terminal_counters[:1] + offsets,
        )
        return original(shared)

    return round_uniforms_


STOPS_IGNORED = Mutation(
    "stop inside the prefix ignored",
    "stops and RNG",
    "a stop token inside the accepted prefix does not end the request",
    ("INV-2", "contract#round-progress"),
    decision_seams(decision_mutations.stops_ignored),
)
"""A stop token inside the accepted prefix ignored."""

STOP_MUTATIONS = (
    Mutation(
        "extra RNG draw after a stop",
        "stops and RNG",
        "a stop inside the accepted prefix still counts the next acceptance test as reached",
        ("INV-3", "contract#reached-events"),
        decision_seams(extra_draw_after_stop),
    ),
    STOPS_IGNORED,
    Mutation(
        "tokens after a stop published",
        "stops and RNG",
        "the request finishes at the stop token, but the accepted drafts after it and the terminal token are "
        "published too",
        ("INV-2", "contract#round-progress"),
        decision_seams(tokens_after_stop),
    ),
    Mutation(
        "bonus counted after an accepted EOS",
        "stops and RNG",
        "when the last accepted draft is EOS, the bonus is still drawn and emitted after it",
        ("INV-2", "INV-3", "contract#bonus-token"),
        decision_seams(bonus_after_accepted_eos),
    ),
    Mutation(
        "batch-dependent random stream",
        "stops and RNG",
        "a step draws its uniforms from the first request's seed, each request at an offset given by its "
        "batch position (the law per request is intact; reproducibility is not)",
        ("INV-10", "contract#verification-shape"),
        (
            Seam(step_module, batch_uniforms, _batch_stream),
            Seam(exact_module, round_uniforms, _batch_round_uniforms),
        ),
    ),
)
"""Failure classes of stops, budgets and RNG accounting."""

ORACLE_MUTATIONS = (
    CORRECTION_FROM_P,
    BONUS_FROM_Q,
    CONTINUE_AFTER_REJECTION,
    SHIFTED_LOGIT_ROW,
    STOPS_IGNORED,
)
"""Decision mutations whose wrong joint the exact oracle must see on its own (its smoke tests)."""
