"""Replay from events alone (INV-8) and hash-chain findings by name (INV-9)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.errors import LogIntegrityError
from specround.statemachine.chain_verification import ChainFindingKind, verify_chain
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import LogHead, StoredEvent
from specround.statemachine.replay import replay_events, replay_request, replay_states
from tests.statemachine._synthetic import random_input, scripted_input

V = 16


def _log_with_rounds(rounds: int = 3) -> tuple[MemoryEventLog, RoundController]:
    log = MemoryEventLog()
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(1)
    for rid in ("a", "b"):
        controller.open_request((1, 2, 3), seed=3, vocab_size=V, request_id=rid, max_new_tokens=40)
    for _ in range(rounds):
        controller.step([random_input(controller, rid, 3, generator) for rid in ("a", "b")])
    return log, controller


def _rechain(events: list[StoredEvent]) -> list[StoredEvent]:
    """Renumber and re-hash a request's events from their payloads (a tamperer who fixes the chain)."""
    out = []
    prev = GENESIS_HASH
    for seq, event in enumerate(events):
        data = canonical_bytes(event.payload)
        new_hash = chain_hash(prev, data)
        out.append(dataclasses.replace(event, seq=seq, prev_hash=prev, hash=new_hash, payload_bytes=data))
        prev = new_hash
    return out


def _with_payload(event: StoredEvent, payload: dict[str, Any], **envelope: Any) -> StoredEvent:
    """The event with another payload, as a row whose stored text was edited would read back."""
    return dataclasses.replace(event, payload=payload, payload_bytes=canonical_bytes(payload), **envelope)


def _edit(event: StoredEvent, **changes: Any) -> StoredEvent:
    return _with_payload(event, {**event.payload, **changes})


def test_replay_reproduces_the_live_states_and_their_digests() -> None:
    log, controller = _log_with_rounds()
    replayed = {r.config.request_id: r for r in replay_events(log.events())}
    for rid, item in replayed.items():
        live = controller.state(rid)
        assert item.state == live and item.snapshot.digest == live.digest()  # INV-8
        head = log.head(rid)
        assert head is not None and (item.head_seq, item.head_hash) == (head.seq, head.hash)
        assert item.rounds == 3 and item.events == 16
        assert item.previous is not None and item.previous.state.generation == 2
    assert replay_states(log) == controller.load_all()


def test_replay_accepts_a_log_without_hash_recomputation() -> None:
    log, controller = _log_with_rounds(1)
    assert replay_request(log.events("a"), verify_hashes=False).state == controller.state("a")


TAMPERINGS: dict[str, tuple[Callable[[list[StoredEvent]], list[StoredEvent]], str]] = {
    "edited payload": (lambda ev: [*ev[:3], _edit(ev[3], emitted_ids=[1]), *ev[4:]], "edited event"),
    "dropped event": (lambda ev: [*ev[:2], *ev[3:]], "expected seq"),
    "reordered events": (lambda ev: [*ev[:2], ev[3], ev[2], *ev[4:]], "expected seq"),
    "duplicated event": (lambda ev: [*ev[:3], ev[2], *ev[3:]], "expected seq"),
    "cut-off round": (lambda ev: ev[:-2], "ends after"),
    "rechained emitted ids": (
        lambda ev: _rechain(
            [*ev[:3], _edit(ev[3], emitted_ids=[*ev[3].payload["emitted_ids"][:-1], 0]), *ev[4:]]
        ),
        "INV-8",
    ),
    "rechained rng": (lambda ev: _rechain([*ev[:4], _edit(ev[4], rng_after=[9, 9, 9]), *ev[5:]]), "INV-3"),
    "rechained committed rows": (
        lambda ev: _rechain([*ev[:4], _edit(ev[4], committed_kv_ids=[0]), *ev[5:]]),
        "INV-5",
    ),
    "rechained successor digest": (
        lambda ev: _rechain([*ev[:4], _edit(ev[4], successor_digest="0" * 64), *ev[5:]]),
        "INV-8",
    ),
    "rechained dropped round": (lambda ev: _rechain([ev[0], *ev[6:]]), "generation"),
    "rechained commit digest": (
        lambda ev: _rechain([*ev[:5], _edit(ev[5], commit_digest="0" * 64), *ev[6:]]),
        "commit digest",
    ),
    "wrong first event": (lambda ev: ev[1:], "first event"),
}


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_replay_refuses_sequences_it_cannot_accept(name: str) -> None:
    log, _ = _log_with_rounds()
    tamper, message = TAMPERINGS[name]
    events = tamper(list(log.events("a")))
    with pytest.raises(LogIntegrityError, match=message):
        replay_request(events)


def test_replay_refuses_a_round_after_the_request_finished() -> None:
    log = MemoryEventLog()
    controller = RoundController(log)
    controller.open_request((1, 2), seed=1, vocab_size=V, request_id="a", max_new_tokens=1)
    controller.run_round(scripted_input(controller, "a", (5,), 1, 9))
    events = list(log.events("a"))
    extra = [_edit(e, round_id="again") for e in events[1:]]
    extra = [dataclasses.replace(e, round_id="again", generation=2) for e in extra]
    with pytest.raises(LogIntegrityError, match="finished"):
        replay_request(_rechain(events + extra))


# --- hash chains ------------------------------------------------------------------------------------------


def _chain() -> tuple[list[StoredEvent], LogHead]:
    log, _ = _log_with_rounds(2)
    head = log.head("a")
    assert head is not None
    return list(log.events("a")), head


def _kinds(events: list[StoredEvent], head: LogHead | None) -> list[ChainFindingKind]:
    return [finding.kind for finding in verify_chain(events, head)]


def test_an_intact_chain_has_no_findings() -> None:
    events, head = _chain()
    assert verify_chain(events, head) == [] and verify_chain(events) == []


def test_each_tampering_is_reported_by_name() -> None:
    events, head = _chain()
    n = len(events)
    edited = [*events[:4], _edit(events[4], accepted=0), *events[5:]]
    assert _kinds(edited, head) == [ChainFindingKind.EDITED]
    for index in (0, 5, n - 1):  # first, middle and last event dropped
        dropped = [e for i, e in enumerate(events) if i != index]
        assert _kinds(dropped, head) == [ChainFindingKind.DROPPED], index
    duplicated = [*events[:5], dataclasses.replace(events[3], seq=99), *events[5:]]
    assert _kinds(duplicated, head) == [ChainFindingKind.DUPLICATED]
    appended_copy = [*events, dataclasses.replace(events[2], seq=n)]
    assert _kinds(appended_copy, head) == [ChainFindingKind.DUPLICATED]
    for index in (0, 4, n - 2):  # adjacent pairs swapped, seqs kept in stored order
        swapped = list(events)
        swapped[index], swapped[index + 1] = swapped[index + 1], swapped[index]
        assert _kinds(swapped, head) == [ChainFindingKind.REORDERED], index
    # A forged event with a correctly computed link next to a real one forks the chain.
    forged_payload = {**events[3].payload, "emitted_ids": [0]}
    forged = _with_payload(
        events[3], forged_payload, hash=chain_hash(events[3].prev_hash, canonical_bytes(forged_payload))
    )
    assert _kinds([*events[:4], forged, *events[4:]], head) == [ChainFindingKind.INSERTED]
    # A forged, well-linked event after the head.
    tail_payload = {**events[-1].payload, "generation": 99}
    tail = dataclasses.replace(
        events[-1],
        seq=n,
        prev_hash=events[-1].hash,
        hash=chain_hash(events[-1].hash, canonical_bytes(tail_payload)),
    )
    tail = _with_payload(tail, tail_payload)
    assert _kinds([*events, tail], head) == [ChainFindingKind.INSERTED]


def test_a_payload_edited_together_with_its_hash_is_still_reported() -> None:
    events, head = _chain()
    payload = {**events[6].payload, "draft_ids": [0, 0, 0]}
    rehashed = _with_payload(
        events[6], payload, hash=chain_hash(events[6].prev_hash, canonical_bytes(payload))
    )
    kinds = _kinds([*events[:6], rehashed, *events[7:]], head)
    assert kinds and set(kinds) <= {
        ChainFindingKind.EDITED,
        ChainFindingKind.DROPPED,
        ChainFindingKind.INSERTED,
    }
    assert kinds[0] in (ChainFindingKind.INSERTED, ChainFindingKind.DROPPED)


def test_an_envelope_that_disagrees_with_its_payload_is_an_edit() -> None:
    events, head = _chain()
    moved = [*events[:2], dataclasses.replace(events[2], kind="round_ready"), *events[3:]]
    assert _kinds(moved, head) == [ChainFindingKind.EDITED]
    renumbered = [*events[:3], *(dataclasses.replace(e, seq=e.seq + 1) for e in events[3:])]
    assert _kinds(renumbered, head) == [ChainFindingKind.EDITED]


def test_logs_without_stored_bytes_are_verified_by_re_serialising() -> None:
    events, head = _chain()
    bare = [dataclasses.replace(e, payload_bytes=None) for e in events]
    assert verify_chain(bare, head) == []
    assert replay_request(bare).state == replay_request(events).state
    edited = [*bare[:4], dataclasses.replace(bare[4], payload={**bare[4].payload, "accepted": 0}), *bare[5:]]
    assert _kinds(edited, head) == [ChainFindingKind.EDITED]
    with pytest.raises(LogIntegrityError, match="edited"):
        replay_request(edited)
