"""Where an event log lives and how to connect to it.

A bare filesystem path (``str`` without ``://`` or any :class:`os.PathLike`) names an embedded SQLite file;
anything else must be a SQLAlchemy URL: ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or
``postgresql+psycopg://user@host:5432/db`` (``postgresql://`` and ``postgres://`` are read as psycopg 3,
the only PostgreSQL driver specround ships with). A PostgreSQL schema other than ``public`` is chosen the
libpq way, e.g. ``...?options=-csearch_path%3Dmyschema``.

SQLite connections run in WAL mode with ``synchronous=NORMAL``, foreign keys on, 4 KiB pages for new files
and a busy timeout. The sqlite3 driver's own transaction handling is switched off and SQLAlchemy's ``begin``
event emits ``BEGIN IMMEDIATE`` instead (the documented recipe), so every write transaction takes the write
lock up front and a fence read can never be overtaken by another writer. Connections marked with the
:data:`READ_ONLY` execution option begin a deferred ``BEGIN``: a consistent snapshot that blocks nobody.

PostgreSQL connections get ``connect_timeout`` and a ``lock_timeout`` equal to the busy timeout, so a write
stuck behind another transaction's row locks fails with :class:`~specround.errors.LogUnavailableError`
after that long instead of waiting forever.
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import QueuePool

from specround.adapters.sql.probe import read_only_uri
from specround.errors import InvalidLogUrlError

__all__ = [
    "DEFAULT_BUSY_TIMEOUT_S",
    "READ_ONLY",
    "SQLITE_PAGE_SIZE",
    "Backend",
    "LogLocation",
    "build_engine",
    "parse_location",
]

Backend = Literal["sqlite", "postgresql"]
"""The database families the SQL event log supports."""

DEFAULT_BUSY_TIMEOUT_S = 30.0
"""How long a write waits for a lock (SQLite busy timeout, PostgreSQL ``lock_timeout``) before it fails."""

SQLITE_PAGE_SIZE = 4096
"""Page size of new SQLite logs.

A commit writes every page it touched to the WAL, so a small step (a ``generate`` round touches four pages)
writes half as much as with 8 KiB pages, and each of a log's thirteen tables and indexes starts at one page
(53 KB instead of 106 KB for an empty log). Measured against 8 KiB pages: B = 1 durable writes 7-11 %
faster, B = 64 about 8 % slower, B = 256 and 1,024 the same, and a 651-round ``generate`` log 428 instead of
about 480 bytes per round.
"""

READ_ONLY = "specround_read_only"
"""Execution option: ``connection.execution_options(**{READ_ONLY: True})`` opens a read transaction."""

_POSTGRES_DRIVER = "postgresql+psycopg"


@dataclass(frozen=True, slots=True)
class LogLocation:
    """A parsed event-log location."""

    url: URL
    """The SQLAlchemy URL to connect to."""
    backend: Backend
    sqlite_path: Path | None
    """The database file of a SQLite log (None for PostgreSQL)."""

    def display(self) -> str:
        """The URL with any password hidden, for messages and reports."""
        return self.url.render_as_string(hide_password=True)

    def label(self) -> str:
        """For users: the SQLite file path as a path, any other log as its URL with the password hidden."""
        return str(self.sqlite_path) if self.sqlite_path is not None else self.display()

    def connect_target(self) -> str:
        """What :func:`parse_location` reads back as this location: the file path, or the full URL."""
        if self.sqlite_path is not None:
            return str(self.sqlite_path)
        return self.url.render_as_string(hide_password=False)


def parse_location(url_or_path: str | os.PathLike[str]) -> LogLocation:
    """Read a filesystem path or a SQLAlchemy URL; raise :class:`InvalidLogUrlError` for anything else."""
    if isinstance(url_or_path, os.PathLike) or "://" not in url_or_path:
        raw_path = os.fspath(url_or_path)
        if raw_path in ("", ":memory:"):
            raise InvalidLogUrlError(
                "the SQL event log needs a database file or server; use the in-memory log for scratch runs"
            )
        path = Path(raw_path)
        return LogLocation(URL.create("sqlite", database=str(path)), "sqlite", path)
    try:
        url = make_url(url_or_path)
        _ = url.port  # a bad port or an unclosed IPv6 bracket fails here
    except (ArgumentError, ValueError) as exc:
        raise InvalidLogUrlError(f"cannot parse event-log URL {url_or_path!r}: {exc}") from exc
    backend, _, driver = url.drivername.partition("+")
    if backend == "sqlite":
        if driver not in ("pysqlite", ""):
            raise InvalidLogUrlError(f"unsupported SQLite driver {driver!r}; use sqlite:///path")
        if url.database in (None, "", ":memory:"):
            raise InvalidLogUrlError("the SQL event log needs a SQLite database file, not an in-memory one")
        return LogLocation(url, "sqlite", Path(str(url.database)))
    if backend in ("postgresql", "postgres"):
        if driver not in ("psycopg", ""):
            raise InvalidLogUrlError(f"unsupported PostgreSQL driver {driver!r}; use {_POSTGRES_DRIVER}://")
        return LogLocation(url.set(drivername=_POSTGRES_DRIVER), "postgresql", None)
    raise InvalidLogUrlError(f"unsupported database {backend!r}: the event log runs on SQLite or PostgreSQL")


def build_engine(
    location: LogLocation, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S, read_only: bool = False
) -> Engine:
    """Create the engine for ``location`` with the log's connection settings (see the module docstring).

    ``read_only``: SQLite files are opened with ``mode=ro`` and keep their journal mode; PostgreSQL
    sessions run with ``default_transaction_read_only``. Nothing can be written through such an engine.
    """
    if busy_timeout_s <= 0:
        raise InvalidLogUrlError(f"busy timeout must be positive, got {busy_timeout_s}")
    try:
        if location.backend == "sqlite":
            if read_only:
                assert location.sqlite_path is not None
                uri = read_only_uri(location.sqlite_path)
                engine = create_engine(
                    "sqlite://",
                    creator=lambda: sqlite3.connect(uri, uri=True, timeout=busy_timeout_s),
                    poolclass=QueuePool,  # one connection per reader, as for a file URL
                )
            else:
                engine = create_engine(location.url, connect_args={"timeout": busy_timeout_s})
            _install_sqlite_hooks(engine, busy_timeout_s, read_only=read_only)
        else:
            engine = create_engine(
                location.url, connect_args={"connect_timeout": max(1, round(busy_timeout_s))}
            )
            _install_postgres_hooks(engine, busy_timeout_s, read_only=read_only)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise InvalidLogUrlError(f"cannot use event-log URL {location.display()}: {exc}") from exc
    return engine


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _enable_wal(cursor: Any, busy_timeout_s: float) -> None:
    """Switch the file to WAL, waiting up to the busy timeout for the lock that takes.

    SQLite answers ``database is locked`` at once, without calling the busy handler, when another
    connection holds the file while this one changes its journal mode (processes racing to create and
    migrate a fresh log), so the switch is retried here with a short, growing pause.
    """
    deadline = time.monotonic() + busy_timeout_s
    pause = 0.001
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


def _install_sqlite_hooks(engine: Engine, busy_timeout_s: float, *, read_only: bool) -> None:
    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # Take BEGIN away from the sqlite3 driver; the "begin" hook below emits it.
        dbapi_connection.isolation_level = None
        # Text that is not valid UTF-8 (a damaged file) reads back with its bytes kept as surrogates, so
        # the row is reported on its own instead of breaking the whole read.
        dbapi_connection.text_factory = _lenient_text
        cursor = dbapi_connection.cursor()
        try:
            if read_only:  # the file keeps its journal mode; nothing is written
                cursor.execute("PRAGMA query_only = ON")
                return
            cursor.execute(f"PRAGMA page_size = {SQLITE_PAGE_SIZE}")  # only a brand-new file takes it
            _enable_wal(cursor, busy_timeout_s)
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        reading = read_only or connection.get_execution_options().get(READ_ONLY, False)
        connection.exec_driver_sql("BEGIN" if reading else "BEGIN IMMEDIATE")


def _install_postgres_hooks(engine: Engine, busy_timeout_s: float, *, read_only: bool) -> None:
    lock_timeout_ms = max(1, round(busy_timeout_s * 1000))

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        # A lock wait longer than the busy timeout fails (mapped to LogUnavailableError) instead of hanging.
        autocommit = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            dbapi_connection.execute(f"SET lock_timeout = {lock_timeout_ms}")
            if read_only:
                dbapi_connection.execute("SET default_transaction_read_only = on")
        finally:
            dbapi_connection.autocommit = autocommit
