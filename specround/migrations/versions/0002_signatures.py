"""Signed chain heads: one row per signed head or checkpoint (written only when the log has a key).

Revision ID: 0002_signatures
Revises: 0001
Create Date: 2026-12-01

``message`` holds the canonical JSON bytes that were signed (:mod:`specround.signing`), ``signature`` the
hex signature, ``scheme`` and ``key_id`` which key made it. ``request_id`` is NULL for a checkpoint over
every head of the log.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002_signatures"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _identifier() -> sa.types.TypeEngine[str]:
    return sa.String(200).with_variant(sa.String(200, collation="C"), "postgresql")


def upgrade() -> None:
    op.create_table(
        "signatures",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("request_id", _identifier(), nullable=True),
        sa.Column("scheme", sa.String(32), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("signature", sa.String(128), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_signatures"),
    )
    op.create_index("ix_signatures_request", "signatures", ["request_id", "id"])


def downgrade() -> None:
    op.drop_index("ix_signatures_request", table_name="signatures")
    op.drop_table("signatures")
