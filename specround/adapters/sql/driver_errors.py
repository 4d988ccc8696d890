"""Driver errors mapped onto specround's exception tree: no raw SQLAlchemy or DBAPI exception escapes.

================================================  =====================================================
raised by the driver                              raised by the event log
================================================  =====================================================
a missing table (``no such table``, ``42P01``)    :class:`~specround.errors.SchemaVersionError`
``IntegrityError`` (a unique/foreign key fired)   :class:`~specround.errors.LogIntegrityError`
``OperationalError`` (locked, refused, timeout),  :class:`~specround.errors.LogUnavailableError`
``InterfaceError``, pool timeout, disconnect
any other driver or SQLAlchemy error              :class:`~specround.errors.EventLogError`
================================================  =====================================================

The original exception stays attached as ``__cause__`` for debugging.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import exc as sa_exc

from specround.errors import (
    EventLogError,
    LogIntegrityError,
    LogUnavailableError,
    SchemaVersionError,
    SpecroundError,
)

__all__ = ["RETRYABLE_SQLSTATES", "db_errors", "is_integrity_error", "is_retryable", "map_db_error"]

RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
"""PostgreSQL serialization failure and deadlock: the transaction may simply be run again."""

_UNAVAILABLE = frozenset({"OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError"})
_INTEGRITY = frozenset({"IntegrityError"})


def _sqlstate(error: BaseException) -> str | None:
    original = getattr(error, "orig", None) or error
    state = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
    return state if isinstance(state, str) else None


def _class_names(error: BaseException) -> set[str]:
    # PEP 249 names the same classes in every driver; SQLAlchemy's wrappers reuse them.
    return {cls.__name__ for cls in type(error).__mro__}


def is_integrity_error(error: BaseException) -> bool:
    """Whether a driver error (SQLAlchemy-wrapped or raw DBAPI) is a unique or foreign key violation."""
    original = getattr(error, "orig", None) or error
    return bool((_class_names(error) | _class_names(original)) & _INTEGRITY)


def is_retryable(error: BaseException) -> bool:
    """Whether a driver error is a transient conflict (deadlock, serialization failure)."""
    return _sqlstate(error) in RETRYABLE_SQLSTATES


def map_db_error(error: BaseException, action: str) -> EventLogError:
    """The specround exception for a driver error raised while doing ``action``."""
    original = getattr(error, "orig", None) or error
    lines = str(original).strip().splitlines()
    message = f"event log could not {action}: {lines[0] if lines else type(original).__name__}"
    if _sqlstate(error) == "42P01" or "no such table" in message:
        return SchemaVersionError(f"{message} (is the schema migrated? run `specround db upgrade URL`)")
    if is_integrity_error(error):
        return LogIntegrityError(message)
    if (_class_names(error) | _class_names(original)) & _UNAVAILABLE:
        return LogUnavailableError(message)
    return EventLogError(message)


@contextmanager
def db_errors(action: str) -> Iterator[None]:
    """Translate driver errors raised inside the block (specround's own errors pass through)."""
    try:
        yield
    except SpecroundError:
        raise
    except (sa_exc.SQLAlchemyError, sqlite3.Error) as error:
        raise map_db_error(error, action) from error
    except UnicodeError as error:  # a stored text (or a key read from one) that is not valid UTF-8
        raise LogIntegrityError(
            f"event log could not {action}: text that is not valid UTF-8 ({error})"
        ) from error
    except Exception as error:
        if type(error).__module__.startswith("psycopg"):
            raise map_db_error(error, action) from error
        raise
