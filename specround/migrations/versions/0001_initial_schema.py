"""Initial event-log schema: requests (projection + fence), events (hash-chained log), publications.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

The column types are spelled out here rather than imported from ``specround.adapters.sql.tables`` so that
this migration keeps building the same schema however the live metadata evolves.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _identifier() -> sa.types.TypeEngine[str]:
    return sa.String(200).with_variant(sa.String(200, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "requests",
        sa.Column("request_id", _identifier(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("head_seq", sa.BigInteger(), nullable=False),
        sa.Column("head_hash", sa.String(64), nullable=False),
        sa.Column("state_digest", sa.String(64), nullable=False),
        sa.Column("finished", sa.Boolean(), nullable=False),
        sa.Column("opened_digest", sa.String(64), nullable=False),
        sa.Column("opened_at", sa.Double(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", name="pk_requests"),
    )
    op.create_table(
        "events",
        sa.Column("request_id", _identifier(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("round_id", _identifier(), nullable=True),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("schema_version", sa.Integer(), nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=False),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "seq", name="pk_events"),
        sa.ForeignKeyConstraint(["request_id"], ["requests.request_id"], name="fk_events_request_id"),
    )
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


def downgrade() -> None:
    op.drop_table("publications")
    op.drop_table("events")
    op.drop_table("requests")
