"""SQL-specific behaviour of SqlEventLog: locations, SQLite settings, error mapping, the database fence."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import LargeBinary, bindparam, event, text

from specround.adapters.sql import SqlEventLog, parse_location
from specround.adapters.sql.engine import SQLITE_PAGE_SIZE, _enable_wal
from specround.adapters.sql.round_body import COMPACT2, decode_round
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.errors import (
    InputError,
    InvalidLogUrlError,
    LogIntegrityError,
    LogUnavailableError,
    SchemaVersionError,
)
from tests.adapters.eventlog_contract import PUBLISHED, assert_chains_verify, opened, snapshot
from tests.adapters.synthetic_rounds import build_round, run_rounds

# --- locations --------------------------------------------------------------------------------------------


def test_a_bare_path_is_a_sqlite_file(tmp_path: Path) -> None:
    for raw in (str(tmp_path / "a.db"), tmp_path / "a.db", "relative/b.db"):
        location = parse_location(raw)
        assert location.backend == "sqlite"
        assert location.sqlite_path == Path(os.fspath(raw))


def test_urls_name_their_backend() -> None:
    assert parse_location("sqlite:///x.db").sqlite_path == Path("x.db")
    assert parse_location("sqlite:////abs/x.db").sqlite_path == Path("/abs/x.db")
    for url in ("postgresql://u@h/db", "postgres://u@h/db", "postgresql+psycopg://u:secret@h:5/db"):
        location = parse_location(url)
        assert location.backend == "postgresql"
        assert location.url.drivername == "postgresql+psycopg"
        assert "secret" not in location.display()


@pytest.mark.parametrize(
    "bad",
    [
        ":memory:",
        "",
        "sqlite://",
        "sqlite:///:memory:",
        "mysql://u@h/db",
        "postgresql+psycopg2://u@h/db",
        "::://",
    ],
)
def test_unusable_locations_are_refused_as_input_errors(bad: str) -> None:
    with pytest.raises(InvalidLogUrlError) as caught:
        SqlEventLog.open(bad)
    assert isinstance(caught.value, InputError)


# --- opening ----------------------------------------------------------------------------------------------


def test_open_without_create_needs_an_existing_log(tmp_path: Path) -> None:
    missing = tmp_path / "missing.sqlite"
    with pytest.raises(LogUnavailableError):
        SqlEventLog.open(missing, create=False)
    assert not missing.exists()
    empty = tmp_path / "empty.sqlite"
    sqlite3.connect(empty).close()
    with pytest.raises(SchemaVersionError):
        SqlEventLog.open(empty, create=False)
    with sqlite3.connect(empty) as raw:
        assert raw.execute("SELECT name FROM sqlite_master").fetchall() == []


def test_two_handles_on_one_file_share_the_log(sqlite_path: str) -> None:
    first = SqlEventLog.open(sqlite_path)
    second = SqlEventLog.open(sqlite_path, create=False)
    cfg, state = opened(first, "req-a")
    publication, _ = build_round(cfg, state)
    assert second.publish([publication])[0].status is PUBLISHED
    assert snapshot(first) == snapshot(second)
    first.close()
    second.close()
    reopened = SqlEventLog.open(sqlite_path, create=False)
    assert reopened.head("req-a") is not None and reopened.head("req-a").generation == 1  # type: ignore[union-attr]
    assert_chains_verify(reopened)
    reopened.close()


def test_sqlite_connections_use_wal_normal_sync_and_foreign_keys(sqlite_path: str) -> None:
    log = SqlEventLog.open(sqlite_path, busy_timeout_s=7.5)
    with log.engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA page_size").scalar() == SQLITE_PAGE_SIZE
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 7500
    log.close()


class _LockedThenFree:
    """A cursor whose first ``locked`` statements fail as SQLite's do while another process holds the file."""

    def __init__(self, locked: int, message: str = "database is locked") -> None:
        self.locked, self.message, self.statements = locked, message, 0

    def execute(self, statement: str) -> None:
        self.statements += 1
        if self.statements <= self.locked:
            raise sqlite3.OperationalError(self.message)


def test_switching_to_wal_waits_for_a_racing_creator() -> None:
    """The journal-mode switch is retried while locked (SQLite does not call its busy handler for it)."""
    cursor = _LockedThenFree(locked=3)
    _enable_wal(cursor, busy_timeout_s=5.0)
    assert cursor.statements == 4
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        _enable_wal(_LockedThenFree(locked=10**9), busy_timeout_s=0.01)  # gives up at the busy timeout
    other = _LockedThenFree(locked=1, message="disk I/O error")
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _enable_wal(other, busy_timeout_s=5.0)
    assert other.statements == 1  # anything but a lock is not retried


def test_a_fresh_file_held_by_another_writer_is_unavailable_after_the_busy_timeout(sqlite_path: str) -> None:
    blocker = sqlite3.connect(sqlite_path, isolation_level=None)  # a rollback-journal file, held exclusively
    blocker.execute("CREATE TABLE t (x)")
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(LogUnavailableError, match="locked"):
            SqlEventLog.open(sqlite_path, busy_timeout_s=0.05)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


def test_every_write_transaction_begins_immediate(sqlite_path: str) -> None:
    log = SqlEventLog.open(sqlite_path)
    statements: list[str] = []

    @event.listens_for(log.engine, "before_cursor_execute")
    def record(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        statements.append(
            statement.split()[0].upper() + (" " + statement.split()[1].upper() if " " in statement else "")
        )

    cfg, state = opened(log, "req-a")
    publication, _ = build_round(cfg, state)
    log.publish([publication])
    log.head("req-a")
    list(log.events())
    begins = [s for s in statements if s.startswith("BEGIN")]
    writes = [s for s in statements if s.split()[0] in ("INSERT", "UPDATE")]
    assert begins == ["BEGIN IMMEDIATE", "BEGIN IMMEDIATE", "BEGIN", "BEGIN"]  # open, publish, 2 reads
    assert writes  # the writes happened inside those transactions
    log.close()


# --- the database fence -----------------------------------------------------------------------------------


def test_a_round_row_rebuilds_the_hashed_canonical_text(log_url: str) -> None:
    """INV-9: one row per round, from which the audit recomputes every link of the five events."""
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a")
    rounds = run_rounds(cfg, state, 2)
    log.publish([p for p, _ in rounds])
    with log.engine.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT generation, round_id, commit_digest, prev_hash, hash, body FROM rounds "
                "ORDER BY generation"
            )
        ).all()
        opened_rows = connection.execute(text("SELECT seq, kind FROM events")).all()
    assert [tuple(row) for row in opened_rows] == [(0, "request_opened")]
    assert [row.generation for row in rows] == [1, 2]
    stored = list(log.events())
    links = [GENESIS_HASH]
    for item in stored:
        assert item.payload_bytes is not None
        assert item.hash == chain_hash(item.prev_hash, item.payload_bytes)
        assert item.prev_hash == links[-1]
        links.append(item.hash)
    previous = None
    for (publication, _), row in zip(rounds, rows, strict=True):
        expected = [canonical_bytes(e) for e in publication.events()]
        rebuilt = decode_round(
            bytes(row.body), "req-a", row.round_id, row.generation, bytes(row.commit_digest).hex(), previous
        )
        previous = rebuilt[3]["processor_after"]
        assert [canonical_bytes(e) for e in rebuilt] == expected
        first = 5 * row.generation - 4
        assert [e.payload_bytes for e in stored[first : first + 5]] == expected
        assert bytes(row.prev_hash) == bytes.fromhex(stored[first].prev_hash)[:8]
        assert bytes(row.hash).hex() == stored[first + 4].hash == links[first + 5]
        assert len(bytes(row.body)) < sum(len(b) for b in expected) // 3  # compact, not the JSON text
        assert bytes(row.body)[0] == COMPACT2  # the form the log writes
    log.close()


def test_the_unique_keys_back_up_the_fence(log_url: str) -> None:
    """A publication row the compare-and-swap did not expect trips the unique key: nothing is appended
    and the caller gets LogIntegrityError, never a raw driver exception."""
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a")
    other_cfg, other_state = opened(log, "req-b")
    publication, _ = build_round(cfg, state)
    bystander, _ = build_round(other_cfg, other_state)
    with log.engine.begin() as connection:
        connection.execute(
            text(
                "INSERT INTO rounds (request_no, generation, round_id, recorded_at, commit_digest, "
                "prev_hash, hash, body) SELECT request_no, 1, 'intruder', 0, :d, :d, :d, :d FROM requests "
                "WHERE request_id = 'req-a'"
            ).bindparams(bindparam("d", type_=LargeBinary())),
            {"d": bytes(32)},
        )
    before = snapshot(log)
    with pytest.raises(LogIntegrityError) as caught:
        log.publish([bystander, publication])
    assert "rounds" in str(caught.value).lower() or "unique" in str(caught.value).lower()
    assert snapshot(log) == before
    log.close()


def test_a_reader_keeps_its_snapshot(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a", max_new_tokens=60)
    rounds = run_rounds(cfg, state, 3)
    log.publish([rounds[0][0]])
    reader = log.events("req-a")
    first = next(reader)
    log.publish([rounds[1][0]])
    assert len([first, *reader]) == 6  # the round published after the read began is not in this read
    assert len(list(log.events("req-a"))) == 11
    log.close()


def test_closing_the_log_ends_unfinished_streams(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a")
    log.publish([p for p, _ in run_rounds(cfg, state, 2)])
    stream = log.events()
    next(stream)  # holds a connection and a read transaction now
    log.close()
    with pytest.raises(StopIteration):
        next(stream)
    # Nothing is left holding the database: a new handle can migrate-check, write and read at once.
    again = SqlEventLog.open(log_url)
    assert len(list(again.events("req-a"))) == 11
    again.close()


def test_a_requests_rounds_are_decoded_as_the_reader_takes_them(
    log_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long request is streamed round by round: its events are never all alive at once."""
    import specround.adapters.sql.log as sql_log

    log = SqlEventLog.open(log_url)
    for rid in ("req-a", "req-b"):
        cfg, state = opened(log, rid, max_new_tokens=200)
        log.publish([p for p, _ in run_rounds(cfg, state, 6)])
    everything = list(log.events())
    decoded: list[int] = []
    decode = sql_log.read_round_row
    monkeypatch.setattr(
        sql_log, "read_round_row", lambda row, *rest, **kw: decoded.append(row[1]) or decode(row, *rest, **kw)
    )
    stream = log.events()
    taken = [next(stream) for _ in range(1 + 5 + 1)]  # req-a: request_opened, round 1, round 2's first
    assert decoded == [1, 2]  # generations decoded so far: rounds 3..6 wait for the reader
    taken += list(stream)
    assert decoded == [1, 2, 3, 4, 5, 6] * 2
    assert [(e.request_id, e.seq, e.hash) for e in taken] == [
        (e.request_id, e.seq, e.hash) for e in everything
    ]
    assert [e.request_id for e in taken].count("req-b") == 31
    log.close()


# --- the publishing connection -------------------------------------------------------------------------


class _Checkouts:
    """Counts the connections the log's pool hands out."""

    def __init__(self, log: SqlEventLog) -> None:
        self.count = 0
        event.listen(log.engine, "checkout", self._seen)

    def _seen(self, *_args: object) -> None:
        self.count += 1


def test_publishing_keeps_its_connection_between_writes(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a", max_new_tokens=60)
    rounds = run_rounds(cfg, state, 4)
    checkouts = _Checkouts(log)
    for publication, _ in rounds:
        assert log.publish([publication])[0].status is PUBLISHED
    assert checkouts.count == 1  # the first write checked one out; the next three reused it
    assert log.engine.pool.checkedout() == 1  # type: ignore[attr-defined]
    assert log.head("req-a").generation == 4  # type: ignore[union-attr]
    log.close()
    assert log.engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # close returned it


class _InjectedWriteError(RuntimeError):
    pass


def test_a_failed_write_gives_its_connection_back(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a")
    (first, _), (second, _) = run_rounds(cfg, state, 2)
    failing = [True]

    @event.listens_for(log.engine, "before_cursor_execute")
    def fail_once(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if failing[0] and "INSERT INTO ROUNDS" in statement.upper():  # alone, or in PostgreSQL's WITH
            failing[0] = False
            raise _InjectedWriteError("injected")

    before = snapshot(log)
    with pytest.raises(_InjectedWriteError):
        log.publish([first])
    assert snapshot(log) == before  # rolled back: nothing half-published
    assert log.engine.pool.checkedout() == 0  # type: ignore[attr-defined]  # the connection went back
    checkouts = _Checkouts(log)
    assert [r.status for r in log.publish([first])] == [PUBLISHED]
    assert [r.status for r in log.publish([second])] == [PUBLISHED]
    assert checkouts.count == 1  # a fresh one, kept again
    assert_chains_verify(log)
    log.close()


def test_a_write_that_finds_the_connection_in_use_takes_its_own(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    cfg, state = opened(log, "req-a")
    (first, _), (second, _) = run_rounds(cfg, state, 2)
    log.publish([first])  # the kept connection now exists
    checkouts = _Checkouts(log)
    with log._writer_lock:  # what another thread's write in progress holds
        assert [r.status for r in log.publish([second])] == [PUBLISHED]
    assert checkouts.count == 1  # its own, from the pool
    assert log.engine.pool.checkedout() == 1  # type: ignore[attr-defined]  # it went back; the kept one stays
    assert log.head("req-a").generation == 2  # type: ignore[union-attr]
    log.close()
    assert log.engine.pool.checkedout() == 0  # type: ignore[attr-defined]


# --- driver errors ----------------------------------------------------------------------------------------


def test_a_locked_database_is_reported_as_unavailable(sqlite_path: str) -> None:
    log = SqlEventLog.open(sqlite_path, busy_timeout_s=0.05)
    cfg, state = opened(log, "req-a")
    publication, _ = build_round(cfg, state)
    blocker = sqlite3.connect(sqlite_path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LogUnavailableError, match="locked"):
            log.publish([publication])
        assert log.head("req-a").generation == 0  # type: ignore[union-attr]  # reads still work under WAL
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert log.publish([publication])[0].status is PUBLISHED
    log.close()


@pytest.mark.postgres
def test_a_locked_postgres_row_times_out_as_unavailable(postgres_url: str) -> None:
    log = SqlEventLog.open(postgres_url, busy_timeout_s=0.2)
    cfg, state = opened(log, "req-a")
    publication, _ = build_round(cfg, state)
    blocker = log.engine.connect()
    transaction = blocker.begin()
    blocker.execute(text("SELECT 1 FROM requests WHERE request_id = 'req-a' FOR UPDATE"))
    try:
        with pytest.raises(LogUnavailableError, match="lock"):
            log.publish([publication])
    finally:
        transaction.rollback()
        blocker.close()
    assert log.publish([publication])[0].status is PUBLISHED
    log.close()


def test_an_unreachable_postgres_server_is_unavailable() -> None:
    with pytest.raises(LogUnavailableError) as caught:
        SqlEventLog.open("postgresql+psycopg://postgres@127.0.0.1:1/test", busy_timeout_s=2)
    assert "sqlalchemy" not in type(caught.value).__module__
    assert caught.value.__cause__ is not None  # the driver's error stays attached for debugging


def test_a_missing_table_is_a_schema_error(log_url: str) -> None:
    log = SqlEventLog.open(log_url)
    opened(log, "req-a")
    with log.engine.begin() as connection:
        connection.execute(text("DROP TABLE rounds"))
    cfg, state = opened(log, "req-b")
    publication, _ = build_round(cfg, state)
    with pytest.raises(SchemaVersionError):
        log.publish([publication])
    log.close()
