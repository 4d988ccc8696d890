"""The one registry of mutations: every failure class as wrong variants of real functions.

Contract: contract#failure-lab.

Each mutation is declared once, as a :class:`~.mutation.Mutation` (name, failure class, the invariants it
breaks, and the functions it patches, by reference). One module per family: :mod:`.sampler` (decisions,
terminal draws, stops, RNG; the wrong decision functions themselves are in :mod:`.decisions`), :mod:`.kv`
(the model adapter's rows), :mod:`.processors` (processor state, penalties, q rows), :mod:`.publication`
(the log's fence and idempotence), and :mod:`.z3_model` (rules of the z3 model).

:data:`MUTATIONS` are the code-path mutations the mutation lab must kill; :data:`MODEL_MUTATIONS` are
the z3 model's, each refuted by the proof it names (:func:`specround.model_check.z3.proofs.all_proofs`);
:data:`ORACLE_MUTATIONS` are the decision mutations the exact oracle's smoke tests run on their own.
"""

from specround.model_check.mutants.kv import KV_MUTATIONS
from specround.model_check.mutants.mutation import Mutation, Reach, Scratch, Seam, SeamGoneError
from specround.model_check.mutants.processors import PROCESSOR_MUTATIONS
from specround.model_check.mutants.publication import PUBLICATION_MUTATIONS
from specround.model_check.mutants.sampler import ORACLE_MUTATIONS, SAMPLER_MUTATIONS, STOP_MUTATIONS
from specround.model_check.mutants.z3_model import MODEL_MUTATIONS

__all__ = [
    "MODEL_MUTATIONS",
    "MUTATIONS",
    "ORACLE_MUTATIONS",
    "Mutation",
    "Reach",
    "Scratch",
    "Seam",
    "SeamGoneError",
    "mutation_named",
]

MUTATIONS: tuple[Mutation, ...] = (
    *SAMPLER_MUTATIONS,
    *STOP_MUTATIONS,
    *KV_MUTATIONS,
    *PROCESSOR_MUTATIONS,
    *PUBLICATION_MUTATIONS,
)
"""Every code-path mutation (the mutation lab's)."""


def mutation_named(name: str) -> Mutation:
    """The mutation called ``name``, code path or z3 model (KeyError if none is)."""
    for mutation in (*MUTATIONS, *MODEL_MUTATIONS):
        if mutation.name == name:
            return mutation
    raise KeyError(name)
