"""The log's hash chain (INV-9) as a bounded z3 model, and its proofs.

Six events, a collision-free uninterpreted hash, and every edit, drop, duplicate, reorder, insert and
recomputed rewrite at every position fails the audit against the anchored head.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import z3

from specround.errors import InputError
from specround.model_check.z3.proofs import Obligation, Proof, ProofKind, ProofRegistry
from specround.model_check.z3.terms import Bool, Int

__all__ = ["CHAIN_EVENTS", "ChainModel", "ChainRow", "chain_proofs"]

CHAIN_EVENTS = 6
"""Events in the bounded hash-chain proofs."""

ChainRow: TypeAlias = tuple[z3.ExprRef, z3.ExprRef, Int]
"""One stored event: (previous hash, hash, payload)."""


class ChainModel:
    """A per-request hash chain ``hash = H(prev_hash, event)`` with a collision-free ``H``.

    ``H`` is uninterpreted over an uninterpreted digest sort. Collision resistance is modelled by inverse
    functions (``H(a, e)`` determines ``a`` and ``e``) and acyclicity by a depth that grows by one per link
    (no chain returns to an earlier digest). The axioms are added as ground instances for every ``H`` term
    built through :meth:`link`, so queries stay quantifier-free.
    """

    def __init__(self) -> None:
        self.digest = z3.DeclareSort("Digest")
        self.genesis = z3.Const("genesis", self.digest)
        self.hash = z3.Function("chain_hash", self.digest, z3.IntSort(), self.digest)
        self.depth = z3.Function("chain_depth", self.digest, z3.IntSort())
        self.prev_of = z3.Function("chain_prev", self.digest, self.digest)
        self.event_of = z3.Function("chain_event", self.digest, z3.IntSort())
        self.facts: list[Bool] = [self.depth(self.genesis) == 0]

    def link(self, prev: z3.ExprRef, event: Int) -> z3.ExprRef:
        """``H(prev, event)``, recording the axiom instances for it."""
        digest = self.hash(prev, event)
        self.facts += [
            self.prev_of(digest) == prev,
            self.event_of(digest) == event,
            self.depth(digest) == self.depth(prev) + 1,
        ]
        return digest

    def build(self, events: Sequence[Int], prev: z3.ExprRef | None = None) -> list[ChainRow]:
        """Rows of an honestly appended chain of ``events`` (after ``prev``, genesis by default)."""
        rows: list[ChainRow] = []
        previous = self.genesis if prev is None else prev
        for event in events:
            digest = self.link(previous, event)
            rows.append((previous, digest, event))
            previous = digest
        return rows

    def verify(self, rows: Sequence[ChainRow]) -> Bool:
        """What an audit checks: the first row links to genesis, each hash recomputes, each row links."""
        if not rows:
            return z3.BoolVal(True)
        checks = [rows[0][0] == self.genesis]
        checks += [digest == self.link(prev, event) for prev, digest, event in rows]
        checks += [rows[i + 1][0] == rows[i][1] for i in range(len(rows) - 1)]
        return z3.And(*checks)

    def head(self, rows: Sequence[ChainRow]) -> z3.ExprRef:
        """The last hash (genesis for an empty chain)."""
        return rows[-1][1] if rows else self.genesis


def _chain_tampers(
    model: ChainModel, rows: list[ChainRow], kind: str
) -> tuple[list[list[ChainRow]], list[Bool]]:
    """Every tampered variant of ``rows`` of one kind, and what makes each a real change."""
    n = len(rows)
    events = [row[2] for row in rows]
    variants: list[list[ChainRow]] = []
    changed: list[Bool] = []
    if kind == "edit":  # a payload rewritten in place, its stored hashes kept
        for j in range(n):
            x = z3.Int(f"edit{j}")
            variants.append([*rows[:j], (rows[j][0], rows[j][1], x), *rows[j + 1 :]])
            changed.append(x != events[j])
    elif kind == "drop":
        variants = [[*rows[:j], *rows[j + 1 :]] for j in range(n)]
    elif kind == "duplicate":
        variants = [[*rows[: j + 1], rows[j], *rows[j + 1 :]] for j in range(n)]
    elif kind == "reorder":
        variants = [[*rows[:j], rows[j + 1], rows[j], *rows[j + 2 :]] for j in range(n - 1)]
    elif kind == "insert":  # a forged row with any stored values, at any position
        for j in range(n + 1):
            forged = (z3.Const(f"ins_prev{j}", model.digest), z3.Const(f"ins_hash{j}", model.digest))
            variants.append([*rows[:j], (*forged, z3.Int(f"ins_event{j}")), *rows[j:]])
    elif kind == "rewrite":  # a payload edited and every later hash recomputed
        for j in range(n):
            x = z3.Int(f"rewrite{j}")
            tail = model.build([x, *events[j + 1 :]], prev=rows[j][0])
            variants.append([*rows[:j], *tail])
            changed.append(x != events[j])
    else:
        raise InputError(f"unknown tamper kind {kind!r}")
    return variants, changed


_CHAIN_TAMPERS = ("edit", "drop", "duplicate", "reorder", "insert", "rewrite")


def _chain_detects(kind: str) -> Obligation:
    """Every tamper of ``kind`` at every position fails the audit against the anchored head.

    The chain alone catches every change that leaves a stored link behind it; a truncated or extended tail
    and a rewrite that recomputes every later hash are caught only against the head hash recorded when the
    last round was published, which the audit compares as well.
    """
    model = ChainModel()
    rows = model.build([z3.Int(f"e{i}") for i in range(CHAIN_EVENTS)])
    head = model.head(rows)
    variants, changed = _chain_tampers(model, rows, kind)
    goal = z3.And(*[z3.Not(z3.And(model.verify(v), model.head(v) == head)) for v in variants])
    return Obligation(premises=(*model.facts, *changed), goal=goal)


def _chain_reach(scenario: str) -> Obligation:
    model = ChainModel()
    rows = model.build([z3.Int(f"e{i}") for i in range(CHAIN_EVENTS)])
    if scenario == "honest_log_verifies":
        goal = z3.And(model.verify(rows), model.head(rows) == model.head(rows))
    else:  # the limitation the head anchor exists for: a forged tail append passes the links alone
        extended = [*rows, *model.build([z3.Int("forged")], prev=model.head(rows))]
        goal = model.verify(extended)
    return Obligation(premises=tuple(model.facts), goal=goal)


def chain_proofs() -> list[Proof]:
    """Every tamper kind is detected; an honest log verifies; a forged tail append passes the links alone."""
    registry = ProofRegistry("protocol.chain")
    for kind in _CHAIN_TAMPERS:
        registry.add(
            f"detects.{kind}",
            _chain_detects,
            kind,
            covers=("INV-9",),
            description=f"every {kind} of a {CHAIN_EVENTS}-event chain, at every position, fails the audit",
        )
    for scenario in ("honest_log_verifies", "tail_append_passes_links_alone"):
        registry.add(
            f"reach.{scenario}",
            _chain_reach,
            scenario,
            covers=("INV-9", "vacuity"),
            kind=ProofKind.REACHABLE,
            description=f"sat-trace regression: {scenario.replace('_', ' ')}",
        )
    return registry.proofs
