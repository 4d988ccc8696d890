"""z3 proofs of the coupling (contract#sampler-law): the one-token coupling and the prefix induction.

Distributions are symbolic z3 reals: ``p`` (target) and ``q`` (proposal) over ``V`` events, non-negative
and summing to one. The sampler's quantities are written exactly as the algorithm defines them:

* acceptance probability ``a(x) = min(1, p(x)/q(x))`` for a proposed event (``q(x) > 0``; an event with
  ``q(x) = 0`` is never proposed and its ratio is never evaluated, contract#degenerate-cases);
* accepted mass ``m(x) = q(x) a(x)`` and rejected mass ``j(x) = q(x) (1 - a(x))`` of proposal ``x``;
* rejection probability ``Z = sum_x j(x)``;
* residual ``r(x) = [p(x) - q(x)]_+ / sum_y [p(y) - q(y)]_+`` when that sum is positive, else 0.

Proof structure. Deciding the whole identity at once is a non-linear problem whose cost grows steeply with
``V`` (z3 needs seconds at V = 4 and minutes beyond), so the proof is a chain of small lemmas, each decided
with the exact definitions above, and each later step assumes only the *statements* of earlier lemmas,
instantiated on fresh variables (the same Python function builds a lemma's statement for its own proof and
for the proofs that use it):

1. ``coupling.accept_rule`` (one event, any V): ``m = min(p, q)``, ``j = [q - p]_+``, ``0 <= a <= 1``.
2. ``coupling.tv.vV``: ``Z = sum [p - q]_+ = 1 - sum min(p, q) = TV(p, q) = 1/2 sum |p - q|``.
3. ``coupling.residual.vV``: when ``Z > 0`` the residual is a distribution supported where ``p > q`` with
   ``Z r = [p - q]_+``; when ``Z = 0`` (e.g. ``p == q``) the correction branch is unreachable.
4. ``coupling.marginal.vV``: ``m(x) + Z r(x) = p(x)`` at every event (contract#positive-residual), so the
   output has law p.
5. ``coupling.maximal.vV``: no coupling of (q, p) puts more than ``sum min(p, q)`` on the diagonal
   (contract#maximal-coupling); ``coupling.attained.vV``: the speculative joint has marginals q and p and
   attains that bound.
6. ``coupling.prefix.vV.kK``: with context-dependent rows ``p_h, q_h`` at every prefix ``h``, the
   speculative joint of the first ``K + 1`` output tokens (accepted prefix, correction or bonus, then serial
   target sampling to the common horizon) equals the target chain product (contract#prefix-induction).

Cross-checks without the lemma chain (all definitions inlined) run where z3 decides them quickly:
``coupling.direct.vV`` (the marginal identity, V <= 3) and ``coupling.prefix_direct.v2.kK`` (K <= 2, every
full draft path enumerated, suffix drafts included).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias

import z3

from specround.model_check.z3.proofs import Obligation, Proof, ProofRegistry, Shown

__all__ = [
    "COUPLING_EVENTS",
    "DIRECT_EVENTS",
    "PREFIX_DRAFTS",
    "PREFIX_EVENTS",
    "OneTokenCoupling",
    "PrefixRows",
    "Real",
    "Row",
    "accept_probability",
    "accept_rule_facts",
    "coupling_proofs",
    "distribution",
    "marginal_facts",
    "one_token_coupling",
    "real_sum",
    "reals",
    "rejection_facts",
    "residual_facts",
    "show_row",
    "speculative_joint",
    "target_joint",
]

COUPLING_EVENTS = range(2, 7)
"""Vocabulary sizes V of the one-token proofs."""
DIRECT_EVENTS = range(2, 4)
"""Vocabulary sizes of the lemma-free cross-check of the marginal identity."""
PREFIX_EVENTS = (2, 3)
"""Vocabulary sizes of the prefix-induction proofs."""
PREFIX_DRAFTS = range(1, 4)
"""Draft lengths K of the prefix-induction proofs (horizon K + 1)."""
_DIRECT_PREFIX_DRAFTS = range(1, 3)

Real: TypeAlias = z3.ArithRef
"""A z3 real term."""
Row: TypeAlias = tuple[z3.ArithRef, ...]
"""One distribution row over the events, as z3 reals."""


def _pos(x: Real) -> Real:
    """``[x]_+``."""
    return z3.If(x > 0, x, z3.RealVal(0))


def _min(x: Real, y: Real) -> Real:
    return z3.If(x <= y, x, y)


def _abs(x: Real) -> Real:
    return z3.If(x >= 0, x, -x)


def real_sum(terms: Sequence[Real]) -> Real:
    """``sum(terms)`` as one z3 term (0 for no terms)."""
    return z3.Sum(list(terms)) if terms else z3.RealVal(0)


def reals(name: str, count: int) -> Row:
    """``count`` fresh real constants ``name_0 .. name_{count-1}``."""
    return tuple(z3.Real(f"{name}_{i}") for i in range(count))


def distribution(row: Sequence[Real]) -> z3.BoolRef:
    """``row`` is a probability distribution: non-negative entries summing to one."""
    return z3.And(*[x >= 0 for x in row], real_sum(row) == 1)


def accept_probability(p: Real, q: Real) -> Real:
    """``a(x) = min(1, p(x)/q(x))`` for a proposed event; 0 (never used) when ``q(x) = 0``."""
    return z3.If(q > 0, z3.If(p >= q, z3.RealVal(1), p / q), z3.RealVal(0))


@dataclass(frozen=True)
class OneTokenCoupling:
    """The speculative sampler's quantities at one position, as z3 terms over symbolic rows."""

    p: Row
    """Target row."""
    q: Row
    """Proposal row."""
    accept: Row
    """a(x)."""
    accepted_mass: Row
    """m(x) = q(x) a(x): mass that proposes x and keeps it."""
    rejected_mass: Row
    """j(x) = q(x) (1 - a(x)): mass that proposes x and rejects it."""
    rejection: Real
    """Z = sum_x j(x)."""
    excess: Row
    """[p(x) - q(x)]_+."""
    excess_total: Real
    """sum_x [p(x) - q(x)]_+ (the residual's normaliser)."""
    residual: Row
    """r(x) = [p(x) - q(x)]_+ / excess_total when positive, else 0."""


def one_token_coupling(p: Row, q: Row) -> OneTokenCoupling:
    """The sampler's definitions over rows ``p`` and ``q`` (same length)."""
    accept = tuple(accept_probability(px, qx) for px, qx in zip(p, q, strict=True))
    accepted = tuple(qx * ax for qx, ax in zip(q, accept, strict=True))
    rejected = tuple(qx * (1 - ax) for qx, ax in zip(q, accept, strict=True))
    excess = tuple(_pos(px - qx) for px, qx in zip(p, q, strict=True))
    excess_total = real_sum(excess)
    residual = tuple(z3.If(excess_total > 0, e / excess_total, z3.RealVal(0)) for e in excess)
    return OneTokenCoupling(
        p=p,
        q=q,
        accept=accept,
        accepted_mass=accepted,
        rejected_mass=rejected,
        rejection=real_sum(rejected),
        excess=excess,
        excess_total=excess_total,
        residual=residual,
    )


# --- lemma statements (shared by a lemma's proof and by the proofs that assume it) ---------------------


def accept_rule_facts(p: Real, q: Real, a: Real, m: Real, j: Real) -> z3.BoolRef:
    """Lemma 1 at one event: ``m = min(p, q)``, ``j = [q - p]_+`` and ``0 <= a <= 1``."""
    return z3.And(m == _min(p, q), j == _pos(q - p), a >= 0, a <= 1)


def rejection_facts(p: Row, q: Row, m: Row, excess: Row, z: Real) -> z3.BoolRef:
    """Lemma 2 (contract#maximal-coupling) for the rejection probability ``z = sum j``.

    ``z = sum [p - q]_+ = 1 - sum m = 1 - sum min(p, q) = 1/2 sum |p - q|``, and ``z = 0`` exactly when
    ``p == q``.
    """
    pairs = list(zip(p, q, strict=True))
    return z3.And(
        z == real_sum(excess),
        z == 1 - real_sum(m),
        z == 1 - real_sum([_min(px, qx) for px, qx in pairs]),
        2 * z == real_sum([_abs(px - qx) for px, qx in pairs]),
        (z == 0) == z3.And(*[px == qx for px, qx in pairs]),
    )


def residual_event_facts(p: Real, q: Real, excess: Real, r: Real, total: Real) -> z3.BoolRef:
    """Lemma 3 at one event, with ``total = sum [p - q]_+``.

    ``r >= 0``, supported on ``p > q``, ``total * r = [p - q]_+`` when ``total > 0``, and
    ``r = [p - q]_+ = 0`` when ``total = 0``.
    """
    return z3.And(
        r >= 0,
        z3.Implies(r > 0, p > q),
        z3.Implies(total > 0, total * r == excess),
        z3.Implies(total == 0, z3.And(r == 0, excess == 0)),
    )


def residual_facts(p: Row, q: Row, excess: Row, r: Row, total: Real) -> z3.BoolRef:
    """Lemma 3: every event's facts, and ``sum r = 1`` when ``total > 0``.

    Contract: contract#positive-residual, contract#degenerate-cases.
    """
    return z3.And(
        *[residual_event_facts(*cells, total) for cells in zip(p, q, excess, r, strict=True)],
        z3.Implies(total > 0, real_sum(r) == 1),
    )


def marginal_facts(p: Row, m: Row, r: Row, z: Real) -> z3.BoolRef:
    """Lemma 4 (contract#positive-residual): accepted mass plus rejection mass times residual is ``p``."""
    return z3.And(*[mx + z * rx == px for mx, rx, px in zip(m, r, p, strict=True)])


@dataclass(frozen=True)
class _Abstract:
    """Fresh variables for one position's quantities, with their definitions as premises.

    ``excess``, ``z`` and ``total`` are *defined* (``[p - q]_+``, ``sum j``, ``sum excess``); ``a``, ``m``,
    ``j`` and ``r`` are unconstrained until a proof adds the lemma statements it assumes.
    """

    p: Row
    q: Row
    a: Row
    m: Row
    j: Row
    excess: Row
    r: Row
    z: Real
    total: Real
    definitions: tuple[z3.BoolRef, ...]

    def lemma1(self) -> list[z3.BoolRef]:
        """Lemma 1 at every event."""
        return [
            accept_rule_facts(*cells) for cells in zip(self.p, self.q, self.a, self.m, self.j, strict=True)
        ]

    def lemma2(self) -> z3.BoolRef:
        """Lemma 2."""
        return rejection_facts(self.p, self.q, self.m, self.excess, self.z)

    def lemma3(self) -> z3.BoolRef:
        """Lemma 3."""
        return residual_facts(self.p, self.q, self.excess, self.r, self.total)

    def lemma3_events(self) -> list[z3.BoolRef]:
        """Lemma 3's per-event conjuncts (without ``sum r = 1``)."""
        cells = zip(self.p, self.q, self.excess, self.r, strict=True)
        return [residual_event_facts(*cell, self.total) for cell in cells]

    def lemma4(self) -> z3.BoolRef:
        """Lemma 4."""
        return marginal_facts(self.p, self.m, self.r, self.z)


def _abstract(name: str, p: Row, q: Row) -> _Abstract:
    size = len(p)
    a, m, j = reals(f"{name}_a", size), reals(f"{name}_m", size), reals(f"{name}_j", size)
    excess, r = reals(f"{name}_ex", size), reals(f"{name}_r", size)
    z, total = z3.Real(f"{name}_Z"), z3.Real(f"{name}_Zr")
    definitions = (
        *[ex == _pos(px - qx) for ex, px, qx in zip(excess, p, q, strict=True)],
        z == real_sum(j),
        total == real_sum(excess),
    )
    return _Abstract(p=p, q=q, a=a, m=m, j=j, excess=excess, r=r, z=z, total=total, definitions=definitions)


# --- one-token obligations ----------------------------------------------------------------------------


def _rows(size: int) -> tuple[Row, Row, list[z3.BoolRef]]:
    p, q = reals("p", size), reals("q", size)
    return p, q, [distribution(p), distribution(q)]


def _accept_rule() -> Obligation:
    p, q = z3.Reals("p q")
    c = one_token_coupling((p,), (q,))
    goal = accept_rule_facts(p, q, c.accept[0], c.accepted_mass[0], c.rejected_mass[0])
    return Obligation(
        premises=(p >= 0, p <= 1, q >= 0, q <= 1), goal=goal, show=(("p", p), ("q", q), ("a", c.accept[0]))
    )


def _tv(size: int) -> Obligation:
    p, q, premises = _rows(size)
    c = _abstract("c", p, q)
    return Obligation(
        premises=(*premises, *c.definitions, *c.lemma1()),
        goal=c.lemma2(),
        show=(*show_row("p", p), *show_row("q", q)),
    )


def _residual(size: int) -> Obligation:
    p, q, premises = _rows(size)
    c = one_token_coupling(p, q)
    return Obligation(
        premises=tuple(premises),
        goal=residual_facts(p, q, c.excess, c.residual, c.excess_total),
        show=(*show_row("p", p), *show_row("q", q), *show_row("r", c.residual)),
    )


def _marginal(size: int) -> Obligation:
    # Only what the identity needs: the rows' normalisation is already inside lemmas 2 and 3.
    p, q, _ = _rows(size)
    c = _abstract("c", p, q)
    return Obligation(
        premises=(*c.definitions, *c.lemma1(), c.z == real_sum(c.excess), *c.lemma3_events()),
        goal=c.lemma4(),
        show=(*show_row("p", p), *show_row("q", q), *show_row("r", c.r)),
    )


def _direct(size: int) -> Obligation:
    p, q, premises = _rows(size)
    c = one_token_coupling(p, q)
    goal = z3.And(
        marginal_facts(p, c.accepted_mass, c.residual, c.rejection),
        c.rejection == 1 - real_sum([_min(px, qx) for px, qx in zip(p, q, strict=True)]),
    )
    return Obligation(premises=tuple(premises), goal=goal, show=(*show_row("p", p), *show_row("q", q)))


def _maximal(size: int) -> Obligation:
    p, q, premises = _rows(size)
    joint = [reals(f"J_{x}", size) for x in range(size)]
    premises += [cell >= 0 for row in joint for cell in row]
    premises += [real_sum(joint[x]) == q[x] for x in range(size)]
    premises += [real_sum([joint[x][y] for x in range(size)]) == p[y] for y in range(size)]
    diagonal = real_sum([joint[x][x] for x in range(size)])
    goal = diagonal <= real_sum([_min(px, qx) for px, qx in zip(p, q, strict=True)])
    return Obligation(premises=tuple(premises), goal=goal, show=(("diagonal", diagonal),))


def _speculative_cells(c: _Abstract) -> list[list[Real]]:
    """S[x][y]: propose x, emit y (keep x with mass m(x), or reject x and draw y from the residual)."""
    size = len(c.p)
    return [
        [(c.m[x] if x == y else z3.RealVal(0)) + c.j[x] * c.r[y] for y in range(size)] for x in range(size)
    ]


def _attained(size: int, part: str) -> Obligation:
    p, q, premises = _rows(size)
    c = _abstract("c", p, q)
    cells = _speculative_cells(c)
    assumed: list[z3.BoolRef] = [*c.definitions, *c.lemma1(), c.lemma3()]
    if part == "proposal":
        assumed.append(c.lemma2())
        goal = z3.And(*[real_sum(cells[x]) == q[x] for x in range(size)])
    elif part == "target":
        assumed.append(c.lemma4())
        goal = z3.And(*[real_sum([cells[x][y] for x in range(size)]) == p[y] for y in range(size)])
    else:
        # Non-negative entries (no normalisation needed) and the per-event lemma statements.
        premises = [x >= 0 for x in (*p, *q)]
        assumed = [*c.definitions, *c.lemma1(), *c.lemma3_events()]
        diagonal = real_sum([cells[x][x] for x in range(size)])
        goal = z3.And(
            *[cell >= 0 for row in cells for cell in row],
            diagonal == real_sum([_min(px, qx) for px, qx in zip(p, q, strict=True)]),
        )
    return Obligation(premises=(*premises, *assumed), goal=goal, show=(*show_row("p", p), *show_row("q", q)))


# --- prefix induction ---------------------------------------------------------------------------------


Prefix: TypeAlias = tuple[int, ...]


class PrefixRows:
    """Context-dependent symbolic rows over ``size`` events, one per prefix, created on first use.

    ``rows(prefix)`` is the row conditioned on ``prefix``; ``rows.rows`` holds every row created so far.
    """

    def __init__(self, name: str, size: int) -> None:
        self.name = name
        self.size = size
        self.rows: dict[Prefix, Row] = {}

    def __call__(self, prefix: Prefix) -> Row:
        """The row conditioned on ``prefix``."""
        if prefix not in self.rows:
            label = "".join(map(str, prefix)) or "e"
            self.rows[prefix] = reals(f"{self.name}_{label}", self.size)
        return self.rows[prefix]


def target_joint(p: PrefixRows, outputs: Prefix) -> Real:
    """The target chain product ``prod_i p(y_i | y_<i)``."""
    terms = [p(outputs[:i])[outputs[i]] for i in range(len(outputs))]
    result: Real = z3.RealVal(1)
    for term in terms:
        result = result * term
    return result


def _serial_completion(
    p: PrefixRows, horizon: int, prefix: Prefix, weight: Real, joint: dict[Prefix, list[Real]]
) -> None:
    """Sample the target serially from ``prefix`` to the horizon, adding each branch's mass."""
    if len(prefix) == horizon:
        joint[prefix].append(weight)
        return
    row = p(prefix)
    for x in range(p.size):
        _serial_completion(p, horizon, (*prefix, x), weight * row[x], joint)


def speculative_joint(
    p: PrefixRows,
    masses: dict[Prefix, tuple[Row, Row, Row]],
    drafts: int,
    size: int,
) -> dict[Prefix, Real]:
    """Joint law of the first ``drafts + 1`` outputs of one speculative round plus serial completion.

    At an accepted prefix ``h`` the proposal ``x`` is kept with mass ``m_h(x)`` (the round continues at
    ``h + x``) or rejected with mass ``j_h(x)``, after which the correction ``c`` is drawn from ``r_h``, the
    round ends and the target completes the horizon serially. After ``drafts`` acceptances the bonus is the
    first serial target draw. ``masses[h] = (m_h, j_h, r_h)``.
    """
    horizon = drafts + 1
    joint: dict[Prefix, list[Real]] = {y: [] for y in itertools.product(range(size), repeat=horizon)}

    def walk(prefix: Prefix, weight: Real) -> None:
        if len(prefix) == drafts:
            _serial_completion(p, horizon, prefix, weight, joint)
            return
        m, j, r = masses[prefix]
        for x in range(size):
            walk((*prefix, x), weight * m[x])
            for correction in range(size):
                _serial_completion(p, horizon, (*prefix, correction), weight * j[x] * r[correction], joint)

    walk((), z3.RealVal(1))
    return {y: real_sum(terms) for y, terms in joint.items()}


def _prefix_induction(size: int, drafts: int) -> Obligation:
    """Lemmas 1 and 4 at every prefix (fresh m, j, r per prefix) => speculative joint == target chain.

    Lemma 1 ties each prefix's masses to its own proposal row ``q_h``; lemma 4 is the one-token coupling
    at that prefix. Nothing else about the rows is assumed.
    """
    p = PrefixRows("p", size)
    q = PrefixRows("q", size)
    masses: dict[Prefix, tuple[Row, Row, Row]] = {}
    premises: list[z3.BoolRef] = []
    for length in range(drafts):
        for prefix in itertools.product(range(size), repeat=length):
            label = "".join(map(str, prefix)) or "e"
            c = _abstract(f"c_{label}", p(prefix), q(prefix))
            masses[prefix] = (c.m, c.j, c.r)
            premises += [*c.definitions, *c.lemma1(), c.lemma4()]
    joint = speculative_joint(p, masses, drafts, size)
    goal = z3.And(*[joint[y] == target_joint(p, y) for y in joint])
    for row in (*p.rows.values(), *q.rows.values()):
        premises.append(distribution(row))
    return Obligation(premises=tuple(premises), goal=goal, show=show_row("p_root", p(())))


def _prefix_direct(drafts: int) -> Obligation:
    """Two events, every full draft path d_1..d_K (suffix drafts included), exact definitions inlined."""
    size = 2
    p = PrefixRows("p", size)
    q = PrefixRows("q", size)
    horizon = drafts + 1
    joint: dict[Prefix, list[Real]] = {y: [] for y in itertools.product(range(size), repeat=horizon)}
    for path in itertools.product(range(size), repeat=drafts):
        path_mass: Real = z3.RealVal(1)
        for i in range(drafts):
            path_mass = path_mass * q(path[:i])[path[i]]
        survive: Real = z3.RealVal(1)
        for i in range(drafts):
            c = one_token_coupling(p(path[:i]), q(path[:i]))
            a = c.accept[path[i]]
            for correction in range(size):
                weight = path_mass * survive * (1 - a) * c.residual[correction]
                _serial_completion(p, horizon, (*path[:i], correction), weight, joint)
            survive = survive * a
        _serial_completion(p, horizon, path, path_mass * survive, joint)
    goal = z3.And(*[real_sum(terms) == target_joint(p, y) for y, terms in joint.items()])
    premises = [distribution(row) for row in (*p.rows.values(), *q.rows.values())]
    return Obligation(premises=tuple(premises), goal=goal, show=show_row("p_root", p(())))


def show_row(label: str, row: Sequence[z3.ExprRef]) -> tuple[tuple[str, Shown], ...]:
    """One model-display entry: ``label = (row[0], row[1], ...)``."""
    return ((label, tuple(row)),)


def _register_one_token(registry: ProofRegistry, size: int, accept: str) -> None:
    """The lemma chain at vocabulary size ``size`` (``accept`` names lemma 1)."""
    tv = registry.add(
        f"tv.v{size}",
        _tv,
        size,
        covers=("contract#maximal-coupling", "contract#degenerate-cases"),
        description="rejection Z = sum [p-q]_+ = 1 - sum min(p,q) = TV(p,q); Z = 0 iff p == q",
        uses=(accept,),
    )
    residual = registry.add(
        f"residual.v{size}",
        _residual,
        size,
        covers=("contract#positive-residual", "contract#degenerate-cases"),
        description="[p-q]_+/Zr is a distribution on {p > q} when Zr > 0, and 0 when Zr = 0",
    )
    marginal = registry.add(
        f"marginal.v{size}",
        _marginal,
        size,
        covers=("contract#positive-residual",),
        description="min(p,q) + Z * residual = p at every event",
        uses=(accept, tv, residual),
    )
    registry.add(
        f"maximal.v{size}",
        _maximal,
        size,
        covers=("contract#maximal-coupling",),
        description="every coupling of (q, p) has diagonal mass <= sum min(p,q)",
    )
    attained = (
        ("proposal", "the speculative joint's proposal marginal is q", (accept, tv, residual)),
        ("target", "the speculative joint's output marginal is p", (accept, residual, marginal)),
        (
            "diagonal",
            "the speculative joint is non-negative and its diagonal is sum min(p,q)",
            (accept, residual),
        ),
    )
    for part, description, uses in attained:
        registry.add(
            f"attained.{part}.v{size}",
            _attained,
            size,
            part,
            covers=("contract#maximal-coupling", "contract#worked-coupling"),
            description=description,
            uses=uses,
        )


def coupling_proofs() -> list[Proof]:
    """The registered coupling proofs (see the module docstring for the lemma chain)."""
    registry = ProofRegistry("coupling")
    accept = registry.add(
        "accept_rule",
        _accept_rule,
        covers=("contract#accept-rule", "contract#degenerate-cases"),
        description="q*min(1,p/q) = min(p,q) and q*(1-a) = [q-p]_+ at one event; a in [0,1]",
    )
    for size in COUPLING_EVENTS:
        _register_one_token(registry, size, accept)
    for size in DIRECT_EVENTS:
        registry.add(
            f"direct.v{size}",
            _direct,
            size,
            covers=("contract#positive-residual",),
            description="marginal identity with every definition inlined (no lemma chain)",
        )
    for size in PREFIX_EVENTS:
        for drafts in PREFIX_DRAFTS:
            registry.add(
                f"prefix.v{size}.k{drafts}",
                _prefix_induction,
                size,
                drafts,
                covers=(
                    "contract#prefix-induction",
                    "contract#first-rejection-stops",
                    "contract#bonus-token",
                ),
                description=f"speculative joint of {drafts + 1} tokens == target chain product",
                uses=(accept, f"coupling.marginal.v{size}"),
            )
    for drafts in _DIRECT_PREFIX_DRAFTS:
        registry.add(
            f"prefix_direct.v2.k{drafts}",
            _prefix_direct,
            drafts,
            covers=("contract#prefix-induction", "contract#first-rejection-stops", "contract#bonus-token"),
            description="prefix induction with full draft paths and inlined definitions (no lemma chain)",
        )
    return registry.proofs
