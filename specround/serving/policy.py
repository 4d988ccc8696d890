"""Draft length as a control policy, not a fixed law (contract#acceptance-profiles).

Two policies share one small protocol (:class:`DraftLengthPolicy`). Around every step the loop asks twice:

1. :meth:`~DraftLengthPolicy.choose` — how many drafts to *ask* each request's proposer for;
2. :meth:`~DraftLengthPolicy.trim` — how many of the drafts the proposer *offered* to verify (a lookup
   proposer may offer fewer than asked, or none).

and reports what happened afterwards (:meth:`~DraftLengthPolicy.observe`). Verifying a prefix of the
offered drafts keeps sampling exact: the number verified depends only on how many were offered and on the
past, never on the round's acceptance uniforms, and a prefix of an autoregressive proposal is itself a
proposal whose q rows are the ones that sampled it. PROPOSAL draws consumed by drafts that are not
verified are still accounted (the counters advance by what the proposer drew).

:class:`FixedDraftLength` asks for, and verifies, the same K every round (capped by budget and context).

:class:`AdaptiveDraftLength` picks the K vector over ``0..MAX_DRAFT_LENGTH`` that maximises the step's
expected committed tokens per second under measured costs (contract#time-ledger):

* **Costs.** Online fits (:mod:`specround.serving.costs`) of the proposer call's seconds against the
  largest K asked of it (a line), the target call's seconds against the rows it computed (measured per row
  count, a line for counts not seen yet: small CPU matrix products are not linear in their rows), and each
  round's state seconds against its K (a line), plus the mean gap between steps. Under
  ``replay_frontier`` a step's target work is one call over ``sum(K_r + 1)`` rows; under
  ``retained_frontier`` it is the frontier call over the B rows plus one call over ``sum(K_r)`` rows.
  When trimming, the drafting is already paid for and only the rest counts.
* **Progress.** Per request, the reach-conditioned acceptance ``alpha_j^reach`` (contract#accepted-prefix),
  counted only over rounds whose acceptance test j was reached (the ACCEPT draws of INV-3), and ``E[G](K) = 1
  + sum_{j<=K} prod_{i<=j} alpha_i^reach`` (:func:`specround.ledger.survival_from_reach`,
  :func:`specround.ledger.expected_progress`). The budget caps K at ``remaining - 1``, so no round is planned
  past it.
* **Search.** The best common K first, then one coordinate pass that lets each request move its own K with
  the others held (a request whose drafts do not pay drops to K = 0: plain decode). Speculation is chosen
  only if it beats plain decoding by :data:`SPECULATION_MARGIN` in predicted tokens per second.

Warm-up and priors (stated, and overridden by measurements as they arrive):

* A declared *draft cost hint* (seconds of one draft token relative to a one-row target step, from the
  weight bytes a draft token streams: :func:`specround.serving.drafts.draft_cost_hint`) prices drafting
  until the proposer's own cost is measured; the first step then decodes plainly (K = 0) to measure the
  target. Without a hint the first step asks for :data:`WARMUP_DRAFT_LENGTH` drafts to measure the
  proposer. Until the cost lines it needs have data the policy stays in this warm-up.
* ``alpha_1^reach`` starts from a Beta prior of mean :data:`PRIOR_ACCEPTANCE` and weight
  :data:`PRIOR_WEIGHT` tests, and each later position's prior is the estimate of the position before it
  (deeper positions resemble the last one measured). Per-request counts decay by :data:`REACH_DECAY` per
  round that verified a draft (a memory of about five rounds), so the policy follows a request from copying
  text to free text.
* Cost lines start from the prior lines of :mod:`specround.serving.costs`: the draft line through the
  origin (a call for zero drafts costs nothing), the verification and state lines with a per-row slope of
  :data:`VERIFY_SLOPE_RATIO` of their intercept (about what a packed CPU verification costs per extra row).
* A request that verified no draft for :data:`PROBE_INTERVAL` rounds probes once (the cheapest non-empty
  draft by predicted step time), so that a stale acceptance estimate cannot lock speculation off forever;
  each probe doubles the wait before the next, and no probe is made unless certain acceptance would beat
  plain decoding by :data:`PROBE_MARGIN` under the predicted costs (a draft model nearly as expensive as
  the target never pays enough to be worth its probes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specround.errors import InvalidRequestError
from specround.ledger import expected_progress, survival_from_reach
from specround.sampling.layouts import replays_frontier, verify_row_count
from specround.sampling.types import Layout
from specround.serving.costs import LinearCost, TabulatedCost
from specround.serving.run_stats import RoundOutcome

__all__ = [
    "MAX_DRAFT_LENGTH",
    "PRIOR_ACCEPTANCE",
    "PRIOR_WEIGHT",
    "PROBE_INTERVAL",
    "PROBE_MARGIN",
    "REACH_DECAY",
    "SPECULATION_MARGIN",
    "VERIFY_SLOPE_RATIO",
    "WARMUP_DRAFT_LENGTH",
    "AdaptiveDraftLength",
    "DraftLengthPolicy",
    "DraftSlot",
    "FixedDraftLength",
    "StepCosts",
]

MAX_DRAFT_LENGTH = 8
"""The largest K any policy asks for."""
WARMUP_DRAFT_LENGTH = 4
"""K asked for in the warm-up step(s) of :class:`AdaptiveDraftLength`."""
PRIOR_ACCEPTANCE = 0.5
"""Prior mean of ``alpha_1^reach``: even odds."""
PRIOR_WEIGHT = 2.0
"""Weight of the acceptance prior, in reached tests."""
REACH_DECAY = 0.8
"""Per-round decay of a request's reach counts (a memory of about five rounds)."""
VERIFY_SLOPE_RATIO = 0.1
"""Prior per-row slope of the verification and state lines, relative to their intercept."""
PROBE_INTERVAL = 32
"""Rounds without a verified draft after which a request probes once (the interval then doubles)."""
SPECULATION_MARGIN = 0.1
"""Speculation must beat plain decoding by this fraction of predicted tokens per second: acceptance
estimated from a few rounds is optimistic for the K it selects (the optimiser's curse), and a predicted gain
smaller than that is within the noise of the estimate."""
PROBE_MARGIN = 0.25
"""A probe is made only if certain acceptance would beat plain decoding by this fraction (a probe costs a
draft model its catch-up over the tokens it skipped, and a two-row verification)."""


@dataclass(frozen=True, slots=True)
class DraftSlot:
    """One request's place in the next step."""

    request_id: str
    cap: int
    """The largest K this round may use: budget (``remaining - 1``), context room and MAX_DRAFT_LENGTH;
    when trimming, also the number of drafts offered."""


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Measured costs of one step, for the cost lines."""

    draft: tuple[int, float] | None = None
    """(largest K asked of the proposer, seconds of its call); None when nothing was drafted."""
    verify_calls: tuple[tuple[int, float], ...] = ()
    """(rows computed, seconds) of each target call."""
    states: tuple[tuple[int, float], ...] = ()
    """(K verified, state seconds) of each round."""
    gap_s: float = 0.0
    """Seconds between the previous step's end and this step's start."""


class DraftLengthPolicy(Protocol):
    """Chooses each request's draft length before a step and learns from what the step did."""

    @property
    def description(self) -> str:
        """A short name for reports, e.g. ``fixed:4`` or ``auto``."""
        ...

    def choose(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to ask for, per slot, in order, each within ``0..slot.cap``."""
        ...

    def trim(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to verify, per slot, each within ``0..slot.cap`` (``cap`` = drafts offered)."""
        ...

    def observe(self, outcomes: Sequence[RoundOutcome], costs: StepCosts) -> None:
        """The published rounds of a step and its measured costs."""
        ...

    def forget(self, request_id: str) -> None:
        """Drop what was learned about a request: it finished, or a round it observed was rolled back."""
        ...


def _check_cap(slot: DraftSlot) -> int:
    if isinstance(slot.cap, bool) or not isinstance(slot.cap, int) or slot.cap < 0:
        raise InvalidRequestError(f"draft-length cap of {slot.request_id!r} must be >= 0, got {slot.cap!r}")
    return min(slot.cap, MAX_DRAFT_LENGTH)


class FixedDraftLength:
    """The same K every round (``0`` is plain decoding)."""

    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_DRAFT_LENGTH:
            raise InvalidRequestError(f"a fixed draft length lies in 0..{MAX_DRAFT_LENGTH}, got {k!r}")
        self.k = k
        """The draft length asked for."""

    @property
    def description(self) -> str:
        """``fixed:<K>``."""
        return f"fixed:{self.k}"

    def choose(self, slots: Sequence[DraftSlot]) -> list[int]:
        """``min(K, cap)`` for every slot."""
        return [min(self.k, _check_cap(slot)) for slot in slots]

    def trim(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Every offered draft (at most K)."""
        return [min(self.k, _check_cap(slot)) for slot in slots]

    def observe(self, outcomes: Sequence[RoundOutcome], costs: StepCosts) -> None:
        """A fixed policy learns nothing."""
        del outcomes, costs

    def forget(self, request_id: str) -> None:
        """Nothing to forget."""
        del request_id


@dataclass(slots=True)
class _Reach:
    """Decayed evidence behind one request's ``alpha_j^reach``, and its probing schedule."""

    reached: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_LENGTH)
    accepted: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_LENGTH)
    zero_streak: int = 0
    """Rounds in a row that verified no draft."""
    probe_interval: int = PROBE_INTERVAL
    """Rounds without drafts before the next probe (doubles after every probe)."""
    probing: bool = False
    """The current round is a probe (set by ``choose``, honoured and cleared by ``trim``)."""

    def rates(self) -> list[float]:
        """Posterior means; position j's prior is position j-1's estimate (position 1's: the prior)."""
        out: list[float] = []
        prior = PRIOR_ACCEPTANCE
        for reached, accepted in zip(self.reached, self.accepted, strict=True):
            prior = (accepted + prior * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            out.append(prior)
        return out

    def observe(self, outcome: RoundOutcome) -> None:
        self.zero_streak = 0 if outcome.drafted else self.zero_streak + 1
        reached = min(outcome.reached, MAX_DRAFT_LENGTH)
        if reached == 0:
            return
        for j in range(MAX_DRAFT_LENGTH):
            self.reached[j] *= REACH_DECAY
            self.accepted[j] *= REACH_DECAY
        for j in range(reached):  # tests 1..reached were reached; 1..A of them accepted
            self.reached[j] += 1.0
            if j < outcome.accepted:
                self.accepted[j] += 1.0


class AdaptiveDraftLength:
    """Per-step K maximising expected tokens per second under measured costs (module docstring)."""

    def __init__(
        self,
        layout: Layout | str = Layout.REPLAY_FRONTIER,
        *,
        max_k: int = MAX_DRAFT_LENGTH,
        draft_cost_hint: float | None = None,
    ) -> None:
        """Create the policy for one verification layout.

        ``draft_cost_hint`` is the declared seconds of one draft token relative to a one-row target step
        (0 for a lookup; see :func:`specround.serving.drafts.draft_cost_hint`), used until the proposer's
        own cost is measured. None means unknown: the first step drafts :data:`WARMUP_DRAFT_LENGTH`
        tokens to measure it.
        """
        if isinstance(max_k, bool) or not isinstance(max_k, int) or not 0 <= max_k <= MAX_DRAFT_LENGTH:
            raise InvalidRequestError(f"max_k lies in 0..{MAX_DRAFT_LENGTH}, got {max_k!r}")
        if draft_cost_hint is not None and not (math.isfinite(draft_cost_hint) and draft_cost_hint >= 0.0):
            raise InvalidRequestError(f"draft_cost_hint must be finite and >= 0, got {draft_cost_hint!r}")
        self.layout = Layout(layout)
        """The verification layout (it shapes the target calls)."""
        self.max_k = max_k
        """The largest K considered."""
        self.draft_cost_hint = draft_cost_hint
        """Declared draft cost per token relative to a one-row target step (None: measure it first)."""
        self.draft_cost = LinearCost("draft seconds per call vs K", slope_ratio=math.inf)
        self.verify_cost = TabulatedCost("verify seconds per call vs rows", slope_ratio=VERIFY_SLOPE_RATIO)
        self.state_cost = LinearCost("state seconds per round vs K", slope_ratio=VERIFY_SLOPE_RATIO)
        self.gap_s = 0.0
        """Smoothed seconds between steps (the queue term)."""
        self._gaps_seen = 0
        self._reach: dict[str, _Reach] = {}
        self.last_prediction: tuple[float, float] | None = None
        """(expected tokens, expected seconds) of the last trimmed step; None during warm-up."""

    @property
    def description(self) -> str:
        """``auto``."""
        return "auto"

    # --- the model ------------------------------------------------------------------------------------

    def alpha_reach(self, request_id: str) -> list[float]:
        """The current ``alpha_1..alpha_8`` of a request (the prior for an unseen one)."""
        return self._reach.get(request_id, _Reach()).rates()

    def expected_progress(self, request_id: str, k: int) -> float:
        """``E[G](K)`` of the request's next round (no stop assumed inside it)."""
        return expected_progress(survival_from_reach(self.alpha_reach(request_id)[:k]))

    def _target_seconds(self, ks: Sequence[int]) -> float:
        rows = sum(verify_row_count(self.layout, k) for k in ks)
        if replays_frontier(self.layout):
            return self.verify_cost.predict(rows)
        frontier = self.verify_cost.predict(len(ks))  # the one-row call of every frontier
        return frontier + (self.verify_cost.predict(rows) if rows else 0.0)

    def draft_seconds(self, k: int) -> float:
        """Predicted seconds of a proposer call asked for ``k`` drafts (measured, else from the hint)."""
        if k <= 0:
            return 0.0
        if self.draft_cost.ready:
            return self.draft_cost.predict(k)
        hint = self.draft_cost_hint or 0.0
        return hint * k * self.verify_cost.predict(1)

    def step_seconds(self, ks: Sequence[int], *, drafting: bool = True) -> float:
        """Predicted wall seconds of a step with draft lengths ``ks`` (without the proposer when trimming)."""
        draft = self.draft_seconds(max(ks, default=0)) if drafting else 0.0
        state = math.fsum(self.state_cost.predict(k) for k in ks)
        return draft + self._target_seconds(ks) + state + self.gap_s

    @property
    def warming_up(self) -> bool:
        """Whether the costs needed for a choice are still unmeasured (the policy then runs its warm-up)."""
        measured = self.verify_cost.ready and self.state_cost.ready
        return not measured or (self.draft_cost_hint is None and not self.draft_cost.ready)

    def _warm_up_length(self, slot: DraftSlot) -> int:
        """Without a hint the warm-up drafts to measure the proposer; with one it decodes plainly first."""
        k = WARMUP_DRAFT_LENGTH if self.draft_cost_hint is None else 0
        return min(k, _check_cap(slot), self.max_k)

    def _best(
        self, slots: Sequence[DraftSlot], *, drafting: bool, certain: bool = False
    ) -> tuple[list[int], float, float]:
        """The K vector maximising expected tokens per second, with its (tokens, seconds).

        ``certain`` evaluates the best case (every draft accepted): if even that does not beat plain
        decoding under the predicted costs, no acceptance estimate can make speculation pay.
        """
        caps = [min(_check_cap(slot), self.max_k) for slot in slots]
        gains = []  # gains[r][k] = E[G_r](k) for k = 0..cap_r
        for slot, cap in zip(slots, caps, strict=True):
            if certain:
                gains.append([float(k + 1) for k in range(cap + 1)])
                continue
            survival = survival_from_reach(self.alpha_reach(slot.request_id)[:cap])
            gains.append([expected_progress(survival[: k + 1]) for k in range(cap + 1)])

        def rate(ks: list[int]) -> tuple[float, float]:
            tokens = math.fsum(g[k] for g, k in zip(gains, ks, strict=True))
            return tokens, self.step_seconds(ks, drafting=drafting)

        best: list[int] = [0] * len(slots)
        best_tokens, best_seconds = rate(best)
        for common in range(1, max(caps, default=0) + 1):
            ks = [min(common, cap) for cap in caps]
            tokens, seconds = rate(ks)
            if tokens * best_seconds > best_tokens * seconds:
                best, best_tokens, best_seconds = ks, tokens, seconds
        if len(slots) > 1:
            for index, cap in enumerate(caps):
                for k in range(cap + 1):
                    if k == best[index]:
                        continue
                    trial = [*best[:index], k, *best[index + 1 :]]
                    tokens, seconds = rate(trial)
                    if tokens * best_seconds > best_tokens * seconds:
                        best, best_tokens, best_seconds = trial, tokens, seconds
        if not certain and any(best):
            plain_tokens, plain_seconds = rate([0] * len(slots))
            if best_tokens * plain_seconds < (1.0 + SPECULATION_MARGIN) * plain_tokens * best_seconds:
                return [0] * len(slots), plain_tokens, plain_seconds  # a predicted gain within the noise
        return best, best_tokens, best_seconds

    def _probe(self, slots: Sequence[DraftSlot], ks: list[int], *, drafting: bool) -> list[int]:
        """Turn a K = 0 into a one-draft probe where one is due and speculation could pay at all."""
        due = [
            index
            for index, slot in enumerate(slots)
            if ks[index] == 0
            and min(_check_cap(slot), self.max_k) > 0
            and self._reach.setdefault(slot.request_id, _Reach()).zero_streak
            >= self._reach[slot.request_id].probe_interval
        ]
        if not due:
            return ks
        plain_seconds = self.step_seconds([0], drafting=drafting)  # one token per plain round
        for index in due:
            best, tokens, seconds = self._best([slots[index]], drafting=drafting, certain=True)
            if best[0] > 0 and tokens * plain_seconds >= (1.0 + PROBE_MARGIN) * seconds:
                # The cheapest non-empty draft (a small CPU matrix product may cost more with fewer rows).
                cap = min(_check_cap(slots[index]), self.max_k)
                ks[index] = min(
                    range(1, cap + 1), key=lambda k: (self.step_seconds([k], drafting=drafting), k)
                )
        return ks

    # --- the protocol ---------------------------------------------------------------------------------

    def choose(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to ask for: the best K vector counting the proposer's cost (the warm-up at first)."""
        if self.warming_up:
            return [self._warm_up_length(slot) for slot in slots]
        best, _, _ = self._best(slots, drafting=True)
        probed = self._probe(slots, list(best), drafting=True)
        for slot, chosen, final in zip(slots, best, probed, strict=True):
            state = self._reach.setdefault(slot.request_id, _Reach())
            state.probing = final > chosen
            if state.probing:  # the next probe waits twice as long
                state.probe_interval *= 2
            elif chosen > 0:  # speculation pays on its own again
                state.probe_interval = PROBE_INTERVAL
        return probed

    def trim(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to verify out of those offered: the best K vector with the drafting already paid for."""
        if self.warming_up:
            self.last_prediction = None
            return [min(_check_cap(slot), self.max_k) for slot in slots]
        ks, tokens, seconds = self._best(slots, drafting=False)
        self.last_prediction = (tokens, seconds)
        for index, slot in enumerate(slots):
            state = self._reach.setdefault(slot.request_id, _Reach())
            if state.probing and ks[index] == 0 and min(_check_cap(slot), self.max_k) > 0:
                ks[index] = min(_check_cap(slot), self.max_k)  # keep the probe asked for in choose()
            state.probing = False
        return ks

    def observe(self, outcomes: Sequence[RoundOutcome], costs: StepCosts) -> None:
        """Update the reach counts of every round and the cost lines of the step."""
        for outcome in outcomes:
            self._reach.setdefault(outcome.request_id, _Reach()).observe(outcome)
        if costs.draft is not None:
            self.draft_cost.observe(*costs.draft)
        for rows, seconds in costs.verify_calls:
            self.verify_cost.observe(rows, seconds)
        for k, seconds in costs.states:
            self.state_cost.observe(k, seconds)
        self._gaps_seen += 1
        self.gap_s = costs.gap_s if self._gaps_seen == 1 else 0.8 * self.gap_s + 0.2 * costs.gap_s

    def forget(self, request_id: str) -> None:
        """Drop a request's reach counts (it finished, or a round they counted was rolled back)."""
        self._reach.pop(request_id, None)
