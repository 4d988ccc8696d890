"""The serving loop with each step's durable write pipelined behind the next step's forwards.

:class:`PipelinedServingLoop` runs the same rounds as :class:`~specround.serving.loop.ServingLoop`, with
the controller's :meth:`~specround.statemachine.controller.RoundController.submit_batch` in place of
``step_batch``. Step t's decision and K/V instruction are executed as soon as the controller has decided
and staged them; the round's group commit then runs on the controller's writer thread while step t + 1
drafts and verifies (torch releases the GIL during the forwards). Step t's rounds are *released* -- counted,
streamed to ``on_round``, returned, finished -- only once their write is durable, which is checked after
step t + 1 has been submitted. The tokens a caller sees are therefore the same, round for round, as in the
synchronous loop, and none of them is seen before its round is in the log. The draft-length policy is not a
caller: it observes step t's staged rounds at once, so that it chooses step t + 1's K from the same history
as the synchronous loop's policy would.

**Failures.** A write that fails or loses the fence aborts its rounds and every round built on them (the
controller rolls each request back to its last durable state). The loop then waits for the write in flight,
re-synchronises every request's target cache and proposer with its durable state (as after an exception
in the synchronous loop), and runs on: a round aborted by an injected fault is retried, any other abort
fails its request. Rounds dropped only because a round they were built on failed are not counted as
failures of their own.
"""

from __future__ import annotations

from dataclasses import dataclass

from specround.serving.loop import ServingLoop, _Prepared, _Round
from specround.serving.run_stats import RoundOutcome
from specround.statemachine.events import RoundTimings
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.step_result import PendingStep

__all__ = ["PipelinedServingLoop"]

_DELIVERED = (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)


@dataclass(slots=True)
class _InFlight:
    """A submitted step whose durable write may still be running."""

    prepared: _Prepared
    pending: PendingStep
    submit_s: float
    """Seconds the controller took to decide, stage and hand over the write."""


class PipelinedServingLoop(ServingLoop):
    """A :class:`ServingLoop` whose step t write overlaps step t + 1's drafting and verification."""

    _in_flight: _InFlight | None = None
    _rolled_back: frozenset[str] = frozenset()

    @property
    def in_flight(self) -> bool:
        """Whether a step's write is outstanding (its rounds are not released yet)."""
        return self._in_flight is not None

    def close(self) -> None:
        """Wait for the outstanding write (releasing its rounds), then release every request's caches."""
        if self._in_flight is not None:
            self._collect(self._in_flight)
            self._in_flight = None
        super().close()

    def _step(self, gap: float) -> list[RoundOutcome]:
        outcomes: list[RoundOutcome] = []
        if self._dirty and self._in_flight is not None:  # settle the write before re-synchronising
            outcomes += self._take_in_flight()
        plannable = [req for req in self._requests.values() if not req.state.finished]
        prepared = self._prepare(gap, plannable)
        if prepared is None:
            if self._in_flight is not None:
                outcomes += self._take_in_flight()
            elif self._requests and not outcomes:  # staged-finished requests with no write: resync them
                self._resync_all()
            return outcomes
        t0 = self._clock()
        args, options = self._batch_inputs(prepared.rounds, prepared.timings)
        pending = self.controller.submit_batch(*args, **options)
        self._execute_staged(prepared.rounds, pending)
        submit_s = self._clock() - t0
        self._observe_staged(prepared, pending, submit_s)
        self._live = []
        previous, self._in_flight = self._in_flight, _InFlight(prepared, pending, submit_s)
        if previous is not None:
            outcomes += self._collect(previous)
        return outcomes

    def _take_in_flight(self) -> list[RoundOutcome]:
        flight, self._in_flight = self._in_flight, None
        return self._collect(flight) if flight is not None else []

    def _execute_staged(self, rounds: list[_Round], pending: PendingStep) -> None:
        """Run each staged round's K/V instruction now; a row refused before staging drops its branch."""
        for rnd, decision in zip(rounds, pending.decisions, strict=True):
            rid = rnd.req.request_id
            branch = self._verified(rnd).branch
            if decision is None:
                self.target.discard(rid, branch)
                continue
            rnd.submitted = True
            self.target.commit(rid, branch, decision.keep)  # INV-5 on the staged instruction
            self._moved_on(rnd.req, self.controller.state(rid))

    def _observe_staged(self, prepared: _Prepared, pending: PendingStep, submit_s: float) -> None:
        """The draft-length policy observes the step's staged rounds as soon as they are decided.

        The synchronous loop's policy sees step t's rounds before it chooses step t + 1's K; so does this
        one, instead of one step later when step t is durable (a lag that cost K = auto about 10 % of its
        speed on repetitive text: more, shorter rounds while acceptance climbs). A staged round that then
        does not become durable is forgotten with its request's evidence (:meth:`_settle`): its redo draws
        the same uniforms, and the K chosen for it must not depend on what they decided.
        """
        share = submit_s / len(prepared.rounds)
        staged: list[RoundOutcome] = []
        state_costs: list[tuple[int, float]] = []
        for rnd, decision, timing in zip(prepared.rounds, pending.decisions, prepared.timings, strict=True):
            state_costs.append((len(rnd.drafts), rnd.rows_s + share))
            if decision is None:
                continue
            staged.append(
                RoundOutcome(
                    request_id=rnd.req.request_id,
                    generation=rnd.req.state.generation,  # the staged successor's
                    requested_k=rnd.k,
                    drafted=len(rnd.drafts),
                    accepted=decision.accepted,
                    reached=decision.reached,
                    emitted_ids=decision.emitted_ids,
                    terminal=decision.terminal,
                    finished=decision.finished,
                    finish_reason=decision.finish_reason,
                    timings=timing,
                )
            )
        self._observe(prepared, staged, state_costs)

    def _collect(self, flight: _InFlight) -> list[RoundOutcome]:
        """Wait for a submitted step's write and release its durable rounds (observed when staged)."""
        results = flight.pending.wait().results()
        prepared = flight.prepared
        outcomes, _ = self._settle_all(prepared.rounds, results, prepared.timings, flight.submit_s)
        return outcomes

    def _settle(self, rnd: _Round, result: RoundResult, timing: RoundTimings) -> RoundOutcome | None:
        """The durable outcome of a round whose K/V instruction already ran when it was staged."""
        req = rnd.req
        if result.status in _DELIVERED:
            return self._published_outcome(rnd, result, timing)
        if req.request_id in self._rolled_back:  # built on a write that failed: redone after the resync
            self._dirty = True
            if rnd.submitted:
                self.policy.forget(req.request_id)  # observed when staged, never durable
            return None
        if not rnd.submitted:  # refused before staging: its branch was dropped, its state never moved
            self._aborted(req, result)
            return None
        self._dirty = True  # the target ran an instruction that did not become durable (or lost its ack)
        if result.status is RoundStatus.ABORTED:
            self.policy.forget(req.request_id)  # observed when staged, never durable
            self._rolled_back = self._rolled_back | {req.request_id}
            self._aborted(req, result)
        return None

    def _resync_all(self) -> None:
        super()._resync_all()
        self._rolled_back = frozenset()
