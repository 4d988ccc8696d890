"""The mutation lab's mutations: every failure class of 0x07 as wrong variants of real functions.

One module per family: :mod:`.sampler` (decisions, terminal draws, stops, RNG), :mod:`.kv` (the model
adapter's rows), :mod:`.processors` (processor state, penalties, q rows), :mod:`.publication` (the log's
fence and idempotence). :data:`MUTATIONS` lists them all in a stable order.
"""

from specround.model_check.mutants.base import Mutation, Reach, Scratch, Seam, SeamGoneError
from specround.model_check.mutants.kv import KV_MUTATIONS
from specround.model_check.mutants.processors import PROCESSOR_MUTATIONS
from specround.model_check.mutants.publication import PUBLICATION_MUTATIONS
from specround.model_check.mutants.sampler import SAMPLER_MUTATIONS, STOP_MUTATIONS

__all__ = ["MUTATIONS", "Mutation", "Reach", "Scratch", "Seam", "SeamGoneError", "mutation_named"]

MUTATIONS: tuple[Mutation, ...] = (
    *SAMPLER_MUTATIONS,
    *STOP_MUTATIONS,
    *KV_MUTATIONS,
    *PROCESSOR_MUTATIONS,
    *PUBLICATION_MUTATIONS,
)
"""Every mutation of the lab."""


def mutation_named(name: str) -> Mutation:
    """The mutation called ``name`` (KeyError if none is)."""
    for mutation in MUTATIONS:
        if mutation.name == name:
            return mutation
    raise KeyError(name)
