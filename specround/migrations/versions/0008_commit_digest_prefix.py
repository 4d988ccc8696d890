"""A round row keeps the first 8 bytes of its commit digest; the reader rebuilds the digest from the body.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-06

A round's commit digest is the digest of its :class:`~specround.statemachine.state.SpeculativeCommit`,
whose values are all in the round's events (the request's layout aside, which the stored prefix picks:
:func:`~specround.statemachine.commit_record.commit_digest_of_events`). The row therefore keeps only its
first :data:`~specround.adapters.sql.tables.COMMIT_PREFIX_BYTES` bytes, and the reader rebuilds the rest:
24 bytes less per round (on PostgreSQL a page then holds about 24 rounds instead of 23). The digest stays
in the hash chain: a rebuilt digest that differs from the one published breaks the round's links. The
fence compares the stored bytes when a round id comes back, to tell a retry from a different round.

Upgrade shortens, request by request in generation order, the digest of each round whose body rebuilds it
exactly (a ``RAW`` body holds its own); any other row keeps all 32 bytes, which the reader takes as they
are, so nothing is lost. Rows are read a page at a time (bounded memory). The freed bytes go to the rounds
written next: on PostgreSQL once (auto)vacuum has reclaimed the old row versions. ``VACUUM`` (SQLite) or
``VACUUM FULL rounds`` (PostgreSQL) returns them to the file system.

Downgrade writes every shortened digest back in full, rebuilt from its round's events.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from specround.adapters.sql.migrate import report_progress
from specround.adapters.sql.rows import round_payloads
from specround.adapters.sql.tables import COMMIT_PREFIX_BYTES
from specround.errors import LogIntegrityError
from specround.statemachine.commit_record import commit_digest_of_events

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PAGE = 500
"""Rows read (and written back) at a time."""
_REPORT_EVERY = 20_000
"""Rounds between two progress lines."""


def _rows(connection: sa.Connection) -> Iterator[list[Any]]:
    """Pages of ``(request_no, generation, round_id, commit_digest, body, request_id)`` in key order."""
    select = (
        "SELECT r.request_no, r.generation, r.round_id, r.commit_digest, r.body, q.request_id FROM rounds r "
        "LEFT JOIN requests q ON q.request_no = r.request_no {where} "
        f"ORDER BY r.request_no, r.generation LIMIT {_PAGE}"
    )
    after = "WHERE r.request_no > :n OR (r.request_no = :n AND r.generation > :g)"
    page = connection.execute(sa.text(select.format(where=""))).all()
    while page:
        yield [tuple(row) for row in page]
        number, generation = page[-1][0], page[-1][1]
        page = connection.execute(sa.text(select.format(where=after)), {"n": number, "g": generation}).all()


def _write(connection: sa.Connection, updates: list[dict[str, Any]]) -> None:
    if updates:
        connection.execute(
            sa.text("UPDATE rounds SET commit_digest = :c WHERE request_no = :n AND generation = :g"), updates
        )


def _walk(connection: sa.Connection) -> Iterator[tuple[Any, int, bytes, list[dict[str, Any]] | None]]:
    """Each round as (request number, generation, stored commit digest, its events or None if unreadable).

    Rounds come request by request in generation order, so that a body's reference to the previous
    round's processor digest resolves.
    """
    current: Any = None
    previous: str | None = None
    read = 0
    for page in _rows(connection):
        read += len(page)
        if read % _REPORT_EVERY < len(page):
            report_progress(op.get_context().config, f"0008: {read} rounds read")
        for number, generation, round_id, commit, body, request_id in page:
            commit, body = bytes(commit), bytes(body)
            if number != current:
                current, previous = number, None
            events: list[dict[str, Any]] | None = None
            if body and request_id is not None:
                try:
                    payloads, _, defects, _ = round_payloads(
                        body, str(request_id), str(round_id), int(generation), commit.hex(), previous
                    )
                except ValueError:  # a body that cannot be split into five events
                    pass
                else:
                    events = None if any(defects) else payloads
            after = None if events is None else events[3].get("processor_after")
            previous = after if isinstance(after, str) else None
            yield number, int(generation), commit, events


def upgrade() -> None:
    connection = op.get_bind()
    updates: list[dict[str, Any]] = []
    rounds = shortened = 0
    for number, generation, commit, events in _walk(connection):
        rounds += 1
        if len(commit) != 32 or events is None:
            continue  # unreadable: the audit names it, and its digest stays whole
        if events[4].get("commit_digest") != commit.hex():
            continue
        rebuilt = commit_digest_of_events(events[0], events[2], events[3], commit.hex())
        if rebuilt == commit.hex():
            updates.append({"c": commit[:COMMIT_PREFIX_BYTES], "n": number, "g": generation})
            shortened += 1
        if len(updates) >= _PAGE:
            _write(connection, updates)
            updates = []
    _write(connection, updates)
    report_progress(
        op.get_context().config,
        f"0008: {shortened} of {rounds} rounds keep the first bytes of their commit digest",
    )


def downgrade() -> None:
    connection = op.get_bind()
    updates: list[dict[str, Any]] = []
    for number, generation, commit, events in _walk(connection):
        if len(commit) == 32:
            continue
        full = None if events is None else events[4].get("commit_digest")
        whole = _digest_bytes(full)
        if whole is None or not whole.startswith(commit):
            raise LogIntegrityError(
                f"cannot downgrade: the commit digest of the round at generation {generation} of request "
                f"number {number} cannot be rebuilt from its events; audit the log"
            )
        updates.append({"c": whole, "n": number, "g": generation})
        if len(updates) >= _PAGE:
            _write(connection, updates)
            updates = []
    _write(connection, updates)


def _digest_bytes(value: Any) -> bytes | None:
    """The 32 bytes of a hex digest (None for anything else, e.g. a prefix read back padded with ``-``)."""
    if not isinstance(value, str) or len(value) != 64:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None
