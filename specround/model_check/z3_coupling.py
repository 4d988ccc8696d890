"""z3 proofs of the coupling (0x03A-0x03H) and of the sampler's decision rules (INV-10).

The one-token coupling (0x03A-0x03D), the prefix induction (0x03F-0x03H), and the decision rules as an
audit re-derives them from logged values.

Distributions are symbolic z3 reals: ``p`` (target) and ``q`` (proposal) over ``V`` events, non-negative
and summing to one. The sampler's quantities are written exactly as the algorithm defines them:

* acceptance probability ``a(x) = min(1, p(x)/q(x))`` for a proposed event (``q(x) > 0``; an event with
  ``q(x) = 0`` is never proposed and its ratio is never evaluated, 0x03D);
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
4. ``coupling.marginal.vV``: ``m(x) + Z r(x) = p(x)`` at every event (0x03C), so the output has law p.
5. ``coupling.maximal.vV``: no coupling of (q, p) puts more than ``sum min(p, q)`` on the diagonal (0x03B);
   ``coupling.attained.vV``: the speculative joint has marginals q and p and attains that bound.
6. ``coupling.prefix.vV.kK``: with context-dependent rows ``p_h, q_h`` at every prefix ``h``, the
   speculative joint of the first ``K + 1`` output tokens (accepted prefix, correction or bonus, then serial
   target sampling to the common horizon) equals the target chain product (0x03F-0x03H).

Cross-checks without the lemma chain (all definitions inlined) run where z3 decides them quickly:
``coupling.direct.vV`` (the marginal identity, V <= 3) and ``coupling.prefix_direct.v2.kK`` (K <= 2, every
full draft path enumerated, suffix drafts included).

Decisions (INV-10): ``decision.accepted_run`` shows that the sampler's ``cumprod``-sum of accepted tests is
the index of the first rejection and that ``u < p/q`` re-derives division-free as ``u q < p``;
``decision.inverse_cdf.vV.wW`` shows that the sampler's two-level (block, then in-block) inverse-CDF search
returns the unique token whose logged bracket ``[mass_before, mass_before + token_mass)`` holds ``u Z``,
and that this token has positive mass (exact arithmetic; the float rounding clamp is the sampler's own).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TypeAlias

import z3

from specround.model_check.proofs import Obligation, Proof, ProofKind, Shown

__all__ = [
    "COUPLING_EVENTS",
    "DECISION_DRAFTS",
    "DIRECT_EVENTS",
    "INVERSE_CDF_CASES",
    "PREFIX_DRAFTS",
    "PREFIX_EVENTS",
    "OneTokenCoupling",
    "PrefixRows",
    "accept_probability",
    "accept_rule_facts",
    "coupling_proofs",
    "distribution",
    "inverse_cdf_obligation",
    "marginal_facts",
    "one_token_coupling",
    "rejection_facts",
    "residual_facts",
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
Row: TypeAlias = tuple[z3.ArithRef, ...]


def _pos(x: Real) -> Real:
    """``[x]_+``."""
    return z3.If(x > 0, x, z3.RealVal(0))


def _min(x: Real, y: Real) -> Real:
    return z3.If(x <= y, x, y)


def _abs(x: Real) -> Real:
    return z3.If(x >= 0, x, -x)


def _sum(terms: Sequence[Real]) -> Real:
    return z3.Sum(list(terms)) if terms else z3.RealVal(0)


def _reals(name: str, count: int) -> Row:
    return tuple(z3.Real(f"{name}_{i}") for i in range(count))


def distribution(row: Sequence[Real]) -> z3.BoolRef:
    """``row`` is a probability distribution: non-negative entries summing to one."""
    return z3.And(*[x >= 0 for x in row], _sum(row) == 1)


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
    excess_total = _sum(excess)
    residual = tuple(z3.If(excess_total > 0, e / excess_total, z3.RealVal(0)) for e in excess)
    return OneTokenCoupling(
        p=p,
        q=q,
        accept=accept,
        accepted_mass=accepted,
        rejected_mass=rejected,
        rejection=_sum(rejected),
        excess=excess,
        excess_total=excess_total,
        residual=residual,
    )


# --- lemma statements (shared by a lemma's proof and by the proofs that assume it) ---------------------


def accept_rule_facts(p: Real, q: Real, a: Real, m: Real, j: Real) -> z3.BoolRef:
    """Lemma 1 at one event: ``m = min(p, q)``, ``j = [q - p]_+`` and ``0 <= a <= 1``."""
    return z3.And(m == _min(p, q), j == _pos(q - p), a >= 0, a <= 1)


def rejection_facts(p: Row, q: Row, m: Row, excess: Row, z: Real) -> z3.BoolRef:
    """Lemma 2 (0x03B) for the rejection probability ``z = sum j``.

    ``z = sum [p - q]_+ = 1 - sum m = 1 - sum min(p, q) = 1/2 sum |p - q|``, and ``z = 0`` exactly when
    ``p == q``.
    """
    pairs = list(zip(p, q, strict=True))
    return z3.And(
        z == _sum(excess),
        z == 1 - _sum(m),
        z == 1 - _sum([_min(px, qx) for px, qx in pairs]),
        2 * z == _sum([_abs(px - qx) for px, qx in pairs]),
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
    """Lemma 3 (0x03C, 0x03D): every event's facts, and ``sum r = 1`` when ``total > 0``."""
    return z3.And(
        *[residual_event_facts(*cells, total) for cells in zip(p, q, excess, r, strict=True)],
        z3.Implies(total > 0, _sum(r) == 1),
    )


def marginal_facts(p: Row, m: Row, r: Row, z: Real) -> z3.BoolRef:
    """Lemma 4 (0x03C): accepted mass plus rejection probability times residual is ``p`` at every event."""
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
    a, m, j = _reals(f"{name}_a", size), _reals(f"{name}_m", size), _reals(f"{name}_j", size)
    excess, r = _reals(f"{name}_ex", size), _reals(f"{name}_r", size)
    z, total = z3.Real(f"{name}_Z"), z3.Real(f"{name}_Zr")
    definitions = (
        *[ex == _pos(px - qx) for ex, px, qx in zip(excess, p, q, strict=True)],
        z == _sum(j),
        total == _sum(excess),
    )
    return _Abstract(p=p, q=q, a=a, m=m, j=j, excess=excess, r=r, z=z, total=total, definitions=definitions)


# --- one-token obligations ----------------------------------------------------------------------------


def _rows(size: int) -> tuple[Row, Row, list[z3.BoolRef]]:
    p, q = _reals("p", size), _reals("q", size)
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
        show=(*_show("p", p), *_show("q", q)),
    )


def _residual(size: int) -> Obligation:
    p, q, premises = _rows(size)
    c = one_token_coupling(p, q)
    return Obligation(
        premises=tuple(premises),
        goal=residual_facts(p, q, c.excess, c.residual, c.excess_total),
        show=(*_show("p", p), *_show("q", q), *_show("r", c.residual)),
    )


def _marginal(size: int) -> Obligation:
    # Only what the identity needs: the rows' normalisation is already inside lemmas 2 and 3.
    p, q, _ = _rows(size)
    c = _abstract("c", p, q)
    return Obligation(
        premises=(*c.definitions, *c.lemma1(), c.z == _sum(c.excess), *c.lemma3_events()),
        goal=c.lemma4(),
        show=(*_show("p", p), *_show("q", q), *_show("r", c.r)),
    )


def _direct(size: int) -> Obligation:
    p, q, premises = _rows(size)
    c = one_token_coupling(p, q)
    goal = z3.And(
        marginal_facts(p, c.accepted_mass, c.residual, c.rejection),
        c.rejection == 1 - _sum([_min(px, qx) for px, qx in zip(p, q, strict=True)]),
    )
    return Obligation(premises=tuple(premises), goal=goal, show=(*_show("p", p), *_show("q", q)))


def _maximal(size: int) -> Obligation:
    p, q, premises = _rows(size)
    joint = [_reals(f"J_{x}", size) for x in range(size)]
    premises += [cell >= 0 for row in joint for cell in row]
    premises += [_sum(joint[x]) == q[x] for x in range(size)]
    premises += [_sum([joint[x][y] for x in range(size)]) == p[y] for y in range(size)]
    diagonal = _sum([joint[x][x] for x in range(size)])
    goal = diagonal <= _sum([_min(px, qx) for px, qx in zip(p, q, strict=True)])
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
        goal = z3.And(*[_sum(cells[x]) == q[x] for x in range(size)])
    elif part == "target":
        assumed.append(c.lemma4())
        goal = z3.And(*[_sum([cells[x][y] for x in range(size)]) == p[y] for y in range(size)])
    else:
        # Non-negative entries (no normalisation needed) and the per-event lemma statements.
        premises = [x >= 0 for x in (*p, *q)]
        assumed = [*c.definitions, *c.lemma1(), *c.lemma3_events()]
        diagonal = _sum([cells[x][x] for x in range(size)])
        goal = z3.And(
            *[cell >= 0 for row in cells for cell in row],
            diagonal == _sum([_min(px, qx) for px, qx in zip(p, q, strict=True)]),
        )
    return Obligation(premises=(*premises, *assumed), goal=goal, show=(*_show("p", p), *_show("q", q)))


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
            self.rows[prefix] = _reals(f"{self.name}_{label}", self.size)
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
    return {y: _sum(terms) for y, terms in joint.items()}


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
    return Obligation(premises=tuple(premises), goal=goal, show=_show("p_root", p(())))


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
    goal = z3.And(*[_sum(terms) == target_joint(p, y) for y, terms in joint.items()])
    premises = [distribution(row) for row in (*p.rows.values(), *q.rows.values())]
    return Obligation(premises=tuple(premises), goal=goal, show=_show("p_root", p(())))


def _show(label: str, row: Sequence[z3.ExprRef]) -> tuple[tuple[str, Shown], ...]:
    """One model-display entry: ``label = (row[0], row[1], ...)``."""
    return ((label, tuple(row)),)


# --- decisions re-derived from logged values (INV-10) -----------------------------------------------

DECISION_DRAFTS = 8
"""Draft length of the accepted-run proof."""
INVERSE_CDF_CASES = ((2, 1), (2, 2), (3, 2), (4, 2), (4, 4), (5, 2), (6, 2), (6, 3), (6, 6))
"""(V, block width) pairs of the two-level inverse-CDF proof (a width that does not divide V pads)."""


def _pick(items: Sequence[Real], index: z3.ArithRef) -> Real:
    """``items[index]`` for a symbolic 0-based ``index`` in range."""
    result = items[0]
    for position in range(1, len(items)):
        result = z3.If(index == position, items[position], result)
    return result


def _accepted_run() -> Obligation:
    """A = sum(cumprod(accepted & within)) is the first rejection's index, tests re-derive division-free.

    Test i (1-based, i <= k) accepts iff ``u_i < p_i / q_i``; the audit re-derives it as ``u_i q_i < p_i``
    from the logged ``u_i``, ``p_i(d_i)``, ``q_i(d_i) > 0``. ``A`` is the leading run of accepted tests.
    """
    size = DECISION_DRAFTS
    k = z3.Int("k")
    u, p, q = _reals("u", size), _reals("p", size), _reals("q", size)
    premises = [k >= 0, k <= size]
    for i in range(size):
        premises += [u[i] >= 0, u[i] < 1, p[i] >= 0, q[i] > 0]
    accepted = [u[i] < p[i] / q[i] for i in range(size)]
    within = [z3.IntVal(i) < k for i in range(size)]
    # The sampler's vectorised form: cumprod over (accepted & within), summed.
    run: list[z3.ArithRef] = []
    product: z3.ArithRef = z3.IntVal(1)
    for i in range(size):
        product = product * z3.If(z3.And(accepted[i], within[i]), 1, 0)
        run.append(product)
    vectorised = z3.Sum(run)
    # The scan form: index of the first test that rejects, or k.
    scan: z3.ArithRef = k
    for i in reversed(range(size)):
        scan = z3.If(z3.And(within[i], z3.Not(accepted[i])), i, scan)
    rederived = [u[i] * q[i] < p[i] for i in range(size)]
    goal = z3.And(
        vectorised == scan,
        *[accepted[i] == rederived[i] for i in range(size)],
        # The audit's check: every test before A accepts, test A + 1 (when reached) rejects.
        *[z3.Implies(i < vectorised, rederived[i]) for i in range(size)],
        *[z3.Implies(z3.And(vectorised == i, within[i]), z3.Not(rederived[i])) for i in range(size)],
    )
    return Obligation(premises=tuple(premises), goal=goal, show=(("k", k), ("A", vectorised), ("scan", scan)))


def inverse_cdf_obligation(size: int, width: int, *, right: bool = True) -> Obligation:
    """The two-level search's token satisfies the logged bracket, has positive mass, and is the only one.

    Exact arithmetic: ``target = u * total``; block = number of block prefix sums <= target; offset = number
    of in-block prefix sums <= target; token = block * width + offset (the sampler's ``_search`` without
    its rounding clamp, which exact arithmetic never needs). ``right=False`` counts prefix sums ``<
    target`` instead (``searchsorted(..., right=False)``), the off-by-one that can pick a zero-mass token.
    """
    blocks = -(-size // width)
    mass = _reals("w", size)
    padded = [*mass, *[z3.RealVal(0)] * (blocks * width - size)]
    u = z3.Real("u")
    total = _sum(mass)
    premises = [*[w >= 0 for w in mass], total > 0, u >= 0, u < 1]
    target = u * total
    block_sums = [_sum(padded[b * width : (b + 1) * width]) for b in range(blocks)]
    block_cum = [_sum(block_sums[: b + 1]) for b in range(blocks)]

    def below(c: Real) -> z3.BoolRef:
        return c <= target if right else c < target

    block = _sum([z3.If(below(c), z3.IntVal(1), z3.IntVal(0)) for c in block_cum])
    prefix = _sum([z3.If(b < block, block_sums[b], z3.RealVal(0)) for b in range(blocks)])
    values = [_pick([padded[b * width + j] for b in range(blocks)], block) for j in range(width)]
    inside = [prefix + _sum(values[: j + 1]) for j in range(width)]
    offset = _sum([z3.If(below(c), z3.IntVal(1), z3.IntVal(0)) for c in inside])
    token = block * width + offset
    mass_before = prefix + _sum([z3.If(j < offset, values[j], z3.RealVal(0)) for j in range(width)])
    token_mass = _pick(values, offset)
    cum_before = [_sum(mass[:x]) for x in range(size)]
    bracket = [z3.And(cum_before[x] <= target, target < cum_before[x] + mass[x]) for x in range(size)]
    goal = z3.And(
        block < blocks,
        offset < width,
        token < size,
        mass_before == _pick(cum_before, token),
        token_mass == _pick(mass, token),
        mass_before <= target,
        target < mass_before + token_mass,
        token_mass > 0,
        *[z3.Implies(bracket[x], token == x) for x in range(size)],
    )
    return Obligation(
        premises=tuple(premises), goal=goal, show=(*_show("w", mass), ("u", u), ("token", token))
    )


def coupling_proofs() -> list[Proof]:
    """The registered coupling proofs (see the module docstring for the lemma chain)."""
    proofs = [
        Proof(
            name="coupling.accept_rule",
            covers=("0x03A", "0x03D"),
            kind=ProofKind.VALID,
            build=_accept_rule,
            description="q*min(1,p/q) = min(p,q) and q*(1-a) = [q-p]_+ at one event; a in [0,1]",
        )
    ]
    for size in COUPLING_EVENTS:
        accept, tv, residual = "coupling.accept_rule", f"coupling.tv.v{size}", f"coupling.residual.v{size}"
        marginal = f"coupling.marginal.v{size}"
        proofs += [
            Proof(
                name=tv,
                covers=("0x03B", "0x03D"),
                kind=ProofKind.VALID,
                build=partial(_tv, size),
                description="rejection Z = sum [p-q]_+ = 1 - sum min(p,q) = TV(p,q); Z = 0 iff p == q",
                uses=(accept,),
            ),
            Proof(
                name=residual,
                covers=("0x03C", "0x03D"),
                kind=ProofKind.VALID,
                build=partial(_residual, size),
                description="[p-q]_+/Zr is a distribution on {p > q} when Zr > 0, and 0 when Zr = 0",
            ),
            Proof(
                name=marginal,
                covers=("0x03C",),
                kind=ProofKind.VALID,
                build=partial(_marginal, size),
                description="min(p,q) + Z * residual = p at every event",
                uses=(accept, tv, residual),
            ),
            Proof(
                name=f"coupling.maximal.v{size}",
                covers=("0x03B",),
                kind=ProofKind.VALID,
                build=partial(_maximal, size),
                description="every coupling of (q, p) has diagonal mass <= sum min(p,q)",
            ),
            Proof(
                name=f"coupling.attained.proposal.v{size}",
                covers=("0x03B", "0x03E"),
                kind=ProofKind.VALID,
                build=partial(_attained, size, "proposal"),
                description="the speculative joint's proposal marginal is q",
                uses=(accept, tv, residual),
            ),
            Proof(
                name=f"coupling.attained.target.v{size}",
                covers=("0x03B", "0x03E"),
                kind=ProofKind.VALID,
                build=partial(_attained, size, "target"),
                description="the speculative joint's output marginal is p",
                uses=(accept, residual, marginal),
            ),
            Proof(
                name=f"coupling.attained.diagonal.v{size}",
                covers=("0x03B", "0x03E"),
                kind=ProofKind.VALID,
                build=partial(_attained, size, "diagonal"),
                description="the speculative joint is non-negative and its diagonal is sum min(p,q)",
                uses=(accept, residual),
            ),
        ]
    proofs += [
        Proof(
            name=f"coupling.direct.v{size}",
            covers=("0x03C",),
            kind=ProofKind.VALID,
            build=partial(_direct, size),
            description="marginal identity with every definition inlined (no lemma chain)",
        )
        for size in DIRECT_EVENTS
    ]
    proofs += [
        Proof(
            name=f"coupling.prefix.v{size}.k{drafts}",
            covers=("0x03F", "0x03G", "0x03H"),
            kind=ProofKind.VALID,
            build=partial(_prefix_induction, size, drafts),
            description=f"speculative joint of {drafts + 1} tokens == target chain product",
            uses=("coupling.accept_rule", f"coupling.marginal.v{size}"),
        )
        for size in PREFIX_EVENTS
        for drafts in PREFIX_DRAFTS
    ]
    proofs += [
        Proof(
            name=f"coupling.prefix_direct.v2.k{drafts}",
            covers=("0x03F", "0x03G", "0x03H"),
            kind=ProofKind.VALID,
            build=partial(_prefix_direct, drafts),
            description="prefix induction with full draft paths and inlined definitions (no lemma chain)",
        )
        for drafts in _DIRECT_PREFIX_DRAFTS
    ]
    proofs.append(
        Proof(
            name="decision.accepted_run",
            covers=("INV-10", "INV-3", "0x03G"),
            kind=ProofKind.VALID,
            build=_accepted_run,
            description="cumprod-sum A equals the first rejection; u < p/q re-derives as u*q < p",
        )
    )
    proofs += [
        Proof(
            name=f"decision.inverse_cdf.v{size}.w{width}",
            covers=("INV-10", "0x03D"),
            kind=ProofKind.VALID,
            build=partial(inverse_cdf_obligation, size, width),
            description="the two-level inverse-CDF token lies in its logged bracket, has mass, and is unique",
        )
        for size, width in INVERSE_CDF_CASES
    ]
    return proofs
