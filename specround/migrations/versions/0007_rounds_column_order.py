"""PostgreSQL: ``rounds`` columns in alignment order, so that no round row carries padding.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

PostgreSQL aligns an 8-byte column to 8 bytes within the row. ``rounds`` was created as ``request_no,
generation, round_id, recorded_at, ...``: a derived round id is stored as ``''`` (one byte), so seven bytes
of padding followed it in every row before the ``double precision`` ``recorded_at``. With the three 8-byte
columns first the row is 8 bytes shorter and a page holds 23 rounds instead of 22 (about 14 bytes per round
on disk).

Upgrade on PostgreSQL rebuilds the table in the new order, the rows copied in primary-key order, and
recreates its primary key and partial unique index under their names. SQLite stores a row without padding,
so its table is left as it is. Downgrade changes nothing: the column order has no other effect.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from specround.adapters.sql.tables import identifier_type

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ORDER = ("request_no", "generation", "recorded_at", "round_id", "commit_digest", "prev_hash", "hash", "body")
_CALLER_IDS = "round_id <> ''"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_table(
        "rounds_aligned",
        sa.Column("request_no", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.Double(), nullable=False),
        sa.Column("round_id", identifier_type(), nullable=False),
        sa.Column("commit_digest", sa.LargeBinary(), nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(), nullable=False),
        sa.Column("hash", sa.LargeBinary(), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
    )
    columns = ", ".join(_ORDER)
    op.execute(
        f"INSERT INTO rounds_aligned ({columns}) SELECT {columns} FROM rounds ORDER BY request_no, generation"
    )
    op.drop_table("rounds")
    op.rename_table("rounds_aligned", "rounds")
    op.create_primary_key("pk_rounds", "rounds", ["request_no", "generation"])
    op.create_index(
        "uq_rounds_round",
        "rounds",
        ["request_no", "round_id"],
        unique=True,
        postgresql_where=sa.text(_CALLER_IDS),
    )


def downgrade() -> None:
    """Nothing to undo: revision 0006 reads and writes the table in either order."""
