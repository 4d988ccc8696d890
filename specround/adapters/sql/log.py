"""``SqlEventLog``: the :class:`~specround.statemachine.ports.EventLog` port over SQLite or PostgreSQL.

* **Schema.** Only alembic migrations create or change tables. ``SqlEventLog.open(location)`` with
  ``create=True`` (the default) migrates the database to this release's head first, on SQLite and on
  PostgreSQL alike (serialised across processes: ``BEGIN IMMEDIATE`` / an advisory lock); with
  ``create=False`` a database that is not at head is refused with :class:`SchemaVersionError` and is left
  untouched. Operators who migrate PostgreSQL explicitly run ``specround db upgrade URL`` and open their
  workers with ``create=False``.
* **Publishing** is one transaction per call (group commit) and takes the whole step's rounds. Canonical
  bytes and each round's stored body (:mod:`specround.adapters.sql.round_body`) are computed before it
  starts. The transaction reads the heads of the batch's requests (``FOR UPDATE`` in request-id order on
  PostgreSQL; SQLite's ``BEGIN IMMEDIATE`` already holds the write lock), looks up the round ids of the
  publications that do not extend their head (retries and losers: only they can name a published round),
  decides every publication with the shared fence :func:`~specround.adapters.fence.plan_publish`, appends
  one ``rounds`` row per winner (its five events in one row), and moves each winner's head with a
  compare-and-swap ``UPDATE ... WHERE generation = expected`` whose row count is checked. When this log
  committed the last round of every request in the call, and each publication extends that head, the
  first attempt decides on those remembered heads and reads none (a head another writer moved since loses
  the compare-and-swap or trips a unique key, and the call is retried on heads read in the transaction, as
  below; so does a plan on remembered heads in which any publication does not win). On SQLite the two
  writes are ``executemany`` calls; on PostgreSQL they are one statement over column arrays sent in binary
  (``WITH appended AS (INSERT ... SELECT * FROM unnest(...)) UPDATE ... FROM unnest(...)``), which the
  server plans once for the whole step: one round trip and the commit per step, whatever the batch size.
  The unique keys of ``rounds`` back the fence up; if one fires anyway (a round id published at an
  earlier generation, or a concurrent writer the locks did not cover), or PostgreSQL reports a deadlock
  or serialization failure, the whole call is retried from the top with every round id looked up, so
  the loser is decided by the fence on the next attempt instead of aborting the others.
  The statements run on the connection's DBAPI cursor with positional tuples (no statement compilation or
  result processing), and the transaction itself (``BEGIN IMMEDIATE`` on SQLite, ``COMMIT``) is driven on
  the DBAPI connection rather than through SQLAlchemy's transaction object; the engine's cursor events
  still fire for each statement, ``BEGIN`` included, and its ``commit`` events before the commit.
* **Opening** a request writes its ``requests`` row and its ``request_opened`` event, whose text is stored
  packed (:mod:`specround.adapters.sql.packed_payload`).
* **Reading** streams: :meth:`SqlEventLog.events` runs two ordered queries (the ``request_opened`` events,
  and the rounds joined to their request ids) in one read transaction (a snapshot), merges them by request
  and yields rows as the driver delivers them (server-side cursors on PostgreSQL), never the whole log.
  Each round row becomes its five :class:`~specround.statemachine.ports.StoredEvent` objects with seqs
  ``5g - 4 .. 5g``: ``payload`` rebuilt from the body, ``payload_bytes`` its canonical bytes (what the
  chain hashed), the first event's ``prev_hash`` and the last one's ``hash`` as stored, and the links
  between them recomputed from the payloads. An edited body therefore shows as a last link that does not
  match, a removed, copied or moved row as a broken link, exactly as for one row per event; a body that
  cannot be read at all yields its five events with empty payloads (which no check accepts).
* **Errors** from the driver never escape raw; see :mod:`specround.adapters.sql.driver_errors`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, TypeVar, cast

from sqlalchemy import Connection, Engine

from specround.adapters.fence import (
    AppendedRound,
    Head,
    PreparedRound,
    PublishedRound,
    PublishPlan,
    check_digest,
    plan_publish,
    prepare_round,
)
from specround.adapters.sql.driver_errors import db_errors, is_integrity_error, is_retryable
from specround.adapters.sql.engine import (
    DEFAULT_BUSY_TIMEOUT_S,
    READ_ONLY,
    LogLocation,
    build_engine,
    parse_location,
)
from specround.adapters.sql.migrate import SchemaStatus, ensure_schema, schema_status
from specround.adapters.sql.packed_payload import pack_payload
from specround.adapters.sql.probe import SqliteFileKind, probe_sqlite_file
from specround.adapters.sql.round_body import RAW, encode_round
from specround.adapters.sql.rows import (
    EVENT_COLUMNS,
    SignatureRow,
    decode_event_row,
    decode_head_row,
    decode_signature_row,
    derived_id_of_body,
    read_round_row,
    row_blob,
    row_id,
)
from specround.adapters.sql.tables import COMMIT_PREFIX_BYTES, PREV_LINK_BYTES
from specround.canonical import GENESIS_HASH, canonical_bytes, chain_hash
from specround.errors import (
    InvalidRequestError,
    LogIntegrityError,
    LogUnavailableError,
    SchemaVersionError,
)
from specround.signing import LogSigner, checkpoint_message, head_message
from specround.statemachine.events import RequestOpened
from specround.statemachine.ports import LogHead, PublishOutcome, RoundPublication, StoredEvent, StoredRound
from specround.statemachine.round_ids import derived_generation

__all__ = ["DEFAULT_CHECKPOINT_EVERY", "PUBLISH_ATTEMPTS", "STREAM_BATCH", "SqlEventLog"]

DEFAULT_CHECKPOINT_EVERY = 64
"""Publishing calls between two signed checkpoints of every head (with a signer)."""

PUBLISH_ATTEMPTS = 4
"""How often a transaction that hit a backstop (unique key, deadlock) is run again before giving up."""

STREAM_BATCH = 2000
"""Rows fetched per round trip while streaming events."""

_IN_CHUNK = 500
"""Most request ids in one ``IN (...)`` list."""
_PAIR_CHUNK = 200
"""Most (request, round id) pairs in one lookup."""

_T = TypeVar("_T")


class _RetryError(Exception):
    """The fence's compare-and-swap or a unique key lost to a concurrent writer: run the call again."""


class _Cursor:
    """The DBAPI cursor of a connection, running the log's statements without an execution context.

    No compilation and no result processing (about 30 us less per statement than ``exec_driver_sql``). The
    engine's ``before_cursor_execute`` / ``after_cursor_execute`` listeners still see every statement
    (with ``context=None``, which SQLAlchemy documents as possible), so instrumentation and the crash
    tests' fault hooks keep working. Driver errors are raw DBAPI errors; :func:`db_errors` maps them.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._cursor = connection.connection.cursor()
        self._dispatch = connection.dispatch

    def run(self, statement: str, parameters: Any, *, many: bool = False) -> Any:
        """Execute (``many``: executemany) and return the DBAPI cursor."""
        connection, cursor, dispatch = self._connection, self._cursor, self._dispatch
        for listener in dispatch.before_cursor_execute:
            listener(connection, cursor, statement, parameters, None, many)
        if many:
            cursor.executemany(statement, parameters)
        else:
            cursor.execute(statement, parameters)
        for listener in dispatch.after_cursor_execute:
            listener(connection, cursor, statement, parameters, None, many)
        return cursor

    def run_rows(self, statement: str, rows: Sequence[tuple[Any, ...]], *, columnar: bool) -> Any:
        """Execute ``statement`` for every row: one array per column (``columnar``), else executemany."""
        if columnar:
            return self.run(statement, [list(column) for column in zip(*rows, strict=True)])
        return self.run(statement, rows, many=True)

    def close(self) -> None:
        """Close the DBAPI cursor."""
        self._cursor.close()


_ROUND_COLUMNS = (
    "request_no",
    "generation",
    "round_id",
    "recorded_at",
    "commit_digest",
    "prev_hash",
    "hash",
    "body",
)
_HEAD_UPDATE_COLUMNS = ("generation", "head_seq", "head_hash", "state_digest", "finished", "updated_at")
_ROUND_COLUMN_TYPES = ("bigint", "bigint", "text", "float8", "bytea", "bytea", "bytea", "bytea")
"""PostgreSQL array types of :data:`_ROUND_COLUMNS`, in order."""
_HEAD_UPDATE_TYPES = ("bigint", "bigint", "text", "text", "boolean", "float8", "text", "bigint")
"""PostgreSQL array types of a head update: :data:`_HEAD_UPDATE_COLUMNS`, request id, expected generation."""


def _binary_arrays(kinds: Sequence[str]) -> str:
    """One array parameter per PostgreSQL type in ``kinds``, sent in binary format (cheaper to dump)."""
    return ", ".join(f"%b::{kind}[]" for kind in kinds)


class _Statements:
    """The log's SQL in the driver's parameter style (the hot path skips statement compilation)."""

    def __init__(self, paramstyle: str, postgres: bool) -> None:
        self.mark = "?" if paramstyle == "qmark" else "%s"
        marks = ", ".join([self.mark] * len(EVENT_COLUMNS))
        self.insert_event = f"INSERT INTO events ({', '.join(EVENT_COLUMNS)}) VALUES ({marks})"
        self.columnar = postgres
        """Whether the step's rows go as one array per column in one statement (:meth:`_Cursor.run_rows`)."""
        if postgres:  # one statement over column arrays: the server plans it once for the whole step
            self.insert_rounds = (
                f"INSERT INTO rounds ({', '.join(_ROUND_COLUMNS)}) "
                f"SELECT * FROM unnest({_binary_arrays(_ROUND_COLUMN_TYPES)})"
            )
            assignments = ", ".join(f"{column} = u.{column}" for column in _HEAD_UPDATE_COLUMNS)
            self.update_head = (
                f"UPDATE requests AS r SET {assignments} FROM unnest({_binary_arrays(_HEAD_UPDATE_TYPES)}) "
                f"AS u({', '.join(_HEAD_UPDATE_COLUMNS)}, request_id, expected) "
                'WHERE r.request_id = u.request_id COLLATE "C" AND r.generation = u.expected'
            )
            self.append_rounds: str | None = f"WITH appended AS ({self.insert_rounds}) {self.update_head}"
            """A step's two writes in one statement (one round trip): the rows, then the compare-and-swap."""
        else:
            marks = ", ".join([self.mark] * len(_ROUND_COLUMNS))
            self.insert_rounds = f"INSERT INTO rounds ({', '.join(_ROUND_COLUMNS)}) VALUES ({marks})"
            assignments = ", ".join(f"{column} = {self.mark}" for column in _HEAD_UPDATE_COLUMNS)
            self.update_head = (
                f"UPDATE requests SET {assignments} "
                f"WHERE request_id = {self.mark} AND generation = {self.mark}"
            )
            self.append_rounds = None
        self.insert_request = (
            "INSERT INTO requests (request_id, generation, head_seq, head_hash, state_digest, finished, "
            f"opened_digest, opened_at, updated_at, request_no) VALUES ({', '.join([self.mark] * 10)})"
        )
        self.next_request_no = "SELECT coalesce(max(request_no), 0) + 1 FROM requests"
        self.lock_suffix = " ORDER BY request_id FOR UPDATE" if postgres else ""
        self.opened = (
            "SELECT e.hash, r.opened_digest FROM requests r JOIN events e "
            f"ON e.request_id = r.request_id AND e.seq = 0 WHERE r.request_id = {self.mark}"
        )
        self.head = (
            "SELECT request_id, generation, head_seq, head_hash, state_digest, finished FROM requests "
            f"WHERE request_id = {self.mark}"
        )
        columns = ", ".join(EVENT_COLUMNS)
        self.all_events = f"SELECT {columns} FROM events ORDER BY request_id, seq"
        self.request_events = f"SELECT {columns} FROM events WHERE request_id = {self.mark} ORDER BY seq"
        rounds = (
            "SELECT q.request_id, r.generation, r.round_id, r.recorded_at, r.commit_digest, r.prev_hash, "
            "r.hash, r.body, r.request_no FROM rounds r"
        )
        # LEFT JOIN: a round row whose request row is gone still reaches the audit (as an orphan).
        self.all_rounds = (
            f"{rounds} LEFT JOIN requests q ON q.request_no = r.request_no "
            "ORDER BY q.request_id, r.generation"
        )
        self.request_rounds = (
            f"{rounds} JOIN requests q ON q.request_no = r.request_no WHERE q.request_id = {self.mark} "
            "ORDER BY r.generation"
        )
        self.request_ids = "SELECT request_id FROM requests ORDER BY request_id"
        self.all_heads = (
            "SELECT request_id, generation, head_seq, head_hash, state_digest, finished FROM requests "
            "ORDER BY request_id"
        )
        self.insert_signature = (
            "INSERT INTO signatures (scope, request_id, scheme, key_id, message, signature, recorded_at) "
            f"VALUES ({', '.join([self.mark] * 7)})"
        )
        self.signatures = (
            "SELECT id, scope, request_id, scheme, key_id, message, signature FROM signatures ORDER BY id"
        )

    def heads(self, count: int) -> str:
        """The heads of ``count`` requests (locked on PostgreSQL), given by :meth:`head_keys`."""
        where = (
            f"= ANY({_binary_arrays(('text',))})"
            if self.columnar
            else f"IN ({', '.join([self.mark] * count)})"
        )
        return (
            "SELECT request_id, generation, head_seq, head_hash, finished, request_no FROM requests "
            f"WHERE request_id {where}{self.lock_suffix}"
        )

    def head_keys(self, request_ids: tuple[str, ...]) -> tuple[Any, ...]:
        """The parameters of :meth:`heads`: one array on PostgreSQL, one value per request otherwise."""
        return (list(request_ids),) if self.columnar else request_ids

    def rounds(self, count: int) -> str:
        """The rounds published under ``count`` (request, round id) pairs, given by :func:`_round_keys`.

        A derived id is stored as ``''`` at the generation it names (or, in rows written before that,
        as itself), so each pair also matches the row of that generation whose id is stored empty. The
        ``round_id <> ''`` term lets the planner use the partial unique index for the first alternative
        (and the primary key for the second) instead of scanning every round of the request.
        """
        mark = self.mark
        pair = (
            f"(request_no = {mark} AND ((round_id = {mark} AND round_id <> '') "
            f"OR (round_id = '' AND generation = {mark})))"
        )
        return (
            "SELECT request_no, round_id, generation, commit_digest, body FROM rounds WHERE "
            + " OR ".join([pair] * count)
        )


_TAILS = 65536
"""Most requests whose head this log remembers (to decide a publication without reading its head, and to
store ``processor_before`` as a reference to the previous round's)."""


@dataclass(frozen=True, slots=True)
class _Tail:
    """What this log last committed for a request: its head, its request number, its processor digest."""

    generation: int
    seq: int
    hash: str
    request_no: int
    processor_after: str

    def head(self) -> Head:
        """The request's head as this log left it (a new object: the fence moves the heads it is given)."""
        return Head(self.generation, self.seq, self.hash, False)


@dataclass(frozen=True, slots=True)
class _Encoded:
    """A prepared round with its stored body (computed before the transaction)."""

    prepared: PreparedRound
    body: bytes
    commit: bytes
    assumed: str | None
    """The head hash the body's reference to the previous round assumes (None: no reference)."""


def _encode(prepared: PreparedRound, tail: _Tail | None) -> _Encoded:
    """Encode a round's body, referring to the previous round's processor digest if ``tail`` is it."""
    pub = prepared.publication
    body = encode_round(
        [event.__dict__ for event in pub.events()],
        pub.request_id,
        pub.round_id,
        pub.expected_generation + 1,
        pub.commit_digest,
        prepared.payloads,
        None if tail is None else tail.processor_after,
    )
    commit = bytes.fromhex(pub.commit_digest)[:COMMIT_PREFIX_BYTES]  # the reader rebuilds the rest
    return _Encoded(prepared, body, commit, None if tail is None else tail.hash)


class SqlEventLog:
    """Durable, hash-chained event log with a per-request generation fence, on SQLite or PostgreSQL.

    Build one with :meth:`open`. Safe to share between threads (each call checks a connection out of the
    engine's pool, except that publishing keeps one between writes while no other thread needs it); many
    processes may open the same database.
    """

    def __init__(self, engine: Engine, location: LogLocation) -> None:
        """Wrap an engine built by :func:`~specround.adapters.sql.engine.build_engine` (see :meth:`open`)."""
        self._engine = engine
        self._location = location
        self._postgres = location.backend == "postgresql"
        self._sql = _Statements(engine.dialect.paramstyle, self._postgres)
        self._closed = False
        self._read_only = False
        self._signer: LogSigner | None = None
        self._checkpoint_every = DEFAULT_CHECKPOINT_EVERY
        self._publishes = 0
        self._tails: dict[str, _Tail] = {}
        """request id -> the head this log left after the last round it published for the request."""
        self._tails_lock = threading.Lock()
        self._writer: Connection | None = None
        """The connection publishing writes keep between calls (see :meth:`_write_on_cursor`)."""
        self._writer_lock = threading.Lock()
        """Held by the one write that is using :attr:`_writer`."""
        self._streams: weakref.WeakSet[Generator[StoredEvent | StoredRound, None, None]] = weakref.WeakSet()
        """Event streams not yet exhausted: each holds a connection (and a read transaction) until it ends."""

    @classmethod
    def open(
        cls,
        url_or_path: str | os.PathLike[str],
        *,
        create: bool = True,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        read_only: bool = False,
        signer: LogSigner | None = None,
        checkpoint_every: int = DEFAULT_CHECKPOINT_EVERY,
    ) -> SqlEventLog:
        """Open the log at a filesystem path (SQLite) or a SQLAlchemy URL.

        With ``create=True`` a missing SQLite file is created and any database is migrated to this
        release's schema; with ``create=False`` the log must already exist at the current schema
        (:class:`~specround.errors.LogUnavailableError` for a missing SQLite file,
        :class:`~specround.errors.SchemaVersionError` for a database that is not at head).
        ``busy_timeout_s`` bounds every lock wait. ``read_only`` (implies ``create=False``) opens a log that
        nothing can be written through: audits, replays and reports change no byte of it.

        A SQLite file is looked at read-only first (:func:`~specround.adapters.sql.probe.probe_sqlite_file`):
        a file that is not a SQLite database, another tool's database, or a path under a file is refused
        with nothing written; an empty file may become a new log (with ``create``).

        With a ``signer`` (:mod:`specround.signing`), every head a call moves is signed inside the same
        transaction, and every ``checkpoint_every`` publishing calls of this handle (and at the first) a
        checkpoint over every head of the log is signed too.
        """
        if (
            isinstance(checkpoint_every, bool)
            or not isinstance(checkpoint_every, int)
            or checkpoint_every < 1
        ):
            raise InvalidRequestError(
                f"checkpoint_every must be a positive integer, got {checkpoint_every!r}"
            )
        location = parse_location(url_or_path)
        create = create and not read_only
        path = location.sqlite_path
        if path is not None:
            kind = probe_sqlite_file(path)
            if not create and kind is SqliteFileKind.MISSING:
                raise LogUnavailableError(f"no event log at {path}")
            if not create and kind is SqliteFileKind.EMPTY:
                raise SchemaVersionError(
                    f"{path} is empty: it holds no event log (create one with `specround db upgrade URL`)"
                )
        engine = build_engine(location, busy_timeout_s=busy_timeout_s, read_only=read_only)
        try:
            ensure_schema(engine, create=create)
        except BaseException:
            engine.dispose()
            raise
        log = cls(engine, location)
        log._read_only = read_only
        log._signer = signer
        log._checkpoint_every = checkpoint_every
        return log

    # --- introspection -----------------------------------------------------------------------------------

    @property
    def location(self) -> LogLocation:
        """Where this log lives."""
        return self._location

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for tools and tests; the log's own writes go through its methods)."""
        return self._engine

    def schema_status(self) -> SchemaStatus:
        """The database's applied and newest schema revisions."""
        self._check_open()
        return schema_status(self._engine)

    # --- the EventLog port ---------------------------------------------------------------------------------

    def open_request(self, event: RequestOpened, state_digest: str) -> None:
        """Append a request's ``request_opened`` event at generation 0 (see the port).

        Opening again with an identical event (same canonical bytes) and state digest is a no-op; anything
        else for a known request id raises :class:`~specround.errors.InvalidRequestError`.
        """
        self._check_open()
        check_digest(f"the initial state digest of {event.request_id!r}", state_digest)
        if event.config.request_id != event.request_id:
            raise InvalidRequestError(
                f"request_opened for {event.request_id!r} carries the config of {event.config.request_id!r}"
            )
        payload = canonical_bytes(event)
        link = chain_hash(GENESIS_HASH, payload)
        opened: list[int] = []

        def attempt(connection: Connection) -> None:
            opened.clear()
            row = connection.exec_driver_sql(self._sql.opened, (event.request_id,)).first()
            if row is not None:
                if (row[0], row[1]) != (link, state_digest):
                    raise InvalidRequestError(
                        f"request {event.request_id!r} is already open with a different request_opened "
                        "event or initial state"
                    )
                return
            now = time.time()
            number = connection.exec_driver_sql(self._sql.next_request_no).scalar_one()
            connection.exec_driver_sql(
                self._sql.insert_request,
                (event.request_id, 0, 0, link, state_digest, False, state_digest, now, now, int(number)),
            )
            connection.exec_driver_sql(
                self._sql.insert_event,
                (
                    event.request_id,
                    0,
                    event.kind,
                    None,
                    0,
                    event.schema_version,
                    GENESIS_HASH,
                    link,
                    now,
                    "",
                    pack_payload(payload),
                ),
            )
            if self._signer is not None:
                cursor = _Cursor(connection)
                try:
                    self._sign_heads(cursor, [(event.request_id, 0, 0, link, state_digest, False)], now)
                finally:
                    cursor.close()
            opened.append(int(number))

        self._write("open a request", attempt)
        if opened:  # its first round extends this head (no processor digest to refer to yet)
            with self._tails_lock:
                self._tails[event.request_id] = _Tail(0, 0, link, opened[0], "")
                _trim(self._tails)

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        """Group-commit rounds in one transaction, fencing each request on its own (see the module doc).

        Malformed publications are refused with :class:`~specround.errors.InvalidRequestError` before the
        transaction starts; a publication for an unknown request (``InvalidRequestError``) or a finished
        one (:class:`~specround.errors.RequestFinishedError`) aborts the call with nothing written.
        """
        self._check_open()
        tails = self._tails
        encoded = [
            _encode(prepared, tails.get(prepared.publication.request_id))
            for prepared in map(prepare_round, publications)
        ]
        if not encoded:
            return []
        written: list[AppendedRound] = []
        prepared = [item.prepared for item in encoded]
        bodies = {id(item.prepared): item for item in encoded}
        request_ids = sorted({p.publication.request_id for p in prepared})
        pairs = sorted({(p.publication.request_id, p.publication.round_id) for p in prepared})

        runs = 0
        numbers: dict[str, int] = {}

        def attempt(cursor: _Cursor) -> list[PublishOutcome]:
            nonlocal runs, numbers
            runs += 1
            remembered = self._remembered_plan(prepared, request_ids) if runs == 1 else None
            if remembered is not None:  # no head was read, so no row is locked yet
                plan, numbers = remembered
            else:
                heads, numbers = self._read_heads(cursor, request_ids)
                # A round id can only be published already if its publication is not at the head (a retry
                # or a loser); the first run looks those up only, and a round id published at an earlier
                # generation trips the unique key instead, which reruns the call with every one looked up.
                wanted = pairs if runs > 1 else _behind(prepared, heads)
                known = self._read_rounds(cursor, wanted, numbers)
                plan = plan_publish(prepared, heads, known)
            if plan.appended:
                now = time.time()
                rows = []
                for appended in plan.appended:
                    item = bodies[id(appended.prepared)]
                    pub = appended.prepared.publication
                    body = item.body
                    if item.assumed is not None and item.assumed != appended.prev_hash:
                        body = _encode(appended.prepared, None).body  # the head moved elsewhere
                    rows.append(
                        (
                            numbers[pub.request_id],
                            appended.generation,
                            _stored_round_id(appended.prepared, body),
                            now,
                            item.commit,
                            bytes.fromhex(appended.prev_hash)[:PREV_LINK_BYTES],
                            bytes.fromhex(appended.hashes[-1]),
                            body,
                        )
                    )
                if remembered is not None:  # lock keys in one global order, as the head read would
                    rows.sort(key=_request_and_generation)
                columnar = self._sql.columnar
                updates = [
                    (
                        u.head.generation,
                        u.head.seq,
                        u.head.hash,
                        u.state_digest,
                        u.head.finished,
                        now,
                        u.request_id,
                        u.expected_generation,
                    )
                    for u in plan.head_updates
                ]
                if remembered is not None:
                    updates.sort(key=_request_id_of_update)
                both = self._sql.append_rounds
                if both is not None:  # PostgreSQL: one statement, one round trip
                    columns = (*zip(*rows, strict=True), *zip(*updates, strict=True))
                    moved = cursor.run(both, [list(column) for column in columns]).rowcount
                else:
                    cursor.run_rows(self._sql.insert_rounds, rows, columnar=columnar)
                    moved = cursor.run_rows(self._sql.update_head, updates, columnar=columnar).rowcount
                if moved != len(updates):
                    raise _RetryError(f"{len(updates) - moved} compare-and-swap(s) lost")
                if self._signer is not None:
                    moved_heads = [(u[6], u[0], u[1], u[2], u[3], bool(u[4])) for u in updates]
                    checkpoint = self._publishes % self._checkpoint_every == 0
                    self._sign_heads(cursor, moved_heads, now, checkpoint=checkpoint)
            written[:] = plan.appended
            return plan.outcomes

        try:
            outcomes = self._write_on_cursor("publish rounds", attempt)
        except BaseException:
            self._forget(request_ids)  # whether anything committed is unknown: read the heads next time
            raise
        self._publishes += 1
        self._remember(written, numbers)
        return outcomes

    def _remembered_plan(
        self, prepared: list[PreparedRound], request_ids: list[str]
    ) -> tuple[PublishPlan, dict[str, int]] | None:
        """The fence's plan on the heads this log last committed, if it knows them all and every round wins.

        None when a request's head is not remembered (opened or last published elsewhere, finished, or
        forgotten after a failed write) or when any publication would not win on the remembered heads: the
        call then decides on heads read in the transaction. A remembered head that another writer has moved
        since makes the compare-and-swap or a unique key fail, and the call is retried on heads read there.
        """
        with self._tails_lock:
            tails = self._tails
            remembered = [tails.get(request_id) for request_id in request_ids]
        heads: dict[str, Head] = {}
        numbers: dict[str, int] = {}
        for request_id, tail in zip(request_ids, remembered, strict=True):
            if tail is None:
                return None
            heads[request_id] = tail.head()
            numbers[request_id] = tail.request_no
        plan = plan_publish(prepared, heads, {})
        if len(plan.appended) != len(prepared):
            return None
        return plan, numbers

    def _remember(self, written: list[AppendedRound], numbers: dict[str, int]) -> None:
        """Note the committed rounds' heads and processor digests (the next round may build on them)."""
        with self._tails_lock:
            tails = self._tails
            for appended in written:
                pub = appended.prepared.publication
                if pub.finished:
                    tails.pop(pub.request_id, None)
                    continue
                tails[pub.request_id] = _Tail(
                    appended.generation,
                    appended.first_seq + len(appended.hashes) - 1,
                    appended.hashes[-1],
                    numbers[pub.request_id],
                    pub.staged.processor_after,
                )
            _trim(tails)

    def _forget(self, request_ids: Sequence[str]) -> None:
        """Drop the remembered heads of ``request_ids`` (a write whose outcome is not known)."""
        with self._tails_lock:
            for request_id in request_ids:
                self._tails.pop(request_id, None)

    def events(self, request_id: str | None = None) -> Iterator[StoredEvent]:
        """Stream stored events in (request, seq) order, for one request or all of them.

        The query runs when the first event is requested, in one read transaction (a snapshot: rounds
        published after that are not part of this stream). An unfinished stream holds a connection until
        it is exhausted, closed, garbage-collected or the log is closed.
        """
        return cast(Iterator[StoredEvent], self._items(request_id, whole=False))

    def event_items(self, request_id: str | None = None) -> Iterator[StoredEvent | StoredRound]:
        """:meth:`events`, with each well-formed round row as one :class:`StoredRound` (replay's input).

        A round row with any defect still comes as its five events, each naming what is wrong.
        """
        return self._items(request_id, whole=True)

    def _items(self, request_id: str | None, *, whole: bool) -> Iterator[StoredEvent | StoredRound]:
        self._check_open()
        if request_id is None:
            stream = self._stream(self._sql.all_events, self._sql.all_rounds, (), whole)
        else:
            stream = self._stream(self._sql.request_events, self._sql.request_rounds, (request_id,), whole)
        self._streams.add(stream)
        return stream

    def request_ids(self) -> list[str]:
        """Every request id in the log, sorted (byte-wise, as Python sorts ``str``)."""
        self._check_open()
        return self._read(
            "list requests", lambda c: [str(row[0]) for row in c.exec_driver_sql(self._sql.request_ids)]
        )

    def head(self, request_id: str) -> LogHead | None:
        """The newest published point of a request, or None if the log has never seen it."""
        self._check_open()

        def read(connection: Connection) -> LogHead | None:
            row = connection.exec_driver_sql(self._sql.head, (request_id,)).first()
            return None if row is None else decode_head_row(tuple(row))

        return self._read("read a head", read)

    def heads(self) -> list[LogHead]:
        """Every request's head, by request id (a head row that cannot be read raises LogIntegrityError)."""
        self._check_open()
        return self._read(
            "read the heads",
            lambda c: [decode_head_row(tuple(row)) for row in c.exec_driver_sql(self._sql.all_heads)],
        )

    def signature_rows(self) -> list[SignatureRow]:
        """Every stored signature, oldest first (empty for a log that was never written with a key)."""
        self._check_open()

        def read(connection: Connection) -> list[SignatureRow]:
            rows = connection.exec_driver_sql(self._sql.signatures).fetchall()
            return [decode_signature_row(tuple(row)) for row in rows]

        return self._read("read the signatures", read)

    def sign_checkpoint(self) -> None:
        """Sign a checkpoint over every head now (after rows were moved out, e.g. by compaction)."""
        self._check_open()
        if self._signer is None:
            raise InvalidRequestError("this log was opened without a signing key")

        def attempt(cursor: _Cursor) -> None:
            self._sign_heads(cursor, [], time.time(), checkpoint=True)

        self._write_on_cursor("sign a checkpoint", attempt)

    def close(self) -> None:
        """Close unfinished event streams and the pool; every later call raises LogUnavailableError."""
        if not self._closed:
            self._closed = True
            for stream in list(self._streams):
                # Ends its read transaction and returns its connection (ValueError: another thread is
                # iterating it right now; it releases the connection when it ends).
                with contextlib.suppress(ValueError):
                    stream.close()
            if self._writer_lock.acquire(blocking=False):  # else the write using it returns it
                try:
                    if self._writer is not None:
                        self._writer.close()
                        self._writer = None
                finally:
                    self._writer_lock.release()
            self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"SqlEventLog({self._location.display()!r}, {state})"

    # --- internals -----------------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogUnavailableError(f"the event log at {self._location.display()} is closed")

    def _write(self, action: str, body: Callable[[Connection], _T]) -> _T:
        """Run ``body`` in one write transaction SQLAlchemy manages; rerun it when a backstop fired."""

        def managed() -> _T:
            with self._engine.begin() as connection:
                return body(connection)

        return self._retried(action, managed)

    def _write_on_cursor(self, action: str, body: Callable[[_Cursor], _T]) -> _T:
        """Run ``body`` in one write transaction driven on the DBAPI connection; rerun it as :meth:`_write`.

        The hot path (publishing): ``BEGIN IMMEDIATE`` (SQLite; PostgreSQL's driver begins at the first
        statement) and ``COMMIT`` go straight to the driver, so SQLAlchemy's transaction object, its
        ``begin`` hook's compiled statement and its commit bookkeeping (about 100 us per call) are not
        paid. The engine's cursor listeners see the ``BEGIN`` as every other statement, and its ``commit``
        listeners run just before the commit, as SQLAlchemy would run them. ``body`` must run its
        statements on the cursor it is given only.

        The connection stays checked out between writes (the pool's check-out and check-in cost about as
        much again); a write that finds it in use by another thread takes one from the pool for itself,
        so concurrent writers still run side by side. A write that fails returns its connection to the
        pool, which resets it (or discards it when the driver has lost it), and the next write checks out
        a fresh one.
        """

        def on_cursor() -> _T:
            pinned = self._writer_lock.acquire(blocking=False)
            try:
                connection = self._writer if pinned else None
                if connection is None:
                    connection = self._engine.connect()
                try:
                    result = self._transaction_on(connection, body)
                except BaseException:
                    if pinned:
                        self._writer = None
                    connection.close()
                    raise
                if not pinned:
                    connection.close()
                elif self._closed:  # close() ran meanwhile: it could not return this one
                    self._writer = None
                    connection.close()
                else:
                    self._writer = connection
                return result
            finally:
                if pinned:
                    self._writer_lock.release()

        return self._retried(action, on_cursor)

    def _transaction_on(self, connection: Connection, body: Callable[[_Cursor], _T]) -> _T:
        """One write transaction of ``body`` on ``connection``'s DBAPI connection, rolled back on failure."""
        raw = connection.connection
        cursor = _Cursor(connection)
        try:
            if not self._postgres:
                cursor.run("BEGIN" if self._read_only else "BEGIN IMMEDIATE", ())
            result = body(cursor)
            for listener in connection.dispatch.commit:
                listener(connection)
            raw.commit()
            return result
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                raw.rollback()
            raise
        finally:
            cursor.close()

    def _retried(self, action: str, run: Callable[[], _T]) -> _T:
        """``run()`` with driver errors mapped, run again when a backstop fired (see the module doc)."""
        for attempt in range(1, PUBLISH_ATTEMPTS + 1):
            try:
                with db_errors(action):
                    return run()
            except _RetryError:
                if attempt == PUBLISH_ATTEMPTS:
                    raise LogUnavailableError(f"could not {action}: the fence kept moving") from None
            except Exception as error:
                cause = error.__cause__
                backstop = cause is not None and (is_integrity_error(cause) or is_retryable(cause))
                if not backstop or attempt == PUBLISH_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _read(self, action: str, body: Callable[[Connection], _T]) -> _T:
        with db_errors(action), self._engine.connect() as connection:
            connection = connection.execution_options(**{READ_ONLY: True})
            with connection.begin():
                return body(connection)

    def _sign_heads(
        self,
        cursor: _Cursor,
        heads: list[tuple[str, int, int, str, str, bool]],
        at: float,
        *,
        checkpoint: bool = False,
    ) -> None:
        """Sign the heads a write moved (and, when one is due, a checkpoint of every head)."""
        signer = self._signer
        assert signer is not None
        rows: list[tuple[str, str | None, str, str, str, str, float]] = []
        for head in heads:
            message = head_message(*head, at)
            rows.append(
                ("head", head[0], signer.scheme, signer.key_id, message.decode(), signer.sign(message), at)
            )
        if checkpoint:
            every = [decode_head_row(tuple(row)) for row in cursor.run(self._sql.all_heads, ()).fetchall()]
            message = checkpoint_message(
                [(h.request_id, h.generation, h.seq, h.hash, h.state_digest, h.finished) for h in every], at
            )
            rows.append(
                ("checkpoint", None, signer.scheme, signer.key_id, message.decode(), signer.sign(message), at)
            )
        if rows:
            cursor.run(self._sql.insert_signature, rows, many=True)

    def _read_heads(self, cursor: _Cursor, request_ids: list[str]) -> tuple[dict[str, Head], dict[str, int]]:
        heads: dict[str, Head] = {}
        numbers: dict[str, int] = {}
        for start in range(0, len(request_ids), _IN_CHUNK):
            chunk = tuple(request_ids[start : start + _IN_CHUNK])
            for row in cursor.run(self._sql.heads(len(chunk)), self._sql.head_keys(chunk)).fetchall():
                try:
                    heads[row[0]] = Head(int(row[1]), int(row[2]), str(row[3]), bool(row[4]))
                    numbers[row[0]] = int(row[5])
                except (TypeError, ValueError):
                    raise LogIntegrityError(
                        f"request {row[0]!r}: the head row is malformed ({row[1]!r}, {row[2]!r}, "
                        f"request_no {row[5]!r}); audit the log"
                    ) from None
        return heads, numbers

    def _read_rounds(
        self, cursor: _Cursor, pairs: list[tuple[str, str]], numbers: dict[str, int]
    ) -> dict[tuple[str, str], PublishedRound]:
        known: dict[tuple[str, str], PublishedRound] = {}
        ids = {number: request_id for request_id, number in numbers.items()}
        pairs = [pair for pair in pairs if pair[0] in numbers]  # unknown requests: plan_publish refuses
        for start in range(0, len(pairs), _PAIR_CHUNK):
            chunk = pairs[start : start + _PAIR_CHUNK]
            flat = tuple(value for pair in chunk for value in _round_keys(pair, numbers))
            for row in cursor.run(self._sql.rounds(len(chunk)), flat).fetchall():
                request_id, generation, commit = ids[int(row[0])], int(row[2]), bytes(row[3]).hex()
                if len(commit) < 2 * COMMIT_PREFIX_BYTES:
                    raise LogIntegrityError(
                        f"request {request_id!r}: the round at generation {generation} stores a "
                        f"{len(commit) // 2}-byte commit digest; audit the log"
                    )
                round_id = row[1] or derived_id_of_body(bytes(row[4]), request_id, generation)
                if round_id:
                    known[(request_id, round_id)] = PublishedRound(generation, commit)
        return known

    def _stream(
        self, events_sql: str, rounds_sql: str, parameters: tuple[Any, ...], whole: bool
    ) -> Generator[StoredEvent | StoredRound, None, None]:
        with db_errors("read events"), self._engine.connect() as connection:
            connection = connection.execution_options(**{READ_ONLY: True})
            with connection.begin():
                raw = connection.connection
                # PostgreSQL: named (server-side) cursors stream; SQLite's cursors step their statements.
                if self._postgres:
                    events = raw.cursor(f"specround_events_{id(raw):x}")
                    rounds = raw.cursor(f"specround_rounds_{id(raw):x}")
                else:
                    events, rounds = raw.cursor(), raw.cursor()
                try:
                    events.execute(events_sql, parameters)
                    rounds.execute(rounds_sql, parameters)
                    yield from _merge(_rows(events), _rows(rounds), whole)
                finally:
                    events.close()
                    rounds.close()


def _stored_round_id(prepared: PreparedRound, body: bytes) -> str:
    """What a round's ``round_id`` column holds: ``''`` for a derived id the body's decoder rebuilds."""
    return "" if prepared.derived_id and body[0] != RAW else prepared.publication.round_id


def _round_keys(pair: tuple[str, str], numbers: dict[str, int]) -> tuple[int, str, int]:
    """The parameters of one pair of :meth:`_Statements.rounds`: request number, round id, generation.

    The generation is the one a derived id names (-1, which no row has, for any other id).
    """
    request_id, round_id = pair
    generation = derived_generation(round_id)
    return numbers[request_id], round_id, -1 if generation is None else generation


def _request_and_generation(row: tuple[Any, ...]) -> tuple[int, int]:
    """The (request number, generation) of a ``rounds`` row: the order its keys are locked in."""
    return row[0], row[1]


def _request_id_of_update(update: tuple[Any, ...]) -> str:
    """The request id of a head update (its seventh parameter): the order the head rows are locked in."""
    return str(update[6])


def _trim(tails: dict[str, _Tail]) -> None:
    """Forget the oldest remembered heads beyond :data:`_TAILS`."""
    while len(tails) > _TAILS:
        del tails[next(iter(tails))]


def _behind(prepared: Sequence[PreparedRound], heads: dict[str, Head]) -> list[tuple[str, str]]:
    """The (request, round id) pairs whose publication does not extend its request's head."""
    pairs = set()
    for item in prepared:
        pub = item.publication
        head = heads.get(pub.request_id)
        if head is not None and head.generation != pub.expected_generation:
            pairs.add((pub.request_id, pub.round_id))
    return sorted(pairs)


def _rows(cursor: Any) -> Iterator[Any]:
    """Every row of an executed DBAPI cursor, fetched :data:`STREAM_BATCH` at a time."""
    while rows := cursor.fetchmany(STREAM_BATCH):
        yield from rows


def _merge(events: Iterator[Any], rounds: Iterator[Any], whole: bool) -> Iterator[StoredEvent | StoredRound]:
    """Both ordered row streams as one stream of events in (request, seq) order, a request at a time.

    Round rows whose ``request_no`` names no request (their request row was deleted) come last, each
    such number as a request of its own named ``(rounds of request_no N)``: the audit reports them as
    orphans instead of never seeing them.
    """
    orphans: dict[Any, list[Any]] = {}
    keyed = _keyed(rounds, orphans)
    pending = next(keyed, None)
    for row in events:
        event = decode_event_row(row)
        request_id = event.request_id
        while pending is not None and pending[0] < request_id:
            expanded, pending = _request_rounds(pending, keyed, None, whole)
            yield from expanded
        yield event
        if pending is not None and pending[0] == request_id:
            opened = event.hash if event.seq == 0 and event.defect is None else None
            expanded, pending = _request_rounds(pending, keyed, opened, whole)
            yield from expanded
    while pending is not None:
        expanded, pending = _request_rounds(pending, keyed, None, whole)
        yield from expanded
    for number, rows in orphans.items():
        label = f"(rounds of request_no {number!r})"
        expanded, _ = _request_rounds(
            (label, *rows[0][1:]), iter([(label, *r[1:]) for r in rows[1:]]), None, whole
        )
        yield from expanded


def _keyed(rounds: Iterator[Any], orphans: dict[Any, list[Any]]) -> Iterator[tuple[Any, ...]]:
    """Round rows with their request id as ``str``; rows of no request are set aside in ``orphans``."""
    for row in rounds:
        if row[0] is None:
            orphans.setdefault(row[8] if len(row) > 8 else None, []).append(row)
            continue
        yield (row_id(row[0]), *row[1:])


def _request_rounds(
    first: Any, rounds: Iterator[Any], opened_hash: str | None, whole: bool
) -> tuple[Iterator[StoredEvent | StoredRound], Any]:
    """The events of every round row of ``first``'s request, and the next request's first row.

    With ``whole``, each well-formed row comes as one :class:`StoredRound` instead of its five events.

    The request's stored rows are read first (memory bounded by one request), so that each row's stored
    link prefix resolves to the full hash of the row it extends wherever that row is stored. Their events
    are decoded row by row as the caller takes them: a long request never holds all its events at once,
    whose objects the garbage collector would otherwise scan again and again.
    """
    request_id = first[0]
    rows = [first]
    pending = next(rounds, None)
    while pending is not None and pending[0] == request_id:
        rows.append(pending)
        pending = next(rounds, None)
    finals = [row_blob(row[6]) or b"" for row in rows]
    links = {final[:PREV_LINK_BYTES]: final.hex() for final in finals if final}
    if opened_hash is not None:
        with contextlib.suppress(ValueError):
            links.setdefault(bytes.fromhex(opened_hash)[:PREV_LINK_BYTES], opened_hash)
    return _decoded_rounds(rows, links, whole), pending


def _decoded_rounds(
    rows: list[Any], links: dict[bytes, str], whole: bool
) -> Iterator[StoredEvent | StoredRound]:
    """The events (``whole``: well-formed rounds whole) of one request's round rows, one row at a time."""
    previous_processor: str | None = None
    generation = 0  # of the last event decoded (a row whose generation is unreadable follows it)
    for row in rows:
        read, previous_processor = read_round_row(row, links, previous_processor, generation + 1, whole=whole)
        if isinstance(read, StoredRound):
            generation = read.generation
            yield read
            continue
        if read:
            generation = read[-1].generation
        yield from read
