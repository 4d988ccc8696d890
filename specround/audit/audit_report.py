"""What an audit finds: findings by invariant, per request, and the whole log's report."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["AuditFinding", "AuditReport", "RequestAudit"]

_FROZEN = ConfigDict(frozen=True)


class AuditFinding(BaseModel):
    """One violated check."""

    model_config = _FROZEN

    request_id: str
    invariant: str
    """The invariant it violates, e.g. ``"INV-9"`` (numbering of specs/invariants.md)."""
    kind: str
    """What was found: a hash-chain finding by name (``edited``, ``dropped``, ``duplicated``,
    ``reordered``, ``inserted``, ``malformed``: a row that cannot be read as an event), ``orphan`` (events
    of a request the log has no head for), ``unreadable`` (a read of the log failed), ``replay`` (an
    event sequence replay refuses), ``head``, ``acceptance``, ``uniform``, ``terminal``, ``emitted``,
    ``stop``; with a key or an anchor (invariant ``SIGNED``): ``unsigned``, ``forged``, ``rewritten``,
    ``rewound``. ``audit-error`` is the audit's own safety net and should never appear."""
    seq: int | None = None
    round_id: str | None = None
    message: str

    def __str__(self) -> str:
        where = "".join(
            [
                f" seq {self.seq}" if self.seq is not None else "",
                f" round {self.round_id}" if self.round_id else "",
            ]
        )
        return f"{self.invariant} {self.kind}: request {self.request_id!r}{where}: {self.message}"


class RequestAudit(BaseModel):
    """The audit of one request."""

    model_config = _FROZEN

    request_id: str
    events: int
    rounds: int
    """Rounds replay accepted and whose decisions were re-derived."""
    generation: int | None
    """The replayed generation (None when replay refused the log)."""
    state_digest: str | None
    head_digest: str | None
    finished: bool | None
    findings: tuple[AuditFinding, ...] = ()

    @property
    def ok(self) -> bool:
        """Whether every check passed."""
        return not self.findings


class AuditReport(BaseModel):
    """The audit of a whole log (or of the requests asked for)."""

    model_config = _FROZEN

    requests: tuple[RequestAudit, ...]

    @property
    def ok(self) -> bool:
        """Whether every request audits clean."""
        return all(r.ok for r in self.requests)

    @property
    def findings(self) -> list[AuditFinding]:
        """Every finding, request by request."""
        return [f for r in self.requests for f in r.findings]

    @property
    def events(self) -> int:
        """Events read."""
        return sum(r.events for r in self.requests)

    @property
    def rounds(self) -> int:
        """Rounds re-derived."""
        return sum(r.rounds for r in self.requests)

    def counts(self) -> dict[str, int]:
        """Findings per invariant."""
        out: dict[str, int] = {}
        for finding in self.findings:
            out[finding.invariant] = out.get(finding.invariant, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> dict[str, object]:
        """A JSON-able summary (what ``specround audit --json`` prints, with the findings)."""
        return {
            "ok": self.ok,
            "requests": len(self.requests),
            "events": self.events,
            "rounds": self.rounds,
            "findings_by_invariant": self.counts(),
            "findings": [f.model_dump() for f in self.findings],
        }
