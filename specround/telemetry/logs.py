"""Structured logging on the standard library: a JSON formatter and request/round context.

``configure_logging(fmt, level)`` attaches one handler to the ``specround`` logger (stderr). ``fmt`` is
``text`` (default) or ``json``; both default from the environment variables :data:`LOG_FORMAT_ENV`
(``SPECROUND_LOG_FORMAT``) and :data:`LOG_LEVEL_ENV` (``SPECROUND_LOG_LEVEL``), and the CLI's
``--log-format`` / ``--log-level`` options override them.

A JSON record is one line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``message``, then the ids of
:data:`CONTEXT_FIELDS` (``request_id``, ``round_id``, ``generation``) and any other fields the call passed
with ``extra=``. Ids come from the call's ``extra`` first, else from the innermost :func:`log_context`
block, so code deep inside a round need not pass them along.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime as dt
import json
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from specround.errors import ReportOptionError

__all__ = [
    "CONTEXT_FIELDS",
    "LOG_FORMATS",
    "LOG_FORMAT_ENV",
    "LOG_LEVEL_ENV",
    "JsonFormatter",
    "configure_logging",
    "log_context",
]

LOG_FORMAT_ENV = "SPECROUND_LOG_FORMAT"
"""Environment variable choosing the log format (``text`` or ``json``)."""
LOG_LEVEL_ENV = "SPECROUND_LOG_LEVEL"
"""Environment variable choosing the level of the ``specround`` logger (e.g. ``DEBUG``)."""
LOG_FORMATS = ("text", "json")
CONTEXT_FIELDS = ("request_id", "round_id", "generation")
"""Ids every record carries when they are known."""

_CONTEXT: contextvars.ContextVar[tuple[tuple[str, Any], ...]] = contextvars.ContextVar(
    "specround_log_context", default=()
)
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
_HANDLER_NAME = "specround-configured"


@contextlib.contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Records logged inside the block carry ``fields`` (e.g. ``request_id=...``), nested blocks merge."""
    token = _CONTEXT.set(tuple({**dict(_CONTEXT.get()), **fields}.items()))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        """Serialise ``record``."""
        context = dict(_CONTEXT.get())
        document: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, tz=dt.UTC).isoformat(timespec="microseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name, context.get(name))
            if value is not None:
                document[name] = value
        for name, value in {**context, **record.__dict__}.items():
            if name not in _STANDARD and name not in document and not name.startswith("_"):
                document[name] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, default=str, sort_keys=False)


class _TextFormatter(logging.Formatter):
    """``time level logger: message [request_id=.. round_id=..]``."""

    def format(self, record: logging.LogRecord) -> str:
        context = dict(_CONTEXT.get())
        ids = []
        for name in CONTEXT_FIELDS:
            value = record.__dict__.get(name, context.get(name))
            if value is not None:
                ids.append(f"{name}={value}")
        base = super().format(record)
        return f"{base} [{' '.join(ids)}]" if ids else base


def configure_logging(
    fmt: str | None = None, level: str | None = None, stream: TextIO | None = None
) -> logging.Logger:
    """Configure the ``specround`` logger once (a later call replaces the handler it added).

    Refuses an unknown format or level with :class:`~specround.errors.ReportOptionError`.
    """
    chosen = (fmt or os.environ.get(LOG_FORMAT_ENV) or "text").lower()
    if chosen not in LOG_FORMATS:
        raise ReportOptionError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {chosen!r}")
    level_name = (level or os.environ.get(LOG_LEVEL_ENV) or "WARNING").upper()
    numeric = logging.getLevelName(level_name)
    if not isinstance(numeric, int):
        raise ReportOptionError(f"unknown log level {level_name!r}")
    logger = logging.getLogger("specround")
    for handler in list(logger.handlers):
        if handler.get_name() == _HANDLER_NAME:
            logger.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        JsonFormatter()
        if chosen == "json"
        else _TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    logger.addHandler(handler)
    logger.setLevel(numeric)
    return logger
