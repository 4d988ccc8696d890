"""A round row keeps the first 8 bytes of its commit digest (migration 0008); the reader rebuilds the rest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from alembic import command
from sqlalchemy import text

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog, database_status, head_revision, upgrade_database
from specround.adapters.sql.migrate import alembic_config
from specround.adapters.sql.tables import COMMIT_PREFIX_BYTES
from specround.audit import audit_log
from specround.errors import LogIntegrityError
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import (
    EventLog,
    PublishStatus,
    RoundPublication,
    StoredEvent,
)
from specround.statemachine.rounds import RoundInput
from tests.adapters.capturing_log import CapturingLog

V, K = 32, 3
_PROCESSORS = [{"kind": "temperature", "params": {"temperature": 0.7}}]


def _generate(log: EventLog, request_id: str, layout: Layout, rounds: int) -> None:
    """``rounds`` controller rounds of a request with a processor, under ``layout``."""
    controller = RoundController(log)
    controller.open_request(
        [1, 2, 3],
        seed=7,
        max_new_tokens=64,
        vocab_size=V,
        request_id=request_id,
        layout=layout,
        processors=_PROCESSORS,
    )
    gen = torch.Generator().manual_seed(len(request_id))
    for _ in range(rounds):
        q = torch.softmax(torch.randn(K, V, generator=gen, dtype=torch.float64), -1)
        p = torch.softmax(torch.randn(K + 1, V, generator=gen, dtype=torch.float64), -1)
        drafts = torch.multinomial(q, 1, generator=gen).reshape(K)
        coordinate = controller.coordinate_digest(request_id)
        (result,) = controller.step([RoundInput(request_id, coordinate, drafts, q, p)])
        result.raise_for_error()


def _write(log: EventLog) -> None:
    _generate(log, "replayed", Layout.REPLAY_FRONTIER, 4)
    _generate(log, "retained", Layout.RETAINED_FRONTIER, 4)


def _stored_commits(log: SqlEventLog) -> list[bytes]:
    with log.engine.connect() as connection:
        rows = connection.execute(text("SELECT commit_digest FROM rounds ORDER BY request_no, generation"))
        return [bytes(row[0]) for row in rows]


def _published_commits(events: list[StoredEvent]) -> list[str]:
    return [str(e.payload["commit_digest"]) for e in events if e.kind == "round_published"]


def _set_commit(log: SqlEventLog, value: bytes) -> None:
    """Overwrite the stored commit digest of the first round of ``retained``."""
    with log.engine.begin() as connection:
        connection.execute(
            text(
                "UPDATE rounds SET commit_digest = :c WHERE generation = 1 AND request_no = "
                "(SELECT request_no FROM requests WHERE request_id = 'retained')"
            ),
            {"c": value},
        )


def test_rows_keep_a_prefix_and_read_back_the_whole_digest_under_either_layout(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        _write(log)
        events = list(log.events())
        published = _published_commits(events)
        assert len(published) == 8 and all(len(digest) == 64 for digest in published)
        assert _stored_commits(log) == [bytes.fromhex(digest)[:COMMIT_PREFIX_BYTES] for digest in published]
        assert audit_log(log).ok


def test_an_edited_prefix_is_named_as_an_edit_of_the_round_published_event(log_url: str) -> None:
    """A prefix that begins no commit of the events is kept (padded): its event fails its hash link."""
    with SqlEventLog.open(log_url) as log:
        _write(log)
        stored = _stored_commits(log)[4]
        _set_commit(log, bytes([stored[0] ^ 1]) + stored[1:])
        (published,) = [e for e in log.events("retained") if e.seq == 5]
        assert published.kind == "round_published"
        assert (
            published.payload["commit_digest"] == bytes([stored[0] ^ 1]).hex() + stored[1:].hex() + "-" * 48
        )
        report = audit_log(log)
        assert [r.request_id for r in report.requests if not r.ok] == ["retained"]
        assert ("INV-9", "edited", 5) in {(f.invariant, f.kind, f.seq) for f in report.findings}


def test_a_0007_log_upgrades_to_prefixes_and_downgrades_back_whole(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        _write(log)
        before = list(log.events())
        whole = [bytes.fromhex(digest) for digest in _published_commits(before)]
        with log.engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0007")
        assert _stored_commits(log) == whole
        # A row whose events do not rebuild its digest keeps all 32 bytes through the upgrade.
        wrong = bytes(32)
        _set_commit(log, wrong)
        lines: list[str] = []
        with log.engine.begin() as connection:
            command.upgrade(alembic_config(connection, lines.append), "head")
        assert lines == ["0008: 7 of 8 rounds keep the first bytes of their commit digest"]
        expected = [digest[:COMMIT_PREFIX_BYTES] for digest in whole]
        expected[4] = wrong
        assert _stored_commits(log) == expected
        assert not audit_log(log).ok  # the wrong digest was not the one its round was hashed with
        _set_commit(log, whole[4])
        assert list(log.events()) == before  # a whole digest reads as it is
        assert audit_log(log).ok


def _first_round(log: EventLog, seed: int) -> RoundPublication:
    """The publication of round ``r-1`` of request ``fenced``, its drafts drawn with ``seed``."""
    capturing = CapturingLog(log)
    controller = RoundController(capturing)
    controller.open_request([1, 2], seed=3, max_new_tokens=8, vocab_size=V, request_id="fenced")
    gen = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(K, V, generator=gen, dtype=torch.float64), -1)
    p = torch.softmax(torch.randn(K + 1, V, generator=gen, dtype=torch.float64), -1)
    drafts = torch.multinomial(q, 1, generator=gen).reshape(K)
    coordinate = controller.coordinate_digest("fenced")
    (result,) = controller.step([RoundInput("fenced", coordinate, drafts, q, p, round_id="r-1")])
    result.raise_for_error()
    (publication,) = capturing.sent
    return publication


def test_the_fence_tells_a_retry_from_another_round_by_the_stored_prefix(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        published = _first_round(log, seed=1)
        other = _first_round(MemoryEventLog(), seed=2)  # the same request and round id, other drafts
        assert (
            other.commit_digest[: 2 * COMMIT_PREFIX_BYTES]
            != published.commit_digest[: 2 * COMMIT_PREFIX_BYTES]
        )
        (retry,) = log.publish([published])
        assert (retry.status, retry.generation) == (PublishStatus.ALREADY_PUBLISHED, 1)
        (conflict,) = log.publish([other])
        assert conflict.status is PublishStatus.DUPLICATE_ROUND
        assert len(_stored_commits(log)) == 1


FIXTURES = Path(__file__).parent / "fixtures"


def test_a_generate_log_written_at_0007_upgrades_and_reads_back_unchanged(tmp_path: Path) -> None:
    """Both layouts and a processor whose state moves: every digest is rebuilt, every event read as before."""
    path = tmp_path / "v0007.sqlite"
    shutil.copyfile(FIXTURES / "v0007_generate.sqlite", path)
    assert database_status(str(path)).current == "0007"
    lines: list[str] = []
    assert upgrade_database(str(path), progress=lines.append).current == head_revision()
    assert lines == ["0008: 94 of 94 rounds keep the first bytes of their commit digest"]
    expected = json.loads((FIXTURES / "v0007_generate.events.json").read_text())
    with SqlEventLog.open(str(path), create=False) as log:
        assert {len(commit) for commit in _stored_commits(log)} == {COMMIT_PREFIX_BYTES}
        read = [[e.request_id, e.seq, e.kind, e.round_id, e.generation, e.hash] for e in log.events()]
        assert read == expected
        assert audit_log(log).ok


def test_a_downgrade_names_a_round_whose_digest_cannot_be_rebuilt(log_url: str) -> None:
    """An edited prefix begins no commit of the events: the downgrade refuses with a named error."""
    with SqlEventLog.open(log_url) as log:
        _write(log)
        stored = _stored_commits(log)[4]
        _set_commit(log, bytes([stored[0] ^ 1]) + stored[1:])
        with pytest.raises(LogIntegrityError, match="cannot downgrade"), log.engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0007")
