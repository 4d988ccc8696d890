"""Alembic environment of the specround event log.

specround runs its migrations programmatically (``specround db upgrade URL``, or the first open of an
embedded SQLite log) and hands this script an open connection in ``config.attributes["connection"]``; the
migrations then run inside that connection's transaction. Without one (e.g. ``alembic -x`` tooling) the
URL in ``sqlalchemy.url`` is opened with the event log's own connection settings.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from specround.adapters.sql.engine import build_engine, parse_location

config = context.config


def _run(connection: Connection) -> None:
    context.configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the migration SQL for ``sqlalchemy.url`` without connecting."""
    context.configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Run the migrations on the given connection, or on a fresh engine for ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("set sqlalchemy.url or pass a connection in config.attributes['connection']")
    engine = build_engine(parse_location(url))
    try:
        with engine.begin() as fresh:
            _run(fresh)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
