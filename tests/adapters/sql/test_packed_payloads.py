"""Packed ``request_opened`` texts: stored deflated, read back byte for byte, checked as text."""

from __future__ import annotations

import hashlib
import json
import shutil
import zlib
from pathlib import Path

import pytest
from alembic import command
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from specround.adapters.sql import SqlEventLog, database_status, head_revision, upgrade_database
from specround.adapters.sql import packed_payload as packing
from specround.adapters.sql.migrate import alembic_config
from specround.adapters.sql.packed_payload import DICTIONARY_V1, pack_payload, unpack_payload
from specround.audit import audit_log
from specround.canonical import canonical_bytes
from specround.statemachine.controller import RoundController
from specround.statemachine.events import RequestOpened

FIXTURES = Path(__file__).parent / "fixtures"
_DICTIONARY_SHA256 = "b5101d6d9d328f1c89215f2eb6ab3290893bf02bfafa89d99637b125b2a8d6a8"


def _open(log: SqlEventLog, request_id: str, **extra: object) -> RequestOpened:
    """Open ``request_id`` through a controller; the ``request_opened`` event it logged."""
    controller = RoundController(log)
    controller.open_request(
        [5, 6, 7, 8], seed=3, max_new_tokens=32, vocab_size=64, request_id=request_id, **extra
    )
    (event,) = [e for e in log.events(request_id) if e.seq == 0]
    return RequestOpened.model_validate(event.payload)


def _stored(log: SqlEventLog, request_id: str) -> tuple[str, bytes | None]:
    with log.engine.connect() as connection:
        row = connection.execute(
            text("SELECT payload, packed_payload FROM events WHERE request_id = :id AND seq = 0"),
            {"id": request_id},
        ).one()
    return str(row[0]), None if row[1] is None else bytes(row[1])


def test_the_dictionary_is_frozen_with_its_form() -> None:
    """Changing the dictionary would make every packed row unreadable: it is pinned by its digest."""
    assert hashlib.sha256(DICTIONARY_V1).hexdigest() == _DICTIONARY_SHA256
    assert packing.DEFLATE_V1 == 1


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096) | st.text(max_size=2048).map(str.encode))
def test_any_text_unpacks_to_the_same_bytes(data: bytes) -> None:
    assert unpack_payload(pack_payload(data)) == data


@pytest.mark.parametrize(
    ("packed", "message"),
    [
        (b"", "is empty"),
        (b"\x02" + pack_payload(b"{}")[1:], "unknown form 2"),
        (pack_payload(b'{"a":1}')[:-2], "cut short"),
        (pack_payload(b'{"a":1}') + b"\x00", "1 bytes after its stream"),
        (b"\x01\xff\xff\xff\xff", "not a deflate stream"),
    ],
)
def test_a_damaged_packed_payload_is_refused_by_name(packed: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        unpack_payload(packed)


def test_a_payload_that_would_unpack_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    bomb = pack_payload(b"0" * 100_000)
    assert len(bomb) < 200
    monkeypatch.setattr(packing, "MAX_UNPACKED_BYTES", 50_000)
    with pytest.raises(ValueError, match="unpacks past 50,000 bytes"):
        unpack_payload(bomb)


def test_a_request_opened_is_stored_packed_and_read_back_as_hashed(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        event = _open(log, "packed-a")
        payload, packed = _stored(log, "packed-a")
        (read,) = [e for e in log.events("packed-a") if e.seq == 0]
    data = canonical_bytes(event)
    assert payload == "" and packed is not None
    assert len(packed) * 3 < len(data)  # the skeleton every request repeats is back-references
    assert read.payload_bytes == data and read.defect is None
    assert zlib.decompressobj(-15, zdict=DICTIONARY_V1).decompress(packed[1:]) == data  # plain raw deflate


def _set_opened(path: str, payload: str, packed: bytes | None) -> None:
    with SqlEventLog.open(path, create=False) as log, log.engine.begin() as connection:
        connection.execute(
            text("UPDATE events SET payload = :payload, packed_payload = :packed WHERE seq = 0"),
            {"payload": payload, "packed": packed},
        )


def _findings(path: str) -> list[tuple[str, int | None, str]]:
    with SqlEventLog.open(path, create=False) as log:
        report = audit_log(log)
    return [(f.kind, f.seq, f.message) for f in report.findings]


def test_an_edited_packed_text_is_an_edited_event(sqlite_path: str) -> None:
    with SqlEventLog.open(sqlite_path) as log:
        event = _open(log, "packed-b")
    edited = canonical_bytes(event).replace(b'"seed":3', b'"seed":4')
    _set_opened(sqlite_path, "", pack_payload(edited))
    findings = _findings(sqlite_path)
    assert findings and findings[0][:2] == ("edited", 0), findings


@pytest.mark.parametrize(
    ("payload", "packed", "named"),
    [
        ("", b"\x01\xff\xff", "not a deflate stream"),
        ("", b"\x07abc", "unknown form 7"),
        ("{}", None, ""),  # a text that is valid JSON but not what was hashed: edited, not malformed
        ("x", b"", "both a payload text and a packed payload"),
    ],
)
def test_a_damaged_packed_row_is_a_named_finding(
    sqlite_path: str, payload: str, packed: bytes | None, named: str
) -> None:
    with SqlEventLog.open(sqlite_path) as log:
        _open(log, "packed-c")
    _set_opened(sqlite_path, payload, packed)
    findings = _findings(sqlite_path)
    kinds = {(kind, seq) for kind, seq, _ in findings}
    if named:
        assert ("malformed", 0) in kinds and any(named in message for _, _, message in findings), findings
    else:
        assert ("edited", 0) in kinds, findings


def test_a_0004_log_keeps_its_texts_and_packs_the_requests_opened_after_the_upgrade(tmp_path: Path) -> None:
    path = str(tmp_path / "v0004.sqlite")
    shutil.copyfile(FIXTURES / "v0004_controller.sqlite", path)
    assert database_status(path).current == "0004"
    assert upgrade_database(path).current == head_revision()
    expected = json.loads((FIXTURES / "v0004_controller.events.json").read_text())
    with SqlEventLog.open(path, create=False) as log:
        with log.engine.connect() as connection:
            old = connection.execute(text("SELECT payload, packed_payload FROM events")).all()
        assert old and all(payload.startswith("{") and packed is None for payload, packed in old)
        _open(log, "after-0006")
        assert _stored(log, "after-0006")[0] == ""
        read = [[e.request_id, e.seq, e.kind, e.round_id, e.generation, e.hash] for e in log.events()]
        assert [r for r in read if r[0] != "after-0006"] == expected
        assert audit_log(log).ok


def test_downgrade_to_0005_writes_the_texts_back(log_url: str) -> None:
    with SqlEventLog.open(log_url) as log:
        for index in range(3):
            _open(log, f"down-{index}")
        before = list(log.events())
        with log.engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0005")
        with log.engine.connect() as connection:
            texts = connection.execute(text("SELECT payload FROM events ORDER BY request_id")).scalars().all()
        assert texts == [e.payload_bytes.decode() for e in before if e.payload_bytes is not None]
        with log.engine.begin() as connection:
            command.upgrade(alembic_config(connection), "head")
        assert list(log.events()) == before
