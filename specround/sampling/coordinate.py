"""The immutable speculative-round coordinate.

Contract: contract#round-coordinate, contract#layout-snapshot, contract#stale-coordinate.

Every p row, q row and draft of a round means something only under one frozen identity: which target and
proposal produced them, under which backend, processors, vocabulary, RNG streams and counters, layout,
prefix and cache coordinates. :class:`RoundCoordinate` is that identity, serialised canonically and
hashed. The digest is provenance, not a lock: a proposal or verification carries the digest of the
coordinate it was computed under, and :func:`require_coordinate` refuses it (``StaleCoordinateError``)
when the round's coordinate is any different.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from specround.canonical import canonical_bytes, digest
from specround.errors import StaleCoordinateError
from specround.sampling.types import Layout, Stream

__all__ = [
    "BackendIdentity",
    "RoundCoordinate",
    "coordinate_diff",
    "prefix_digest",
    "require_coordinate",
]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class BackendIdentity(BaseModel):
    """How the logits were computed: numeric type, attention/logit path and software revision."""

    model_config = _FROZEN

    dtype: str = Field(min_length=1)
    """Work dtype / autocast policy, e.g. ``"float32"``."""
    attention_path: str = Field(min_length=1)
    """Attention and logit implementation, e.g. ``"sdpa-rectangular-mask"``."""
    software_revision: str = Field(min_length=1)
    """Library versions that can change the arithmetic, e.g. ``"specround 0.1.0; torch 2.13.0"``."""


class RoundCoordinate(BaseModel):
    """M_round = (I_T, I_D, Omega, Pi_T, Pi_D, R, S_0, Lambda) of one request's round, frozen."""

    model_config = _FROZEN

    request_id: str = Field(min_length=1)
    target_model_id: str = Field(min_length=1)
    """I_T: the target model (weights digest or a pinned name)."""
    draft_model_id: str = Field(min_length=1)
    """I_D: the draft model or proposer specification."""
    backend: BackendIdentity
    target_processors_digest: str = Field(min_length=1)
    """Pi_T: ``ProcessorChain.config_digest()`` of the target's declared processors."""
    draft_processors_digest: str = Field(min_length=1)
    """Pi_D: the same for the proposal's processors."""
    vocab_size: int = Field(ge=1)
    """Omega: number of target-token events."""
    vocab_digest: str = Field(min_length=1)
    """Omega: digest of the vocabulary and any draft-to-target token mapping."""
    rng_seed: int
    """R: the request seed that keys every stream."""
    rng_streams: tuple[int, ...] = (int(Stream.PROPOSAL), int(Stream.ACCEPT), int(Stream.TERMINAL))
    """R: stream ids, in the order of :attr:`rng_counters`."""
    rng_counters: tuple[int, ...]
    """R: round-start counter of each stream in :attr:`rng_streams`."""
    layout: Layout
    """Lambda: where the frontier's K/V row lives."""
    prefix_digest: str = Field(min_length=1)
    """S_0: :func:`prefix_digest` of the conditioning token ids (prompt and output so far)."""
    cache_length: int = Field(ge=0)
    """S_0: committed target K/V rows."""
    frontier_position: int = Field(ge=0)
    """S_0: absolute position of the frontier token."""
    generation: int = Field(ge=0)
    """S_0: the request's published generation when the round started."""

    @model_validator(mode="after")
    def _counters_match_streams(self) -> RoundCoordinate:
        if len(self.rng_counters) != len(self.rng_streams) or len(set(self.rng_streams)) != len(
            self.rng_streams
        ):
            raise ValueError("rng_streams must be distinct and rng_counters must hold one counter per stream")
        if any(c < 0 for c in self.rng_counters):
            raise ValueError("rng_counters must be non-negative")
        return self

    def canonical_bytes(self) -> bytes:
        """Canonical JSON bytes of the coordinate."""
        return canonical_bytes(self)

    def digest(self) -> str:
        """SHA-256 of :meth:`canonical_bytes`: what proposals and verifications carry."""
        return digest(self)


def prefix_digest(token_ids: Sequence[int]) -> str:
    """Digest of a conditioning sequence of token ids (order and identity, not only length)."""
    return digest({"prefix": [int(t) for t in token_ids]})


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: value}


def coordinate_diff(a: RoundCoordinate, b: RoundCoordinate) -> list[str]:
    """Names of the fields in which ``a`` and ``b`` differ, in declaration order (``backend.dtype``...)."""
    left = _flatten(a.model_dump(mode="json"))
    right = _flatten(b.model_dump(mode="json"))
    return [name for name in left if left[name] != right.get(name)]


def require_coordinate(expected: RoundCoordinate, offered: str | RoundCoordinate, what: str) -> None:
    """Refuse ``what`` (a proposal, a verification...) bound to a coordinate other than ``expected``.

    ``offered`` is the digest the result carries, or the coordinate itself; with a coordinate the error
    names the first differing field. Raises :class:`StaleCoordinateError`.
    """
    if isinstance(offered, RoundCoordinate):
        changed = coordinate_diff(expected, offered)
        if changed:
            first = changed[0]
            want = _flatten(expected.model_dump(mode="json"))[first]
            got = _flatten(offered.model_dump(mode="json"))[first]
            raise StaleCoordinateError(
                f"{what} is bound to a stale round coordinate: {first} is {got!r}, the round has {want!r}"
                + (f" (also differs: {', '.join(changed[1:])})" if len(changed) > 1 else "")
            )
        return
    expected_digest = expected.digest()
    if offered != expected_digest:
        raise StaleCoordinateError(
            f"{what} is bound to round coordinate {str(offered)[:16]}..., "
            f"the round's is {expected_digest[:16]}..."
        )
