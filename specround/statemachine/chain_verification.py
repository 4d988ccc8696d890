"""Hash-chain verification of one request's stored events (INV-9).

Each request's events form a chain: ``hash = chain_hash(prev_hash, canonical_bytes(payload))`` with
``GENESIS_HASH`` before the first event. :func:`verify_chain` checks a request's events *as stored* (in seq
order, the way the log returns them) and reports every finding by name:

``edited``
    An event whose stored hash does not match its payload (the payload or the hash was changed), or whose
    envelope (kind, request, round id) disagrees with its payload, or whose seq numbers are not 0, 1, 2...
``dropped``
    An event whose predecessor is missing (its ``prev_hash`` names no stored event), or a chain that ends
    before the log's head.
``duplicated``
    An event stored again (same hash as an earlier stored event).
``reordered``
    An event stored before the event its ``prev_hash`` names.
``inserted``
    An event no later event links to although it is not the chain's head (a forged extra event), or an
    event stored after the head.
``malformed``
    A row the log could not read as an event (its ``defect``: a payload that is not a JSON object, a column
    of the wrong type, ...). It is then treated like an edited event.

The head (:class:`~specround.statemachine.ports.LogHead`) anchors the tail: without it, dropping the last
events or appending a forged tail with correct links is undetectable from the events alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.statemachine.ports import LogHead, StoredEvent

__all__ = ["ChainFinding", "ChainFindingKind", "verify_chain"]


class ChainFindingKind(StrEnum):
    """The names INV-9 reports."""

    EDITED = "edited"
    DROPPED = "dropped"
    DUPLICATED = "duplicated"
    REORDERED = "reordered"
    INSERTED = "inserted"
    MALFORMED = "malformed"


@dataclass(frozen=True, slots=True)
class ChainFinding:
    """One problem of a request's chain."""

    kind: ChainFindingKind
    request_id: str
    seq: int | None
    """The stored seq of the event concerned (None for a finding about the tail)."""
    message: str

    def __str__(self) -> str:
        where = f"seq {self.seq}" if self.seq is not None else "tail"
        return f"{self.kind.value}: request {self.request_id!r} {where}: {self.message}"


def verify_chain(events: Iterable[StoredEvent], head: LogHead | None = None) -> list[ChainFinding]:
    """Every finding about one request's stored events (empty when the chain is intact)."""
    stored = list(events)
    if not stored:
        return []
    request_id = stored[0].request_id
    findings: list[ChainFinding] = []

    def report(kind: ChainFindingKind, seq: int | None, message: str) -> None:
        findings.append(ChainFinding(kind, request_id, seq, message))

    # 1. Duplicates (same hash stored again) are set aside; the rest is checked as a chain.
    position: dict[str, int] = {}
    unique: list[StoredEvent] = []
    for event in stored:
        if event.request_id != request_id:
            report(ChainFindingKind.INSERTED, event.seq, f"an event of request {event.request_id!r}")
            continue
        if event.hash in position:
            first = unique[position[event.hash]]
            report(ChainFindingKind.DUPLICATED, event.seq, f"a copy of the event at seq {first.seq}")
            continue
        position[event.hash] = len(unique)
        unique.append(event)

    # 2. Each event's own integrity: hash over payload, envelope against payload.
    edited: set[int] = set()
    for index, event in enumerate(unique):
        payload = event.payload
        if event.defect is not None or not isinstance(payload, dict):
            report(ChainFindingKind.MALFORMED, event.seq, event.defect or "the payload is not an object")
            edited.add(index)
            continue
        raw = event.payload_bytes
        data = raw if raw is not None else canonical_bytes(payload)
        if chain_hash(event.prev_hash, data) != event.hash:
            report(ChainFindingKind.EDITED, event.seq, "the stored hash does not match the payload")
            edited.add(index)
        elif (
            payload.get("kind") != event.kind
            or payload.get("request_id") != event.request_id
            or payload.get("round_id") != event.round_id
        ):
            report(ChainFindingKind.EDITED, event.seq, "the envelope disagrees with the payload")
            edited.add(index)

    # 3. Links. An event no other event links to, other than the tail, is either forged (inserted) or the
    #    predecessor of a dropped event; a forged one forks the chain, hangs from a missing link or extends
    #    past the head.
    children: dict[str, int] = {}
    for event in unique:
        children[event.prev_hash] = children.get(event.prev_hash, 0) + 1
    head_index = position.get(head.hash) if head is not None else None
    tail_hash = head.hash if head is not None else unique[-1].hash
    inserted: set[int] = set()
    for index, event in enumerate(unique):
        if event.hash in children or event.hash == tail_hash:
            continue
        link = event.prev_hash
        after_head = head_index is not None and link == unique[head_index].hash
        forked = children[link] > 1
        dangling = link != GENESIS_HASH and link not in position
        if after_head or forked or (dangling and index not in edited):
            where = "after the head" if after_head else "that no later event links to"
            report(ChainFindingKind.INSERTED, event.seq, f"an event {where}")
            inserted.add(index)
    for index, event in enumerate(unique):
        if index in inserted:
            continue
        link = event.prev_hash
        if link == GENESIS_HASH:
            continue  # stored later than its successor: that successor is reported as reordered
        target = position.get(link)
        if target is None:
            previous = _previous_kept(index, inserted)
            if previous is not None and previous in edited:
                continue  # the predecessor's hash was edited: already reported as edited
            report(ChainFindingKind.DROPPED, event.seq, "the event it links to is missing")
        elif target > index:
            report(
                ChainFindingKind.REORDERED,
                event.seq,
                f"stored before the event it follows (seq {unique[target].seq})",
            )

    # 4. The tail against the head.
    if head is not None and head.hash not in position and len(unique) - 1 not in edited:
        report(ChainFindingKind.DROPPED, None, f"the head (seq {head.seq}) is not among the stored events")

    # 5. Seq numbers: 0, 1, 2... in stored order (the seq is outside the hashed payload).
    if not findings:
        for index, event in enumerate(unique):
            if event.seq != index:
                report(ChainFindingKind.EDITED, event.seq, f"seq {event.seq} stored at position {index}")
                break
    return findings


def _previous_kept(index: int, skipped: set[int]) -> int | None:
    for candidate in range(index - 1, -1, -1):
        if candidate not in skipped:
            return candidate
    return None
