"""The commit record of a round: which values it binds, in one place.

A round's :class:`~specround.statemachine.state.SpeculativeCommit` binds what the round decided and staged
to where it started. Its digest is the ``commit_digest`` of the round's ``round_published`` event (and so of
the hash chain). Three readers build it:
- the controller, when it stages a round (:mod:`specround.statemachine.step`);
- replay, from the state it rebuilt (:mod:`specround.statemachine.replay`);
- the SQL log's reader, from the round's own events: a stored row keeps only the digest's first bytes
  (:mod:`specround.adapters.sql.round_body`).

They all call :func:`commit_values`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specround.sampling.types import Layout
from specround.statemachine.records import record_digest_of
from specround.statemachine.state import SpeculativeCommit

__all__ = ["commit_digest_of_events", "commit_values"]


def commit_values(
    *,
    request_id: str,
    round_id: str,
    expected_generation: int,
    layout: str,
    accepted: int,
    terminal: str,
    emitted: Sequence[int],
    committed_kv: Sequence[int],
    discarded_kv: Sequence[int],
    rng_before: Sequence[int],
    rng_after: Sequence[int],
    processor_before: str,
    processor_after: str,
    finished: bool,
    finish_reason: str | None,
    coordinate_digest: str,
    successor_digest: str,
) -> dict[str, Any]:
    """The field values of a round's :class:`SpeculativeCommit` (``record_digest_of`` hashes them)."""
    return {
        "request_id": request_id,
        "round_id": round_id,
        "expected_generation": expected_generation,
        "layout": layout,
        "accepted_draft_count": accepted,
        "terminal_kind": terminal,
        "emitted_token_ids": emitted,
        "committed_kv_token_ids": committed_kv,
        "discarded_kv_token_ids": discarded_kv,
        "rng_before": rng_before,
        "rng_after": rng_after,
        "processor_before_hash": processor_before,
        "processor_after_hash": processor_after,
        "finished": finished,
        "finish_reason": finish_reason,
        "coordinate_digest": coordinate_digest,
        "successor_digest": successor_digest,
    }


_LAYOUTS = tuple(layout.value for layout in Layout)
_tried_first = _LAYOUTS
"""The layouts in the order tried: the one a round matched last comes first (a log's rounds mostly share
one), so a round usually costs one digest. Rebound whole, never mutated, so concurrent readers see an
order that holds every layout."""


def commit_digest_of_events(
    ready: Mapping[str, Any],
    decided: Mapping[str, Any],
    staged: Mapping[str, Any],
    prefix: str,
) -> str | None:
    """The commit digest of a round's events whose hex starts with ``prefix`` (None: no layout gives one).

    The events do not name the request's layout (its ``request_opened`` event does), so each layout is
    tried; ``prefix`` (the stored first bytes of the digest) picks the one the round was committed under.
    """
    global _tried_first
    order = _tried_first
    for layout in order:
        digest = record_digest_of(
            SpeculativeCommit,
            commit_values(
                request_id=ready["request_id"],
                round_id=ready["round_id"],
                expected_generation=ready["expected_generation"],
                layout=layout,
                accepted=decided["accepted"],
                terminal=decided["terminal"],
                emitted=decided["emitted_ids"],
                committed_kv=staged["committed_kv_ids"],
                discarded_kv=staged["discarded_kv_ids"],
                rng_before=staged["rng_before"],
                rng_after=staged["rng_after"],
                processor_before=staged["processor_before"],
                processor_after=staged["processor_after"],
                finished=decided["finished"],
                finish_reason=decided["finish_reason"],
                coordinate_digest=ready["coordinate_digest"],
                successor_digest=staged["successor_digest"],
            ),
        )
        if digest.startswith(prefix):
            if layout != order[0]:
                _tried_first = (layout, *(other for other in _LAYOUTS if other != layout))
            return digest
    return None
