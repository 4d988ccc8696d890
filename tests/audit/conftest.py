"""The PostgreSQL fixtures of the SQL tests, for the audit tests that run on PostgreSQL too."""

from tests.adapters.sql.conftest import postgres_base_url, postgres_url

__all__ = ["postgres_base_url", "postgres_url"]
