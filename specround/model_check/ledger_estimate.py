"""The speedup ledger estimated from observed rounds (contract#speedup-ledger, contract#acceptance-profiles).

Each :class:`RoundRecord` is what one published round reports: accepted drafts ``A``, drafted ``k``,
emitted tokens ``G``, whether the request stopped, and the four timing terms. The SQL event log provides
the same fields. :func:`estimate_ledger` turns a list of records into the ledger's quantities:

* ``alpha_j^reach`` counts only rounds whose test j was *reached*: ``k >= j`` and the round neither
  rejected nor stopped before position j. A round reached ``A + 1`` tests when it ended with a correction
  (``A < k`` and ``G = A + 1``) and ``A`` tests otherwise (a bonus, or a stop inside the accepted prefix);
  this is exactly the ACCEPT draw count of INV-3.
* The survival tail is the chain-rule product of those rates, and ``Pr(A = a)`` its adjacent differences;
  the empirical tail ``Pr(A >= j)`` over rounds that drafted at least j is reported beside it.
* Time per token is the renewal-reward ratio ``sum T / sum G``; ``mean(T / G)`` is reported beside it to
  show that the two differ whenever progress varies.

Records that break the round contract are refused: progress without the correction/bonus token
(:class:`~specround.errors.MissingProgressTokenError`) and negative timings
(:class:`~specround.errors.NegativeCostError`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specround.errors import LedgerDeclarationError, MissingProgressTokenError, NegativeCostError
from specround.ledger import ReachCount, accepted_pmf

__all__ = ["LedgerEstimate", "ReachCount", "RoundRecord", "estimate_ledger"]


@dataclass(frozen=True)
class RoundRecord:
    """What one published round reports to the ledger.

    ``accepted`` is A (the accepted drafts that were emitted; the stop distance when a stop inside the
    accepted prefix ended the request), ``drafted`` is k, ``emitted`` is G, ``stopped`` says whether the
    request finished in this round. Timings are seconds of T_D, T_V, T_S and T_Q.
    """

    accepted: int
    drafted: int
    emitted: int
    stopped: bool
    t_draft: float = 0.0
    t_verify: float = 0.0
    t_state: float = 0.0
    t_queue: float = 0.0
    count: int = 1
    """How many identical rounds this record stands for (an aggregated log query), >= 1."""

    def __post_init__(self) -> None:
        if self.count < 1:
            raise LedgerDeclarationError(f"a record stands for at least one round, got count = {self.count}")
        if not 0 <= self.accepted <= self.drafted:
            raise LedgerDeclarationError(f"need 0 <= A <= k, got A = {self.accepted}, k = {self.drafted}")
        if not self.stopped and self.emitted != self.accepted + 1:
            raise MissingProgressTokenError(
                "an unstopped round emits A + 1 tokens (the correction or bonus counts): "
                f"A = {self.accepted}, G = {self.emitted}"
            )
        if self.stopped and not (max(1, self.accepted) <= self.emitted <= self.accepted + 1):
            raise LedgerDeclarationError(
                f"a stopped round emits A or A + 1 tokens (and at least one): A = {self.accepted}, "
                f"G = {self.emitted}"
            )
        for name in ("t_draft", "t_verify", "t_state", "t_queue"):
            value = float(getattr(self, name))
            if not math.isfinite(value) or value < 0.0:
                raise NegativeCostError(f"{name} = {value!r} must be finite and >= 0")

    @property
    def round_time(self) -> float:
        """``T_round = T_D + T_V + T_S + T_Q``."""
        return math.fsum((self.t_draft, self.t_verify, self.t_state, self.t_queue))

    @property
    def reached_tests(self) -> int:
        """Acceptance tests the round reached: ``A + 1`` after a rejection, else ``A`` (INV-3)."""
        rejected = self.accepted < self.drafted and self.emitted == self.accepted + 1
        return self.accepted + 1 if rejected else self.accepted


@dataclass(frozen=True)
class LedgerEstimate:
    """Ledger quantities estimated from observed rounds."""

    rounds: int
    reach: tuple[ReachCount, ...]
    survival: tuple[float, ...]
    """Chain-rule tail ``prod alpha_i^reach`` up to the last position with a defined rate."""
    accepted_pmf: tuple[float, ...]
    """Adjacent differences of :attr:`survival`."""
    empirical_survival: tuple[float | None, ...]
    """``Pr(A >= j | k >= j)`` counted directly, j = 0..max k (``None`` when no round drafted j)."""
    mean_accepted: float
    mean_progress: float
    mean_round_time: float
    time_per_token: float
    """Renewal-reward ``sum T / sum G``."""
    mean_time_per_token_ratio: float
    """``mean(T / G)``: a different quantity, shown for contrast."""
    discarded_rows: float
    """Mean ``k - A`` draft rows discarded per round."""


def estimate_ledger(records: Sequence[RoundRecord]) -> LedgerEstimate:
    """Estimate the ledger from observed rounds (at least one; each weighted by its ``count``)."""
    if not records:
        raise LedgerDeclarationError("the ledger needs at least one observed round")
    max_k = max(r.drafted for r in records)
    reach = tuple(
        ReachCount(
            position=j,
            reached=sum(r.count for r in records if r.reached_tests >= j),
            accepted=sum(r.count for r in records if r.reached_tests >= j and r.accepted >= j),
        )
        for j in range(1, max_k + 1)
    )
    survival = [1.0]
    for count in reach:
        rate = count.rate
        if rate is None:
            break
        survival.append(survival[-1] * rate)
    empirical: list[float | None] = []
    for j in range(max_k + 1):
        eligible = sum(r.count for r in records if r.drafted >= j)
        hits = sum(r.count for r in records if r.drafted >= j and r.accepted >= j)
        empirical.append(hits / eligible if eligible else None)
    n = sum(r.count for r in records)
    total_time = math.fsum(r.round_time * r.count for r in records)
    total_progress = sum(r.emitted * r.count for r in records)
    return LedgerEstimate(
        rounds=n,
        reach=reach,
        survival=tuple(survival),
        accepted_pmf=accepted_pmf(survival),
        empirical_survival=tuple(empirical),
        mean_accepted=sum(r.accepted * r.count for r in records) / n,
        mean_progress=total_progress / n,
        mean_round_time=total_time / n,
        time_per_token=total_time / total_progress,
        mean_time_per_token_ratio=math.fsum(r.round_time / r.emitted * r.count for r in records) / n,
        discarded_rows=sum((r.drafted - r.accepted) * r.count for r in records) / n,
    )
