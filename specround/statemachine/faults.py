"""Named fault points F-1..F-6 and the configuration that injects failures at them.

Contract: contract#fenced-publication, specs/faults.md.

A :class:`FaultPlan` is handed to the controller; at each point of a round the controller asks the plan
whether to fail there, and raises :class:`~specround.errors.InjectedFaultError` if so. No monkey-patching:
which point, which requests, which rounds and how many times are all data.

Guarantees the controller gives (and the tests check by digests):

* F-1..F-5 (before publication): the authoritative state and the log stay exactly as they were (INV-7);
  the round is ``ABORTED`` and may be retried with the same inputs, which re-derives the same decision
  (counter-based RNG, INV-3).
* F-6 (after publication, before the acknowledgement reaches the caller): the round *is* published;
  recovery is the idempotent acknowledgement — retrying the same round returns the already-published
  successor and appends nothing (INV-6).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

from specround.errors import InjectedFaultError, InvalidRequestError

__all__ = ["FAULT_POINTS_BEFORE_PUBLICATION", "NO_FAULT", "FaultPlan", "FaultPoint", "FaultRule"]

NO_FAULT = 0
"""The number that stands for "no fault" where a fault point is encoded as its number (F-n as n)."""


class FaultPoint(StrEnum):
    """Where in a round a failure is injected (numbering fixed in specs/faults.md)."""

    AFTER_VERIFICATION = "F-1"
    """After the target's rows were handed in (VERIFIED_TEMPORARY)."""
    AFTER_DECISION = "F-2"
    """After the acceptance decision (DECIDED)."""
    AFTER_KV_STAGING = "F-3"
    """After the K/V rows to commit and discard were staged."""
    AFTER_OUTPUT_STAGING = "F-4"
    """After the output, processor state and RNG counters were staged."""
    BEFORE_PUBLICATION = "F-5"
    """Immediately before the generation-fenced publication."""
    AFTER_PUBLICATION = "F-6"
    """After publication, before the acknowledgement reaches the caller."""

    @property
    def number(self) -> int:
        """``n`` of ``F-n`` (1..6): the integer a model that encodes fault points as numbers uses."""
        return int(self.value.removeprefix("F-"))

    @classmethod
    def numbered(cls, number: int) -> FaultPoint:
        """The point ``F-number``; raises ``ValueError`` for a number outside 1..6."""
        return cls(f"F-{number}")

    @property
    def before_publication(self) -> bool:
        """Whether a failure here must leave state and log unchanged (F-1..F-5)."""
        return self is not FaultPoint.AFTER_PUBLICATION

    @property
    def stage_title(self) -> str:
        """Where the point lies, in a few words (the coverage table's and the report's title)."""
        return _FAULT_TITLES[self]


_FAULT_TITLES: dict[FaultPoint, str] = {
    FaultPoint.AFTER_VERIFICATION: "after target verification",
    FaultPoint.AFTER_DECISION: "after the acceptance decision",
    FaultPoint.AFTER_KV_STAGING: "after staging K/V rows",
    FaultPoint.AFTER_OUTPUT_STAGING: "after staging output and processors",
    FaultPoint.BEFORE_PUBLICATION: "immediately before publication",
    FaultPoint.AFTER_PUBLICATION: "after publication, before the acknowledgement",
}


FAULT_POINTS_BEFORE_PUBLICATION: tuple[FaultPoint, ...] = tuple(p for p in FaultPoint if p.before_publication)
"""F-1..F-5."""


@dataclass(frozen=True, slots=True)
class FaultRule:
    """Fail at ``point`` for the matching rounds, at most ``times`` times (None: every time)."""

    point: FaultPoint
    request_ids: frozenset[str] | None = None
    """Requests it applies to; None means every request."""
    generations: frozenset[int] | None = None
    """Round numbers it applies to, as the generation the round would publish (1 for the first round);
    None means every round."""
    times: int | None = 1
    """How many times it fires in total; None means without limit."""

    def __post_init__(self) -> None:
        if not isinstance(self.point, FaultPoint):
            object.__setattr__(self, "point", FaultPoint(self.point))
        if self.times is not None and self.times < 1:
            raise InvalidRequestError(f"a fault rule fires at least once, got times={self.times}")

    def matches(self, point: FaultPoint, request_id: str, generation: int) -> bool:
        """Whether this rule covers the given round at the given point (ignoring how often it fired)."""
        return (
            point is self.point
            and (self.request_ids is None or request_id in self.request_ids)
            and (self.generations is None or generation in self.generations)
        )


@dataclass(slots=True)
class FaultPlan:
    """A set of fault rules with their remaining firing counts; safe to share between threads."""

    rules: tuple[FaultRule, ...] = ()
    _remaining: list[int | None] = field(init=False, repr=False)
    _fired: list[tuple[FaultPoint, str, int]] = field(init=False, repr=False)
    _points: frozenset[FaultPoint] = field(init=False, repr=False)
    _lock: threading.Lock = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.rules = tuple(self.rules)
        self._remaining = [rule.times for rule in self.rules]
        self._fired = []
        self._points = frozenset(rule.point for rule in self.rules)
        self._lock = threading.Lock()

    @classmethod
    def at(
        cls,
        point: FaultPoint | str,
        *,
        request_ids: Iterable[str] | None = None,
        generations: Iterable[int] | None = None,
        times: int | None = 1,
    ) -> FaultPlan:
        """A plan with a single rule."""
        rule = FaultRule(
            point=FaultPoint(point),
            request_ids=None if request_ids is None else frozenset(request_ids),
            generations=None if generations is None else frozenset(generations),
            times=times,
        )
        return cls((rule,))

    @property
    def points(self) -> frozenset[FaultPoint]:
        """Every point some rule targets (lets the controller skip the others cheaply)."""
        return self._points

    def add(self, rule: FaultRule) -> None:
        """Arm one more rule (e.g. between the steps of a test)."""
        with self._lock:
            self.rules = (*self.rules, rule)
            self._remaining.append(rule.times)
            self._points = self._points | {rule.point}

    @property
    def fired(self) -> tuple[tuple[FaultPoint, str, int], ...]:
        """``(point, request_id, generation)`` of every fault injected so far, in order."""
        with self._lock:
            return tuple(self._fired)

    def should_fail(self, point: FaultPoint, request_id: str, generation: int) -> bool:
        """Consume one firing of the first matching rule that has firings left; True if one did."""
        with self._lock:
            for index, rule in enumerate(self.rules):
                left = self._remaining[index]
                if (left is None or left > 0) and rule.matches(point, request_id, generation):
                    if left is not None:
                        self._remaining[index] = left - 1
                    self._fired.append((point, request_id, generation))
                    return True
            return False

    def check(self, point: FaultPoint, request_id: str, generation: int) -> None:
        """Raise :class:`InjectedFaultError` if the plan fails this round at this point."""
        if self.should_fail(point, request_id, generation):
            raise InjectedFaultError(
                point.value,
                f"injected fault at {point.value} for request {request_id!r}, generation {generation}",
            )
