"""One streaming pass over the round rows into everything the report shows (bounded memory).

:class:`RoundFold` consumes :class:`~specround.report.extract.RoundRow` values in any order and keeps only
counters: per draft position (reached, accepted, drafted), the accepted-count histogram per ``k``, per
request totals (a few integers per request), and time buckets whose width doubles whenever their number
would exceed :data:`MAX_BUCKETS` (so the pass needs no first query for the time range). :meth:`finish`
turns the counters into :class:`ReportData`: the reach-conditioned rates with Wilson intervals, the
Kaplan-Meier survival tail with its band (:mod:`specround.report.intervals`), ``Pr(A = a)``, the time ledger
and the K/V row ledger.

Definitions (contract#speedup-ledger, contract#temporary-rows):

* ``alpha_j^reach = accepted_j / reached_j``: ``reached_j`` counts rounds whose acceptance test ``j`` ran
  (``accept_draws >= j``), ``accepted_j`` those that accepted ``d_j`` (``A >= j``). Rows a round never
  reached are not in the denominator.
* ``s_j = prod_{i<=j} alpha_i^reach`` and ``Pr(A = a) = s_a - s_{a+1}`` (``s_K`` at the last position).
* Time per committed token is the renewal-reward ratio ``sum T_round / sum G`` over rounds with timings;
  ``mean(T_round / G)`` is shown beside it because the two differ whenever progress varies.
* Temporary rows are the verification's input rows; committed rows are the K/V rows the round kept.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from specround.report.extract import RoundRow
from specround.report.intervals import SurvivalPoint, kaplan_meier, wilson_interval

__all__ = [
    "MAX_BUCKETS",
    "PositionRate",
    "ReportData",
    "RequestTotals",
    "RoundFold",
    "TimeBucket",
    "fold_rounds",
]

MAX_BUCKETS = 160
"""Most time buckets kept; the width doubles (neighbours merge) beyond it."""
_START_WIDTH_S = 1e-3


@dataclass(slots=True)
class TimeBucket:
    """Totals of the rounds published in ``[start, start + width)``."""

    start: float = 0.0
    width: float = 0.0
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    reached: int = 0
    emitted: int = 0
    verify_rows: int = 0
    committed_rows: int = 0
    timed_rounds: int = 0
    timed_emitted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    state_s: float = 0.0
    queue_s: float = 0.0

    def merge(self, other: TimeBucket) -> None:
        """Add another bucket's totals."""
        for name in (
            "rounds",
            "drafted",
            "accepted",
            "reached",
            "emitted",
            "verify_rows",
            "committed_rows",
            "timed_rounds",
            "timed_emitted",
            "draft_s",
            "verify_s",
            "state_s",
            "queue_s",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def acceptance(self) -> float | None:
        """Accepted drafts over drafted tokens in the bucket."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def round_s(self) -> float:
        """Summed ``T_round`` of the timed rounds."""
        return self.draft_s + self.verify_s + self.state_s + self.queue_s

    @property
    def time_per_token(self) -> float | None:
        """Renewal-reward ``sum T / sum G`` over the bucket's timed rounds."""
        return self.round_s / self.timed_emitted if self.timed_emitted else None


@dataclass(slots=True)
class RequestTotals:
    """Per-request totals."""

    request_id: str
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    finished: bool = False

    @property
    def acceptance(self) -> float | None:
        """Accepted over drafted tokens; None for a request that never drafted."""
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True, slots=True)
class PositionRate:
    """The evidence and estimate of one draft position ``j``."""

    position: int
    reached: int
    accepted: int
    drafted: int
    """Rounds that drafted at least ``j`` tokens (reached or not)."""
    rate: float | None
    """``alpha_j^reach``; None when no round reached ``j``."""
    low: float
    high: float
    """Wilson 95% interval of the rate."""

    @property
    def unconditioned(self) -> float | None:
        """``accepted_j / drafted_j``: accepted over *all* proposed rows at ``j`` (not reach-conditioned)."""
        return self.accepted / self.drafted if self.drafted else None


@dataclass(frozen=True)
class ReportData:
    """Everything the report renders, computed from the counters of one pass."""

    rounds: int
    requests: int
    finished_requests: int
    drafted: int
    accepted: int
    emitted: int
    verify_rows: int
    committed_rows: int
    discarded_rows: int
    terminals: dict[str, int]
    positions: tuple[PositionRate, ...]
    survival: tuple[SurvivalPoint, ...]
    accepted_pmf: tuple[float, ...]
    """``Pr(A = a)`` for ``a = 0..J`` from the survival tail (J = last position with a defined rate)."""
    accepted_counts: dict[int, dict[int, int]]
    """``k -> {a: rounds}``: the observed accepted counts per draft length."""
    buckets: tuple[TimeBucket, ...]
    per_request: tuple[RequestTotals, ...]
    timed_rounds: int
    timed_emitted: int
    time_totals: dict[str, float]
    """Summed draft/verify/state/queue seconds of the timed rounds."""
    mean_time_per_token_ratio: float | None
    """``mean(T_round / G)`` over timed rounds (for contrast with the renewal-reward ratio)."""
    first_at: float | None
    last_at: float | None

    @property
    def mean_accepted(self) -> float | None:
        """Mean A per round."""
        return self.accepted / self.rounds if self.rounds else None

    @property
    def mean_progress(self) -> float | None:
        """Mean G per round."""
        return self.emitted / self.rounds if self.rounds else None

    @property
    def time_per_token(self) -> float | None:
        """Renewal-reward time per committed token ``sum T / sum G`` over timed rounds."""
        if not self.timed_emitted:
            return None
        return math.fsum(self.time_totals.values()) / self.timed_emitted

    @property
    def expected_progress(self) -> float:
        """``E[G] = 1 + sum_j s_j`` from the survival tail (no stops)."""
        return 1.0 + math.fsum(p.survival for p in self.survival)


@dataclass(slots=True)
class RoundFold:
    """Streaming accumulator of round rows (see the module docstring)."""

    reached: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    accepted_counts: dict[int, dict[int, int]] = field(default_factory=dict)
    terminals: dict[str, int] = field(default_factory=dict)
    requests: dict[str, RequestTotals] = field(default_factory=dict)
    buckets: dict[int, TimeBucket] = field(default_factory=dict)
    anchor: float | None = None
    width: float = _START_WIDTH_S
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    verify_rows: int = 0
    committed_rows: int = 0
    discarded_rows: int = 0
    timed_rounds: int = 0
    timed_emitted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    state_s: float = 0.0
    queue_s: float = 0.0
    ratio_sum: float = 0.0
    first_at: float | None = None
    last_at: float | None = None

    def add(self, row: RoundRow) -> None:
        """Fold one round in."""
        self.rounds += 1
        k, a, reached = row.drafted, row.accepted, row.reached
        self._grow(max(k, reached))
        for j in range(reached):
            self.reached[j] += 1
        for j in range(a):
            self.accepted_at[j] += 1
        for j in range(k):
            self.drafted_at[j] += 1
        per_k = self.accepted_counts.setdefault(k, {})
        per_k[a] = per_k.get(a, 0) + 1
        self.terminals[row.terminal] = self.terminals.get(row.terminal, 0) + 1
        self.drafted += k
        self.accepted += a
        self.emitted += row.emitted
        self.verify_rows += row.verify_rows
        self.committed_rows += row.committed_rows
        self.discarded_rows += row.discarded_rows
        totals = self.requests.get(row.request_id)
        if totals is None:
            totals = self.requests[row.request_id] = RequestTotals(row.request_id)
        totals.rounds += 1
        totals.drafted += k
        totals.accepted += a
        totals.emitted += row.emitted
        totals.finished = totals.finished or row.finished
        at = row.recorded_at
        self.first_at = at if self.first_at is None else min(self.first_at, at)
        self.last_at = at if self.last_at is None else max(self.last_at, at)
        bucket = self._bucket(at)
        bucket.rounds += 1
        bucket.drafted += k
        bucket.accepted += a
        bucket.reached += reached
        bucket.emitted += row.emitted
        bucket.verify_rows += row.verify_rows
        bucket.committed_rows += row.committed_rows
        round_s = row.round_s
        if round_s is not None:
            assert row.draft_s is not None and row.verify_s is not None
            assert row.state_s is not None and row.queue_s is not None
            self.timed_rounds += 1
            self.timed_emitted += row.emitted
            self.draft_s += row.draft_s
            self.verify_s += row.verify_s
            self.state_s += row.state_s
            self.queue_s += row.queue_s
            self.ratio_sum += round_s / row.emitted
            bucket.timed_rounds += 1
            bucket.timed_emitted += row.emitted
            bucket.draft_s += row.draft_s
            bucket.verify_s += row.verify_s
            bucket.state_s += row.state_s
            bucket.queue_s += row.queue_s

    def _grow(self, positions: int) -> None:
        while len(self.reached) < positions:
            self.reached.append(0)
            self.accepted_at.append(0)
            self.drafted_at.append(0)

    def _bucket(self, at: float) -> TimeBucket:
        if self.anchor is None:
            self.anchor = at
        key = math.floor((at - self.anchor) / self.width)
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TimeBucket()
            keys = self.buckets.keys()
            while max(keys) - min(keys) + 1 > MAX_BUCKETS:
                self._coarsen()
                keys = self.buckets.keys()
            key = math.floor((at - self.anchor) / self.width)
            bucket = self.buckets[key]
        return bucket

    def _coarsen(self) -> None:
        merged: dict[int, TimeBucket] = {}
        for key, bucket in self.buckets.items():
            target = merged.get(key // 2)
            if target is None:
                merged[key // 2] = bucket
            else:
                target.merge(bucket)
        self.buckets = merged
        self.width *= 2

    def finish(self) -> ReportData:
        """The report's quantities from the counters."""
        positions = []
        for j, (n, a, d) in enumerate(zip(self.reached, self.accepted_at, self.drafted_at, strict=True)):
            low, high = wilson_interval(a, n) if n else (0.0, 1.0)
            positions.append(PositionRate(j + 1, n, a, d, a / n if n else None, low, high))
        survival = kaplan_meier(self.reached, self.accepted_at)
        tail = [1.0] + [p.survival for p in survival]
        pmf = (*(max(0.0, tail[a] - tail[a + 1]) for a in range(len(tail) - 1)), tail[-1])
        anchor = self.anchor or 0.0
        buckets = []
        for key in sorted(self.buckets):
            bucket = self.buckets[key]
            bucket.start = anchor + key * self.width
            bucket.width = self.width
            buckets.append(bucket)
        return ReportData(
            rounds=self.rounds,
            requests=len(self.requests),
            finished_requests=sum(1 for r in self.requests.values() if r.finished),
            drafted=self.drafted,
            accepted=self.accepted,
            emitted=self.emitted,
            verify_rows=self.verify_rows,
            committed_rows=self.committed_rows,
            discarded_rows=self.discarded_rows,
            terminals=dict(sorted(self.terminals.items())),
            positions=tuple(positions),
            survival=tuple(survival),
            accepted_pmf=pmf,
            accepted_counts={k: dict(sorted(v.items())) for k, v in sorted(self.accepted_counts.items())},
            buckets=tuple(buckets),
            per_request=tuple(sorted(self.requests.values(), key=lambda r: r.request_id)),
            timed_rounds=self.timed_rounds,
            timed_emitted=self.timed_emitted,
            time_totals={
                "draft": self.draft_s,
                "verify": self.verify_s,
                "state": self.state_s,
                "queue": self.queue_s,
            },
            mean_time_per_token_ratio=self.ratio_sum / self.timed_rounds if self.timed_rounds else None,
            first_at=self.first_at,
            last_at=self.last_at,
        )


def fold_rounds(rows: Iterable[RoundRow]) -> ReportData:
    """Fold every row and finish."""
    fold = RoundFold()
    add = fold.add
    for row in rows:
        add(row)
    return fold.finish()
