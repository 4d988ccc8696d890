"""Derived round ids stored empty: the unique key on round ids covers only the ids callers chose.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-06

A round the caller does not name carries the id the controller derives from its generation, coordinate
digest and drafts (:mod:`specround.statemachine.round_ids`). Its row can store that id as ``''``: the reader
rebuilds it from the body, which holds those values. The unique constraint ``uq_rounds_round`` on
``(request_no, round_id)`` becomes a unique index of the same name over the rows whose id is not empty, so
that a derived id costs neither its text nor an index entry (about 46 bytes per round: 20 of column, 26 of
index). Two rounds still cannot share an id: a derived id names its generation, which the primary key
holds once, and a caller's id of the derived form is refused unless it is the derived one.

Upgrade replaces the constraint by the partial index (SQLite rebuilds the table); the rows already written
keep their ids as they are (the reader and the fence accept both). The logical event stream is untouched.

Downgrade writes every empty id back in full (decoded from the round's body) and restores the constraint.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from specround.adapters.sql.rows import derived_id_of_body
from specround.errors import LogIntegrityError

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_INDEX = "uq_rounds_round"
_CALLER_IDS = "round_id <> ''"
_BATCH = 500
"""Rows whose id the downgrade writes back per read."""


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        with op.batch_alter_table("rounds") as batch:
            batch.drop_constraint(_INDEX, type_="unique")
    else:
        op.drop_constraint(_INDEX, "rounds", type_="unique")
    op.create_index(
        _INDEX,
        "rounds",
        ["request_no", "round_id"],
        unique=True,
        sqlite_where=sa.text(_CALLER_IDS),
        postgresql_where=sa.text(_CALLER_IDS),
    )


def downgrade() -> None:
    connection = op.get_bind()
    select = sa.text(
        "SELECT r.request_no, r.generation, r.body, q.request_id FROM rounds r "
        f"LEFT JOIN requests q ON q.request_no = r.request_no WHERE r.round_id = '' LIMIT {_BATCH}"
    )
    # A batch at a time (bounded memory): each batch's rows leave the selection as they are written back.
    while empty := connection.execute(select).all():
        for number, generation, body, request_id in empty:
            round_id = derived_id_of_body(bytes(body), str(request_id), int(generation))
            if not round_id:
                raise LogIntegrityError(
                    f"cannot downgrade: the round at generation {generation} of request {request_id!r} has "
                    "an empty id and a body that does not name its derived one; audit the log"
                )
            connection.execute(
                sa.text("UPDATE rounds SET round_id = :id WHERE request_no = :no AND generation = :g"),
                {"id": round_id, "no": number, "g": generation},
            )
    op.drop_index(_INDEX, "rounds")
    if connection.dialect.name == "sqlite":
        with op.batch_alter_table("rounds") as batch:
            batch.create_unique_constraint(_INDEX, ["request_no", "round_id"])
    else:
        op.create_unique_constraint(_INDEX, "rounds", ["request_no", "round_id"])
