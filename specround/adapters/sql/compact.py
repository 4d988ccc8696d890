"""Retention: move finished requests out of a log into an archive log, chains and signatures intact.

:func:`compact_log` selects the requests of a SQL log that finished before a cutoff (their head row's
``updated_at``), copies every row of theirs (``requests``, ``events``, ``rounds``, ``signatures``)
verbatim into a second log (a SQLite file, created and migrated when missing), and only after that copy
has committed deletes them from the source in one transaction. Both logs then audit clean on their own: a
moved request's chain is unchanged, and nothing in the source refers to it. A run cut short between the
two transactions leaves the requests in both logs; running it again finds them already archived with the
same head and only deletes them from the source. A ``rounds`` row is keyed by its request's ``request_no``,
which is per log: the archive gives each moved request the next free number there and its rounds follow it.

A signed log (one with ``signatures`` rows) is compacted only with its key: the newest signed checkpoint
still lists the moved requests, so a fresh checkpoint is signed in both logs afterwards.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Table

from specround.adapters.sql import tables
from specround.adapters.sql.driver_errors import db_errors
from specround.adapters.sql.log import SqlEventLog
from specround.errors import InvalidRequestError, LogIntegrityError
from specround.signing import LogSigner

__all__ = ["CompactReport", "compact_log"]

_CHUNK = 200
"""Requests moved per statement batch."""

_COPIED = (tables.requests, tables.events, tables.rounds, tables.signatures)
"""Tables whose rows of a request move, parents first (a signature's own id and a request's
``request_no`` are renumbered)."""
_ROUNDS = tables.rounds


def _columns(table: Table) -> list[str]:
    return [
        column.name for column in table.columns if not (table is tables.signatures and column.name == "id")
    ]


def _order(table: Table) -> str:
    return ", ".join(column.name for column in table.primary_key.columns)


@dataclass(frozen=True, slots=True)
class CompactReport:
    """What one compaction moved."""

    moved: tuple[str, ...]
    """Request ids now only in the archive."""
    events: int
    """Events moved (a ``rounds`` row counts as its five events)."""


def _mark(connection: Connection) -> str:
    return "?" if connection.dialect.paramstyle == "qmark" else "%s"


def _marks(connection: Connection, count: int) -> str:
    return ", ".join([_mark(connection)] * count)


def _rows(connection: Connection, table: Table, ids: list[str]) -> list[tuple[Any, ...]]:
    """The rows of ``ids`` in ``table`` (``rounds`` rows lead with their request id, by ``request_no``)."""
    marks = _marks(connection, len(ids))
    if table is _ROUNDS:
        columns = ", ".join(f"r.{name}" for name in _columns(table))
        order = ", ".join(f"r.{column.name}" for column in table.primary_key.columns)
        sql = (
            f"SELECT q.request_id, {columns} FROM rounds r JOIN requests q ON q.request_no = r.request_no "
            f"WHERE q.request_id IN ({marks}) ORDER BY {order}"
        )
    else:
        sql = (
            f"SELECT {', '.join(_columns(table))} FROM {table.name} WHERE request_id IN ({marks}) "
            f"ORDER BY {_order(table)}"
        )
    return [tuple(row) for row in connection.exec_driver_sql(sql, tuple(ids)).fetchall()]


def compact_log(
    source: str | os.PathLike[str],
    archive: str | os.PathLike[str],
    *,
    before: float,
    signer: LogSigner | None = None,
) -> CompactReport:
    """Move the requests of ``source`` that finished before ``before`` (Unix seconds) into ``archive``."""
    with SqlEventLog.open(source, create=False, signer=signer) as log:
        if signer is None and log.signature_rows():
            raise InvalidRequestError("the log is signed: compact it with its key (--key)")
        with db_errors("select requests to compact"), log.engine.connect() as connection:
            mark = _mark(connection)
            found = connection.exec_driver_sql(
                f"SELECT request_id FROM requests WHERE finished = {mark} AND updated_at < {mark} "
                "ORDER BY request_id",
                (True, before),
            ).fetchall()
        ids = [str(row[0]) for row in found]
        if not ids:
            return CompactReport(moved=(), events=0)
        with SqlEventLog.open(archive, signer=signer) as target:
            events = 0
            for start in range(0, len(ids), _CHUNK):
                chunk = ids[start : start + _CHUNK]
                events += _copy(log, target, chunk)
                _delete(log, chunk)
            if signer is not None:
                target.sign_checkpoint()
                log.sign_checkpoint()
    return CompactReport(moved=tuple(ids), events=events)


def _copy(source: SqlEventLog, target: SqlEventLog, ids: list[str]) -> int:
    """Copy the rows of ``ids`` into ``target`` (skipping requests it already holds with the same head)."""
    with db_errors("read the requests to archive"), source.engine.connect() as connection:
        rows = {table.name: _rows(connection, table, ids) for table in _COPIED}
    with db_errors("write the archive"), target.engine.begin() as connection:
        marks = _marks(connection, len(ids))
        found = connection.exec_driver_sql(
            f"SELECT request_id, head_hash FROM requests WHERE request_id IN ({marks})", tuple(ids)
        ).fetchall()
        held = {str(row[0]): str(row[1]) for row in found}
        head_hash = _columns(tables.requests).index("head_hash")
        heads = {str(row[0]): str(row[head_hash]) for row in rows["requests"]}
        for request_id, link in held.items():
            if heads.get(request_id) != link:
                raise LogIntegrityError(
                    f"request {request_id!r} is already archived with another head; nothing was moved"
                )
        numbers = _numbers(connection, [str(row[0]) for row in rows["requests"] if row[0] not in held])
        for table in _COPIED:
            columns = _columns(table)
            fresh = _renumbered(table, columns, rows[table.name], held, numbers)
            if fresh:
                connection.exec_driver_sql(
                    f"INSERT INTO {table.name} ({', '.join(columns)}) "
                    f"VALUES ({_marks(connection, len(columns))})",
                    fresh,
                )
    return len(rows["events"]) + _ROUND_EVENTS * len(rows["rounds"])


_ROUND_EVENTS = 5
"""Events one ``rounds`` row holds."""


def _numbers(connection: Connection, fresh: list[str]) -> dict[str, int]:
    """The archive's next free ``request_no`` for each request id it is about to receive."""
    top = connection.exec_driver_sql("SELECT coalesce(max(request_no), 0) FROM requests").scalar_one()
    return {request_id: int(top) + offset for offset, request_id in enumerate(fresh, start=1)}


def _renumbered(
    table: Table,
    columns: list[str],
    rows: list[tuple[Any, ...]],
    held: dict[str, str],
    numbers: dict[str, int],
) -> list[tuple[Any, ...]]:
    """The rows of requests the archive does not hold, with ``request_no`` given the archive's number."""
    if table is _ROUNDS:  # (request id, *columns): the archive's number replaces the source's
        at = columns.index("request_no")
        return [
            tuple(numbers[row[0]] if i == at else value for i, value in enumerate(row[1:]))
            for row in rows
            if row[0] not in held
        ]
    at = columns.index("request_id")
    fresh = [row for row in rows if row[at] not in held]
    if table is tables.requests:
        number = columns.index("request_no")
        fresh = [
            tuple(numbers[row[at]] if i == number else value for i, value in enumerate(row)) for row in fresh
        ]
    return fresh


def _delete(source: SqlEventLog, ids: list[str]) -> None:
    with db_errors("delete archived requests"), source.engine.begin() as connection:
        marks = _marks(connection, len(ids))
        for table in reversed(_COPIED):  # children first
            if table is _ROUNDS:
                connection.exec_driver_sql(
                    "DELETE FROM rounds WHERE request_no IN "
                    f"(SELECT request_no FROM requests WHERE request_id IN ({marks}))",
                    tuple(ids),
                )
                continue
            connection.exec_driver_sql(f"DELETE FROM {table.name} WHERE request_id IN ({marks})", tuple(ids))
