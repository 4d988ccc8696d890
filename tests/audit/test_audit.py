"""The audit: clean logs audit clean; each re-derivation catches its tampering (INV-2, INV-8, INV-10)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.audit import audit_log, audit_request, replay_against_heads
from specround.audit.decision_audit import DecisionAuditor, finish_all
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import LogHead, StoredEvent
from specround.statemachine.replay import ReplayedRound, replay_request
from tests.statemachine._synthetic import random_input, scripted_input

V = 16
EOS = 15


def _populated_log() -> MemoryEventLog:
    log = MemoryEventLog()
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(21)
    for index, layout in enumerate([Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER] * 2):
        controller.open_request(
            (1, 2, 3),
            seed=index,
            vocab_size=V,
            layout=layout,
            request_id=f"r{index}",
            max_new_tokens=9,
            stop_token_ids=[EOS],
            processors=[{"kind": "temperature", "params": {"temperature": 0.7}}],
        )
    for _ in range(6):
        items = [
            random_input(
                controller, rid, 1 + (i % 4), generator, dtype=torch.float32 if i % 2 else torch.float64
            )
            for i, rid in enumerate(sorted(controller.load_all()))
            if not controller.state(rid).finished
        ]
        if items:
            controller.step(items)
    controller.run_round(scripted_input(controller, "r0", (), 0, 4)) if not controller.state(
        "r0"
    ).finished else None
    return log


class StaticLog:
    """A read-only EventLog over given events and heads (for tampered logs whose chain was re-computed)."""

    def __init__(self, events: Sequence[StoredEvent], heads: dict[str, LogHead]) -> None:
        self._events = list(events)
        self._heads = heads

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        return iter([e for e in self._events if request_id is None or e.request_id == request_id])

    def request_ids(self) -> list[str]:
        return sorted({e.request_id for e in self._events})

    def head(self, request_id: str) -> LogHead | None:
        return self._heads.get(request_id)


def _rechain(events: list[StoredEvent]) -> list[StoredEvent]:
    out, prev = [], GENESIS_HASH
    for event in events:
        data = canonical_bytes(event.payload)
        new_hash = chain_hash(prev, data)
        out.append(dataclasses.replace(event, prev_hash=prev, hash=new_hash, payload_bytes=data))
        prev = new_hash
    return out


def _tampered(log: MemoryEventLog, kind: str, edit: Any) -> tuple[StaticLog, str]:
    """Edit the first event of ``kind`` that ``edit`` accepts (a new payload, or None to skip); re-chain."""
    for rid in log.request_ids():
        events = list(log.events(rid))
        for index, event in enumerate(events):
            if event.kind != kind:
                continue
            payload = edit(dict(event.payload))
            if payload is None:
                continue
            events[index] = dataclasses.replace(event, payload=payload)
            events = _rechain(events)
            head = log.head(rid)
            assert head is not None
            heads = {rid: dataclasses.replace(head, hash=events[-1].hash)}
            return StaticLog(events, heads), rid
    raise AssertionError(f"no {kind} event to tamper with")


def test_a_clean_log_audits_clean_and_replays_to_its_heads() -> None:
    log = _populated_log()
    report = audit_log(log)
    assert report.ok, report.findings
    assert report.rounds > 10 and report.events == sum(1 for _ in log.events())
    assert all(r.generation is not None and r.state_digest == r.head_digest for r in report.requests)
    checks = replay_against_heads(log)
    assert checks and all(c.ok for c in checks)


def _first_correction(payload: dict[str, Any]) -> dict[str, Any] | None:
    return payload if payload["terminal"] == "correction" else None


def _set(payload: dict[str, Any] | None, **changes: Any) -> dict[str, Any] | None:
    return None if payload is None else {**payload, **changes}


@pytest.mark.parametrize(
    ("name", "kind", "edit", "finding"),
    [
        (
            "accept uniform",
            "round_decided",
            lambda p: (
                _set(p, accept_uniforms=[0.5, *p["accept_uniforms"][1:]]) if p["accept_draws"] else None
            ),
            "uniform",
        ),
        (
            "terminal uniform",
            "round_decided",
            lambda p: (
                _set(p, terminal_uniform=(p["terminal_uniform"] + 0.25) % 1.0)
                if p["terminal_draws"]
                else None
            ),
            "uniform",
        ),
        (
            "bracket",
            "round_decided",
            lambda p: (
                _set(p, terminal_mass_before=p["terminal_mass_before"] + 2.0) if p["terminal_draws"] else None
            ),
            "terminal",
        ),
        (
            "correction from p",
            "round_decided",
            lambda p: (
                _set(_first_correction(p), terminal_token_mass=p["terminal_p"]) if p["terminal_q"] else None
            ),
            "terminal",
        ),
        (
            "q for a bonus",
            "round_decided",
            lambda p: _set(p, terminal_q=0.5) if p["terminal"] == "bonus" else None,
            "terminal",
        ),
        (
            "terminal row",
            "round_decided",
            lambda p: _set(p, terminal_row=99) if p["terminal_draws"] else None,
            "terminal",
        ),
        (
            "rejection logged with p = q",
            "round_verified",
            lambda p: None,  # replaced below: needs the decided event of the same round
            "acceptance",
        ),
    ],
)
def test_tampered_decisions_are_re_derived_and_caught(name: str, kind: str, edit: Any, finding: str) -> None:
    log = _populated_log()
    if name == "rejection logged with p = q":
        tampered, rid = _raise_a_rejected_test(log)
    else:
        tampered, rid = _tampered(log, kind, edit)
    report = audit_log(tampered)  # type: ignore[arg-type]
    kinds = {(f.invariant, f.kind) for f in report.findings}
    assert ("INV-10", finding) in kinds, report.findings
    assert not any(f.invariant == "INV-9" for f in report.findings)  # the chain itself was re-computed
    assert [r.request_id for r in report.requests if not r.ok] == [rid]


def _raise_a_rejected_test(log: MemoryEventLog) -> tuple[StaticLog, str]:
    """Make the rejected draft of a correction look certain to be accepted (p(d) = q(d))."""
    for rid in log.request_ids():
        events = list(log.events(rid))
        for index, event in enumerate(events):
            if event.kind == "round_decided" and event.payload["terminal"] == "correction":
                a = event.payload["accepted"]
                ready, verified = events[index - 2], events[index - 1]
                p_draft = list(verified.payload["p_draft"])
                p_draft[a] = ready.payload["q_draft"][a]
                events[index - 1] = dataclasses.replace(
                    verified, payload={**verified.payload, "p_draft": p_draft}
                )
                events = _rechain(events)
                head = log.head(rid)
                assert head is not None
                return StaticLog(events, {rid: dataclasses.replace(head, hash=events[-1].hash)}), rid
    raise AssertionError("no correction in the log")


def test_a_stale_head_is_an_inv8_finding() -> None:
    log = _populated_log()
    rid = log.request_ids()[0]
    head = log.head(rid)
    assert head is not None
    static = StaticLog(list(log.events()), {r: log.head(r) for r in log.request_ids()})  # type: ignore[misc]
    static._heads[rid] = dataclasses.replace(head, state_digest="0" * 64)
    report = audit_log(static)  # type: ignore[arg-type]
    assert {(f.invariant, f.kind) for f in report.findings} == {("INV-8", "head")}


def _captured_rounds(log: MemoryEventLog, rid: str) -> list[ReplayedRound]:
    rounds: list[ReplayedRound] = []
    replay_request(log.events(rid), on_round=rounds.append)
    return rounds


def test_stops_are_re_derived_from_the_processors_stop_sets() -> None:
    log = MemoryEventLog()
    controller = RoundController(log)
    controller.open_request(
        (1, 2), seed=3, vocab_size=V, request_id="s", max_new_tokens=8, stop_token_ids=[EOS]
    )
    controller.run_round(scripted_input(controller, "s", (5, 6), 2, 7))
    controller.run_round(scripted_input(controller, "s", (5, EOS, 6), 3, 7))
    first, second = _captured_rounds(log, "s")
    clean = DecisionAuditor("s")
    clean(first)
    clean(second)
    assert clean.finish() == []
    # A token after a stop, and a stop that did not finish the request (INV-2).
    after_stop = dataclasses.replace(first, decided={**first.decided, "emitted_ids": [EOS, 6, 7]})
    not_finished = dataclasses.replace(
        second, decided={**second.decided, "finished": False, "finish_reason": None}
    )
    auditor = DecisionAuditor("s")
    auditor(after_stop)
    auditor(not_finished)
    found = [(f.invariant, f.kind) for f in auditor.finish()]
    assert found.count(("INV-2", "stop")) >= 2


def test_decision_checks_batched_over_requests_find_what_each_request_finds_alone() -> None:
    """finish_all over several requests gives each the findings finish() gives it alone.

    One request is clean, one logs a wrong ACCEPT uniform and a flipped acceptance, one a TERMINAL uniform
    off by an ulp, one a p value that is not a number (malformed: the batch falls back to each request,
    then to each round, and names the round).
    """
    log = _populated_log()
    rids = sorted(log.request_ids())
    rounds = {rid: _captured_rounds(log, rid) for rid in rids}

    def tampered(rid: str) -> list[ReplayedRound]:
        captured = list(rounds[rid])
        first = captured[0]
        if rid == rids[1]:
            uniforms = list(first.decided["accept_uniforms"])
            assert uniforms, "the first round of this request reached no test"
            uniforms[0] = 0.5 if uniforms[0] != 0.5 else 0.25
            captured[0] = dataclasses.replace(first, decided={**first.decided, "accept_uniforms": uniforms})
        elif rid == rids[2]:
            with_terminal = next(
                i for i, r in enumerate(captured) if r.decided["terminal_uniform"] is not None
            )
            r = captured[with_terminal]
            shifted = float(
                torch.tensor(r.decided["terminal_uniform"], dtype=torch.float64).nextafter(
                    torch.tensor(1.0, dtype=torch.float64)
                )
            )
            captured[with_terminal] = dataclasses.replace(
                r, decided={**r.decided, "terminal_uniform": shifted}
            )
        elif rid == rids[3]:
            with_draft = next(i for i, r in enumerate(captured) if r.verified["p_draft"])
            r = captured[with_draft]
            p_draft = ["not a number", *r.verified["p_draft"][1:]]
            captured[with_draft] = dataclasses.replace(r, verified={**r.verified, "p_draft": p_draft})
        return captured

    def fed(rid: str) -> DecisionAuditor:
        auditor = DecisionAuditor(rid)
        for replayed in tampered(rid):
            auditor(replayed)
        return auditor

    alone = [fed(rid).finish() for rid in rids]
    together = finish_all([fed(rid) for rid in rids])
    assert together == alone
    kinds = [{(f.invariant, f.kind) for f in found} for found in together]
    assert kinds[0] == set()
    assert ("INV-10", "uniform") in kinds[1]
    assert ("INV-10", "uniform") in kinds[2]
    assert ("INV-10", "malformed") in kinds[3]


def test_a_log_of_more_requests_than_one_batch_audits_as_each_request_alone() -> None:
    """audit_log finishes the decision checks of 64 requests at a time; the report is audit_request's."""
    log = MemoryEventLog()
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(5)
    rids = [f"q{index:03d}" for index in range(70)]
    for index, rid in enumerate(rids):
        controller.open_request((1, 2), seed=index, vocab_size=V, request_id=rid, max_new_tokens=6)
    for _ in range(2):
        controller.step([random_input(controller, rid, 2, generator) for rid in rids])
    report = audit_log(log)
    assert [a.request_id for a in report.requests] == rids
    assert [a.model_dump() for a in report.requests] == [audit_request(log, rid).model_dump() for rid in rids]
    assert all(a.rounds == 2 and not a.findings for a in report.requests)
