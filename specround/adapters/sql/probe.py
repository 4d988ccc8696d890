"""Look at a SQLite file before the event log touches it: a specround log, an empty file, or neither.

Opening a log sets WAL mode and may create tables, so :meth:`SqlEventLog.open` first reads the file's
table list through a read-only connection (``mode=ro``: nothing is written, not even a journal mode). A
file that is not a SQLite database, or a SQLite database of another tool, is refused before anything
changes; an empty file, or a database without tables, may become a log.
"""

from __future__ import annotations

import sqlite3
from enum import StrEnum
from pathlib import Path
from urllib.parse import quote

from specround.errors import InvalidLogUrlError, LogUnavailableError, SchemaVersionError

__all__ = ["SqliteFileKind", "probe_sqlite_file", "read_only_uri", "refuse_unusable_path"]

_LOG_TABLES = frozenset({"alembic_version", "requests"})
"""Tables every revision of the event log has."""


class SqliteFileKind(StrEnum):
    """What a path holds, as far as the event log is concerned."""

    MISSING = "missing"
    EMPTY = "empty"
    """A zero-byte file or a database without tables: a new log may be created there."""
    EVENT_LOG = "event_log"


def read_only_uri(path: Path) -> str:
    """The ``file:`` URI that opens ``path`` read-only with the sqlite3 driver (``uri=True``)."""
    return f"file:{quote(str(path.resolve()))}?mode=ro"


def refuse_unusable_path(path: Path) -> None:
    """Raise :class:`InvalidLogUrlError` when a log cannot live at ``path`` (a folder, or under a file)."""
    if path.exists() and not path.is_file():
        raise InvalidLogUrlError(f"the event log {path} exists and is not a file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InvalidLogUrlError(f"the event log {path} cannot be created: {parent} is a file")
            break


def probe_sqlite_file(path: Path) -> SqliteFileKind:
    """Classify ``path`` without writing to it; refuse a file that is not (or not yet) an event log.

    Raises :class:`InvalidLogUrlError` for a path under a file or a folder, :class:`SchemaVersionError`
    for a file that is not a SQLite database or is another tool's database.
    """
    refuse_unusable_path(path)
    if not path.exists():
        return SqliteFileKind.MISSING
    try:
        if path.stat().st_size == 0:
            return SqliteFileKind.EMPTY
        connection = sqlite3.connect(read_only_uri(path), uri=True)
    except (OSError, sqlite3.Error) as exc:
        raise LogUnavailableError(f"cannot read {path}: {exc}") from exc
    connection.text_factory = bytes
    try:
        rows = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc) or "malformed" in str(exc) or "encrypted" in str(exc):
            raise SchemaVersionError(f"{path} is not a SQLite database ({exc}), so not an event log") from exc
        raise LogUnavailableError(f"cannot read {path}: {exc}") from exc
    except UnicodeError as exc:  # the schema itself holds bytes that are not UTF-8: a damaged file
        raise SchemaVersionError(
            f"{path} has a damaged SQLite schema ({exc}), so it is not an event log"
        ) from exc
    finally:
        connection.close()
    tables = {bytes(row[0]).decode("utf-8", "replace") for row in rows if row[0] is not None}
    if not tables:
        return SqliteFileKind.EMPTY
    if tables >= _LOG_TABLES:
        return SqliteFileKind.EVENT_LOG
    shown = ", ".join(sorted(tables)[:5])
    raise SchemaVersionError(
        f"{path} is a SQLite database of another tool (tables: {shown}), not a specround event log; "
        "it was left untouched"
    )
