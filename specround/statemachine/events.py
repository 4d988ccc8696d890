"""The events of the log: immutable, versioned pydantic models, one per lifecycle transition.

Events are *slim*: each carries only what its transition adds, so a round's five events together hold what
an audit needs, the acceptance log included (contract#acceptance-log), without repeating a payload. The log
wraps each in a :class:`~specround.statemachine.ports.StoredEvent` envelope with the per-request sequence
number and hash chain link ``hash = chain_hash(prev_hash, canonical_bytes(event))``.

Versioning: every event has ``schema_version``. :func:`parse_event` upcasts older payloads step by step
through :data:`UPCASTERS` before validation, so a log written by an older release stays readable.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from specround.errors import LogIntegrityError, SchemaVersionError
from specround.statemachine.records import register_record
from specround.statemachine.state import FinishReason, RequestConfig, TerminalName

__all__ = [
    "EVENT_SCHEMA_VERSION",
    "ROUND_EVENT_KINDS",
    "UPCASTERS",
    "Event",
    "RequestOpened",
    "RoundDecided",
    "RoundPublished",
    "RoundReady",
    "RoundStaged",
    "RoundTimings",
    "RoundVerified",
    "parse_event",
    "whole_microseconds",
]

EVENT_SCHEMA_VERSION = 1
"""The schema version this release writes."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class _EventBase(BaseModel):
    model_config = _FROZEN

    schema_version: int = EVENT_SCHEMA_VERSION
    request_id: str


class RequestOpened(_EventBase):
    """A request was admitted with its immutable configuration; generation 0 starts here."""

    kind: Literal["request_opened"] = "request_opened"
    config: RequestConfig
    initial_state_digest: str


class RoundReady(_EventBase):
    """ROUND_READY: the proposal bound to the round coordinate (drafts and their q probabilities)."""

    kind: Literal["round_ready"] = "round_ready"
    round_id: str
    expected_generation: int = Field(ge=0)
    coordinate_digest: str
    draft_ids: tuple[int, ...]
    q_draft: tuple[float, ...]
    """q_i(d_i) from the processed rows that sampled the drafts."""
    proposal_before: int = Field(ge=0)
    proposal_after: int = Field(ge=0)
    q_rows_digest: str | None = None


class RoundVerified(_EventBase):
    """VERIFIED_TEMPORARY: the target's processed probabilities of the drafts."""

    kind: Literal["round_verified"] = "round_verified"
    round_id: str
    p_draft: tuple[float, ...]
    """p_i(d_i) for i = 1..k."""
    verify_rows: int = Field(ge=0)
    """Target input rows in the verification pass (k + 1 under replay_frontier, k under retained)."""
    p_rows_digest: str | None = None


class RoundDecided(_EventBase):
    """DECIDED: the accept/reject outcome with the uniforms and the terminal draw's inverse-CDF bracket."""

    kind: Literal["round_decided"] = "round_decided"
    round_id: str
    accepted: int = Field(ge=0)
    terminal: TerminalName
    emitted_ids: tuple[int, ...] = Field(min_length=1)
    accept_counter: int = Field(ge=0)
    """First ACCEPT counter of the round."""
    accept_draws: int = Field(ge=0)
    accept_uniforms: tuple[float, ...]
    """The uniforms of the reached acceptance tests, in order (``accept_draws`` of them)."""
    terminal_counter: int = Field(ge=0)
    terminal_draws: int = Field(ge=0, le=1)
    terminal_uniform: float | None = None
    terminal_row: int | None = None
    """Index of the p row the terminal token came from (A for a correction, k for a bonus)."""
    residual_mass: float | None = None
    terminal_mass_before: float | None = None
    terminal_token_mass: float | None = None
    terminal_p: float | None = None
    """p of the terminal token in its row."""
    terminal_q: float | None = None
    """q of the terminal token in the rejected position's row (0 for a bonus)."""
    degenerate_correction: bool = False
    """A rejection whose residual mass was at or below the sampler's degenerate tolerance, so the
    correction was drawn from the target row itself (contract#degenerate-cases); ``residual_mass`` then holds
    that row's sum."""
    finished: bool
    finish_reason: FinishReason | None = None


class RoundStaged(_EventBase):
    """STAGED: the successor assembled off to the side and validated by token identities."""

    kind: Literal["round_staged"] = "round_staged"
    round_id: str
    committed_kv_ids: tuple[int, ...]
    discarded_kv_ids: tuple[int, ...]
    processor_before: str
    processor_after: str
    rng_before: tuple[int, int, int]
    rng_after: tuple[int, int, int]
    successor_digest: str


def whole_microseconds(seconds: float) -> float:
    """``seconds`` rounded to whole microseconds (how measured timings are recorded).

    A timing of ``n / 1e6`` seconds is stored as the integer ``n`` (a few bytes instead of a float64) by
    the SQL log; the clocks' sub-microsecond digits are noise at the scale of a round.
    """
    return round(seconds * 1e6) / 1e6


class RoundTimings(BaseModel):
    """Wall time of the parts of a round, in seconds (the time ledger, contract#time-ledger).

    Measured timings are recorded at whole microseconds (:func:`whole_microseconds`); any non-negative
    float is accepted.
    """

    model_config = _FROZEN

    draft_s: float = Field(0.0, ge=0)
    verify_s: float = Field(0.0, ge=0)
    state_s: float = Field(0.0, ge=0)
    queue_s: float = Field(0.0, ge=0)


class RoundPublished(_EventBase):
    """PUBLISHED: the generation fence moved from ``generation - 1`` to ``generation``."""

    kind: Literal["round_published"] = "round_published"
    round_id: str
    generation: int = Field(ge=1)
    commit_digest: str
    timings: RoundTimings | None = None


Event = Annotated[
    RequestOpened | RoundReady | RoundVerified | RoundDecided | RoundStaged | RoundPublished,
    Field(discriminator="kind"),
]
"""Any event, discriminated by ``kind``."""

ROUND_EVENT_KINDS: tuple[str, ...] = (
    "round_ready",
    "round_verified",
    "round_decided",
    "round_staged",
    "round_published",
)
"""The events of one published round, in the order they are appended."""

UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {}
"""``(kind, version) -> function`` turning a payload of that version into the next version's payload."""

_EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)

for _record in (RoundReady, RoundVerified, RoundDecided, RoundStaged, RoundPublished, RoundTimings):
    register_record(_record)


def parse_event(payload: dict[str, Any]) -> Event:
    """Validate a stored payload into an event, upcasting older schema versions first.

    Raises :class:`SchemaVersionError` for a version newer than this release or with no upcaster path, and
    :class:`LogIntegrityError` for a payload that does not validate.
    """
    if not isinstance(payload, dict):
        raise LogIntegrityError(f"an event payload must be a JSON object, got {type(payload).__name__}")
    data = dict(payload)
    kind = str(data.get("kind"))
    version = data.get("schema_version", 1)
    if isinstance(version, bool) or not isinstance(version, int):
        raise LogIntegrityError(f"{kind} event has schema_version {version!r}, not an integer")
    if version > EVENT_SCHEMA_VERSION:
        raise SchemaVersionError(f"{kind} event has schema_version {version} > {EVENT_SCHEMA_VERSION}")
    while version < EVENT_SCHEMA_VERSION:
        upcast = UPCASTERS.get((kind, version))
        if upcast is None:
            raise SchemaVersionError(f"no upcaster for {kind} schema_version {version}")
        data = upcast(data)
        version += 1
        data["schema_version"] = version
    try:
        return _EVENT_ADAPTER.validate_python(data)
    except ValidationError as exc:
        raise LogIntegrityError(f"invalid {kind} event payload: {exc}") from exc
