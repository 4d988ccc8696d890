"""Alembic migrations of the event log, run programmatically.

The migration scripts ship inside the wheel (``specround/migrations``). :func:`upgrade` runs them in one
transaction on the caller's engine: under ``BEGIN IMMEDIATE`` on SQLite and under a transaction-scoped
advisory lock on PostgreSQL, so many workers opening a fresh log at once migrate it exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Connection, Engine, text

from specround.adapters.sql.driver_errors import db_errors
from specround.adapters.sql.engine import READ_ONLY
from specround.errors import SchemaVersionError

__all__ = [
    "MIGRATIONS_DIR",
    "SchemaStatus",
    "alembic_config",
    "ensure_schema",
    "head_revision",
    "report_progress",
    "schema_status",
    "upgrade",
]

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent.parent / "migrations"
"""The alembic script directory shipped with the package."""

_MIGRATION_LOCK_KEY = 0x5EC0_0D01
"""PostgreSQL advisory-lock key that serialises concurrent migrations of one database."""


@dataclass(frozen=True, slots=True)
class SchemaStatus:
    """Where a database's event-log schema stands."""

    current: str | None
    """The applied revision, None for a database without the schema."""
    head: str
    """The newest revision this release ships."""

    @property
    def up_to_date(self) -> bool:
        """Whether the database is at this release's newest revision."""
        return self.current == self.head


def alembic_config(
    connection: Connection | None = None, progress: Callable[[str], None] | None = None
) -> Config:
    """An alembic configuration for the shipped scripts, optionally bound to an open connection.

    ``progress`` receives a line now and then from a migration that rewrites rows (:func:`report_progress`).
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    config.attributes["progress"] = progress
    return config


def report_progress(config: Config | None, line: str) -> None:
    """Hand ``line`` to the ``progress`` callback the migration run was given (if any)."""
    progress = None if config is None else config.attributes.get("progress")
    if progress is not None:
        progress(line)


@cache
def _script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


@cache
def head_revision() -> str:
    """The newest migration revision shipped with this release."""
    head = _script_directory().get_current_head()
    if head is None:  # pragma: no cover - the package always ships a revision
        raise SchemaVersionError("no event-log migrations are installed")
    return head


def _known(revision: str) -> bool:
    try:
        return _script_directory().get_revision(revision) is not None
    except CommandError:
        return False


def schema_status(engine: Engine) -> SchemaStatus:
    """Read the applied revision (one short read transaction)."""
    with db_errors("read the schema version"), engine.connect() as connection:
        connection = connection.execution_options(**{READ_ONLY: True})
        with connection.begin():
            heads = MigrationContext.configure(connection).get_current_heads()
    if len(heads) > 1:
        raise SchemaVersionError(f"the database has several schema heads {sorted(heads)}")
    current = heads[0] if heads else None
    if current is not None and not _known(current):
        raise SchemaVersionError(
            f"the database is at schema revision {current!r}, which this release does not know "
            f"(newest known: {head_revision()!r}); upgrade specround"
        )
    return SchemaStatus(current=current, head=head_revision())


def upgrade(
    engine: Engine, revision: str = "head", progress: Callable[[str], None] | None = None
) -> SchemaStatus:
    """Migrate the database up to ``revision`` in one transaction; a no-op when already there.

    ``progress`` receives a line now and then from a migration that rewrites every round.
    """
    status = schema_status(engine)
    if revision == "head" and status.up_to_date:
        return status
    try:
        with db_errors("migrate the schema"), engine.begin() as connection:
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _MIGRATION_LOCK_KEY})
            command.upgrade(alembic_config(connection, progress), revision)
    except CommandError as exc:
        raise SchemaVersionError(f"cannot migrate the event log to {revision!r}: {exc}") from exc
    return schema_status(engine)


def ensure_schema(engine: Engine, *, create: bool) -> SchemaStatus:
    """Check that the schema is at head; migrate it first when ``create`` is true.

    Raises :class:`SchemaVersionError` when the database is behind and ``create`` is false, or when it is
    ahead of this release.
    """
    status = schema_status(engine)
    if status.up_to_date:
        return status
    if not create:
        where = "has no event-log schema" if status.current is None else f"is at revision {status.current!r}"
        raise SchemaVersionError(
            f"the database {where}, this release needs {status.head!r}; run `specround db upgrade URL`"
        )
    return upgrade(engine)
