"""The round coordinate of a request's published state.

Contract: contract#round-coordinate, contract#layout-snapshot, contract#stale-coordinate.

A proposal and a verification are made *for* one :class:`~specround.sampling.coordinate.RoundCoordinate`:
the static identities the request was opened with (target and draft model, backend, draft processors,
vocabulary mapping — kept in ``RequestConfig.coordinate``) plus the parts that change every round (the
target processor policy, RNG counters, layout, conditioning prefix, cache length, frontier position,
generation). The controller refuses a round whose coordinate digest is not the request's current one
(:class:`~specround.errors.StaleCoordinateError`).

The prefix enters as ``"fold:" + hex`` of the output's token fold
(:func:`specround.statemachine.state.fold_tokens`) — a digest of the token ids in order that the controller
already maintains, so binding a round costs O(1) in the output length. :func:`coordinate_digest` builds the
canonical bytes directly; it equals ``round_coordinate(...).digest()`` (tested).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from specround.canonical import canonical_bytes, digest, dumps_trusted
from specround.errors import InvalidRequestError
from specround.sampling.coordinate import BackendIdentity, RoundCoordinate
from specround.sampling.types import Stream
from specround.statemachine.staging import RequestSnapshot
from specround.statemachine.state import RequestConfig

__all__ = [
    "STATIC_COORDINATE_FIELDS",
    "UNSPECIFIED",
    "coordinate_digest",
    "round_coordinate",
    "static_coordinate",
]

UNSPECIFIED = "unspecified"
"""The value of a static identity the caller did not declare (synthetic rows, tests)."""

STATIC_COORDINATE_FIELDS = (
    "target_model_id",
    "draft_model_id",
    "backend",
    "draft_processors_digest",
    "vocab_digest",
)
"""The coordinate fields a request declares once, at open (``RequestConfig.coordinate``)."""

_STREAMS = [int(Stream.PROPOSAL), int(Stream.ACCEPT), int(Stream.TERMINAL)]


def static_coordinate(declared: Mapping[str, Any] | None, vocab_size: int) -> dict[str, Any]:
    """Validate the static coordinate fields a request declares and fill the undeclared ones.

    Unknown keys or invalid values raise :class:`~specround.errors.InvalidRequestError`. Undeclared ids
    become :data:`UNSPECIFIED`; the vocabulary digest defaults to a digest of the vocabulary size alone.
    """
    declared = dict(declared or {})
    unknown = set(declared) - set(STATIC_COORDINATE_FIELDS)
    if unknown:
        raise InvalidRequestError(
            f"unknown coordinate fields {sorted(unknown)}; allowed: {list(STATIC_COORDINATE_FIELDS)}"
        )
    backend = declared.get("backend") or {}
    if isinstance(backend, BackendIdentity):
        backend = backend.model_dump(mode="json")
    static = {
        "target_model_id": declared.get("target_model_id") or UNSPECIFIED,
        "draft_model_id": declared.get("draft_model_id") or UNSPECIFIED,
        "backend": {
            "dtype": UNSPECIFIED,
            "attention_path": UNSPECIFIED,
            "software_revision": UNSPECIFIED,
            **(dict(backend) if isinstance(backend, Mapping) else {"invalid": backend}),
        },
        "draft_processors_digest": declared.get("draft_processors_digest") or UNSPECIFIED,
        "vocab_digest": declared.get("vocab_digest") or digest({"vocab_size": vocab_size}),
    }
    try:  # validate through the model once, at the API boundary
        RoundCoordinate(
            request_id="validation",
            **static,
            target_processors_digest=UNSPECIFIED,
            vocab_size=vocab_size,
            rng_seed=0,
            rng_counters=(0, 0, 0),
            layout="replay_frontier",
            prefix_digest=UNSPECIFIED,
            cache_length=0,
            frontier_position=0,
            generation=0,
        )
        canonical_bytes(static)
    except (ValueError, TypeError) as exc:
        raise InvalidRequestError(f"invalid coordinate fields: {exc}") from exc
    return static


def _document(config: RequestConfig, snapshot: RequestSnapshot, target_config_digest: str) -> dict[str, Any]:
    """The coordinate exactly as ``RoundCoordinate.model_dump(mode="json")`` writes it."""
    state = snapshot.state
    static = config.coordinate
    return {
        "request_id": config.request_id,
        "target_model_id": static["target_model_id"],
        "draft_model_id": static["draft_model_id"],
        "backend": static["backend"],
        "target_processors_digest": target_config_digest,
        "draft_processors_digest": static["draft_processors_digest"],
        "vocab_size": config.vocab_size,
        "vocab_digest": static["vocab_digest"],
        "rng_seed": config.seed,
        "rng_streams": _STREAMS,
        "rng_counters": [state.rng.proposal, state.rng.accept, state.rng.terminal],
        "layout": config.layout.value,
        "prefix_digest": "fold:" + snapshot.output_fold.hex(),
        "cache_length": len(state.cache),
        "frontier_position": state.position,
        "generation": state.generation,
    }


def round_coordinate(
    config: RequestConfig, snapshot: RequestSnapshot, target_config_digest: str | None = None
) -> RoundCoordinate:
    """The :class:`RoundCoordinate` of a round starting at ``snapshot``.

    ``target_config_digest`` is ``snapshot.chain.config_digest()`` (pass it when already known).
    """
    document = _document(config, snapshot, target_config_digest or snapshot.chain.config_digest())
    return RoundCoordinate.model_validate(document)


def coordinate_digest(
    config: RequestConfig, snapshot: RequestSnapshot, target_config_digest: str | None = None
) -> str:
    """``round_coordinate(config, snapshot).digest()``, computed without building the model."""
    document = _document(config, snapshot, target_config_digest or snapshot.chain.config_digest())
    # The static fields passed canonical_bytes (NaN check included) at open; the rest are ints and strings.
    return hashlib.sha256(dumps_trusted(document)).hexdigest()
