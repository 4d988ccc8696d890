"""Stream one slim row per published round out of an event log, filtered, without loading the log.

The SQL log stores a round's five events in one ``rounds`` row. :func:`sql_round_rows` reads those rows
in one query with the request and time filters pushed into it (request ids, the time window on the row's
``recorded_at``), rebuilds each round's events from its body and streams the result (``yield_per``, a
server-side cursor on PostgreSQL): memory stays bounded by the driver's batch, whatever the log's size. The
model filters are decided per request first, from each ``request_opened`` row (whose text may be stored
packed, so no SQL JSON function can read it); only the admitted request ids are kept. :func:`port_round_rows`
does the same over any :class:`~specround.statemachine.ports.EventLog` (e.g. the memory log) by folding
its event stream one request at a time; a test checks that both give the same rows.

The report reads the logged values as they are; whether they are *right* is the audit's job (a round
whose events are missing or out of place is simply not joined, and the audit reports it by name).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from specround.errors import ReportOptionError
from specround.statemachine.ports import EventLog

if TYPE_CHECKING:
    from specround.adapters.sql import SqlEventLog

__all__ = [
    "ReportFilter",
    "RoundRow",
    "matching_request_ids",
    "parse_time",
    "port_round_rows",
    "round_rows",
    "sql_round_rows",
]

STREAM_BATCH = 5000
"""Rows fetched per round trip."""
_NO_DIGEST = "0" * 64


@dataclass(frozen=True, slots=True)
class ReportFilter:
    """Which rounds a report covers. Empty fields do not filter."""

    request_ids: tuple[str, ...] = ()
    """Only these requests."""
    since: float | None = None
    """Only rounds published at or after this Unix time (``recorded_at``)."""
    until: float | None = None
    """Only rounds published before this Unix time."""
    target_model: str | None = None
    """Only requests whose coordinate's ``target_model_id`` is this."""
    draft_model: str | None = None
    """Only requests whose coordinate's ``draft_model_id`` is this."""

    def describe(self) -> dict[str, Any]:
        """The filters that are set, JSON-able."""
        out: dict[str, Any] = {}
        if self.request_ids:
            out["request_ids"] = list(self.request_ids)
        for name in ("since", "until", "target_model", "draft_model"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    def admits_time(self, recorded_at: float) -> bool:
        """Whether a round published at ``recorded_at`` is inside the time window."""
        return (self.since is None or recorded_at >= self.since) and (
            self.until is None or recorded_at < self.until
        )

    def admits_coordinate(self, coordinate: dict[str, Any]) -> bool:
        """Whether a request with this static coordinate passes the model filters."""
        return (self.target_model is None or coordinate.get("target_model_id") == self.target_model) and (
            self.draft_model is None or coordinate.get("draft_model_id") == self.draft_model
        )

    def admits_opened(self, payload: dict[str, Any]) -> bool:
        """Whether the request whose ``request_opened`` payload this is passes the model filters."""
        config = payload.get("config")
        coordinate = config.get("coordinate") if isinstance(config, dict) else None
        return self.admits_coordinate(coordinate if isinstance(coordinate, dict) else {})


@dataclass(frozen=True, slots=True)
class RoundRow:
    """What the report needs of one published round."""

    request_id: str
    recorded_at: float
    """When the round was published (Unix seconds)."""
    drafted: int
    """k: draft tokens proposed."""
    verify_rows: int
    """Temporary target input rows the verification computed (k + 1 replayed, k retained)."""
    accepted: int
    """A as logged (the emitted accepted drafts)."""
    reached: int
    """Acceptance tests reached (the round's ACCEPT draws, INV-3)."""
    terminal: str
    emitted: int
    """G: tokens the round published."""
    finished: bool
    committed_rows: int
    """K/V rows the round committed (INV-5: ``[F_0] + d_1..d_A``)."""
    discarded_rows: int
    """Branch rows it discarded."""
    draft_s: float | None = None
    verify_s: float | None = None
    state_s: float | None = None
    queue_s: float | None = None

    @property
    def round_s(self) -> float | None:
        """``T_round = T_D + T_V + T_S + T_Q`` when the round carries timings."""
        if self.draft_s is None or self.verify_s is None or self.state_s is None or self.queue_s is None:
            return None
        return self.draft_s + self.verify_s + self.state_s + self.queue_s


def _round_query(postgres: bool, filters: ReportFilter) -> tuple[str, list[Any]]:
    """The rounds query with the request and time filters pushed into it (the model filters are not)."""
    mark = "%s" if postgres else "?"
    where = ["1 = 1"]
    parameters: list[Any] = []
    if filters.request_ids:
        where.append(f"q.request_id IN ({', '.join([mark] * len(filters.request_ids))})")
        parameters.extend(filters.request_ids)
    if filters.since is not None:
        where.append(f"r.recorded_at >= {mark}")
        parameters.append(float(filters.since))
    if filters.until is not None:
        where.append(f"r.recorded_at < {mark}")
        parameters.append(float(filters.until))
    sql = (
        "SELECT q.request_id, r.recorded_at, r.generation, r.round_id, r.body FROM rounds r "
        f"JOIN requests q ON q.request_no = r.request_no WHERE {' AND '.join(where)}"
    )
    return sql, parameters


def _admitted_by_model(connection: Any, postgres: bool, filters: ReportFilter) -> set[str] | None:
    """The ids of the requests whose ``request_opened`` passes the model filters (None: no model filter).

    The events table holds one ``request_opened`` row per request, its text possibly packed, so the
    configurations are read here rather than filtered with the database's JSON functions (only those of
    the requests the request filter names, when it names any); only the admitted ids are kept.
    """
    from specround.adapters.sql.rows import EVENT_COLUMNS, decode_event_row

    if filters.target_model is None and filters.draft_model is None:
        return None
    admitted: set[str] = set()
    sql = f"SELECT {', '.join(EVENT_COLUMNS)} FROM events WHERE seq = 0 AND kind = 'request_opened'"
    if filters.request_ids:
        mark = "%s" if postgres else "?"
        sql += f" AND request_id IN ({', '.join([mark] * len(filters.request_ids))})"
    rows = connection.exec_driver_sql(sql, tuple(filters.request_ids))
    for row in rows:
        event = decode_event_row(tuple(row))
        if filters.admits_opened(event.payload):
            admitted.add(event.request_id)
    return admitted


def sql_round_rows(log: SqlEventLog, filters: ReportFilter | None = None) -> Iterator[RoundRow]:
    """Stream the rounds of a :class:`~specround.adapters.sql.SqlEventLog` (one query, bounded memory).

    Rows come in the database's scan order (not sorted); the query runs in one read transaction. A round
    whose body cannot be read is left out (the audit reports it by name).
    """
    from specround.adapters.sql.driver_errors import db_errors
    from specround.adapters.sql.engine import READ_ONLY
    from specround.adapters.sql.round_body import decode_round
    from specround.errors import LogIntegrityError

    filters = filters or ReportFilter()
    engine = log.engine
    postgres = engine.dialect.name == "postgresql"
    sql, parameters = _round_query(postgres, filters)
    with db_errors("read report rows"), engine.connect() as connection:
        connection = connection.execution_options(**{READ_ONLY: True}, yield_per=STREAM_BATCH)
        with connection.begin():
            admitted = _admitted_by_model(connection, postgres, filters)
            result = connection.exec_driver_sql(sql, tuple(parameters))
            for request_id, recorded_at, generation, round_id, body in result:
                if admitted is not None and request_id not in admitted:
                    continue
                try:
                    # The report reads neither processor nor commit digests: a reference to the previous
                    # round's processor digest, and the commit digest (which the row keeps only the
                    # first bytes of), get placeholders instead of reading rows in order.
                    events = decode_round(
                        bytes(body), request_id, round_id, int(generation), _NO_DIGEST, _NO_DIGEST
                    )
                    parts = {str(event.get("kind")): event for event in events}
                    yield _row_from_payloads(request_id, float(recorded_at), parts)
                except (
                    LogIntegrityError,
                    AttributeError,
                    IndexError,
                    KeyError,
                    OverflowError,
                    TypeError,
                    ValueError,
                ):  # a damaged row: left out of the report, named by the audit
                    continue


def port_round_rows(log: EventLog, filters: ReportFilter | None = None) -> Iterator[RoundRow]:
    """Stream the rounds of any :class:`EventLog` by folding its events one request at a time."""
    filters = filters or ReportFilter()
    wanted = set(filters.request_ids)
    ids: Sequence[str] = sorted(wanted) if wanted else log.request_ids()
    for request_id in ids:
        admitted: bool | None = None
        pending: dict[str, dict[str, Any]] = {}
        for event in log.events(request_id):
            if event.kind == "request_opened":
                admitted = filters.admits_opened(event.payload)
                if not admitted:
                    break
                continue
            if admitted is None:
                break
            pending[event.kind] = event.payload
            if event.kind != "round_published":
                continue
            parts, pending = pending, {}
            if len(parts) != 5 or not filters.admits_time(event.recorded_at):
                continue
            yield _row_from_payloads(request_id, event.recorded_at, parts)


def _row_from_payloads(request_id: str, recorded_at: float, parts: dict[str, dict[str, Any]]) -> RoundRow:
    ready, verified, decided = parts["round_ready"], parts["round_verified"], parts["round_decided"]
    staged, timings = parts["round_staged"], parts["round_published"].get("timings") or {}
    return RoundRow(
        request_id=request_id,
        recorded_at=recorded_at,
        drafted=len(ready["draft_ids"]),
        verify_rows=int(verified["verify_rows"]),
        accepted=int(decided["accepted"]),
        reached=int(decided["accept_draws"]),
        terminal=str(decided["terminal"]),
        emitted=len(decided["emitted_ids"]),
        finished=bool(decided["finished"]),
        committed_rows=len(staged["committed_kv_ids"]),
        discarded_rows=len(staged["discarded_kv_ids"]),
        draft_s=timings.get("draft_s"),
        verify_s=timings.get("verify_s"),
        state_s=timings.get("state_s"),
        queue_s=timings.get("queue_s"),
    )


def round_rows(log: EventLog, filters: ReportFilter | None = None) -> Iterator[RoundRow]:
    """The SQL path for a log with an SQLAlchemy ``engine`` (the SQL log), the port fold otherwise."""
    from specround.adapters.sql import SqlEventLog

    if isinstance(log, SqlEventLog):
        return sql_round_rows(log, filters)
    return port_round_rows(log, filters)


def parse_time(text: str) -> float:
    """Unix seconds from ``text``: a number of seconds, or an ISO 8601 time (UTC when it names no zone).

    Refuses anything else with :class:`~specround.errors.ReportOptionError`.
    """
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ReportOptionError(f"not a Unix time or an ISO 8601 time: {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def matching_request_ids(log: EventLog, filters: ReportFilter) -> list[str]:
    """The sorted request ids that pass the request and model filters (the time window is not applied)."""
    ids = sorted(set(filters.request_ids)) if filters.request_ids else log.request_ids()
    if filters.target_model is None and filters.draft_model is None:
        return ids
    kept = []
    for request_id in ids:
        for event in log.events(request_id):
            if event.kind == "request_opened" and filters.admits_opened(event.payload):
                kept.append(request_id)
            break
    return kept
