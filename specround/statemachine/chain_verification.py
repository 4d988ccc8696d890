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

:class:`ChainCheck` is the same check, streamed: it takes the events one at a time and keeps of each only
its envelope's links (for the intact prefix of a chain, only its hash), never its payload, so an audit can
check a request's chain while replay consumes the same events. :func:`verify_chain` feeds one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from specround.canonical import GENESIS_HASH, canonical_bytes
from specround.statemachine.ports import LogHead, StoredEvent, StoredRound

__all__ = ["ChainCheck", "ChainFinding", "ChainFindingKind", "verify_chain"]


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


_Verdict = tuple[ChainFindingKind, str] | None
"""What is wrong with one event on its own (malformed, or edited), None when nothing is."""

_Link = tuple[str, int, str, str, _Verdict]
"""What the chain check keeps of a stored event: request id, seq, prev_hash, hash and its own verdict."""

_sha256 = hashlib.sha256
_HASH_EDITED = (ChainFindingKind.EDITED, "the stored hash does not match the payload")
_ENVELOPE_EDITED = (ChainFindingKind.EDITED, "the envelope disagrees with the payload")


def _stored_hash_matches(event: StoredEvent) -> bool:
    """Whether ``event.hash`` is ``chain_hash(prev_hash, bytes)`` over its stored bytes (or its payload's)."""
    raw = event.payload_bytes
    data = raw if raw is not None else canonical_bytes(event.payload)
    return _sha256(event.prev_hash.encode("ascii") + data).hexdigest() == event.hash  # chain_hash, inlined


class ChainCheck:
    """The chain check of one request's stored events, fed one event at a time in stored order.

    :meth:`feed` checks the event on its own at once (its hash over its bytes, its envelope) and keeps
    only its links; :meth:`findings` then reports exactly what :func:`verify_chain` reports for the same
    events. While the events fed form an intact chain (seq ``0, 1, 2...``, each linking to the one before,
    no finding of its own), only their hashes are kept.
    """

    __slots__ = ("_hashes", "_last", "_last_matches", "_links", "_request_id", "_tail")

    def __init__(self) -> None:
        """An empty check (no events fed yet)."""
        self._request_id: str | None = None
        self._hashes: dict[str, None] = {}
        """The hashes of the intact prefix, in order (the prefix's other links follow from them)."""
        self._links: list[_Link] | None = None
        """Every event's links, once an event did not extend the intact prefix."""
        self._tail = GENESIS_HASH
        """The last hash of the intact prefix (the link the next event must name)."""
        self._last: StoredEvent | StoredRound | None = None
        self._last_matches = False

    def feed(self, event: StoredEvent) -> None:
        """Take the next stored event (raises only what serialising a payload without bytes raises)."""
        payload = event.payload
        request_id, prev_hash, link = event.request_id, event.prev_hash, event.hash
        verdict: _Verdict = None
        if event.defect is not None or not isinstance(payload, dict):
            verdict, matches = (
                (ChainFindingKind.MALFORMED, event.defect or "the payload is not an object"),
                False,
            )
        else:
            matches = _stored_hash_matches(event)
            if not matches:
                verdict = _HASH_EDITED
            else:
                get = payload.get
                if (
                    get("kind") != event.kind
                    or get("request_id") != request_id
                    or get("round_id") != event.round_id
                ):
                    verdict = _ENVELOPE_EDITED
        self._last, self._last_matches = event, matches
        links = self._links
        if links is None:
            hashes = self._hashes
            if not hashes:
                self._request_id = request_id
            if (
                verdict is None
                and request_id == self._request_id
                and event.seq == len(hashes)
                and prev_hash == self._tail
                and link not in hashes
                and link != GENESIS_HASH
            ):
                hashes[link] = None
                self._tail = link
                return
            links = self._expand()
        links.append((request_id, event.seq, prev_hash, link, verdict))

    def feed_round(self, stored: StoredRound) -> None:
        """Take a whole round: what feeding its five events gives, with the chain recomputed once.

        Its inner events' hashes are derived from their bytes, so each of them matches by construction;
        the round's stored (last) hash matches when the chain recomputed over the five payloads reaches
        it. A round that extends the intact prefix with matching envelopes is taken at once; any other is
        fed event by event (whose findings then name the event).
        """
        hashes = self._hashes
        chained = stored.chained_hashes()
        matches = chained[-1] == stored.hash
        if (
            matches
            and self._links is None
            and hashes
            and stored.request_id == self._request_id
            and stored.first_seq == len(hashes)
            and stored.prev_hash == self._tail
            and GENESIS_HASH not in chained
            and not any(link in hashes for link in chained)
            and len(set(chained)) == len(chained)
            and stored.envelopes_match()
        ):
            for link in chained:
                hashes[link] = None
            self._tail = stored.hash
        else:
            for event in stored.events():
                self.feed(event)
        self._last, self._last_matches = stored, matches

    def hash_matches(self, item: StoredEvent | StoredRound) -> bool:
        """Whether an event's stored hash (every stored hash of a round) matches its bytes.

        The verdict of the event or round just fed is reused.
        """
        if item is self._last:
            return self._last_matches
        if isinstance(item, StoredRound):
            return item.hash_matches()
        return _stored_hash_matches(item)

    def findings(self, head: LogHead | None = None) -> list[ChainFinding]:
        """Every finding about the events fed so far (empty when the chain is intact), against ``head``."""
        if self._links is None:
            hashes = self._hashes
            if not hashes or head is None or head.hash == self._tail:
                return []  # an intact chain that ends at the head (what the general check finds too)
        links = self._links if self._links is not None else self._expand()
        return _chain_findings(links, head)

    def _expand(self) -> list[_Link]:
        """The intact prefix's links, spelled out; later events are kept as links from now on."""
        request_id = self._request_id
        assert request_id is not None or not self._hashes
        links: list[_Link] = []
        prev = GENESIS_HASH
        for index, link in enumerate(self._hashes):
            links.append((request_id or "", index, prev, link, None))
            prev = link
        self._hashes = {}
        self._tail = GENESIS_HASH
        self._links = links
        return links


def verify_chain(events: Iterable[StoredEvent], head: LogHead | None = None) -> list[ChainFinding]:
    """Every finding about one request's stored events (empty when the chain is intact)."""
    check = ChainCheck()
    for event in events:
        check.feed(event)
    return check.findings(head)


def _chain_findings(stored: list[_Link], head: LogHead | None) -> list[ChainFinding]:
    """The findings of a request's stored links (see the module docstring), in the order reported."""
    if not stored:
        return []
    request_id = stored[0][0]
    findings: list[ChainFinding] = []

    def report(kind: ChainFindingKind, seq: int | None, message: str) -> None:
        findings.append(ChainFinding(kind, request_id, seq, message))

    # 1. Duplicates (same hash stored again) are set aside; the rest is checked as a chain.
    position: dict[str, int] = {}
    unique: list[_Link] = []
    for event in stored:
        event_request, seq, _, link, _ = event
        if event_request != request_id:
            report(ChainFindingKind.INSERTED, seq, f"an event of request {event_request!r}")
            continue
        if link in position:
            first = unique[position[link]]
            report(ChainFindingKind.DUPLICATED, seq, f"a copy of the event at seq {first[1]}")
            continue
        position[link] = len(unique)
        unique.append(event)

    # 2. Each event's own integrity: hash over payload, envelope against payload (judged when fed).
    edited: set[int] = set()
    for index, (_, seq, _, _, verdict) in enumerate(unique):
        if verdict is not None:
            report(verdict[0], seq, verdict[1])
            edited.add(index)

    # 3. Links. An event no other event links to, other than the tail, is either forged (inserted) or the
    #    predecessor of a dropped event; a forged one forks the chain, hangs from a missing link or extends
    #    past the head.
    children: dict[str, int] = {}
    for _, _, prev_hash, _, _ in unique:
        children[prev_hash] = children.get(prev_hash, 0) + 1
    head_index = position.get(head.hash) if head is not None else None
    tail_hash = head.hash if head is not None else unique[-1][3]
    inserted: set[int] = set()
    for index, (_, seq, prev_hash, link, _) in enumerate(unique):
        if link in children or link == tail_hash:
            continue
        after_head = head_index is not None and prev_hash == unique[head_index][3]
        forked = children[prev_hash] > 1
        dangling = prev_hash != GENESIS_HASH and prev_hash not in position
        if after_head or forked or (dangling and index not in edited):
            where = "after the head" if after_head else "that no later event links to"
            report(ChainFindingKind.INSERTED, seq, f"an event {where}")
            inserted.add(index)
    for index, (_, seq, prev_hash, _, _) in enumerate(unique):
        if index in inserted:
            continue
        if prev_hash == GENESIS_HASH:
            continue  # stored later than its successor: that successor is reported as reordered
        target = position.get(prev_hash)
        if target is None:
            previous = _previous_kept(index, inserted)
            if previous is not None and previous in edited:
                continue  # the predecessor's hash was edited: already reported as edited
            report(ChainFindingKind.DROPPED, seq, "the event it links to is missing")
        elif target > index:
            report(
                ChainFindingKind.REORDERED,
                seq,
                f"stored before the event it follows (seq {unique[target][1]})",
            )

    # 4. The tail against the head.
    if head is not None and head.hash not in position and len(unique) - 1 not in edited:
        report(ChainFindingKind.DROPPED, None, f"the head (seq {head.seq}) is not among the stored events")

    # 5. Seq numbers: 0, 1, 2... in stored order (the seq is outside the hashed payload).
    if not findings:
        for index, (_, seq, _, _, _) in enumerate(unique):
            if seq != index:
                report(ChainFindingKind.EDITED, seq, f"seq {seq} stored at position {index}")
                break
    return findings


def _previous_kept(index: int, skipped: set[int]) -> int | None:
    for candidate in range(index - 1, -1, -1):
        if candidate not in skipped:
            return candidate
    return None
