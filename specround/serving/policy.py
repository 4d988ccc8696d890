"""Draft length as a control policy (0x05E: "draft length is a control policy, not a fixed law").

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
expected committed tokens per second under measured costs (0x05C):

* **Costs.** Online fits (:mod:`specround.serving.costs`) of the proposer call's seconds against the
  largest K asked of it (a line), the target call's seconds against the rows it computed (measured per row
  count, a line for counts not seen yet: small CPU matrix products are not linear in their rows), and each
  round's state seconds against its K (a line), plus the mean gap between steps. Under
  ``replay_frontier`` a step's target work is one call over ``sum(K_r + 1)`` rows; under
  ``retained_frontier`` it is the frontier call over the B rows plus one call over ``sum(K_r)`` rows.
  When trimming, the drafting is already paid for and only the rest counts.
* **Progress.** Per request, the reach-conditioned acceptance ``alpha_j^reach`` (0x05A), counted only over
  rounds whose acceptance test j was reached (the ACCEPT draws of INV-3), and ``E[G](K) = 1 +
  sum_{j<=K} prod_{i<=j} alpha_i^reach`` (:func:`specround.ledger.survival_from_reach`,
  :func:`specround.ledger.expected_progress`). The budget caps K at ``remaining - 1``, so no round is
  planned past it.
* **Search.** The best common K first, then one coordinate pass that lets each request move its own K with
  the others held (a request whose drafts do not pay drops to K = 0: plain decode).

Warm-up and priors (stated, and overridden by measurements as they arrive):

* The first step asks for :data:`WARMUP_DRAFT_LENGTH` drafts per request and verifies what is offered,
  which measures the proposer's cost and a multi-row verification; until every cost line has data the
  policy stays in warm-up.
* Each ``alpha_j^reach`` starts from a Beta prior of mean :data:`PRIOR_ACCEPTANCE` and weight
  :data:`PRIOR_WEIGHT` tests; per-request counts decay by :data:`REACH_DECAY` per round that verified a
  draft (a memory of about ten rounds), so the policy follows a request from copying text to free text.
* Cost lines start from the prior lines of :mod:`specround.serving.costs`: the draft line through the
  origin (a call for zero drafts costs nothing), the verification and state lines with a per-row slope of
  :data:`VERIFY_SLOPE_RATIO` of their intercept (about what a packed CPU verification costs per extra row).
* A request that verified no draft for :data:`PROBE_INTERVAL` rounds asks for and verifies one draft
  once, so that a stale acceptance estimate cannot lock speculation off forever.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from specround.errors import InvalidRequestError
from specround.ledger import expected_progress, survival_from_reach
from specround.sampling.types import Layout
from specround.serving.costs import LinearCost, TabulatedCost
from specround.serving.stats import RoundOutcome

__all__ = [
    "MAX_DRAFT_LENGTH",
    "PRIOR_ACCEPTANCE",
    "PRIOR_WEIGHT",
    "PROBE_INTERVAL",
    "REACH_DECAY",
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
PRIOR_ACCEPTANCE = 0.6
"""Prior mean of every ``alpha_j^reach`` (the acceptance rate of the 003 worked example)."""
PRIOR_WEIGHT = 2.0
"""Weight of the acceptance prior, in reached tests."""
REACH_DECAY = 0.9
"""Per-round decay of a request's reach counts."""
VERIFY_SLOPE_RATIO = 0.1
"""Prior per-row slope of the verification and state lines, relative to their intercept."""
PROBE_INTERVAL = 16
"""Rounds at K = 0 after which a request verifies one draft once."""


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
        """Drop what was learned about a finished request."""
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
    """Decayed evidence behind one request's ``alpha_j^reach``, and its run of K = 0 rounds."""

    reached: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_LENGTH)
    accepted: list[float] = field(default_factory=lambda: [0.0] * MAX_DRAFT_LENGTH)
    zero_streak: int = 0

    def rates(self) -> list[float]:
        return [
            (accepted + PRIOR_ACCEPTANCE * PRIOR_WEIGHT) / (reached + PRIOR_WEIGHT)
            for reached, accepted in zip(self.reached, self.accepted, strict=True)
        ]

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
        self, layout: Layout | str = Layout.REPLAY_FRONTIER, *, max_k: int = MAX_DRAFT_LENGTH
    ) -> None:
        if isinstance(max_k, bool) or not isinstance(max_k, int) or not 0 <= max_k <= MAX_DRAFT_LENGTH:
            raise InvalidRequestError(f"max_k lies in 0..{MAX_DRAFT_LENGTH}, got {max_k!r}")
        self.layout = Layout(layout)
        """The verification layout (it shapes the target calls)."""
        self.max_k = max_k
        """The largest K considered."""
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
        rows = sum(ks)
        if self.layout is Layout.REPLAY_FRONTIER:
            return self.verify_cost.predict(rows + len(ks))
        frontier = self.verify_cost.predict(len(ks))
        return frontier + (self.verify_cost.predict(rows) if rows else 0.0)

    def step_seconds(self, ks: Sequence[int], *, drafting: bool = True) -> float:
        """Predicted wall seconds of a step with draft lengths ``ks`` (without the proposer when trimming)."""
        longest = max(ks, default=0)
        draft = self.draft_cost.predict(longest) if drafting and longest else 0.0
        state = math.fsum(self.state_cost.predict(k) for k in ks)
        return draft + self._target_seconds(ks) + state + self.gap_s

    @property
    def warming_up(self) -> bool:
        """Whether a cost line still lacks data (the policy then asks for the warm-up K)."""
        return not (self.draft_cost.ready and self.verify_cost.ready and self.state_cost.ready)

    def _best(self, slots: Sequence[DraftSlot], *, drafting: bool) -> tuple[list[int], float, float]:
        """The K vector maximising expected tokens per second, with its (tokens, seconds)."""
        caps = [min(_check_cap(slot), self.max_k) for slot in slots]
        gains = []  # gains[r][k] = E[G_r](k) for k = 0..cap_r
        for slot, cap in zip(slots, caps, strict=True):
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
        return best, best_tokens, best_seconds

    # --- the protocol ---------------------------------------------------------------------------------

    def choose(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to ask for: the best K vector counting the proposer's cost (warm-up K at first)."""
        if self.warming_up:
            return [min(WARMUP_DRAFT_LENGTH, _check_cap(slot), self.max_k) for slot in slots]
        best, _, _ = self._best(slots, drafting=True)
        for index, slot in enumerate(slots):
            if best[index] == 0 and _check_cap(slot) > 0 and self.max_k > 0:
                streak = self._reach.setdefault(slot.request_id, _Reach()).zero_streak
                if streak >= PROBE_INTERVAL:
                    best[index] = 1
        return best

    def trim(self, slots: Sequence[DraftSlot]) -> list[int]:
        """Drafts to verify out of those offered: the best K vector with the drafting already paid for."""
        if self.warming_up:
            self.last_prediction = None
            ks = [min(_check_cap(slot), self.max_k) for slot in slots]
        else:
            ks, tokens, seconds = self._best(slots, drafting=False)
            for index, slot in enumerate(slots):
                state = self._reach.setdefault(slot.request_id, _Reach())
                if ks[index] == 0 and _check_cap(slot) > 0 and state.zero_streak >= PROBE_INTERVAL:
                    ks[index] = 1  # the probe (see the module docstring)
            self.last_prediction = (tokens, seconds)
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
        """Drop a finished request's reach counts."""
        self._reach.pop(request_id, None)
