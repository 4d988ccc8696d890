"""The executable invariants INV-1..INV-9 (specs/invariants.md), each written once as a named check.

Every check returns the :class:`Breach` es it finds (an empty list when the invariant holds) instead of
raising, so that each caller decides what a breach means: the Hypothesis state machine of
``tests/statemachine`` asserts there are none, the conformance walk of ``specround check``
(:mod:`specround.model_check.conformance`) records them as violations and goes on, and the audit
(:mod:`specround.audit`) turns them into findings. INV-10 (every logged decision re-derives) is the
audit's own re-derivation (:mod:`specround.audit.decision_audit`).

Three kinds of check:

* **state invariants**, which hold after every step for every published state:
  :func:`frontier_shape` (INV-1), :func:`processors_follow_output` (INV-4),
  :func:`live_projection_agrees` and :func:`head_agrees` (INV-8), :func:`replay_reproduces` (INV-8) and
  :func:`chain_intact` (INV-9); :func:`state_invariants` runs them all;
* **round invariants**, which a published round keeps between its start state and its successor:
  :func:`published_round` (INV-2, INV-3, INV-5, INV-6), with :func:`emission_respects_stops` (INV-2) the
  part the audit shares;
* **outcome invariants** of the attempts that must not publish a new round: :func:`fault_effect` (INV-7,
  and F-6 as INV-6), :func:`retry_acknowledged` and :func:`stale_writer_refused` (INV-6),
  :func:`finished_request_refused` (INV-2) and :func:`reload_agrees` (INV-8);
* **pipelined invariants** of rounds submitted with ``submit_batch`` (specs/faults.md, "Pipelined
  publication"): :func:`pipelined_in_flight` (INV-5, INV-7) while the write is outstanding,
  :func:`pipelined_matches_synchronous` (INV-6) for a round that became durable and
  :func:`pipelined_round_lost` (INV-7) for one that did not, :func:`pipelined_aborted_before_write`
  (INV-7) for one aborted before its write was handed over.

"The log unchanged" is decided on :func:`log_fingerprint`: the ``(request, seq, hash)`` of every stored
event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specround.errors import InjectedFaultError, RequestFinishedError, SpecroundError, StaleGenerationError
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.statemachine.chain_verification import verify_chain
from specround.statemachine.faults import FaultPoint
from specround.statemachine.ports import EventLog, LogHead
from specround.statemachine.replay import replay_states
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.staging import chain_from_config
from specround.statemachine.state import RequestConfig, RequestState

if TYPE_CHECKING:
    from specround.statemachine.controller import RoundController
    from specround.statemachine.step_result import RowDecision

__all__ = [
    "CHECKED_INVARIANTS",
    "INVARIANT_TITLES",
    "Breach",
    "LogFingerprint",
    "chain_intact",
    "emission_respects_stops",
    "fault_effect",
    "finished_request_refused",
    "frontier_shape",
    "head_agrees",
    "live_projection_agrees",
    "log_fingerprint",
    "pipelined_aborted_before_write",
    "pipelined_in_flight",
    "pipelined_matches_synchronous",
    "pipelined_round_lost",
    "processors_after",
    "processors_follow_output",
    "published_round",
    "reload_agrees",
    "replay_reproduces",
    "retry_acknowledged",
    "stale_writer_refused",
    "state_invariants",
]


@dataclass(frozen=True, slots=True)
class Breach:
    """One invariant that does not hold: its number (``"INV-n"``, specs/invariants.md) and what was seen."""

    invariant: str
    message: str

    def __str__(self) -> str:
        return f"{self.invariant}: {self.message}"


LogFingerprint = list[tuple[str, int, str]]
"""``(request, seq, hash)`` of every stored event, in the log's order."""

INVARIANT_TITLES: dict[str, str] = {
    "INV-1": "frontier shape: C == O[:-1], F == O[-1], P == len(C)",
    "INV-2": "growth min(A + 1, H); nothing after a stop; no round after finishing",
    "INV-3": "ACCEPT draws = reached tests, TERMINAL draws 1 (0 on a prefix stop)",
    "INV-4": "processors advance over published tokens only, in order",
    "INV-5": "K/V commits [F_0] + d_1..d_A; rejected and later rows discarded",
    "INV-6": "publication is a compare-and-swap; re-publication is idempotent",
    "INV-7": "a failure before publication changes nothing; F-6 recovery acknowledges",
    "INV-8": "replaying the log reproduces the live state",
    "INV-9": "hash chains detect every edit, drop, duplicate, reorder, insert",
    "INV-10": "every logged decision re-derives from the logged values",
}
"""Every invariant of specs/invariants.md with a one-line title (numbers are never reused)."""

CHECKED_INVARIANTS: tuple[str, ...] = tuple(f"INV-{n}" for n in range(1, 10))
"""The invariants the checks of this module decide (INV-10 is the audit's re-derivation of decisions)."""


def log_fingerprint(log: EventLog) -> LogFingerprint:
    """The log's fingerprint: equal fingerprints mean an unchanged log."""
    return [(e.request_id, e.seq, e.hash) for e in log.events()]


def _breach(holds: bool, invariant: str, message: str) -> list[Breach]:
    return [] if holds else [Breach(invariant, message)]


# --- state invariants -----------------------------------------------------------------------------------


def frontier_shape(request_id: str, state: RequestState) -> list[Breach]:
    """INV-1: ``C == O[:-1]``, ``F == O[-1]`` and ``P == len(C)`` (finished requests keep the shape too)."""
    holds = (
        state.cache == state.output[:-1]
        and state.frontier == state.output[-1]
        and state.position == len(state.cache)
    )
    return _breach(holds, "INV-1", f"{request_id}: C, F, P do not follow O")


def processors_after(config: RequestConfig, state: RequestState) -> ProcessorChain:
    """What the processor state G of ``state`` must be: the declared chain advanced over its tokens.

    The tokens are the output (prompt included) when ``config.prompt_advances_processors``, else the
    generated tokens.
    """
    chain = chain_from_config(config)
    chain.advance_many(state.output if config.prompt_advances_processors else state.generated)
    return chain


def processors_follow_output(config: RequestConfig, state: RequestState) -> list[Breach]:
    """INV-4: the processor state G is the declared chain advanced over the published tokens, in order."""
    holds = processors_after(config, state).digest() == state.processors_digest
    return _breach(
        holds,
        "INV-4",
        f"{state.request_id}: the processors were not advanced over exactly the published tokens",
    )


def head_agrees(
    request_id: str, head: LogHead | None, *, state_digest: str, generation: int, finished: bool
) -> list[Breach]:
    """INV-8: the log's head publishes this state (digest, generation and finished flag)."""
    if head is None:
        return [Breach("INV-8", f"{request_id}: the log has no head")]
    holds = (head.state_digest, head.generation, head.finished) == (state_digest, generation, finished)
    return _breach(
        holds,
        "INV-8",
        f"{request_id} is at generation {generation} (finished={finished}, digest "
        f"{state_digest[:16]}...); the head says {head.generation} (finished={head.finished}, digest "
        f"{head.state_digest[:16]}...)",
    )


def live_projection_agrees(
    request_id: str, published: RequestState, live: RequestState, head: LogHead | None
) -> list[Breach]:
    """INV-8: the controller's live projection and the log's head are the published state."""
    breaches = _breach(
        live == published, "INV-8", f"{request_id}: the live projection differs from the published state"
    )
    return breaches + head_agrees(
        request_id,
        head,
        state_digest=published.digest(),
        generation=published.generation,
        finished=published.finished,
    )


def replay_reproduces(log: EventLog, published: Mapping[str, RequestState]) -> list[Breach]:
    """INV-8: replaying the whole log gives exactly the published states (a refused replay breaks it)."""
    try:
        replayed = replay_states(log)
    except SpecroundError as error:
        return [Breach("INV-8", f"replay refuses the log: {error}")]
    return _breach(
        replayed == dict(published), "INV-8", "replaying the log does not give the published states"
    )


def chain_intact(log: EventLog, request_id: str) -> list[Breach]:
    """INV-9: the request's events form an unbroken hash chain ending at its head."""
    findings = verify_chain(log.events(request_id), log.head(request_id))
    return _breach(not findings, "INV-9", f"{request_id}: {[str(f) for f in findings]}")


def state_invariants(
    controller: RoundController, log: EventLog, published: Mapping[str, RequestState]
) -> list[Breach]:
    """Every state invariant for every published state: INV-1, INV-8 (live, head, replay), INV-9, INV-4."""
    breaches: list[Breach] = []
    for rid, state in published.items():
        breaches += frontier_shape(rid, state)
        breaches += live_projection_agrees(rid, state, controller.state(rid), log.head(rid))
    breaches += replay_reproduces(log, published)
    for rid in published:
        breaches += chain_intact(log, rid)
    for rid, state in published.items():
        breaches += processors_follow_output(controller.config(rid), state)
    return breaches


# --- round invariants -----------------------------------------------------------------------------------


def emission_respects_stops(
    emitted: Sequence[int], ends_request: Sequence[bool], remaining: int, finished: bool
) -> list[Breach]:
    """INV-2: nothing follows a stop, the budget holds, and the request finishes exactly when it must.

    No token follows one that ends the request, at most ``remaining`` tokens are emitted, and ``finished``
    holds exactly when the last token ends the request or the budget is used up.
    ``ends_request[i]``: whether ``emitted[i]`` is a stop at its offset (in the stop set of the chain
    advanced over ``emitted[:i]``).
    """
    n = len(emitted)
    breaches: list[Breach] = []
    early = [i for i in range(n - 1) if ends_request[i]]
    if early:
        breaches.append(
            Breach(
                "INV-2", f"token {emitted[early[0]]} at offset {early[0]} ends the request, yet more followed"
            )
        )
    if n > remaining:
        breaches.append(Breach("INV-2", f"{n} tokens emitted with {remaining} left in the budget"))
    should_finish = n > 0 and (bool(ends_request[n - 1]) or n >= remaining)
    if finished != should_finish:
        says = "finished" if should_finish else "unfinished"
        breaches.append(
            Breach("INV-2", f"finished={finished} after {list(emitted)}; stops and budget say {says}")
        )
    return breaches


def published_round(config: RequestConfig, before: RequestState, result: RoundResult) -> list[Breach]:
    """INV-2, INV-3, INV-5, INV-6 of one published round from ``before`` (its start state).

    Output grows by the emitted tokens, ``A + 1`` of them (``A`` on a stop inside the prefix) within the
    stops and the budget (INV-2); ACCEPT draws = reached tests and one TERMINAL draw unless a stop ended the
    prefix (INV-3); the K/V commit is ``[F_0] + emitted[:-1]`` (INV-5); the generation moves by one (INV-6).
    """
    after, kv = result.state, result.kv
    if after is None or kv is None:
        return [Breach("INV-6", f"{before.request_id}: no published state")]
    emitted = result.emitted_ids
    stop = result.terminal == "stop"
    breaches = _breach(after.output == before.output + emitted, "INV-2", f"output grew by {emitted} wrongly")
    breaches += _breach(
        len(emitted) == result.accepted + (0 if stop else 1),
        "INV-2",
        f"{len(emitted)} tokens emitted for A = {result.accepted} ({result.terminal})",
    )
    stop_sets = processors_after(config, before).stop_sets_along(emitted)
    ends_request = [token in stop_sets[i] for i, token in enumerate(emitted)]
    remaining = config.max_new_tokens - before.generated_count
    breaches += emission_respects_stops(emitted, ends_request, remaining, result.finished)
    draws = (after.rng.accept - before.rng.accept, after.rng.terminal - before.rng.terminal)
    reached = result.accepted + (1 if result.terminal == "correction" else 0)
    breaches += _breach(
        draws == (reached, 0 if stop else 1), "INV-3", f"draws {draws} for a {result.terminal} round"
    )
    breaches += _breach(
        bool(emitted) and kv.committed_token_ids == (before.frontier, *emitted[:-1]),
        "INV-5",
        f"committed {kv.committed_token_ids} for frontier {before.frontier} and {emitted}",
    )
    breaches += _breach(
        after.generation == before.generation + 1, "INV-6", "the generation did not move by one"
    )
    return breaches


# --- outcome invariants ---------------------------------------------------------------------------------


def fault_effect(
    point: FaultPoint,
    result: RoundResult,
    before: RequestState,
    authoritative: RequestState,
    *,
    log_unchanged: bool,
) -> list[Breach]:
    """INV-7 and INV-6 of a round that failed at ``point``.

    F-1..F-5 abort and change neither the state nor the log (INV-7); F-6 publishes the successor and
    withholds the acknowledgement (INV-6).
    ``before`` is the state the round started from, ``authoritative`` the state after the attempt.
    """
    breaches = _breach(
        isinstance(result.error, InjectedFaultError) and result.error.point == point.value,
        "INV-7",
        f"no injected fault at {point.value}: {result.error!r}",
    )
    if point.before_publication:
        breaches += _breach(result.status is RoundStatus.ABORTED, "INV-7", f"{point.value}: {result.status}")
        breaches += _breach(log_unchanged, "INV-7", f"{point.value} changed the log")
        breaches += _breach(
            authoritative.digest() == before.digest(), "INV-7", f"{point.value} changed the state"
        )
        return breaches
    breaches += _breach(result.status is RoundStatus.UNACKNOWLEDGED, "INV-6", f"F-6: {result.status}")
    breaches += _breach(authoritative.generation == before.generation + 1, "INV-6", "F-6 did not publish")
    return breaches


def retry_acknowledged(result: RoundResult, published: RequestState, *, log_unchanged: bool) -> list[Breach]:
    """INV-6: re-submitting a published round is acknowledged with its successor and appends nothing."""
    breaches = _breach(
        result.status is RoundStatus.ACKNOWLEDGED and result.state == published,
        "INV-6",
        f"retry: {result.status} {result.error!r}",
    )
    return breaches + _breach(log_unchanged, "INV-6", "the retry appended to the log")


def stale_writer_refused(result: RoundResult, *, log_unchanged: bool) -> list[Breach]:
    """INV-6: a writer that loaded an older generation loses the compare-and-swap and appends nothing."""
    breaches = _breach(
        result.status is RoundStatus.ABORTED and isinstance(result.error, StaleGenerationError),
        "INV-6",
        f"the stale writer got {result.status} ({result.error!r})",
    )
    return breaches + _breach(log_unchanged, "INV-6", "the stale writer appended to the log")


def finished_request_refused(result: RoundResult, *, log_unchanged: bool) -> list[Breach]:
    """INV-2: a round offered to a finished request is refused and appends nothing."""
    breaches = _breach(
        isinstance(result.error, RequestFinishedError), "INV-2", f"finished request: {result.status}"
    )
    return breaches + _breach(log_unchanged, "INV-2", "a finished request's round appended")


def reload_agrees(rebuilt: Mapping[str, RequestState], published: Mapping[str, RequestState]) -> list[Breach]:
    """INV-8: a controller that reloads every request from the log holds the published states."""
    holds = {rid: s.digest() for rid, s in rebuilt.items()} == {
        rid: s.digest() for rid, s in published.items()
    }
    return _breach(holds, "INV-8", "the reloaded controller disagrees with the published states")


# --- pipelined invariants -------------------------------------------------------------------------------


def pipelined_in_flight(
    request_id: str,
    decision: RowDecision | None,
    synchronous: RoundResult,
    *,
    settled: bool,
    log_unchanged: bool,
) -> list[Breach]:
    """INV-5 and INV-7 of a submitted round whose durable write has not completed yet.

    The engine already holds the round's decision and K/V instruction, and they are those of the same round
    stepped synchronously from the same state (``synchronous``: emitted tokens, A, terminal, finished,
    ``keep``, new frontier, the acceptance tests reached and the finish reason; INV-5); nothing of it is
    released or durable yet (its outcome is not ``settled`` and the log is unchanged; INV-7).
    """
    if decision is None:
        return [Breach("INV-5", f"{request_id}: the submitted round handed the engine no decision")]
    kv, state, commit = synchronous.kv, synchronous.state, synchronous.commit
    if kv is None or state is None or commit is None:
        return [Breach("INV-6", f"{request_id}: the synchronous reference round did not publish")]
    handed = (
        decision.emitted_ids,
        decision.accepted,
        decision.terminal,
        decision.finished,
        decision.keep,
        decision.new_frontier,
        decision.reached,
        decision.finish_reason,
    )
    reference = (
        synchronous.emitted_ids,
        synchronous.accepted,
        synchronous.terminal,
        synchronous.finished,
        kv.keep,
        state.frontier,
        commit.rng_after[1] - commit.rng_before[1],
        synchronous.finish_reason,
    )
    breaches = _breach(
        handed == reference,
        "INV-5",
        f"{request_id}: the engine was handed (emitted, A, terminal, finished, keep, frontier, tests "
        f"reached, finish reason) {handed}; stepped synchronously the round gives {reference}",
    )
    breaches += _breach(not settled, "INV-7", f"{request_id}: the round was settled before its write ran")
    return breaches + _breach(log_unchanged, "INV-7", f"{request_id}: the log changed before the write ran")


def pipelined_matches_synchronous(result: RoundResult, synchronous: RoundResult) -> list[Breach]:
    """INV-6: a pipelined round that became durable publishes the successor a synchronous publish gives."""
    holds = (
        result.status is RoundStatus.PUBLISHED
        and result.state is not None
        and synchronous.state is not None
        and result.state.digest() == synchronous.state.digest()
    )
    return _breach(
        holds,
        "INV-6",
        f"{result.request_id}: the pipelined round is {result.status.value}"
        + ("" if result.state is None else f" at generation {result.state.generation}")
        + "; it does not hold the successor the synchronous round publishes",
    )


def pipelined_round_lost(
    result: RoundResult, rollback_to: int, durable: RequestState, *, log_unchanged: bool
) -> list[Breach]:
    """INV-7 of a submitted round that did not become durable.

    Its write failed or lost the fence, or it was built on a round whose write did: it is ``ABORTED``,
    hands out no state and no tokens, ``rollback_to`` crops the request's K/V back to its last durable cache
    (``len(durable.cache)``), and the log is unchanged.
    """
    rid = result.request_id
    breaches = _breach(
        result.status is RoundStatus.ABORTED and result.state is None and not result.emitted_ids,
        "INV-7",
        f"{rid}: a round that did not become durable is {result.status.value}, releasing "
        f"{list(result.emitted_ids)}",
    )
    breaches += _breach(
        rollback_to == len(durable.cache),
        "INV-7",
        f"{rid}: rollback_to {rollback_to}, the durable cache holds {len(durable.cache)} rows",
    )
    return breaches + _breach(
        log_unchanged, "INV-7", f"{rid}: a round that did not become durable changed the log"
    )


def pipelined_aborted_before_write(
    request_id: str, decision: RowDecision | None, rollback_to: int
) -> list[Breach]:
    """INV-7: a submitted round aborted before its write was handed over (F-5) leaves the engine nothing.

    Its ``PendingStep`` decision is None (no K/V instruction to act on) and ``rollback_to`` is -1 (nothing
    to undo). :func:`fault_effect` decides the rest (the error, the state and the log unchanged).
    """
    breaches = _breach(
        decision is None, "INV-7", f"{request_id}: a round aborted at F-5 handed the engine a decision"
    )
    return breaches + _breach(
        rollback_to == -1, "INV-7", f"{request_id}: a round aborted at F-5 has rollback_to {rollback_to}"
    )
