"""Audit a log through the EventLog port: hash chains, replay, heads, and every decision re-derived.

For each request (streamed one request at a time): the hash chain is verified against the log's head
(INV-9, findings by name); replay rebuilds the state from the events alone, re-staging every round exactly
as the controller does (INV-1, INV-3..INV-6, INV-8 — a sequence it refuses is a ``replay`` finding); the
replayed state must equal the head's state digest, generation and finished flag (INV-8); and every round's
decision is re-derived from the logged values and the counter-based RNG (INV-10, INV-2;
:mod:`specround.audit.decisions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specround.audit.decisions import DecisionAuditor
from specround.audit.report import AuditFinding, AuditReport, RequestAudit
from specround.errors import EventLogError, LogIntegrityError
from specround.statemachine.chain import verify_chain
from specround.statemachine.ports import EventLog
from specround.statemachine.replay import replay_request

__all__ = ["ReplayCheck", "audit_log", "audit_request", "replay_against_heads"]


def audit_request(log: EventLog, request_id: str) -> RequestAudit:
    """Audit one request of ``log``."""
    events = list(log.events(request_id))
    head = log.head(request_id)
    findings: list[AuditFinding] = [
        AuditFinding(
            request_id=request_id, invariant="INV-9", kind=f.kind.value, seq=f.seq, message=f.message
        )
        for f in verify_chain(events, head)
    ]
    if not events:
        findings.append(
            AuditFinding(
                request_id=request_id, invariant="INV-8", kind="replay", message="the request has no events"
            )
        )
        return RequestAudit(
            request_id=request_id,
            events=0,
            rounds=0,
            generation=None,
            state_digest=None,
            head_digest=head.state_digest if head else None,
            finished=None,
            findings=tuple(findings),
        )
    auditor = DecisionAuditor(request_id)
    generation = digest = finished = None
    try:
        replayed = replay_request(events, on_round=auditor)
    except (LogIntegrityError, EventLogError) as exc:
        findings.append(
            AuditFinding(request_id=request_id, invariant="INV-8", kind="replay", message=str(exc))
        )
    else:
        state = replayed.state
        generation, digest, finished = state.generation, replayed.snapshot.digest, state.finished
        if head is None:
            findings.append(
                AuditFinding(
                    request_id=request_id, invariant="INV-8", kind="head", message="the log has no head"
                )
            )
        elif (head.state_digest, head.generation, head.finished) != (digest, generation, finished):
            findings.append(
                AuditFinding(
                    request_id=request_id,
                    invariant="INV-8",
                    kind="head",
                    message=(
                        f"replay reaches generation {generation} (finished={finished}, "
                        f"digest {digest[:16]}...); the head says {head.generation} "
                        f"(finished={head.finished}, digest {head.state_digest[:16]}...)"
                    ),
                )
            )
    findings.extend(auditor.finish())
    return RequestAudit(
        request_id=request_id,
        events=len(events),
        rounds=auditor.rounds,
        generation=generation,
        state_digest=digest,
        head_digest=head.state_digest if head else None,
        finished=finished,
        findings=tuple(findings),
    )


def audit_log(log: EventLog, request_ids: Iterable[str] | None = None) -> AuditReport:
    """Audit every request of ``log`` (or the given ones), one request at a time."""
    ids = list(request_ids) if request_ids is not None else log.request_ids()
    return AuditReport(requests=tuple(audit_request(log, rid) for rid in ids))


@dataclass(frozen=True, slots=True)
class ReplayCheck:
    """One request rebuilt from its events and compared with the log's head (the live projection)."""

    request_id: str
    events: int
    rounds: int
    generation: int | None
    state_digest: str | None
    head_generation: int | None
    head_digest: str | None
    error: str | None
    """Why replay refused the events, if it did."""

    @property
    def ok(self) -> bool:
        """Whether replay succeeded and reproduced the head exactly (INV-8)."""
        return (
            self.error is None
            and self.state_digest is not None
            and (self.state_digest, self.generation) == (self.head_digest, self.head_generation)
        )


def replay_against_heads(log: EventLog, request_id: str | None = None) -> list[ReplayCheck]:
    """Replay every request (or one) from its events and compare with the log's head state digests."""
    ids = [request_id] if request_id is not None else log.request_ids()
    checks = []
    for rid in ids:
        head = log.head(rid)
        head_generation = head.generation if head else None
        head_digest = head.state_digest if head else None
        events = list(log.events(rid))
        try:
            replayed = replay_request(events)
        except (LogIntegrityError, EventLogError) as exc:
            checks.append(
                ReplayCheck(rid, len(events), 0, None, None, head_generation, head_digest, str(exc))
            )
            continue
        checks.append(
            ReplayCheck(
                rid,
                replayed.events,
                replayed.rounds,
                replayed.state.generation,
                replayed.snapshot.digest,
                head_generation,
                head_digest,
                None,
            )
        )
    return checks
