"""The local PostgreSQL server as the default for the PostgreSQL-backed tests.

``.ci/run`` sets ``SPECROUND_TEST_POSTGRES_URL`` (and requires the server). A plain ``make test`` on a
machine where the server answers at :data:`DEFAULT_POSTGRES_URL` uses it too, so a newcomer's run does not
silently skip a third of the backends; where nothing answers there, those tests skip as before.
"""

from __future__ import annotations

import os
import socket

from sqlalchemy.engine import make_url

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
URL_ENV = "SPECROUND_TEST_POSTGRES_URL"


def _answers(url: str) -> bool:
    """Whether a PostgreSQL server accepts a connection and a query at ``url`` (within a few seconds)."""
    parsed = make_url(url)
    try:
        with socket.create_connection((parsed.host or "127.0.0.1", parsed.port or 5432), timeout=1.0):
            pass
    except OSError:
        return False
    from sqlalchemy import create_engine, text

    engine = create_engine(url, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception:
        return False
    finally:
        engine.dispose()
    return True


def use_local_server_by_default() -> str | None:
    """Set :data:`URL_ENV` to the local server when it is unset and the server answers; return the URL."""
    url = os.environ.get(URL_ENV)
    if url:
        return url
    if _answers(DEFAULT_POSTGRES_URL):
        os.environ[URL_ENV] = DEFAULT_POSTGRES_URL
        return DEFAULT_POSTGRES_URL
    return None
