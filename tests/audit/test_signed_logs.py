"""Signed heads: with the key an audit catches forged histories, deleted rows and a wrong key; anchors catch
truncation and rewinding. Without a key the same forgery audits clean (the threat model's stated gap)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from specround.adapters.sql import SqlEventLog
from specround.audit import anchor_of, audit_anchor, audit_log, audit_signatures
from specround.errors import InvalidRequestError
from specround.signing import KEY_ENV, HmacSigner, load_key
from specround.statemachine.controller import RoundController
from tests.statemachine._synthetic import random_input

runner = CliRunner()
V = 16
KEY = b"0123456789abcdef-signing-key"
HACKED = (73, 32, 104, 97, 118, 101, 32, 98, 101, 101, 110, 32, 72, 65, 67, 75, 69, 68)
"""The bytes of "I have been HACKED", used as the forged request's prompt token ids (V = 128)."""


def _write(path: Path, signer: HmacSigner | None, prompts: dict[str, tuple[int, ...]], steps: int) -> None:
    log = SqlEventLog.open(path, signer=signer, checkpoint_every=2)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(5)
    for rid, prompt in prompts.items():
        controller.open_request(prompt, seed=9, vocab_size=128, request_id=rid, max_new_tokens=40)
    for _ in range(steps):
        controller.step([random_input(controller, rid, 2, generator) for rid in prompts])
    log.close()


@pytest.fixture
def signed_log(tmp_path: Path) -> Path:
    path = tmp_path / "signed.sqlite"
    _write(path, HmacSigner(KEY), {"a": (1, 2, 3), "b": (4, 5, 6)}, steps=4)
    return path


_REQUEST_COLUMNS = (
    "request_id, generation, head_seq, head_hash, state_digest, finished, opened_digest, opened_at, "
    "updated_at, request_no"
)
_ROUND_COLUMNS = "request_no, generation, round_id, recorded_at, commit_digest, prev_hash, hash, body"


def _number(request_id: str) -> str:
    """The SQL for a request's ``request_no`` (its rounds' key)."""
    return f"(SELECT request_no FROM requests WHERE request_id = '{request_id}')"


def _signature_findings(path: Path, key: bytes = KEY) -> list[tuple[str, str]]:
    with SqlEventLog.open(path, read_only=True) as log:
        return [(f.request_id, f.kind) for f in audit_signatures(log, HmacSigner(key))]


def _sql(path: Path, *statements: str) -> None:
    connection = sqlite3.connect(path)
    try:
        with connection:
            for statement in statements:
                connection.execute(statement)
    finally:
        connection.close()


def test_a_signed_log_verifies_with_its_key_and_not_with_another(signed_log: Path) -> None:
    assert _signature_findings(signed_log) == []
    wrong = _signature_findings(signed_log, b"another key, sixteen bytes+")
    assert wrong and {kind for _, kind in wrong} == {"forged", "unsigned"}


def test_a_history_rebuilt_with_the_library_is_caught_with_the_key(signed_log: Path, tmp_path: Path) -> None:
    forged = tmp_path / "forged.sqlite"
    _write(forged, None, {"b": HACKED}, steps=4)  # the same request id, a different text
    _sql(
        signed_log,
        f"ATTACH DATABASE '{forged}' AS f",
        f"DELETE FROM rounds WHERE request_no = {_number('b')}",
        "DELETE FROM events WHERE request_id = 'b'",
        "DELETE FROM requests WHERE request_id = 'b'",
        f"INSERT INTO requests ({_REQUEST_COLUMNS}) SELECT {_REQUEST_COLUMNS.replace('request_no', '2')} "
        "FROM f.requests",
        "INSERT INTO events SELECT * FROM f.events",
        f"INSERT INTO rounds ({_ROUND_COLUMNS}) SELECT {_ROUND_COLUMNS.replace('request_no', '2')} "
        "FROM f.rounds",
    )
    with SqlEventLog.open(signed_log, read_only=True) as log:
        assert audit_log(log).ok  # without a key the forgery is self-consistent: the stated gap
    findings = _signature_findings(signed_log)
    assert ("b", "unsigned") in findings and ("b", "rewritten") in findings
    assert all(rid == "b" for rid, _ in findings)
    result = runner.invoke(app_cli(), ["audit", str(signed_log), "--key", str(_key_file(tmp_path)), "--json"])
    assert result.exit_code == 1 and not json.loads(result.stdout)["ok"]


def test_a_deleted_request_row_is_caught(signed_log: Path) -> None:
    _sql(
        signed_log,
        "PRAGMA foreign_keys = OFF",
        "DELETE FROM requests WHERE request_id = 'a'",
    )
    with SqlEventLog.open(signed_log, read_only=True) as log:
        assert ("a", "orphan") in [(f.request_id, f.kind) for f in audit_log(log).findings]
    assert ("a", "dropped") in _signature_findings(signed_log)


def test_a_deleted_request_is_caught_by_the_checkpoint(signed_log: Path) -> None:
    _sql(
        signed_log,
        f"DELETE FROM rounds WHERE request_no = {_number('a')}",
        "DELETE FROM events WHERE request_id = 'a'",
        "DELETE FROM requests WHERE request_id = 'a'",
        "DELETE FROM signatures WHERE request_id = 'a'",
    )
    assert ("a", "dropped") in _signature_findings(signed_log)


def test_truncation_with_the_head_rewound_is_caught_by_an_anchor(signed_log: Path) -> None:
    with SqlEventLog.open(signed_log, read_only=True) as log:
        anchor = anchor_of(log)
        signed_heads = [json.loads(r.message) for r in log.signature_rows() if r.request_id == "a"]
    [older] = [m["heads"][0] for m in signed_heads if m["heads"][0][1] == 3]  # a at generation 3
    _, generation, seq, link, digest, _ = older
    _sql(
        signed_log,
        f"DELETE FROM rounds WHERE request_no = {_number('a')} AND generation > {generation}",
        f"UPDATE requests SET generation = {generation}, head_seq = {seq}, head_hash = '{link}', "
        f"state_digest = '{digest}' WHERE request_id = 'a'",
        "DELETE FROM signatures WHERE id = (SELECT MAX(id) FROM signatures WHERE request_id = 'a')",
        "DELETE FROM signatures WHERE scope = 'checkpoint' AND id > (SELECT MAX(id) FROM signatures "
        "WHERE request_id = 'a')",
    )
    with SqlEventLog.open(signed_log, read_only=True) as log:
        assert audit_log(log).ok  # a consistent, shorter history
        assert audit_signatures(log, HmacSigner(KEY)) == []  # signed heads alone cannot see a rewind
        assert [(f.request_id, f.kind) for f in audit_anchor(log, anchor)] == [("a", "rewound")]


def test_the_anchor_and_key_options_of_the_cli(signed_log: Path, tmp_path: Path) -> None:
    printed = runner.invoke(app_cli(), ["anchor", str(signed_log)])
    assert printed.exit_code == 0
    anchor_file = tmp_path / "anchor.json"
    anchor_file.write_text(printed.stdout)
    assert json.loads(printed.stdout)["requests"] == 2
    clean = runner.invoke(
        app_cli(), ["audit", str(signed_log), "--key", str(_key_file(tmp_path)), "--anchor", str(anchor_file)]
    )
    assert clean.exit_code == 0, clean.output
    edited = json.loads(printed.stdout)
    edited["heads"][0][2] += 1
    anchor_file.write_text(json.dumps(edited))
    refused = runner.invoke(app_cli(), ["audit", str(signed_log), "--anchor", str(anchor_file), "--json"])
    assert refused.exit_code == 1 and "edited anchor" in refused.stdout


def test_keys_are_read_from_a_file_or_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert load_key(_key_file(tmp_path)) == KEY
    monkeypatch.delenv(KEY_ENV, raising=False)
    assert load_key() is None
    monkeypatch.setenv(KEY_ENV, KEY.decode())
    assert load_key() == KEY
    short = tmp_path / "short.key"
    short.write_bytes(b"short\n")
    with pytest.raises(InvalidRequestError, match="at least 16"):
        load_key(short)


def _key_file(directory: Path) -> Path:
    path = directory / "log.key"
    path.write_bytes(KEY + b"\n")
    return path


def app_cli():  # type: ignore[no-untyped-def]
    from specround.cli import app

    return app


def _rechain(path: Path, request_id: str, edit: dict[str, object], seq: int) -> None:
    """Edit one payload of ``request_id`` and recompute its chain and head, as a forger without the key.

    Every round row is rewritten in the RAW body form (the canonical texts themselves), with the chain
    links recomputed from the edited payload on.
    """
    import hashlib

    from specround.adapters.sql.round_body import encode_raw
    from specround.canonical import canonical_bytes

    with SqlEventLog.open(path, read_only=True) as log:
        events = list(log.events(request_id))
    connection = sqlite3.connect(path)
    with connection:
        prev = events[0].hash
        for generation in range(1, len(events) // 5 + 1):
            first = prev
            texts = []
            for event in events[5 * generation - 4 : 5 * generation + 1]:
                payload = dict(event.payload)
                if event.seq == seq:
                    payload.update(edit)
                data = canonical_bytes(payload)
                texts.append(data)
                prev = hashlib.sha256(prev.encode("ascii") + data).hexdigest()
            connection.execute(
                "UPDATE rounds SET body = ?, prev_hash = ?, hash = ? "
                f"WHERE request_no = {_number(request_id)} AND generation = ?",
                (encode_raw(texts), bytes.fromhex(first)[:8], bytes.fromhex(prev), generation),
            )
        connection.execute("UPDATE requests SET head_hash = ? WHERE request_id = ?", (prev, request_id))
    connection.close()
    if "timings" in edit:  # timings are not part of any decision: without the key this audits clean
        with SqlEventLog.open(path, read_only=True) as log:
            assert audit_log(log, [request_id]).ok


FORGERIES = {
    "edited timings, chain recomputed": lambda p: _rechain(
        p, "a", {"timings": {"draft_s": 9.0, "queue_s": 0.0, "state_s": 0.0, "verify_s": 0.0}}, 5
    ),
    "an extra field, chain recomputed": lambda p: _rechain(p, "b", {"note": "inserted"}, 5),
    "the head moved by hand": lambda p: _sql(p, "UPDATE requests SET finished = 1 WHERE request_id = 'a'"),
    "a tail cut, signatures kept": lambda p: _sql(
        p,
        f"DELETE FROM rounds WHERE request_no = {_number('a')} AND generation > 3",
        "UPDATE requests SET head_seq = 15, head_hash = (SELECT lower(hex(hash)) FROM rounds WHERE "
        f"request_no = {_number('a')} AND generation = 3) WHERE request_id = 'a'",
    ),
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_forgeries_without_the_key_are_caught_with_it(signed_log: Path, name: str) -> None:
    FORGERIES[name](signed_log)
    assert _signature_findings(signed_log), f"{name} was accepted with the key"


def test_a_request_inserted_without_the_key_is_unsigned(signed_log: Path, tmp_path: Path) -> None:
    extra = tmp_path / "extra.sqlite"
    _write(extra, None, {"c": HACKED}, steps=2)
    _sql(
        signed_log,
        f"ATTACH DATABASE '{extra}' AS x",
        f"INSERT INTO requests ({_REQUEST_COLUMNS}) SELECT {_REQUEST_COLUMNS.replace('request_no', '3')} "
        "FROM x.requests",
        "INSERT INTO events SELECT * FROM x.events",
        f"INSERT INTO rounds ({_ROUND_COLUMNS}) SELECT {_ROUND_COLUMNS.replace('request_no', '3')} "
        "FROM x.rounds",
    )
    assert ("c", "unsigned") in _signature_findings(signed_log)
