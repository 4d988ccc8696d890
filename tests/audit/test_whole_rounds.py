"""Whole stored rounds: replay and the audit judge them exactly as they judge their five events.

The SQL log streams each well-formed round row as one :class:`~specround.statemachine.ports.StoredRound`
to replay and the audit (``event_items``), which fold it at once when it is intact. Every case below is
judged twice, once from those items and once from the plain event stream (a proxy that hides
``event_items``), and the two must agree: the same replayed states, the same refusal, the same findings.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from specround.adapters.sql import SqlEventLog
from specround.adapters.sql.round_body import encode_raw
from specround.audit import audit_log, replay_against_heads
from specround.errors import LogIntegrityError
from specround.statemachine.forwarding_log import ForwardingLog
from specround.statemachine.ports import LogHead, RoundStreamingLog, StoredEvent, StoredRound
from specround.statemachine.replay import ReplayedRequest, replay_events, replay_log
from tests.statemachine._synthetic import run_random_steps

V = 16
_ROUND = "request_no = (SELECT request_no FROM requests WHERE request_id = ?) AND generation = ?"


class _EventsOnly(ForwardingLog):
    """The log without ``event_items`` (and with its heads listed): replay and the audit take its events
    one by one."""

    def __init__(self, log: SqlEventLog) -> None:
        super().__init__(log)
        self._log = log

    def heads(self) -> list[LogHead]:
        return self._log.heads()


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    path = tmp_path / "log.sqlite"
    log = SqlEventLog.open(path)
    run_random_steps(log, ("a", "b"), steps=4, vocab=V, generator_seed=11, request_seed=3, max_new_tokens=60)
    log.close()
    return path


def _execute(path: Path, statement: str, parameters: tuple[object, ...]) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            assert connection.execute(statement, parameters).rowcount == 1
    finally:
        connection.close()


def _round_events(path: Path, generation: int) -> list[StoredEvent]:
    with SqlEventLog.open(path, create=False) as log:
        return [e for e in log.events("a") if e.generation == generation and e.seq > 0]


def _edit_payload(
    path: Path, *, index: int, rechain: bool, old: bytes = b'"round_id"', new: bytes = b'"round_id" '
) -> None:
    """Change one event of request a's second round (``rechain``: and its stored hash to match)."""
    events = _round_events(path, 2)
    texts = [e.payload_bytes or b"" for e in events]
    assert old in texts[index]
    texts[index] = texts[index].replace(old, new, 1)  # still JSON
    _execute(path, f"UPDATE rounds SET body = ? WHERE {_ROUND}", (encode_raw(texts), "a", 2))
    if rechain:
        link = events[0].prev_hash
        for data in texts:
            link = hashlib.sha256(link.encode("ascii") + data).hexdigest()
        _execute(path, f"UPDATE rounds SET hash = ? WHERE {_ROUND}", (bytes.fromhex(link), "a", 2))


def _flip_hash(path: Path) -> None:
    _execute(path, f"UPDATE rounds SET hash = zeroblob(32) WHERE {_ROUND}", ("a", 3))


def _relink(path: Path) -> None:
    """Request a's third round names a link no stored event has."""
    _execute(path, f"UPDATE rounds SET prev_hash = x'0102030405060708' WHERE {_ROUND}", ("a", 3))


def _drop_round(path: Path) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            connection.execute(f"DELETE FROM rounds WHERE {_ROUND}", ("a", 2))
    finally:
        connection.close()


def _unchanged(path: Path) -> None:
    del path


_DAMAGE: dict[str, Callable[[Path], None]] = {
    "intact": _unchanged,
    "edited inner event": lambda path: _edit_payload(path, index=1, rechain=False),
    "edited and rechained": lambda path: _edit_payload(path, index=2, rechain=True),
    "an event of an unknown schema version": lambda path: _edit_payload(
        path, index=1, rechain=True, old=b'"schema_version":1', new=b'"schema_version":99'
    ),
    "an event names another round": lambda path: _edit_payload(
        path, index=3, rechain=True, old=b'"round_id":"', new=b'"round_id":"x'
    ),
    "stored hash changed": _flip_hash,
    "link to nowhere": _relink,
    "round deleted": _drop_round,
}


def _replayed(requests: Iterator[ReplayedRequest]) -> list[tuple[object, ...]] | str:
    """Every replayed request's outcome, or the refusal's message."""
    try:
        return [
            (
                r.config.request_id,
                r.snapshot.digest,
                r.rounds,
                r.events,
                r.head_seq,
                r.head_hash,
                r.last_round_id,
            )
            for r in requests
        ]
    except LogIntegrityError as exc:
        return str(exc)


@pytest.mark.parametrize("damage", sorted(_DAMAGE))
def test_replay_and_audit_judge_whole_rounds_as_their_events(log_path: Path, damage: str) -> None:
    _DAMAGE[damage](log_path)
    with SqlEventLog.open(log_path, create=False) as log:
        assert isinstance(log, RoundStreamingLog)
        plain = _EventsOnly(log)
        assert not isinstance(plain, RoundStreamingLog)
        items = list(log.event_items())
        assert [
            e for item in items for e in (item.events() if isinstance(item, StoredRound) else [item])
        ] == list(log.events())
        whole = _replayed(replay_log(log))
        assert whole == _replayed(replay_events(log.events()))
        report = audit_log(log)
        assert report == audit_log(plain)
        assert replay_against_heads(log) == replay_against_heads(plain)
    if damage == "intact":
        assert isinstance(whole, list) and [r[2] for r in whole] == [4, 4]
        assert report.ok and sum(isinstance(item, StoredRound) for item in items) == 8
    else:
        assert not report.ok, damage  # every damage is found, by both readings


def test_an_intact_log_is_replayed_and_audited_without_spelling_out_its_rounds(
    log_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spelled: list[int] = []
    events_of = StoredRound.events

    def counted(stored: StoredRound) -> list[StoredEvent]:
        spelled.append(stored.generation)
        return events_of(stored)

    monkeypatch.setattr(StoredRound, "events", counted)
    with SqlEventLog.open(log_path, create=False) as log:
        assert [r.rounds for r in replay_log(log)] == [4, 4]
        assert audit_log(log).ok
        assert spelled == []  # the fast path took every round whole
        assert [e.seq for e in log.events("a")] == list(range(21))  # the plain stream: every event
