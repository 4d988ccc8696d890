"""Derived round ids on the SQL log: stored as '' (migration 0005), read back whole, fenced as before."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from alembic import command
from sqlalchemy import text

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog
from specround.adapters.sql.migrate import alembic_config
from specround.adapters.sql.round_body import encode_raw
from specround.audit import audit_log
from specround.errors import InvalidRequestError
from specround.statemachine.controller import RoundController
from specround.statemachine.events import EVENT_SCHEMA_VERSION
from specround.statemachine.ports import (
    EventLog,
    PublishOutcome,
    PublishStatus,
    RoundPublication,
    StoredRound,
    stored_items,
)
from specround.statemachine.round_ids import check_round_id, derived_generation, derived_round_id
from specround.statemachine.rounds import RoundInput
from tests.adapters.capturing_log import CapturingLog
from tests.adapters.eventlog_contract import opened
from tests.adapters.synthetic_rounds import build_round

V, K = 16, 2
REQUEST = "derived-ids"


def _rows(first_draft_mass: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Drafts (0, 1) with q uniform and p giving the first draft ``first_draft_mass``."""
    q = torch.full((K, V), 1.0 / V, dtype=torch.float64)
    p = torch.full((K + 1, V), (1.0 - first_draft_mass) / (V - 1), dtype=torch.float64)
    p[:, 0] = first_draft_mass
    return torch.tensor([0, 1]), q, p


def _round(log: EventLog, first_draft_mass: float, round_id: str | None = None) -> RoundPublication:
    """One round of a fresh controller over ``log``: the publication it sent."""
    capturing = CapturingLog(log)
    controller = RoundController(capturing)
    controller.open_request([1, 2, 3], seed=5, max_new_tokens=64, vocab_size=V, request_id=REQUEST)
    drafts, q, p = _rows(first_draft_mass)
    coordinate = controller.coordinate_digest(REQUEST)
    (result,) = controller.step([RoundInput(REQUEST, coordinate, drafts, q, p, round_id=round_id)])
    result.raise_for_error()
    (publication,) = capturing.sent
    return publication


def _stored_ids(log: SqlEventLog) -> list[tuple[int, str]]:
    with log.engine.connect() as connection:
        rows = connection.execute(text("SELECT generation, round_id FROM rounds ORDER BY generation"))
        return [(int(g), str(r)) for g, r in rows]


def test_the_derived_id_names_its_generation_and_the_reserved_form_is_checked() -> None:
    derived = derived_round_id(6, "ab" * 32, (3, 4))
    assert derived.startswith("g7-") and len(derived) == 3 + 16
    assert derived_generation(derived) == 7
    assert derived_generation("g07-0123456789abcdef") is None  # not the form: a caller's own id
    assert derived_generation("round-7") is None
    assert check_round_id(derived, 6, "ab" * 32, (3, 4)) is True
    assert check_round_id("round-7", 6, "ab" * 32, (3, 4)) is False
    with pytest.raises(InvalidRequestError, match="reserved for derived round ids"):
        check_round_id(derived, 6, "ab" * 32, (3, 5))  # another round's derived id
    with pytest.raises(InvalidRequestError, match="reserved for derived round ids"):
        check_round_id(derived, 6, "é\udc80" * 32, (3, 4))  # text no digest holds: named, not a crash


def test_a_derived_id_is_stored_empty_and_read_back_whole(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        publication = _round(log, 0.5)
        assert derived_generation(publication.round_id) == 1
        assert _stored_ids(log) == [(1, "")]
        rounds = [event for event in log.events(REQUEST) if event.kind != "request_opened"]
        assert [event.round_id for event in rounds] == [publication.round_id] * 5
        assert all(event.payload["round_id"] == publication.round_id for event in rounds)
        assert audit_log(log).ok


def test_a_callers_id_is_stored_as_it_is(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        _round(log, 0.5, round_id="engine-round-1")
        assert _stored_ids(log) == [(1, "engine-round-1")]
        assert audit_log(log).ok


def test_a_callers_id_of_the_reserved_form_is_refused_unless_it_is_the_derived_one(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        derived = _round(MemoryEventLog(), 0.5).round_id  # this round's derived id, from another log
        _round(log, 0.5, round_id=derived)  # naming a round by its own derived id is fine
        assert _stored_ids(log) == [(1, "")]
        other = derived_round_id(0, "cd" * 32, (0, 1))  # the form, but another round's id
        follow = CapturingLog(log)
        controller = RoundController(follow)
        controller.open_request([1, 2, 3], seed=5, max_new_tokens=64, vocab_size=V, request_id=REQUEST)
        drafts, q, p = _rows(0.5)
        coordinate = controller.coordinate_digest(REQUEST)
        (result,) = controller.step([RoundInput(REQUEST, coordinate, drafts, q, p, round_id=other)])
        assert isinstance(result.error, InvalidRequestError) and not follow.sent
        # A publication built without the controller is refused by the log before anything is written.
        config, state = opened(log, "synthetic")
        forged, _ = build_round(config, state, round_id=derived_round_id(0, "ef" * 32, (1, 2)))
        with pytest.raises(InvalidRequestError, match="reserved for derived round ids"):
            log.publish([forged])
        assert _stored_ids(log) == [(1, "")]


def test_a_retried_derived_round_is_already_published_and_a_rival_is_a_duplicate(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        first = _round(log, 0.5)
        _round(log, 0.5)  # moves the head on: the first round is now behind it
        retried = _round(MemoryEventLog(), 0.5)  # the same round computed again elsewhere
        assert (retried.round_id, retried.commit_digest) == (first.round_id, first.commit_digest)
        assert log.publish([retried]) == [
            PublishOutcome(REQUEST, first.round_id, PublishStatus.ALREADY_PUBLISHED, 1)
        ]
        # The same coordinate and drafts, other target rows: the same derived id for another commit.
        rival = _round(MemoryEventLog(), 0.0)
        assert rival.round_id == first.round_id and rival.commit_digest != first.commit_digest
        assert log.publish([rival]) == [
            PublishOutcome(REQUEST, first.round_id, PublishStatus.DUPLICATE_ROUND, 2)
        ]
        assert len(_stored_ids(log)) == 2 and audit_log(log).ok


def test_rows_written_before_0005_keep_their_ids_and_still_fence(sqlite_path: str) -> None:
    with SqlEventLog.open(sqlite_path) as log:
        first = _round(log, 0.5)
        with log.engine.begin() as connection:  # the row as revision 0004 wrote it: the id in full
            connection.execute(text("UPDATE rounds SET round_id = :id"), {"id": first.round_id})
        assert _stored_ids(log) == [(1, first.round_id)]
        assert log.publish([first]) == [
            PublishOutcome(REQUEST, first.round_id, PublishStatus.ALREADY_PUBLISHED, 1)
        ]
        second = _round(log, 0.5)  # a round written now is stored empty next to it
        assert _stored_ids(log) == [(1, first.round_id), (2, "")]
        assert [e.round_id for e in log.events(REQUEST)][1:] == [first.round_id] * 5 + [second.round_id] * 5
        assert audit_log(log).ok


def test_downgrade_to_0004_writes_the_derived_ids_back(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        ids = [_round(log, 0.5).round_id for _ in range(3)]
        before = list(log.events())
        assert [r for _, r in _stored_ids(log)] == ["", "", ""]
        with log.engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0004")
        assert [r for _, r in _stored_ids(log)] == ids
        with log.engine.begin() as connection:  # this release reads the newest schema (a column was added)
            command.upgrade(alembic_config(connection), "head")
        assert list(log.events()) == before


def test_a_compact_rows_envelopes_are_built_by_the_reader_and_a_raw_rows_checked(sqlite_path: str) -> None:
    with SqlEventLog.open(sqlite_path) as log:
        _round(log, 0.5)
        second = _round(log, 0.5)
        texts = [e.payload_bytes for e in log.events(REQUEST) if e.generation == 2]
        assert all(data is not None for data in texts)
        with log.engine.begin() as connection:  # the second round rewritten in the RAW form, its id kept ''
            connection.execute(
                text("UPDATE rounds SET body = :body WHERE generation = 2"),
                {"body": encode_raw([data for data in texts if data is not None])},
            )
        assert _stored_ids(log) == [(1, ""), (2, "")]
        compact, raw = [item for item in stored_items(log, REQUEST) if isinstance(item, StoredRound)]
        assert compact.envelopes_built and not raw.envelopes_built
        assert raw.round_id == second.round_id  # derived from the RAW round_ready text
        for stored in (compact, raw):  # the full check agrees with what the reader built
            assert dataclasses.replace(stored, envelopes_built=False).envelopes_match(EVENT_SCHEMA_VERSION)
            assert stored.envelopes_match(EVENT_SCHEMA_VERSION) and not stored.envelopes_match(2)
        assert audit_log(log).ok


def test_the_fences_lookup_reads_two_index_entries_not_the_requests_rounds(sqlite_path: str) -> None:
    """Looking up a (request, round id) pair uses the partial unique index and the primary key."""
    from specround.adapters.sql.log import _Statements

    with SqlEventLog.open(sqlite_path) as log, log.engine.connect() as connection:
        raw = connection.connection.dbapi_connection
        assert raw is not None
        lookup = _Statements("qmark", False).rounds(1)
        plan = raw.execute("EXPLAIN QUERY PLAN " + lookup, (1, "x", 3)).fetchall()
        details = [str(row[-1]) for row in plan]
        assert any("MULTI-INDEX OR" in d for d in details), details
        assert any("uq_rounds_round (request_no=? AND round_id=?)" in d for d in details), details
        assert any("(request_no=? AND generation=?)" in d for d in details), details
