"""One row per round: a round's five lifecycle events in one ``rounds`` row with a compact binary body.

Revision ID: 0003
Revises: 0002_signatures
Create Date: 2026-12-01

Upgrade: every request gets ``request_no`` (1, 2, ... in request-id order) and each published round's five
``events`` rows and its ``publications`` row become one ``rounds`` row (body encoded by
:func:`specround.adapters.sql.round_body.encode_round`, kept ``RAW`` whenever the compact form would not
give back the stored text byte for byte). ``events`` keeps the ``request_opened`` rows; ``publications`` is
dropped. The logical event stream is unchanged: the same events, seqs, envelopes, canonical bytes and hash
links. Only intact rounds can be folded: a log whose round events are missing, out of order or whose
links inside a round do not verify is refused with :class:`~specround.errors.LogIntegrityError` (audit it
with the previous release) and left as it was.

Downgrade rebuilds the ``events`` and ``publications`` rows from ``rounds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from specround.adapters.sql.round_body import decode_round, encode_raw, encode_round, raw_payloads
from specround.canonical import chain_hash, dumps_trusted, load
from specround.errors import LogIntegrityError

revision: str = "0003"
down_revision: str | None = "0002_signatures"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KINDS = ("round_ready", "round_verified", "round_decided", "round_staged", "round_published")
_BATCH = 500
_PREV_LINK_BYTES = 8
"""Bytes of a round's ``prev_hash`` its row keeps (the rest is the hash of the row it extends)."""


def _identifier() -> sa.types.TypeEngine[str]:
    return sa.String(200).with_variant(sa.String(200, collation="C"), "postgresql")


def upgrade() -> None:
    op.add_column("requests", sa.Column("request_no", sa.BigInteger(), nullable=True))
    op.create_index("uq_requests_request_no", "requests", ["request_no"], unique=True)
    op.create_table(
        "rounds",
        sa.Column("request_no", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("round_id", _identifier(), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.Column("commit_digest", sa.LargeBinary(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(), nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("request_no", "generation", name="pk_rounds"),
        sa.UniqueConstraint("request_no", "round_id", name="uq_rounds_round"),
    )
    connection = op.get_bind()
    request_ids = [
        row[0] for row in connection.execute(sa.text("SELECT request_id FROM requests ORDER BY request_id"))
    ]
    for number, request_id in enumerate(request_ids, start=1):
        connection.execute(
            sa.text("UPDATE requests SET request_no = :no WHERE request_id = :id"),
            {"no": number, "id": request_id},
        )
        _fold_request(connection, request_id, number)
    connection.execute(sa.text("DELETE FROM events WHERE kind <> 'request_opened'"))
    op.drop_table("publications")


def _fail(request_id: str, seq: int, message: str) -> LogIntegrityError:
    return LogIntegrityError(
        f"cannot upgrade the log to one row per round: request {request_id!r} seq {seq}: {message}; "
        "audit it with the previous release"
    )


def _fold_request(connection: sa.Connection, request_id: str, number: int) -> None:
    """Fold one request's round events into ``rounds`` rows."""
    opened = connection.execute(
        sa.text("SELECT hash FROM events WHERE request_id = :id AND seq = 0 AND kind = 'request_opened'"),
        {"id": request_id},
    ).first()
    if opened is None:
        raise _fail(request_id, 0, "no request_opened event at seq 0")
    commits = {
        int(row[0]): row[1]
        for row in connection.execute(
            sa.text("SELECT generation, commit_digest FROM publications WHERE request_id = :id"),
            {"id": request_id},
        )
    }
    rows = connection.execute(
        sa.text(
            "SELECT seq, kind, round_id, generation, schema_version, prev_hash, hash, recorded_at, payload "
            "FROM events WHERE request_id = :id AND seq > 0 ORDER BY seq"
        ),
        {"id": request_id},
    ).all()
    previous = opened[0]
    previous_processor: str | None = None
    batch: list[dict[str, Any]] = []
    for start in range(0, len(rows), len(_KINDS)):
        group = rows[start : start + len(_KINDS)]
        generation = start // len(_KINDS) + 1
        first_seq = start + 1
        if len(group) != len(_KINDS):
            raise _fail(request_id, group[0][0], f"a round of {len(group)} events")
        round_id = group[0][2]
        link = previous
        for offset, (seq, kind, rid, gen, _version, prev_hash, event_hash, _at, payload) in enumerate(group):
            if seq != first_seq + offset or kind != _KINDS[offset] or rid != round_id or gen != generation:
                raise _fail(request_id, seq, f"expected {_KINDS[offset]} of generation {generation} here")
            if prev_hash != link:
                raise _fail(request_id, seq, "prev_hash does not link to the previous event")
            if offset < len(_KINDS) - 1 and chain_hash(prev_hash, payload.encode("utf-8")) != event_hash:
                raise _fail(request_id, seq, "the stored hash does not match the payload")
            link = event_hash
        commit = commits.get(generation)
        if commit is None:
            raise _fail(request_id, group[-1][0], f"no publication of generation {generation}")
        payloads = [row[8].encode("utf-8") for row in group]
        events = [load(p) for p in payloads]
        body = encode_round(events, request_id, round_id, generation, commit, payloads, previous_processor)
        if raw_payloads(body) is None:
            decoded = decode_round(body, request_id, round_id, generation, commit, previous_processor)
            if [dumps_trusted(event) for event in decoded] != payloads:
                body = encode_raw(payloads)
        after = events[3].get("processor_after")
        previous_processor = after if isinstance(after, str) else None
        batch.append(
            {
                "no": number,
                "gen": generation,
                "rid": round_id,
                "at": group[-1][7],
                "commit": bytes.fromhex(commit),
                "prev": bytes.fromhex(group[0][5])[:_PREV_LINK_BYTES],
                "hash": bytes.fromhex(group[-1][6]),
                "body": body,
            }
        )
        previous = link
        if len(batch) >= _BATCH:
            _insert(connection, batch)
            batch = []
    if batch:
        _insert(connection, batch)


def _insert(connection: sa.Connection, batch: list[dict[str, Any]]) -> None:
    connection.execute(
        sa.text(
            "INSERT INTO rounds (request_no, generation, round_id, recorded_at, commit_digest, prev_hash, "
            "hash, body) VALUES (:no, :gen, :rid, :at, :commit, :prev, :hash, :body)"
        ).bindparams(
            sa.bindparam("commit", type_=sa.LargeBinary()),
            sa.bindparam("prev", type_=sa.LargeBinary()),
            sa.bindparam("hash", type_=sa.LargeBinary()),
            sa.bindparam("body", type_=sa.LargeBinary()),
        ),
        batch,
    )


def downgrade() -> None:
    op.create_table(
        "publications",
        sa.Column("request_id", _identifier(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("round_id", _identifier(), nullable=False),
        sa.Column("commit_digest", sa.String(64), nullable=False),
        sa.Column("successor_digest", sa.String(64), nullable=False),
        sa.Column("event_seq", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "generation", name="pk_publications"),
        sa.UniqueConstraint("request_id", "round_id", name="uq_publications_round"),
        sa.ForeignKeyConstraint(["request_id"], ["requests.request_id"], name="fk_publications_request_id"),
    )
    connection = op.get_bind()
    requests = connection.execute(
        sa.text("SELECT request_id, request_no FROM requests ORDER BY request_id")
    ).all()
    for request_id, number in requests:
        rounds = connection.execute(
            sa.text(
                "SELECT generation, round_id, recorded_at, commit_digest, prev_hash, hash, body FROM rounds "
                "WHERE request_no = :no ORDER BY generation"
            ),
            {"no": number},
        ).all()
        events: list[dict[str, Any]] = []
        publications: list[dict[str, Any]] = []
        opened = connection.execute(
            sa.text("SELECT hash FROM events WHERE request_id = :id AND seq = 0"), {"id": request_id}
        ).scalar_one()
        finals = [opened, *(bytes(row[5]).hex() for row in rounds)]
        links = {bytes.fromhex(full)[:_PREV_LINK_BYTES]: full for full in finals}
        previous_processor: str | None = None
        for generation, round_id, at, commit_raw, prev_raw, hash_raw, body in rounds:
            commit = bytes(commit_raw).hex()
            body = bytes(body)
            payloads = raw_payloads(body)
            if payloads is None:
                decoded = decode_round(body, request_id, round_id, generation, commit, previous_processor)
                payloads = [dumps_trusted(e) for e in decoded]
            after = load(payloads[3]).get("processor_after")
            previous_processor = after if isinstance(after, str) else None
            link = links.get(bytes(prev_raw), bytes(prev_raw).hex())
            staged = load(payloads[3])
            for offset, payload in enumerate(payloads):
                seq = (generation - 1) * len(_KINDS) + 1 + offset
                last = offset == len(_KINDS) - 1
                event_hash = bytes(hash_raw).hex() if last else chain_hash(link, payload)
                events.append(
                    {
                        "id": request_id,
                        "seq": seq,
                        "kind": _KINDS[offset],
                        "rid": round_id,
                        "gen": generation,
                        "version": int(load(payload).get("schema_version", 1)),
                        "prev": link,
                        "hash": event_hash,
                        "at": at,
                        "payload": payload.decode("utf-8"),
                    }
                )
                link = event_hash
            publications.append(
                {
                    "id": request_id,
                    "gen": generation,
                    "rid": round_id,
                    "commit": commit,
                    "successor": staged.get("successor_digest", ""),
                    "seq": generation * len(_KINDS),
                    "at": at,
                }
            )
        if events:
            connection.execute(
                sa.text(
                    "INSERT INTO events (request_id, seq, kind, round_id, generation, schema_version, "
                    "prev_hash, hash, recorded_at, payload) VALUES (:id, :seq, :kind, :rid, :gen, :version, "
                    ":prev, :hash, :at, :payload)"
                ),
                events,
            )
            connection.execute(
                sa.text(
                    "INSERT INTO publications (request_id, generation, round_id, commit_digest, "
                    "successor_digest, event_seq, recorded_at) "
                    "VALUES (:id, :gen, :rid, :commit, :successor, :seq, :at)"
                ),
                publications,
            )
    op.drop_table("rounds")
    op.drop_index("uq_requests_request_no", table_name="requests")
    op.execute("ALTER TABLE requests DROP COLUMN request_no")
