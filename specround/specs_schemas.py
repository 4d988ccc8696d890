"""JSON Schemas of the logged events and the state/commit records, generated from the pydantic models.

``python -m specround.specs_schemas [DIR]`` (or ``specround schemas [DIR]``) writes one
``<name>.schema.json`` per model into ``DIR`` (default ``specs/schemas``); ``--check`` writes nothing and
exits 1 when a checked-in file differs from what the code generates (a test runs the check, so the files
cannot drift from the models). The schemas are pydantic's validation-mode JSON Schema (draft 2020-12),
with ``$id`` ``specround:<name>`` and the event schema version in ``x-schema-version``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, TypeAdapter

from specround.statemachine.events import (
    EVENT_SCHEMA_VERSION,
    Event,
    RequestOpened,
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundTimings,
    RoundVerified,
)
from specround.statemachine.state import RequestConfig, RequestState, RngCounters, SpeculativeCommit

__all__ = ["DEFAULT_DIRECTORY", "SCHEMA_MODELS", "check_schemas", "main", "schema_documents", "write_schemas"]

DEFAULT_DIRECTORY = Path("specs/schemas")
"""Where the checked-in schemas live, relative to the repository root."""

SCHEMA_MODELS: dict[str, type[BaseModel]] = {
    "request_opened": RequestOpened,
    "round_ready": RoundReady,
    "round_verified": RoundVerified,
    "round_decided": RoundDecided,
    "round_staged": RoundStaged,
    "round_published": RoundPublished,
    "round_timings": RoundTimings,
    "request_config": RequestConfig,
    "request_state": RequestState,
    "rng_counters": RngCounters,
    "speculative_commit": SpeculativeCommit,
}
"""File stem -> model; ``event.schema.json`` (any event, discriminated by ``kind``) is written beside them."""


def _decorate(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"specround:{name}",
        "x-schema-version": EVENT_SCHEMA_VERSION,
        **schema,
    }


def schema_documents() -> dict[str, str]:
    """File name -> the exact text written for it (sorted keys, two-space indent, trailing newline)."""
    documents: dict[str, dict[str, Any]] = {
        name: _decorate(name, model.model_json_schema()) for name, model in SCHEMA_MODELS.items()
    }
    event_schema: dict[str, Any] = TypeAdapter(Event).json_schema()
    event_schema["title"] = "Event"
    documents["event"] = _decorate("event", event_schema)
    return {
        f"{name}.schema.json": json.dumps(doc, indent=2, sort_keys=True) + "\n"
        for name, doc in documents.items()
    }


def write_schemas(directory: str | Path = DEFAULT_DIRECTORY) -> list[Path]:
    """Write every schema into ``directory`` (created if needed); returns the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in schema_documents().items():
        path = out / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def check_schemas(directory: str | Path = DEFAULT_DIRECTORY) -> list[str]:
    """Differences between ``directory`` and the generated schemas (missing, stale or extra files)."""
    out = Path(directory)
    expected = schema_documents()
    problems = []
    for filename, text in expected.items():
        path = out / filename
        if not path.is_file():
            problems.append(f"{path} is missing")
        elif path.read_text(encoding="utf-8") != text:
            problems.append(f"{path} differs from the models (regenerate with `specround schemas`)")
    if out.is_dir():
        for path in sorted(out.glob("*.schema.json")):
            if path.name not in expected:
                problems.append(f"{path} has no model")
    return problems


def main(argv: list[str] | None = None) -> int:
    """``python -m specround.specs_schemas [--check] [DIR]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    directory = Path(rest[0]) if rest else DEFAULT_DIRECTORY
    if check:
        problems = check_schemas(directory)
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    for path in write_schemas(directory):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
