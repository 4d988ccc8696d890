"""What a z3 proof is, and the one registry shape every proof family uses.

Every proof is a :class:`Proof`: a name, the invariants / fault points / spec sections it covers, a kind
and a function that builds its :class:`Obligation` (premises and a goal, as z3 terms). Each family (the
coupling, the decisions, the protocol, the hash chain) registers its proofs with a :class:`ProofRegistry`,
one call per proof; :func:`all_proofs` gathers the families and derives one refutation proof per mutation
of the z3 model (:data:`specround.model_check.mutants.MODEL_MUTATIONS`). :mod:`.proof_runner` decides them.

Kinds and what "ok" means:

``VALID``
    ``premises => goal`` for every assignment. The runner first checks that the premises are satisfiable
    (a proof over contradictory premises is reported ``VACUOUS``, never ``PROVED``), then that
    ``premises and not goal`` is unsat (``PROVED``); a model of it is a counterexample (``REFUTED``).
``REACHABLE``
    ``premises and goal`` has a model (``REACHABLE``): a sat-trace regression proving that the model still
    allows a behaviour (A = 0, a bonus, a stop inside the prefix, ...), so that an over-constrained model
    cannot pass the ``VALID`` proofs vacuously. ``UNREACHABLE`` is a failure.
``REFUTABLE``
    A deliberately broken variant (a mutation of the model) that the named proof must catch: ``premises
    and not goal`` must have a model (``REFUTED`` is the expected outcome, ``PROVED`` a failure).

Proofs that rely on lemmas proved elsewhere in the registry list them in ``uses``; a lemma's statement is
built by the same function for the lemma's own proof and for the proofs that assume it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from functools import partial
from typing import TYPE_CHECKING, TypeAlias

import z3

from specround.errors import InputError

if TYPE_CHECKING:
    from specround.model_check.mutants import Mutation

__all__ = [
    "Obligation",
    "Proof",
    "ProofKind",
    "ProofRegistry",
    "Shown",
    "all_proofs",
    "mutant_proofs",
]


class ProofKind(StrEnum):
    """What the runner asks of an obligation (see the module docstring)."""

    VALID = "valid"
    REACHABLE = "reachable"
    REFUTABLE = "refutable"


Shown: TypeAlias = "z3.ExprRef | tuple[z3.ExprRef, ...]"
"""What an obligation shows from a model: one term, or a tuple of terms printed as ``(a, b, ...)``."""


@dataclass(frozen=True)
class Obligation:
    """The z3 content of one proof: premises, a goal, and named terms to print from a model."""

    premises: tuple[z3.BoolRef, ...]
    goal: z3.BoolRef
    show: tuple[tuple[str, Shown], ...] = ()
    """Terms (or tuples of terms) evaluated in a counterexample or witness model, by label."""


@dataclass(frozen=True)
class Proof:
    """One registered proof."""

    name: str
    covers: tuple[str, ...]
    """``INV-n``, ``F-n`` and contract sections (``contract#maximal-coupling``) this proof is evidence for."""
    kind: ProofKind
    build: Callable[[], Obligation]
    description: str
    uses: tuple[str, ...] = ()
    """Names of lemma proofs whose statements this proof assumes."""


class ProofRegistry:
    """The proofs of one family, in registration order, named ``<prefix>.<name>``."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.proofs: list[Proof] = []

    def add(
        self,
        name: str,
        build: Callable[..., Obligation],
        *args: object,
        covers: Iterable[str],
        description: str,
        kind: ProofKind = ProofKind.VALID,
        uses: Iterable[str] = (),
    ) -> str:
        """Register ``build(*args)`` as proof ``<prefix>.<name>``; returns the full name (for ``uses``)."""
        full = f"{self.prefix}.{name}"
        if any(proof.name == full for proof in self.proofs):
            raise InputError(f"proof {full!r} registered twice")
        obligation = partial(build, *args) if args else build
        self.proofs.append(Proof(full, tuple(covers), kind, obligation, description, tuple(uses)))
        return full


def _under(mutation: Mutation, build: Callable[[], Obligation]) -> Obligation:
    """``build()`` with ``mutation`` applied; a mutation none of whose rules the build called is an error."""
    from specround.model_check.mutants import SeamGoneError

    with mutation.applied() as reach:
        obligation = build()
    if not reach.reached:
        raise SeamGoneError(f"unreached: building the proof never called a rule {mutation.name!r} replaces")
    return obligation


def mutant_proofs(base: Sequence[Proof], mutations: Iterable[Mutation]) -> list[Proof]:
    """For each mutation of the model, the proof it names (``refuted_by``) rebuilt under it, as REFUTABLE."""
    by_name = {proof.name: proof for proof in base}
    proofs = []
    for mutation in mutations:
        target = by_name.get(mutation.refuted_by or "")
        if target is None:
            raise InputError(f"mutation {mutation.name!r} names no registered proof: {mutation.refuted_by!r}")
        family = target.name.split(".", 1)[0]
        proofs.append(
            Proof(
                name=f"{family}.mutant.{mutation.name.replace(' ', '_')}",
                covers=(*mutation.violates, "contract#failure-lab"),
                kind=ProofKind.REFUTABLE,
                build=partial(_under, mutation, target.build),
                description=f"{target.name} must refute: {mutation.failure_class}",
            )
        )
    return proofs


def all_proofs() -> tuple[Proof, ...]:
    """Every registered proof, in a stable order (coupling lemmas first, then the protocol, then mutants)."""
    from specround.model_check.mutants import MODEL_MUTATIONS
    from specround.model_check.z3.coupling import coupling_proofs
    from specround.model_check.z3.decision_proofs import decision_proofs
    from specround.model_check.z3.hash_chain import chain_proofs
    from specround.model_check.z3.protocol_proofs import protocol_proofs

    base = (*coupling_proofs(), *decision_proofs(), *protocol_proofs(), *chain_proofs())
    proofs = (*base, *mutant_proofs(base, MODEL_MUTATIONS))
    names = [proof.name for proof in proofs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise InputError(f"duplicate proof names: {duplicates}")
    return proofs
