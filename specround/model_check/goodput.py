"""Choosing K under declared acceptance profiles and cost terms.

Contract: contract#time-ledger, contract#acceptance-profiles, contract#temporary-rows.

A :class:`GoodputFixture` declares, for one request coordinate, the reach-conditioned acceptance profile
``alpha_1^reach, alpha_2^reach, ...``, the cost terms of

    T_round(K) = T_D(K) + T_V(K) + T_S(A, K) + T_Q(K)

and optionally a stop distance and the progress it claims per round. :func:`goodput_table` evaluates
``E[G](K) / E[T_round](K)`` for every K in ``1..min(8, len(profile))`` and :func:`best_k` picks the K that
maximises it, reporting whether the optimum is interior.

The ledger refuses three kinds of declaration (contract#speedup-ledger): rates that are not reach-conditioned
or are given for unreachable positions (:class:`~specround.errors.UnreachableRateError`), claimed progress
that omits the correction/bonus token (:class:`~specround.errors.MissingProgressTokenError`), and any negative
cost term, declared or evaluated (:class:`~specround.errors.NegativeCostError`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Literal

from specround.errors import (
    LedgerDeclarationError,
    MissingProgressTokenError,
    NegativeCostError,
    UnreachableRateError,
)
from specround.ledger import (
    accepted_pmf,
    expected_accepted,
    expected_progress_with_stops,
    survival_from_reach,
)

__all__ = [
    "MAX_LOOKAHEAD",
    "PROGRESS_TOLERANCE",
    "AcceptanceProfile",
    "CostTerms",
    "GoodputFixture",
    "GoodputRow",
    "KChoice",
    "best_k",
    "declared_mean_matches",
    "goodput_table",
]

MAX_LOOKAHEAD = 8
"""The largest K the ledger's optimiser considers."""

PROGRESS_TOLERANCE = 1e-9
"""How far a declared E[G] may sit from the ledger's own value before it is refused."""

Conditioning = Literal["reach", "all_proposed_rows"]


@dataclass(frozen=True)
class AcceptanceProfile:
    """Reach-conditioned acceptance rates by draft position, ``rates[j-1] = alpha_j^reach``.

    ``conditioning`` names what the rates average over. Only ``"reach"`` is accepted; a rate averaged over
    all proposed rows (``"all_proposed_rows"``) mixes in unreachable suffix rows and is refused.
    """

    name: str
    rates: tuple[float, ...]
    conditioning: Conditioning = "reach"

    def survival(self, k: int) -> tuple[float, ...]:
        """``(s_0, ..., s_K)`` for the first K positions of the profile (validated)."""
        if self.conditioning != "reach":
            raise UnreachableRateError(
                f"profile {self.name!r} averages acceptance over {self.conditioning}: rates over rows that "
                "no round reaches estimate a different quantity than alpha_j^reach (contract#accepted-prefix)"
            )
        if not 0 <= k <= len(self.rates):
            raise LedgerDeclarationError(
                f"profile {self.name!r} declares {len(self.rates)} positions, not {k}"
            )
        # Validate the whole declared profile, not only the prefix in use.
        survival_from_reach(self.rates)
        return survival_from_reach(self.rates[:k])

    @property
    def mean_rate(self) -> float:
        """Arithmetic mean of the declared rates (not enough on its own: contract#acceptance-profiles)."""
        return math.fsum(self.rates) / len(self.rates) if self.rates else math.nan


@dataclass(frozen=True)
class CostTerms:
    """Declared per-round cost coefficients (seconds, or units of one target decode step).

    ``T_D(K) = draft_fixed + draft_per_token * K`` (K serial draft calls);
    ``T_V(K) = verify_fixed + verify_per_row * (K + 1)`` (the verification shape grows with the rows);
    ``T_S(A, K) = state_fixed + state_per_row * K + state_per_accepted * A`` (packing, decision,
    compaction); ``T_Q(K) = queue_per_row * K + queue_per_row_squared * K**2`` (batch pressure of the
    temporary rows). Every coefficient must be finite and non-negative.
    """

    draft_fixed: float = 0.0
    draft_per_token: float = 0.0
    verify_fixed: float = 0.0
    verify_per_row: float = 0.0
    state_fixed: float = 0.0
    state_per_row: float = 0.0
    state_per_accepted: float = 0.0
    queue_per_row: float = 0.0
    queue_per_row_squared: float = 0.0

    def __post_init__(self) -> None:
        for field in fields(self):
            value = float(getattr(self, field.name))
            if not math.isfinite(value) or value < 0.0:
                raise NegativeCostError(f"cost term {field.name} = {value!r} must be finite and >= 0")

    def draft(self, k: int) -> float:
        """``T_D(K)``."""
        return self.draft_fixed + self.draft_per_token * k

    def verify(self, k: int) -> float:
        """``T_V(K)``."""
        return self.verify_fixed + self.verify_per_row * (k + 1)

    def state(self, accepted: float, k: int) -> float:
        """``T_S(A, K)``; linear in ``A``, so ``E[T_S] = T_S(E[A], K)``."""
        return self.state_fixed + self.state_per_row * k + self.state_per_accepted * accepted

    def queue(self, k: int) -> float:
        """``T_Q(K)``."""
        return self.queue_per_row * k + self.queue_per_row_squared * k * k

    def expected_round_time(self, k: int, expected_accepted_count: float) -> float:
        """``E[T_round(K)] = T_D(K) + T_V(K) + E[T_S(A, K)] + T_Q(K)``; refuses a non-positive total."""
        terms = (self.draft(k), self.verify(k), self.state(expected_accepted_count, k), self.queue(k))
        if any(t < 0.0 for t in terms):
            raise NegativeCostError(f"a cost term evaluates negative at K = {k}: {terms}")
        total = math.fsum(terms)
        if total <= 0.0:
            raise NegativeCostError(f"a round costs nothing at K = {k}: a free round hides its cost")
        return total


@dataclass(frozen=True)
class GoodputRow:
    """One K of a goodput table."""

    k: int
    survival: tuple[float, ...]
    accepted_pmf: tuple[float, ...]
    expected_accepted: float
    expected_progress: float
    expected_round_time: float
    goodput: float
    """``E[G] / E[T_round]`` committed tokens per unit of time."""
    speedup: float
    """``goodput * baseline_step``: goodput relative to one token per ordinary target decode step."""
    discarded_rows: float
    """``K - E[A]`` draft K/V rows thrown away per round (contract#temporary-rows)."""


@dataclass(frozen=True)
class GoodputFixture:
    """A declared coordinate for the K optimiser.

    ``stop_distance`` is the stop distance H of every round (``math.inf``: no stop). ``claimed_progress``,
    when given, is the E[G] per K (K = 1, 2, ...) that the declaration relies on; it must equal the ledger's
    value, and a claim that equals E[A] (the correction/bonus token omitted) is refused by name.
    ``baseline_step`` is the time of one ordinary (non-speculative) target decode step.
    """

    name: str
    profile: AcceptanceProfile
    costs: CostTerms
    baseline_step: float
    stop_distance: float = math.inf
    claimed_progress: tuple[float, ...] | None = None
    max_k: int = MAX_LOOKAHEAD

    def lookaheads(self) -> range:
        """The K values the optimiser compares: ``1..min(max_k, 8, declared positions)``."""
        return range(1, min(self.max_k, MAX_LOOKAHEAD, len(self.profile.rates)) + 1)


def _progress(fixture: GoodputFixture, survival: tuple[float, ...]) -> float:
    stops = None if fixture.stop_distance == math.inf else {fixture.stop_distance: 1.0}
    return expected_progress_with_stops(accepted_pmf(survival), stops)


def goodput_table(fixture: GoodputFixture) -> list[GoodputRow]:
    """Evaluate every K of ``fixture.lookaheads()``; validates the whole declaration first."""
    if not math.isfinite(fixture.baseline_step) or fixture.baseline_step <= 0.0:
        raise NegativeCostError(f"baseline_step must be finite and > 0, got {fixture.baseline_step!r}")
    ks = fixture.lookaheads()
    if len(ks) == 0:
        raise LedgerDeclarationError(f"fixture {fixture.name!r} declares no draft position")
    rows: list[GoodputRow] = []
    for k in ks:
        survival = fixture.profile.survival(k)
        progress = _progress(fixture, survival)
        mean_accepted = expected_accepted(survival)
        if fixture.claimed_progress is not None:
            _check_claim(fixture, k, progress, mean_accepted)
        round_time = fixture.costs.expected_round_time(k, mean_accepted)
        rate = progress / round_time
        rows.append(
            GoodputRow(
                k=k,
                survival=survival,
                accepted_pmf=accepted_pmf(survival),
                expected_accepted=mean_accepted,
                expected_progress=progress,
                expected_round_time=round_time,
                goodput=rate,
                speedup=rate * fixture.baseline_step,
                discarded_rows=k - mean_accepted,
            )
        )
    return rows


def _check_claim(fixture: GoodputFixture, k: int, progress: float, mean_accepted: float) -> None:
    claims = fixture.claimed_progress or ()
    if k > len(claims):
        raise LedgerDeclarationError(f"fixture {fixture.name!r} claims no progress for K = {k}")
    claimed = float(claims[k - 1])
    if abs(claimed - progress) <= PROGRESS_TOLERANCE:
        return
    if abs(claimed - mean_accepted) <= PROGRESS_TOLERANCE or claimed < 1.0:
        raise MissingProgressTokenError(
            f"fixture {fixture.name!r} claims E[G] = {claimed} at K = {k}, but the round also emits its "
            f"correction/bonus token: E[G] = E[min(A + 1, H)] = {progress} (contract#round-progress)"
        )
    raise LedgerDeclarationError(
        f"fixture {fixture.name!r} claims E[G] = {claimed} at K = {k}; the profile gives {progress}"
    )


@dataclass(frozen=True)
class KChoice:
    """The optimiser's answer for one fixture."""

    fixture: str
    best_k: int
    interior: bool
    """``1 < best_k < largest K considered``: a true trade-off, not a boundary of the search."""
    rows: tuple[GoodputRow, ...]

    @property
    def best(self) -> GoodputRow:
        """The row of the chosen K."""
        return self.rows[self.best_k - self.rows[0].k]


def best_k(fixture: GoodputFixture) -> KChoice:
    """The K in ``fixture.lookaheads()`` that maximises goodput (the smallest such K on exact ties)."""
    rows = goodput_table(fixture)
    best = max(rows, key=lambda row: (row.goodput, -row.k))
    return KChoice(
        fixture=fixture.name,
        best_k=best.k,
        interior=rows[0].k < best.k < rows[-1].k,
        rows=tuple(rows),
    )


def declared_mean_matches(profiles: Sequence[AcceptanceProfile]) -> bool:
    """Whether the profiles share one arithmetic mean rate (the premise of contract#acceptance-profiles)."""
    means = [p.mean_rate for p in profiles]
    return all(abs(m - means[0]) <= PROGRESS_TOLERANCE for m in means)
