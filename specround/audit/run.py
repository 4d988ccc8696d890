"""Audit a log through the EventLog port: hash chains, replay, heads, and every decision re-derived.

For each request (streamed one request at a time): the hash chain is verified against the log's head
(INV-9, findings by name); replay rebuilds the state from the events alone, re-staging every round exactly
as the controller does (INV-1, INV-3..INV-6, INV-8 — a sequence it refuses is a ``replay`` finding); the
replayed state must equal the head's state digest, generation and finished flag (INV-8); and every round's
decision is re-derived from the logged values and the counter-based RNG (INV-10, INV-2;
:mod:`specround.audit.decision_audit`).

A request's events are streamed once: the chain check
(:class:`~specround.statemachine.chain_verification.ChainCheck`) judges each event as replay takes it and
keeps only its links, so the audit holds no more of a request's events than replay's round in flight (and
the events replay refused to go on with are read to their end for the chain check alone). Where the log
streams well-formed rounds whole (the SQL log's ``event_items``), the chain check and replay each take a
round at once, its five hashes computed once for both. The head is read
after the events, and the findings are reported in the order of the checks above. The whole-log audit
finishes the RNG and acceptance checks of up to 64 requests together (one Philox call and one acceptance
test for all their draws, :func:`~specround.audit.decision_audit.finish_all`): a serving log of many short
requests would otherwise pay numpy's and torch's per-call price once per request.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specround.audit.audit_report import AuditFinding, AuditReport, RequestAudit
from specround.audit.decision_audit import DecisionAuditor, finish_all
from specround.errors import SpecroundError
from specround.statemachine.chain_verification import ChainCheck
from specround.statemachine.invariants import head_agrees
from specround.statemachine.ports import (
    EventLog,
    LogHead,
    StoredEvent,
    StoredRound,
    stored_events_of,
    stored_items,
)
from specround.statemachine.replay import replay_request

__all__ = ["ReplayCheck", "audit_log", "audit_request", "replay_against_heads", "with_findings"]


def _finding(
    request_id: str, invariant: str, kind: str, message: str, seq: int | None = None
) -> AuditFinding:
    return AuditFinding(request_id=request_id, invariant=invariant, kind=kind, seq=seq, message=message)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


class _StreamBrokeError(Exception):
    """The log's event stream raised while a request's events were being audited.

    Not a :class:`~specround.errors.SpecroundError`, so that neither replay's refusal handling nor the
    audit's catches it on the way out: the caller drops that request's partial audit.
    """

    def __init__(self, error: SpecroundError) -> None:
        super().__init__(str(error))
        self.error = error


_Item = StoredEvent | StoredRound
"""What a log's stream holds: events, and whole rounds where the log streams them
(:func:`~specround.statemachine.ports.stored_items`)."""


class _Source:
    """A log's event stream, read one item at a time; a read that fails raises :class:`_StreamBrokeError`."""

    def __init__(self, stream: Iterator[_Item]) -> None:
        self._stream = stream
        self.following: _Item | None = None
        """The item after the request just read to its end (None: the stream ended)."""

    def pull(self) -> _Item | None:
        """The next event, or None at the end of the stream."""
        try:
            return next(self._stream, None)
        except SpecroundError as exc:
            raise _StreamBrokeError(exc) from exc

    def request(self, first: _Item, tally: _Tally, *, whole: bool) -> Iterator[_Item]:
        """``first`` and the items after it of its request (``whole``: every item left in the stream).

        Each is fed to ``tally``'s chain check and its events counted before it is passed on; at the end,
        :attr:`following` is the item that ended the request.
        """
        stream = self._stream
        chain = tally.chain
        judging = True
        request_id = first.request_id
        tally.first_seq = first.first_seq if isinstance(first, StoredRound) else first.seq
        count = 0
        event: _Item | None = first
        try:
            while event is not None and (whole or event.request_id == request_id):
                count += stored_events_of(event)
                if judging:
                    try:
                        if isinstance(event, StoredRound):
                            chain.feed_round(event)
                        else:
                            chain.feed(event)
                    except Exception as exc:  # a payload without bytes that cannot be serialised
                        tally.chain_error, judging = exc, False
                yield event
                try:
                    event = next(stream, None)
                except SpecroundError as exc:
                    raise _StreamBrokeError(exc) from exc
        finally:
            tally.events = count
        self.following = event


@dataclass(slots=True)
class _Tally:
    """What the audit keeps of a request's events as they stream past: the chain check and a count."""

    chain: ChainCheck
    events: int = 0
    first_seq: int | None = None
    chain_error: Exception | None = None
    """Why the chain check could not judge an event (it then judges no more of them)."""


def audit_request(log: EventLog, request_id: str) -> RequestAudit:
    """Audit one request of ``log`` (read on its own; a damaged log gives findings, never an exception)."""
    try:
        source = _Source(stored_items(log, request_id))
        return _audit_events(log, request_id, source, source.pull(), [], whole=True)
    except (SpecroundError, _StreamBrokeError) as exc:
        error = exc.error if isinstance(exc, _StreamBrokeError) else exc
        findings = [_finding(request_id, "INV-9", "unreadable", f"the events cannot be read: {_why(error)}")]
        return _audit_events(log, request_id, None, None, findings)


@runtime_checkable
class _HeadListing(Protocol):
    """A log that lists every request's head in one read (the SQL event log)."""

    def heads(self) -> list[LogHead]:
        """Every request's head (raises when a head row cannot be read)."""
        ...


def _listed_heads(log: EventLog) -> dict[str, LogHead] | None:
    """Every head of ``log`` by request id, read at once.

    None when the log cannot list them or one row is unreadable: the audit then reads each request's head
    on its own, which names the bad row.
    """
    if not isinstance(log, _HeadListing):
        return None
    try:
        return {head.request_id: head for head in log.heads()}
    except SpecroundError:
        return None


def _read_head(
    log: EventLog,
    request_id: str,
    findings: list[AuditFinding],
    heads: Mapping[str, LogHead] | None = None,
) -> tuple[bool, LogHead | None]:
    """(readable, head), from ``heads`` when given; a head row that cannot be read is a ``head`` finding."""
    if heads is not None:
        return True, heads.get(request_id)
    try:
        return True, log.head(request_id)
    except SpecroundError as exc:
        findings.append(_finding(request_id, "INV-8", "head", f"the head cannot be read: {_why(exc)}"))
        return False, None


def _audit_events(
    log: EventLog,
    request_id: str,
    source: _Source | None,
    first: _Item | None,
    findings: list[AuditFinding],
    *,
    whole: bool = False,
    in_table: bool | None = None,
    heads: Mapping[str, LogHead] | None = None,
) -> RequestAudit:
    """Audit one request's events, read once as they stream, against its head, read after them.

    :func:`_audit_pending` with the decision checks finished at once.
    """
    return _completed([_audit_pending(log, request_id, source, first, findings, whole, in_table, heads)])[0]


@dataclass(frozen=True, slots=True)
class _PendingAudit:
    """A request's audit whose RNG and acceptance checks still wait for their batch (:func:`_completed`)."""

    audit: RequestAudit
    """The audit with every finding but the decision checks'."""
    auditor: DecisionAuditor | None
    """None for a request with no readable events (nothing to re-derive)."""


def _completed(pending: list[_PendingAudit]) -> list[RequestAudit]:
    """Finish the decision checks of ``pending`` as one batch (:func:`finish_all`); their audits, in order."""
    decided = iter(finish_all([p.auditor for p in pending if p.auditor is not None]))
    return [
        p.audit
        if p.auditor is None
        else p.audit.model_copy(update={"findings": (*p.audit.findings, *next(decided))})
        for p in pending
    ]


def _audit_pending(
    log: EventLog,
    request_id: str,
    source: _Source | None,
    first: _Item | None,
    findings: list[AuditFinding],
    whole: bool,
    in_table: bool | None,
    heads: Mapping[str, LogHead] | None,
) -> _PendingAudit:
    """:func:`_audit_events` up to the decision checks, which the caller finishes (:func:`_completed`).

    The events are ``first`` and the rest of its request in ``source`` (``whole``: every event left in it;
    no events when ``first`` is None).
    ``in_table``: whether the log lists the request (None: not known, e.g. a request audited by id).
    ``heads``: every head of the log, already read (None: read this request's head after its events).
    A failing read of the events raises :class:`_StreamBrokeError` (and nothing of the request is reported).
    """
    tally = _Tally(ChainCheck())
    chain = tally.chain
    auditor = DecisionAuditor(request_id)
    replayed = None
    refused: AuditFinding | None = None
    if first is not None:
        assert source is not None
        stream = source.request(first, tally, whole=whole)
        try:
            # verify_hashes with the chain check's verdicts: each event's hash is computed once.
            replayed = replay_request(stream, hash_check=chain.hash_matches, on_round=auditor)
        except _StreamBrokeError:
            raise
        except SpecroundError as exc:
            refused = _finding(request_id, "INV-8", "replay", str(exc))
        except Exception as exc:  # pragma: no cover - replay names every refusal; kept so the audit goes on
            refused = _finding(request_id, "INV-8", "audit-error", f"replay failed: {_why(exc)}")
        for _ in stream:  # the events after a refusal: the chain check reads them all
            pass
    readable, head = _read_head(log, request_id, findings, heads)
    if readable and head is None and tally.events:
        findings.append(
            _finding(
                request_id,
                "INV-9",
                "orphan",
                f"{tally.events} event(s) of a request the log has no head for (a deleted request row?)",
                seq=tally.first_seq,
            )
        )
    elif in_table is False and head is not None:
        findings.append(_finding(request_id, "INV-8", "head", "the request is missing from the request list"))
    try:
        if tally.chain_error is not None:
            raise tally.chain_error
        found = chain.findings(head)
        findings.extend(_finding(request_id, "INV-9", f.kind.value, f.message, seq=f.seq) for f in found)
    except Exception as exc:  # pragma: no cover - the chain check reads every field defensively
        findings.append(_finding(request_id, "INV-9", "audit-error", f"the chain check failed: {_why(exc)}"))
    head_digest = head.state_digest if head else None
    if not tally.events:
        if readable and head is not None:
            findings.append(_finding(request_id, "INV-9", "dropped", "the request has a head but no events"))
        elif not findings:
            findings.append(_finding(request_id, "INV-8", "replay", "the request has no events"))
        return _PendingAudit(_findings_only(request_id, findings, head_digest), None)
    generation = digest = finished = None
    if refused is not None:
        findings.append(refused)
    elif replayed is not None:
        state = replayed.state
        generation, digest, finished = state.generation, replayed.snapshot.digest, state.finished
        if head is None:
            if readable and not any(f.kind == "orphan" for f in findings):
                findings.append(_finding(request_id, "INV-8", "head", "the log has no head"))
        else:
            findings.extend(
                _finding(request_id, breach.invariant, "head", f"replay: {breach.message}")
                for breach in head_agrees(
                    request_id, head, state_digest=digest, generation=generation, finished=finished
                )
            )
    audit = RequestAudit(
        request_id=request_id,
        events=tally.events,
        rounds=auditor.rounds,
        generation=generation,
        state_digest=digest,
        head_digest=head_digest,
        finished=finished,
        findings=tuple(findings),
    )
    return _PendingAudit(audit, auditor)


_LOG = "(log)"
"""The request id of findings about the whole log rather than one request."""
_BATCHED_REQUESTS = 64
"""Requests whose decision checks :func:`audit_log` finishes together (their draws are all it keeps)."""


def audit_log(log: EventLog, request_ids: Iterable[str] | None = None) -> AuditReport:
    """Audit every request of ``log`` (or the given ones), one request at a time.

    The whole-log audit enumerates requests from the events as well as from the log's request list, so
    events whose request row was deleted are reported (``orphan``), and so is a listed request without
    events. A log that lists its heads (the SQL log) has them read once, after its request ids; otherwise
    each request's head is read after its events. Nothing a damaged log holds raises: a row, payload, head
    or schema the audit cannot read is a named finding, and the audit goes on with the rest of the log.
    """
    if request_ids is not None:
        return AuditReport(requests=tuple(audit_request(log, rid) for rid in dict.fromkeys(request_ids)))
    audits: list[RequestAudit] = []
    log_findings: list[AuditFinding] = []
    listed: list[str] = []
    try:
        listed = list(log.request_ids())
    except SpecroundError as exc:
        log_findings.append(
            _finding(_LOG, "INV-9", "unreadable", f"the request list cannot be read: {_why(exc)}")
        )
    listed_set = set(listed)
    heads = _listed_heads(log)  # one read instead of one per request, where the log can list them
    seen: set[str] = set()
    pending: list[_PendingAudit] = []
    try:
        source = _Source(stored_items(log))
        event = source.pull()
        while event is not None:
            request_id = event.request_id
            if request_id in seen:  # pragma: no cover - the port orders the stream by request
                for _ in source.request(event, _Tally(ChainCheck()), whole=False):
                    pass
                log_findings.append(_finding(request_id, "INV-9", "reordered", "events not stored together"))
            else:
                pending.append(
                    _audit_pending(log, request_id, source, event, [], False, request_id in listed_set, heads)
                )
                seen.add(request_id)
                if len(pending) >= _BATCHED_REQUESTS:
                    audits.extend(_completed(pending))
                    pending.clear()
            event = source.following
    except (SpecroundError, _StreamBrokeError) as exc:
        error = exc.error if isinstance(exc, _StreamBrokeError) else exc
        log_findings.append(
            _finding(_LOG, "INV-9", "unreadable", f"the event stream broke off: {_why(error)}")
        )
        for request_id in listed:  # read the requests the stream did not reach one by one
            if request_id not in seen:
                seen.add(request_id)
                audits.append(audit_request(log, request_id))
    audits.extend(_completed(pending))
    for request_id in listed:
        if request_id not in seen:
            audits.append(_audit_events(log, request_id, None, None, [], in_table=True, heads=heads))
    if log_findings:
        audits.append(_findings_only(_LOG, log_findings))
    audits.sort(key=lambda a: a.request_id)
    return AuditReport(requests=tuple(audits))


def _findings_only(
    request_id: str, findings: Iterable[AuditFinding], head_digest: str | None = None
) -> RequestAudit:
    """The audit entry of an id with no readable events: its findings, and its head's digest if any."""
    return RequestAudit(
        request_id=request_id,
        events=0,
        rounds=0,
        generation=None,
        state_digest=None,
        head_digest=head_digest,
        finished=None,
        findings=tuple(findings),
    )


def with_findings(report: AuditReport, findings: Iterable[AuditFinding]) -> AuditReport:
    """``report`` with more findings added to the requests they name (new entries for other ids)."""
    extra: dict[str, list[AuditFinding]] = {}
    for finding in findings:
        extra.setdefault(finding.request_id, []).append(finding)
    if not extra:
        return report
    audits = []
    for audit in report.requests:
        more = extra.pop(audit.request_id, [])
        audits.append(audit.model_copy(update={"findings": (*audit.findings, *more)}) if more else audit)
    for request_id, more in extra.items():
        audits.append(_findings_only(request_id, more))
    audits.sort(key=lambda a: a.request_id)
    return AuditReport(requests=tuple(audits))


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
    """Replay every request (or one) from its events and compare with the log's head state digests.

    A head or event that cannot be read is that request's ``error``; nothing a damaged log holds raises.
    """
    ids = [request_id] if request_id is not None else log.request_ids()
    checks = []
    for rid in ids:
        items: list[_Item] = []
        head_generation = head_digest = None
        try:
            head = log.head(rid)
            head_generation = head.generation if head else None
            head_digest = head.state_digest if head else None
            items = list(stored_items(log, rid))
            replayed = replay_request(items)
        except SpecroundError as exc:
            events = sum(map(stored_events_of, items))
            checks.append(ReplayCheck(rid, events, 0, None, None, head_generation, head_digest, str(exc)))
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
