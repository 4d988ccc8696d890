"""Serving: the loop that wires a target, a proposer and the round controller, and the draft-length policy.

:class:`ServingLoop` drives a batch of requests through rounds (one packed verification per step, one
controller step, the controller's K/V instruction executed on the adapter); :class:`AdaptiveDraftLength`
and :class:`FixedDraftLength` choose K; :mod:`specround.serving.session` builds a ready loop from
command-line style options for ``specround generate``.
"""

from specround.serving.loop import GenerationRequest, ServingLoop
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    AdaptiveDraftLength,
    DraftLengthPolicy,
    DraftSlot,
    FixedDraftLength,
    StepCosts,
)
from specround.serving.run_stats import AcceptanceStats, ReachCount, RoundOutcome

__all__ = [
    "MAX_DRAFT_LENGTH",
    "AcceptanceStats",
    "AdaptiveDraftLength",
    "DraftLengthPolicy",
    "DraftSlot",
    "FixedDraftLength",
    "GenerationRequest",
    "ReachCount",
    "RoundOutcome",
    "ServingLoop",
    "StepCosts",
]
