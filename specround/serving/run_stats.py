"""What the serving loop measured: per-round outcomes and the acceptance/throughput summary of a run.

:class:`RoundOutcome` is one published round as the loop saw it (drafts asked for and received, accepted
count, reached acceptance tests, emitted tokens, the time ledger). :class:`AcceptanceStats` folds outcomes
into the quantities of the speedup ledger (contract#accepted-prefix, contract#serving-telemetry): accepted /
proposed drafts, the reach-conditioned acceptance ``alpha_j^reach`` by draft position (a test counts at
position j only if the round *reached* it: the ACCEPT draws of INV-3), mean accepted length, tokens per round
and the time split.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from specround.ledger import ReachCount
from specround.statemachine.events import RoundTimings
from specround.statemachine.state import FinishReason, TerminalName

__all__ = ["AcceptanceStats", "ReachCount", "RoundOutcome"]


@dataclass(frozen=True, slots=True)
class RoundOutcome:
    """One published round of one request."""

    request_id: str
    generation: int
    """The generation the round published."""
    requested_k: int
    """Drafts the policy asked the proposer for (after the budget and context caps)."""
    drafted: int
    """Drafts verified: the prefix of the proposal the policy kept (a lookup may offer fewer than asked)."""
    accepted: int
    """A: drafts emitted as accepted."""
    reached: int
    """Acceptance tests the round reached (its ACCEPT draws, INV-3)."""
    emitted_ids: tuple[int, ...]
    """The tokens the round published, in order."""
    terminal: TerminalName
    finished: bool
    finish_reason: FinishReason | None
    timings: RoundTimings
    """The round's share of the step's wall time (see :mod:`specround.serving.loop`)."""

    @property
    def emitted(self) -> int:
        """G: tokens the round published."""
        return len(self.emitted_ids)

    @property
    def seconds(self) -> float:
        """``T_round = T_D + T_V + T_S + T_Q`` of the round."""
        t = self.timings
        return math.fsum((t.draft_s, t.verify_s, t.state_s, t.queue_s))


@dataclass(slots=True)
class AcceptanceStats:
    """Running totals over published rounds (one request, or a whole run)."""

    rounds: int = 0
    speculative_rounds: int = 0
    """Rounds that verified at least one draft."""
    generated: int = 0
    proposed: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    state_s: float = 0.0
    queue_s: float = 0.0
    reached_at: list[int] = field(default_factory=list)
    """``reached_at[j - 1]``: rounds whose acceptance test j was reached."""
    accepted_at: list[int] = field(default_factory=list)
    """``accepted_at[j - 1]``: rounds whose draft j was accepted (after reaching it)."""
    finished: int = 0

    def add(self, outcome: RoundOutcome) -> None:
        """Fold one round in."""
        self.rounds += 1
        self.generated += outcome.emitted
        self.proposed += outcome.drafted
        self.accepted += outcome.accepted
        if outcome.drafted:
            self.speculative_rounds += 1
        while len(self.reached_at) < outcome.reached:
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for j in range(outcome.reached):
            self.reached_at[j] += 1
            if j < outcome.accepted:
                self.accepted_at[j] += 1
        t = outcome.timings
        self.draft_s += t.draft_s
        self.verify_s += t.verify_s
        self.state_s += t.state_s
        self.queue_s += t.queue_s
        if outcome.finished:
            self.finished += 1

    def extend(self, outcomes: Iterable[RoundOutcome]) -> None:
        """Fold several rounds in."""
        for outcome in outcomes:
            self.add(outcome)

    @property
    def reach(self) -> tuple[ReachCount, ...]:
        """``alpha_j^reach`` evidence for every position some round reached."""
        return tuple(
            ReachCount(j + 1, reached, accepted)
            for j, (reached, accepted) in enumerate(zip(self.reached_at, self.accepted_at, strict=True))
        )

    @property
    def alpha_reach(self) -> tuple[float, ...]:
        """Reach-conditioned acceptance by draft position (positions no round reached are left out)."""
        return tuple(c.rate for c in self.reach if c.rate is not None)

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed drafts (None without drafts)."""
        return self.accepted / self.proposed if self.proposed else None

    @property
    def mean_accepted(self) -> float | None:
        """Mean A over rounds that verified at least one draft."""
        return self.accepted / self.speculative_rounds if self.speculative_rounds else None

    @property
    def tokens_per_round(self) -> float | None:
        """Mean G over all rounds."""
        return self.generated / self.rounds if self.rounds else None

    @property
    def logged_seconds(self) -> float:
        """Sum of the rounds' time ledgers."""
        return math.fsum((self.draft_s, self.verify_s, self.state_s, self.queue_s))
