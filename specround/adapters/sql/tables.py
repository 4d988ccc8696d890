"""The event log's tables as SQLAlchemy Core metadata (the schema at the newest migration).

The tables are created and upgraded **only** by the alembic migrations in :mod:`specround.migrations`; this
metadata is what the log queries against, and a test checks that it matches what the migrations build.

``requests``
    One row per request: the live projection and the generation fence (current generation, head sequence
    number and hash, digest of the published state, finished flag) and the state digest it was opened with.
``events``
    The append-only, per-request hash-chained log. Hot fields are columns; ``payload`` holds the event's
    canonical JSON text exactly as it was hashed, so an audit recomputes every link from what is stored.
``signatures``
    Signed heads and checkpoints (only a log opened with a key writes them; :mod:`specround.signing`): the
    signed canonical message, the signature, its scheme and key id.
``publications``
    One row per published round. Its primary key (request, generation) and unique key (request, round id)
    are the database half of the fence (INV-6): no two transactions can publish the same generation of a
    request, and a round id is published at most once.

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
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeEngine

__all__ = [
    "HASH_LENGTH",
    "ID_LENGTH",
    "KIND_LENGTH",
    "events",
    "identifier_type",
    "metadata",
    "publications",
    "requests",
    "signatures",
]

ID_LENGTH = 200
"""Longest request or round id (``RequestConfig.request_id`` allows 200 characters)."""
HASH_LENGTH = 64
"""Hex SHA-256."""
KIND_LENGTH = 32
"""Longest event kind."""


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
    PrimaryKeyConstraint("request_id", name="pk_requests"),
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
    PrimaryKeyConstraint("request_id", "seq", name="pk_events"),
    ForeignKeyConstraint(["request_id"], ["requests.request_id"], name="fk_events_request_id"),
)
"""Every event, hash-chained per request, in (request, seq) order."""

publications = Table(
    "publications",
    metadata,
    Column("request_id", identifier_type(), nullable=False),
    Column("generation", BigInteger, nullable=False),
    Column("round_id", identifier_type(), nullable=False),
    Column("commit_digest", String(HASH_LENGTH), nullable=False),
    Column("successor_digest", String(HASH_LENGTH), nullable=False),
    Column("event_seq", BigInteger, nullable=False),
    Column("recorded_at", Double, nullable=False),
    PrimaryKeyConstraint("request_id", "generation", name="pk_publications"),
    UniqueConstraint("request_id", "round_id", name="uq_publications_round"),
    ForeignKeyConstraint(["request_id"], ["requests.request_id"], name="fk_publications_request_id"),
)
"""One row per published round: the fence's unique keys (request, generation) and (request, round id)."""

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
