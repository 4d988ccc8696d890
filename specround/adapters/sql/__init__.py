"""The SQL event log: SQLAlchemy Core over SQLite (embedded default) or PostgreSQL (shared by workers).

:class:`SqlEventLog` implements :class:`~specround.statemachine.ports.EventLog`; :func:`upgrade_database`
and :func:`database_status` back ``specround db upgrade`` / ``specround db current``.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from specround.adapters.sql.engine import DEFAULT_BUSY_TIMEOUT_S, LogLocation, build_engine, parse_location
from specround.adapters.sql.log import SqlEventLog
from specround.adapters.sql.migrate import SchemaStatus, head_revision, schema_status, upgrade
from specround.adapters.sql.probe import SqliteFileKind, probe_sqlite_file

__all__ = [
    "LogLocation",
    "SchemaStatus",
    "SqlEventLog",
    "database_status",
    "head_revision",
    "parse_location",
    "upgrade_database",
]


def upgrade_database(
    url_or_path: str | os.PathLike[str],
    revision: str = "head",
    *,
    busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
    progress: Callable[[str], None] | None = None,
) -> SchemaStatus:
    """Migrate the event-log schema at ``url_or_path`` to ``revision`` (creating a SQLite file if needed).

    Another tool's SQLite database, or a file that is not one, is refused untouched. ``progress`` receives
    a line now and then while a migration rewrites the log's rounds.
    """
    location = parse_location(url_or_path)
    if location.sqlite_path is not None:
        probe_sqlite_file(location.sqlite_path)
    engine = build_engine(location, busy_timeout_s=busy_timeout_s)
    try:
        return upgrade(engine, revision, progress)
    finally:
        engine.dispose()


def database_status(
    url_or_path: str | os.PathLike[str], *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S
) -> SchemaStatus:
    """The applied and newest schema revisions of the database at ``url_or_path`` (changes nothing).

    A SQLite path that does not exist is reported as having no schema, without creating the file.
    """
    location = parse_location(url_or_path)
    if location.sqlite_path is not None:
        kind = probe_sqlite_file(location.sqlite_path)
        if kind is not SqliteFileKind.EVENT_LOG:
            return SchemaStatus(current=None, head=head_revision())
    engine = build_engine(location, busy_timeout_s=busy_timeout_s, read_only=True)
    try:
        return schema_status(engine)
    finally:
        engine.dispose()
