"""The round coordinate of a request's published state (0x01A, 0x01C, 0x01D).

A proposal and a verification are made *for* one coordinate: the static identities the request was opened
with (models, backend, draft processors, vocabulary mapping; ``RequestConfig.coordinate``) plus the parts
that change every round (target processor policy, RNG counters, layout, the conditioning prefix, cache
length, frontier position, generation). The controller refuses a round whose coordinate digest is not the
request's current one (:class:`~specround.errors.StaleCoordinateError`).

The prefix enters as the token fold of ``O`` (:func:`specround.statemachine.state.fold_tokens`), which the
controller already maintains, so binding a round costs O(1) in the output length.
"""

from __future__ import annotations

from typing import Any

from specround.canonical import digest
from specround.sampling.types import Stream
from specround.statemachine.staging import RequestSnapshot
from specround.statemachine.state import RequestConfig

__all__ = ["coordinate_digest", "coordinate_document"]


def coordinate_document(
    config: RequestConfig, snapshot: RequestSnapshot, target_config_digest: str | None = None
) -> dict[str, Any]:
    """Every field of the round coordinate of ``snapshot`` as a JSON-able mapping.

    ``target_config_digest`` is ``snapshot.chain.config_digest()`` (pass it when already known).
    """
    state = snapshot.state
    return {
        "static": config.coordinate,
        "request_id": config.request_id,
        "seed": config.seed,
        "vocab_size": config.vocab_size,
        "layout": config.layout.value,
        "target_processors_config": target_config_digest or snapshot.chain.config_digest(),
        "rng_streams": {s.name.lower(): int(s) for s in Stream},
        "rng_counters": list(state.rng.as_tuple()),
        "prefix_fold": snapshot.output_fold.hex(),
        "prefix_length": len(state.output),
        "cache_length": len(state.cache),
        "frontier_position": state.position,
        "generation": state.generation,
    }


def coordinate_digest(
    config: RequestConfig, snapshot: RequestSnapshot, target_config_digest: str | None = None
) -> str:
    """Canonical digest of :func:`coordinate_document`."""
    return digest(coordinate_document(config, snapshot, target_config_digest))
