"""Checks of a log against what was attested outside its hash chains: signatures and anchors.

* :func:`audit_signatures` verifies the signed heads and checkpoints a log written with a key holds
  (:mod:`specround.signing`) against the same key. Every request's current head must carry a valid
  signature (else ``unsigned``); every signed head must still be in its request's chain at its seq with its
  hash (else ``rewritten``: the history was rebuilt, truncated or rewound); a signature that does not verify
  is ``forged``; a signed request whose events are gone is ``dropped``; the newest checkpoint's heads must
  all be in their chains.
* :func:`anchor_of` lists every head of a log with a digest over the list, for storing elsewhere;
  :func:`audit_anchor` checks that each anchored head is still in its chain (truncation and rewinding
  since the anchor are ``rewound``, deleted requests ``dropped``).

Neither raises for a damaged log: what cannot be read is a finding.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from specround.audit.audit_report import AuditFinding
from specround.canonical import canonical_bytes, digest, load
from specround.errors import SpecroundError
from specround.signing import LogSigner, SignatureRow, SignedClaim, parse_claim
from specround.statemachine.ports import EventLog, LogHead

__all__ = ["SIGNED", "SignedLog", "anchor_bytes", "anchor_of", "audit_anchor", "audit_signatures"]

SIGNED = "SIGNED"
"""The ``invariant`` of findings about signatures and anchors."""
_LOG = "(log)"

Head = tuple[str, int, int, str, str, bool]


@runtime_checkable
class SignedLog(Protocol):
    """A log that can list its heads and stored signatures (the SQL event log)."""

    def heads(self) -> list[LogHead]:
        """Every request's head."""
        ...

    def signature_rows(self) -> list[SignatureRow]:
        """Every stored signature, oldest first."""
        ...


def _finding(request_id: str | None, kind: str, message: str, seq: int | None = None) -> AuditFinding:
    return AuditFinding(request_id=request_id or _LOG, invariant=SIGNED, kind=kind, seq=seq, message=message)


def _chains(log: EventLog) -> dict[str, dict[int, str]]:
    """The hash of every stored event by seq, by request."""
    chains: dict[str, dict[int, str]] = {}
    for event in log.events():
        chains.setdefault(event.request_id, {})[event.seq] = event.hash
    return chains


def _head_tuple(head: LogHead) -> Head:
    return (head.request_id, head.generation, head.seq, head.hash, head.state_digest, head.finished)


def _claims(
    rows: Iterable[SignatureRow], signer: LogSigner, findings: list[AuditFinding]
) -> list[tuple[SignatureRow, SignedClaim]]:
    valid = []
    for row in rows:
        where = f"signature #{row.id}"
        if row.defect is not None:
            findings.append(_finding(row.request_id, "malformed", f"{where}: {row.defect}"))
            continue
        if row.scheme != signer.scheme or row.key_id != signer.key_id:
            findings.append(
                _finding(
                    row.request_id,
                    "forged",
                    f"{where} was made with {row.scheme} key {row.key_id!r}, not this key "
                    f"({signer.scheme} {signer.key_id!r})",
                )
            )
            continue
        if not signer.verify(row.message, row.signature):
            findings.append(_finding(row.request_id, "forged", f"{where} does not verify with this key"))
            continue
        try:
            claim = parse_claim(load(row.message))
        except Exception:  # a verified message is the writer's own canonical JSON; kept for safety
            claim = None
        if (
            claim is None
            or claim.kind != row.scope
            or (claim.kind == "head" and [h[0] for h in claim.heads] != [row.request_id])
        ):
            findings.append(_finding(row.request_id, "malformed", f"{where} signs no head claim"))
            continue
        valid.append((row, claim))
    return valid


def audit_signatures(log: EventLog, signer: LogSigner) -> list[AuditFinding]:
    """Every finding about the signed heads and checkpoints of ``log`` under ``signer``'s key."""
    if not isinstance(log, SignedLog):
        return [_finding(None, "unsigned", "this kind of log keeps no signatures")]
    findings: list[AuditFinding] = []
    try:
        rows = log.signature_rows()
        heads = log.heads()
        chains = _chains(log)
    except SpecroundError as exc:
        return [_finding(None, "unreadable", f"the signatures cannot be checked: {exc}")]
    valid = _claims(rows, signer, findings)
    signed: dict[str, set[Head]] = {}
    for _, claim in valid:
        if claim.kind == "head":
            for claimed in claim.heads:
                signed.setdefault(claimed[0], set()).add(claimed)
    current = {h.request_id: _head_tuple(h) for h in heads}
    for request_id in sorted(set(current) | set(chains) | set(signed)):
        chain = chains.get(request_id, {})
        now = current.get(request_id)
        claims = signed.get(request_id, set())
        if now is not None and now not in claims:
            findings.append(
                _finding(
                    request_id,
                    "unsigned",
                    f"the head (generation {now[1]}, seq {now[2]}) carries no signature of this key",
                    seq=now[2],
                )
            )
        elif now is None and chain and not claims:
            findings.append(_finding(request_id, "unsigned", "events of a request no signature names"))
        elif now is None and chain:
            findings.append(_finding(request_id, "dropped", "a signed request's head row is missing"))
        if claims and not chain:
            findings.append(_finding(request_id, "dropped", "a signed request has no events left"))
            continue
        for signed_head in sorted(claims, key=lambda c: c[2]):
            _, generation, seq, link, _, _ = signed_head
            if chain.get(seq) != link:
                findings.append(
                    _finding(
                        request_id,
                        "rewritten",
                        f"the signed head of generation {generation} (seq {seq}) is not in the chain: "
                        "the history was rebuilt, truncated or rewound",
                        seq=seq,
                    )
                )
                break
    checkpoints = [claim for _, claim in valid if claim.kind == "checkpoint"]
    if checkpoints:
        findings.extend(_missing_heads(checkpoints[-1].heads, chains, "the newest signed checkpoint"))
    return findings


def _missing_heads(
    heads: Iterable[Head], chains: Mapping[str, Mapping[int, str]], what: str
) -> list[AuditFinding]:
    findings = []
    for request_id, generation, seq, link, _, _ in heads:
        chain = chains.get(request_id)
        if not chain:
            findings.append(
                _finding(request_id, "dropped", f"{what} lists this request; the log has no events")
            )
        elif chain.get(seq) != link:
            findings.append(
                _finding(
                    request_id,
                    "rewound",
                    f"{what} has it at generation {generation} (seq {seq}); that event is not in the chain",
                    seq=seq,
                )
            )
    return findings


def anchor_of(log: EventLog) -> dict[str, Any]:
    """Every head of ``log`` and a digest over them: ``{"requests", "heads", "digest"}`` (JSON-able)."""
    if isinstance(log, SignedLog):
        heads = [_head_tuple(head) for head in log.heads()]
    else:
        heads = []
        for request_id in log.request_ids():
            head = log.head(request_id)
            if head is not None:
                heads.append(_head_tuple(head))
    listed = [list(head) for head in sorted(heads)]
    return {"requests": len(listed), "heads": listed, "digest": digest(listed)}


def audit_anchor(log: EventLog, anchor: Mapping[str, Any]) -> list[AuditFinding]:
    """Findings for every anchored head no longer in its chain (and for an anchor that is not one)."""
    heads = anchor.get("heads") if isinstance(anchor, Mapping) else None
    parsed: list[Head] = []
    if isinstance(heads, list):
        for head in heads:
            if (
                isinstance(head, list)
                and len(head) == 6
                and isinstance(head[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in head[1:3])
                and isinstance(head[3], str)
            ):
                parsed.append((head[0], head[1], head[2], head[3], str(head[4]), bool(head[5])))
            else:
                parsed = []
                break
    if not parsed and heads != []:
        return [
            _finding(None, "malformed", "the anchor is not a list of heads printed by `specround anchor`")
        ]
    if anchor.get("digest") != digest([list(h) for h in parsed]):
        return [_finding(None, "malformed", "the anchor's digest does not match its heads (edited anchor)")]
    try:
        chains = _chains(log)
    except SpecroundError as exc:
        return [_finding(None, "unreadable", f"the chains cannot be read: {exc}")]
    return _missing_heads(parsed, chains, "the anchor")


def anchor_bytes(anchor: Mapping[str, Any]) -> bytes:
    """The canonical JSON of an anchor (what ``specround anchor`` prints)."""
    return canonical_bytes(dict(anchor))
