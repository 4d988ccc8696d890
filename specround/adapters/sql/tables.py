"""The event log's tables as SQLAlchemy Core metadata (the schema at the newest migration).

The tables are created and upgraded **only** by the alembic migrations in :mod:`specround.migrations`; this
metadata is what the log queries against, and a test checks that it matches what the migrations build.

``requests``
    One row per request: the live projection and the generation fence (current generation, head sequence
    number and hash, digest of the published state, finished flag), the state digest it was opened with,
    and ``request_no``, the compact integer key its rounds are stored under. Every published round updates
    its request's row; on PostgreSQL the table's pages are filled to half (``fillfactor``, migration 0004)
    so that those updates stay on their page (heap-only, no new index entries) and dead versions are pruned.
``events``
    The events that are not part of a round: each request's ``request_opened`` at seq 0. Hot fields are
    columns; the event's canonical JSON text, exactly as it was hashed, is either ``payload`` or, packed
    (:mod:`specround.adapters.sql.packed_payload`, about a quarter of the size), ``packed_payload`` with
    ``payload`` left ``''`` (migration 0006; rows written before keep their text).
``rounds``
    One row per published round holding all five of its lifecycle events (seqs ``5g - 4 .. 5g`` of
    generation ``g``): the round id and time as columns, ``commit_digest`` (the first
    :data:`COMMIT_PREFIX_BYTES` bytes of the round's commit digest, migration 0008: the reader rebuilds the
    digest from the events), ``prev_hash`` (the chain link the round extends, its first
    :data:`PREV_LINK_BYTES` bytes) and ``hash`` (the link of its ``round_published`` event, 32 raw bytes),
    and the events' values in ``body`` (:mod:`specround.adapters.sql.round_body`). The links between the five
    events are recomputed from the rebuilt canonical bytes on reading. A round id the controller derived
    (:mod:`specround.statemachine.round_ids`) is stored as ``''`` and rebuilt from the body (migration
    0005). Its primary key (request, generation) and unique index (request, round id, over the ids stored
    in full) are the database half of the fence (INV-6): no two transactions can publish the same
    generation of a request, and a round id is published at most once (a derived id names its generation).
    On PostgreSQL the table's 8-byte columns come first (migration 0007), so that its rows carry no
    alignment padding.
``signatures``
    Signed heads and checkpoints (only a log opened with a key writes them; :mod:`specround.signing`): the
    signed canonical message, the signature, its scheme and key id.

Identifiers compare byte-wise on both backends (``COLLATE "C"`` on PostgreSQL, SQLite's default BINARY), so
``ORDER BY request_id`` agrees with Python's ``sorted``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Double,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.types import TypeEngine

__all__ = [
    "COMMIT_PREFIX_BYTES",
    "HASH_LENGTH",
    "ID_LENGTH",
    "KIND_LENGTH",
    "PREV_LINK_BYTES",
    "events",
    "identifier_type",
    "metadata",
    "requests",
    "rounds",
    "signatures",
]

ID_LENGTH = 200
"""Longest request or round id (``RequestConfig.request_id`` allows 200 characters)."""
HASH_LENGTH = 64
"""Hex SHA-256."""
KIND_LENGTH = 32
"""Longest event kind."""
PREV_LINK_BYTES = 8
"""Bytes of the link a stored round extends that its row keeps (the reader resolves them to the full hash
of the stored round, or ``request_opened`` event, whose hash starts with them)."""

COMMIT_PREFIX_BYTES = 8
"""Bytes of a round's commit digest that its row keeps (migration 0008): the reader rebuilds the digest
from the round's events, and these bytes must begin it; the fence compares them when a round id comes
back. A row written before keeps all 32 (a digest its events did not rebuild stays that way)."""


def identifier_type() -> TypeEngine[str]:
    """A request/round id column type that sorts byte-wise on every backend."""
    return String(ID_LENGTH).with_variant(String(ID_LENGTH, collation="C"), "postgresql")


metadata = MetaData()
"""Metadata of the event-log tables."""

requests = Table(
    "requests",
    metadata,
    Column("request_id", identifier_type(), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("head_seq", BigInteger, nullable=False),
    Column("head_hash", String(HASH_LENGTH), nullable=False),
    Column("state_digest", String(HASH_LENGTH), nullable=False),
    Column("finished", Boolean, nullable=False),
    Column("opened_digest", String(HASH_LENGTH), nullable=False),
    Column("opened_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("request_no", BigInteger, nullable=True),
    PrimaryKeyConstraint("request_id", name="pk_requests"),
    Index("uq_requests_request_no", "request_no", unique=True),
)
"""Live projection and fence: one row per request."""

events = Table(
    "events",
    metadata,
    Column("request_id", identifier_type(), nullable=False),
    Column("seq", BigInteger, nullable=False),
    Column("kind", String(KIND_LENGTH), nullable=False),
    Column("round_id", identifier_type(), nullable=True),
    Column("generation", BigInteger, nullable=False),
    Column("schema_version", Integer, nullable=False),
    Column("prev_hash", String(HASH_LENGTH), nullable=False),
    Column("hash", String(HASH_LENGTH), nullable=False),
    Column("recorded_at", Double, nullable=False),
    Column("payload", Text, nullable=False),
    Column("packed_payload", LargeBinary, nullable=True),
    PrimaryKeyConstraint("request_id", "seq", name="pk_events"),
    ForeignKeyConstraint(["request_id"], ["requests.request_id"], name="fk_events_request_id"),
)
"""Every event, hash-chained per request, in (request, seq) order."""

rounds = Table(
    "rounds",
    metadata,
    Column("request_no", BigInteger, nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("recorded_at", Double, nullable=False),
    Column("round_id", identifier_type(), nullable=False),
    Column("commit_digest", LargeBinary, nullable=False),
    Column("prev_hash", LargeBinary, nullable=False),
    Column("hash", LargeBinary, nullable=False),
    Column("body", LargeBinary, nullable=False),
    PrimaryKeyConstraint("request_no", "generation", name="pk_rounds"),
    Index(
        "uq_rounds_round",
        "request_no",
        "round_id",
        unique=True,
        sqlite_where=text("round_id <> ''"),
        postgresql_where=text("round_id <> ''"),
    ),
)
"""One row per published round: its five events, and the fence's unique keys."""

signatures = Table(
    "signatures",
    metadata,
    Column("id", Integer, autoincrement=True, nullable=False),
    Column("scope", String(16), nullable=False),
    Column("request_id", identifier_type(), nullable=True),
    Column("scheme", String(32), nullable=False),
    Column("key_id", String(64), nullable=False),
    Column("message", Text, nullable=False),
    Column("signature", String(128), nullable=False),
    Column("recorded_at", Double, nullable=False),
    PrimaryKeyConstraint("id", name="pk_signatures"),
    Index("ix_signatures_request", "request_id", "id"),
)
"""Signed heads (``scope = 'head'``) and checkpoints over every head (``'checkpoint'``, no request id)."""
