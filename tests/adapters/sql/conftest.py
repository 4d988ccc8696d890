"""Fixtures for the SQL event-log tests: a temp SQLite file, and a fresh PostgreSQL schema per test.

PostgreSQL tests read ``SPECROUND_TEST_POSTGRES_URL`` (e.g.
``postgresql+psycopg://postgres@127.0.0.1:5432/test``; the session sets it to the local server when that
answers, see tests/postgres_default.py). Without it they skip, unless
``SPECROUND_REQUIRE_POSTGRES=1`` (set by ``.ci/run``), which turns a missing or unreachable server into a
failure. Each test gets its own schema (selected through libpq's ``options=-csearch_path=...``), dropped
afterwards, so tests never see each other's rows and can run next to other users of the database.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

POSTGRES_URL_ENV = "SPECROUND_TEST_POSTGRES_URL"
REQUIRE_POSTGRES_ENV = "SPECROUND_REQUIRE_POSTGRES"


def _postgres_unavailable(reason: str) -> None:
    if os.environ.get(REQUIRE_POSTGRES_ENV) == "1":
        pytest.fail(f"PostgreSQL is required ({REQUIRE_POSTGRES_ENV}=1) but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def postgres_base_url() -> str:
    """The server URL from the environment, checked once per session."""
    url = os.environ.get(POSTGRES_URL_ENV)
    if not url:
        _postgres_unavailable(f"{POSTGRES_URL_ENV} is not set")
        raise AssertionError("unreachable")
    engine = create_engine(url, connect_args={"connect_timeout": 5})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        _postgres_unavailable(f"cannot connect to {make_url(url).render_as_string()}: {exc}")
    finally:
        engine.dispose()
    return url


def schema_url(base_url: str, schema: str) -> str:
    """``base_url`` with ``search_path`` set to ``schema`` and the connections named after it."""
    url = make_url(base_url).update_query_dict(
        {"options": f"-csearch_path={schema}", "application_name": schema}
    )
    return url.render_as_string(hide_password=False)


@pytest.fixture
def postgres_url(postgres_base_url: str) -> Iterator[str]:
    """A URL whose tables live in a fresh, empty schema that is dropped after the test.

    Connections a failed test left open (their ``application_name`` is the schema's name) are ended first,
    so a leftover lock can never stall the suite.
    """
    schema = f"specround_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(postgres_base_url)
    with admin.begin() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield schema_url(postgres_base_url, schema)
    finally:
        with admin.begin() as connection:
            connection.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = :name AND pid <> pg_backend_pid()"
                ),
                {"name": schema},
            )
            connection.execute(text("SET LOCAL lock_timeout = '30s'"))
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_path(tmp_path: Path) -> str:
    """A path for a new SQLite log in the test's temp directory."""
    return str(tmp_path / "events.sqlite")


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def log_url(request: pytest.FixtureRequest) -> str:
    """The location of a new, empty log on each backend."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_path"))
    return str(request.getfixturevalue("postgres_url"))
