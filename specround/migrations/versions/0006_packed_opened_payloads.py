"""Packed event payloads: ``events.packed_payload`` holds a ``request_opened`` text, deflated.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-06

Each request's ``request_opened`` event is its one row of ``events``; its canonical JSON text (about 700
bytes for the controller bench's requests, more with processors and a long prompt) is mostly what every
request repeats. The log now writes it packed (:mod:`specround.adapters.sql.packed_payload`, about a
quarter of the size) into the new nullable column ``packed_payload`` and leaves ``payload`` as ``''``. The
reader unpacks it to the same bytes, so the logical event stream and every hash are unchanged.

Upgrade adds the column; the rows already written keep their text (the reader accepts both). Downgrade
writes every packed text back into ``payload`` and drops the column.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from specround.adapters.sql.packed_payload import unpack_payload
from specround.errors import LogIntegrityError

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMN = "packed_payload"
_BATCH = 500
"""Rows the downgrade unpacks per read."""


def upgrade() -> None:
    op.add_column("events", sa.Column(_COLUMN, sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    connection = op.get_bind()
    select = sa.text(
        f"SELECT request_id, seq, {_COLUMN} FROM events WHERE {_COLUMN} IS NOT NULL "
        f"ORDER BY request_id, seq LIMIT {_BATCH}"
    )
    # A batch at a time (bounded memory): each batch's rows leave the selection as they are written back.
    while packed := connection.execute(select).all():
        for request_id, seq, data in packed:
            try:
                text = unpack_payload(bytes(data)).decode("utf-8")
            except (ValueError, UnicodeDecodeError) as exc:
                raise LogIntegrityError(
                    f"cannot downgrade: the packed payload of request {request_id!r} seq {seq} does not "
                    f"unpack ({exc}); audit the log"
                ) from None
            connection.execute(
                sa.text(
                    f"UPDATE events SET payload = :text, {_COLUMN} = NULL "
                    "WHERE request_id = :id AND seq = :seq"
                ),
                {"text": text, "id": request_id, "seq": seq},
            )
    if connection.dialect.name == "sqlite":
        with op.batch_alter_table("events") as batch:
            batch.drop_column(_COLUMN)
    else:
        op.drop_column("events", _COLUMN)
