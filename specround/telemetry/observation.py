"""What a serving process tells its telemetry about each round, free of any metrics library.

The serving loop builds one :class:`RoundObservation` per round it handed to the controller (published,
acknowledged, aborted or unacknowledged) from the controller's
:class:`~specround.statemachine.rounds.RoundResult` and the round's time ledger, and passes it to every
:class:`RoundRecorder` it was given. :class:`~specround.telemetry.metrics.SpecroundMetrics` is the
Prometheus recorder; the domain (``statemachine``) never sees either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from specround.errors import InjectedFaultError
from specround.statemachine.events import RoundTimings
from specround.statemachine.rounds import RoundResult

__all__ = ["RoundObservation", "RoundRecorder"]


@dataclass(frozen=True, slots=True)
class RoundObservation:
    """One round as telemetry sees it."""

    request_id: str
    round_id: str | None
    status: str
    """``published``, ``acknowledged``, ``aborted`` or ``unacknowledged`` (RoundStatus values)."""
    generation: int
    drafted: int
    """k: draft tokens proposed."""
    accepted: int
    """A (0 unless the round was published or acknowledged)."""
    emitted: int
    """G: output tokens the round published."""
    terminal: str | None
    finished: bool
    verify_rows: int
    """Temporary target rows the verification computed."""
    committed_rows: int
    """K/V rows the round committed (0 unless published)."""
    timings: RoundTimings | None
    error: str | None = None
    """The error class of an aborted or unacknowledged round."""
    fault_point: str | None = None
    """F-1..F-6 when an injected fault stopped the round."""

    @classmethod
    def from_result(
        cls, result: RoundResult, *, drafted: int, verify_rows: int, timings: RoundTimings | None
    ) -> RoundObservation:
        """Build from the controller's result and what the caller knows of the round."""
        error = result.error
        published = result.status.value in ("published", "acknowledged")
        return cls(
            request_id=result.request_id,
            round_id=result.round_id,
            status=result.status.value,
            generation=result.generation,
            drafted=drafted,
            accepted=result.accepted if published else 0,
            emitted=len(result.emitted_ids) if published else 0,
            terminal=result.terminal if published else None,
            finished=result.finished,
            verify_rows=verify_rows,
            committed_rows=result.kv.keep if published and result.kv is not None else 0,
            timings=timings,
            error=type(error).__name__ if error is not None else None,
            fault_point=error.point if isinstance(error, InjectedFaultError) else None,
        )


class RoundRecorder(Protocol):
    """Anything that consumes round observations (metrics, structured logs, tests)."""

    def observe_round(self, observation: RoundObservation) -> None:
        """Record one round."""
        ...
