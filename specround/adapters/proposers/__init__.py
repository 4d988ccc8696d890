"""Proposers: n-gram prompt lookup, early exit (self-speculation) and a separate draft model.

Every proposer returns draft ids with the processed q rows that actually sampled them (one-hot for the
n-gram point mass) and counts its PROPOSAL draws (one uniform per sampled draft).
"""

from specround.adapters.proposers.draws import draw_proposals
from specround.adapters.proposers.factory import (
    PROPOSER_KINDS,
    early_exit_proposer,
    proposer_from_spec,
    reduced_precision_proposer,
)
from specround.adapters.proposers.model_draft import DraftEngine, ModelProposer
from specround.adapters.proposers.ngram import NGramProposer, lookup_continuation

__all__ = [
    "PROPOSER_KINDS",
    "DraftEngine",
    "ModelProposer",
    "NGramProposer",
    "draw_proposals",
    "early_exit_proposer",
    "lookup_continuation",
    "proposer_from_spec",
    "reduced_precision_proposer",
]
