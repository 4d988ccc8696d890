"""Exact enumeration oracle: the speculative joint equals the target joint.

Contract: contract#prefix-induction, contract#exact-enumeration.

For every fixture the oracle enumerates each draft path ``d_1..d_K`` with its processed ``q`` mass, every
first rejection and the all-accepted (or stopped) branch, every terminal token, and completes each branch
to the horizon with ordinary target transitions. It then compares the speculative joint with the target
joint over **all** sequences of the horizon (stopped sequences padded with a STOP symbol in both).

The decisions come from the real batched sampler, never from a copy of the algorithm. The sampler's core
``decide_from_uniforms(batch, accept_uniforms, terminal_uniforms)`` is deterministic, and the counter-based
RNG hands it uniforms on the grid ``k / 2**53``. For fixed inputs the decision is a step function of each
uniform, so the probability of an outcome is the number of grid points that produce it divided by 2**53:

* **Acceptance.** For each path and test ``i`` (earlier tests fed ``u = 0``), the oracle locates the
  smallest grid point at which test ``i`` rejects by bisection over the 53-bit grid (54 calls of the real
  function, every probe of every fixture batched into one call per step). The acceptance measure is that
  count divided by 2**53: exact for the grid, within 2**-53 of the real line.
* **Terminal token.** For each branch (tests ``1..a`` fed ``u = 0``, test ``a + 1`` fed the first
  rejecting grid point, or all tests ``u = 0``), the oracle locates, by bisection on the TERMINAL uniform,
  the first grid point whose token is ``>= v`` for every ``v``; token ``v``'s measure is the gap between
  consecutive breakpoints.

This relies on one documented property of the sampler and nothing else: each decision is **monotone in
its uniform** (a test accepts exactly below a threshold; terminal tokens are ordered by id along the
uniform, as inverse CDF gives). The oracle re-checks the property where it matters: at both ends of every
token interval the real function returns that token, the intervals' bracket agrees with the decision's
self-reported inverse-CDF fields (``terminal_mass_before``, ``terminal_token_mass``, ``residual_mass``),
and the outcome does not change when the uniforms the decision reports as unreached are moved.

Beside the joint, each fixture reports the per-position identities of the sampler law (acceptance
``1 - TV(p, q)``, the normalised residual, ``p == q`` never corrects), the accounting invariants of each
leaf (INV-2, INV-3, INV-10 re-derived from the oracle's own rows) and the processor-row checks of
:mod:`specround.model_check.fixture_tables` (``rows_along`` against per-prefix rows, both softmax backends).
Those per-fixture checks are :mod:`specround.model_check.enumeration_checks`; the records and tolerances are
:mod:`specround.model_check.enumeration_results`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from specround.model_check.enumeration_checks import finish_fixture
from specround.model_check.enumeration_results import (
    GRID,
    IDENTITY_TOLERANCE,
    JOINT_TOLERANCE,
    PARITY_TOLERANCE,
    FixtureEnumeration,
    LeafTally,
)
from specround.model_check.fixture_tables import STOPPED, FixtureTables
from specround.sampling.exact import decide_from_uniforms
from specround.sampling.types import PAD_ID, SamplerBatch, SamplerDecision

__all__ = [
    "GRID",
    "IDENTITY_TOLERANCE",
    "JOINT_TOLERANCE",
    "PARITY_TOLERANCE",
    "DecideFn",
    "FixtureEnumeration",
    "enumerate_fixtures",
]

DecideFn = Callable[[SamplerBatch, torch.Tensor, torch.Tensor], SamplerDecision]
"""The decision function under test: ``(batch, accept_uniforms [B, K], terminal_uniforms [B])``."""

_F64 = torch.float64
_TOP = (GRID - 1) / GRID
"""The largest grid uniform, fed to uniforms a decision reports as unreached."""


def _real_decide(batch: SamplerBatch, accept: torch.Tensor, terminal: torch.Tensor) -> SamplerDecision:
    return decide_from_uniforms(batch, accept, terminal)


# --- the padded batch of every (fixture, draft path) case -------------------------------------------------


@dataclass
class _Cases:
    """All draft paths of all fixtures as one padded sampler batch (zero-mass padding columns and rows)."""

    tables: list[FixtureTables]
    owner: list[int]
    """Fixture index of each case."""
    path_index: list[int]
    """Index of each case's path in its fixture's ``paths``."""
    p: torch.Tensor  # [C, K+1, V]
    q: torch.Tensor  # [C, K, V]
    draft_ids: torch.Tensor  # [C, K]
    draft_lens: torch.Tensor  # [C]
    stop_ids: torch.Tensor  # [C, K+1, S]
    remaining: torch.Tensor  # [C]

    @classmethod
    def build(cls, tables: Sequence[FixtureTables]) -> _Cases:
        k_max = max(t.fixture.draft_len for t in tables)
        v_max = max(t.fixture.vocab_size for t in tables)
        s_max = max([1, *(len(s) for t in tables for path in t.paths for s in path.stop_sets)])
        owner: list[int] = []
        path_index: list[int] = []
        for f, t in enumerate(tables):
            owner.extend([f] * len(t.paths))
            path_index.extend(range(len(t.paths)))
        n = len(owner)
        p = torch.zeros(n, k_max + 1, v_max, dtype=_F64)
        q = torch.zeros(n, k_max, v_max, dtype=_F64)
        draft_ids = torch.full((n, k_max), PAD_ID, dtype=torch.int64)
        draft_lens = torch.zeros(n, dtype=torch.int64)
        stop_ids = torch.full((n, k_max + 1, s_max), PAD_ID, dtype=torch.int64)
        remaining = torch.zeros(n, dtype=torch.int64)
        for c, (f, j) in enumerate(zip(owner, path_index, strict=True)):
            fixture, path = tables[f].fixture, tables[f].paths[j]
            k, v = fixture.draft_len, fixture.vocab_size
            p[c, : k + 1, :v] = path.p_rows
            q[c, :k, :v] = path.q_rows
            draft_ids[c, :k] = torch.tensor(path.tokens, dtype=torch.int64)
            draft_lens[c] = k
            for i, stops in enumerate(path.stop_sets):
                if stops:
                    stop_ids[c, i, : len(stops)] = torch.tensor(sorted(stops), dtype=torch.int64)
            remaining[c] = fixture.budget
        return cls(list(tables), owner, path_index, p, q, draft_ids, draft_lens, stop_ids, remaining)

    @property
    def k_max(self) -> int:
        """Padded draft length of the batch."""
        return int(self.draft_ids.shape[1])

    def batch(self, index: torch.Tensor) -> SamplerBatch:
        """The sampler batch of cases ``index`` [B] (seeds and counters are irrelevant to the core)."""
        zeros = torch.zeros(index.shape[0], dtype=torch.int64)
        return SamplerBatch(
            p=self.p[index],
            q=self.q[index],
            draft_ids=self.draft_ids[index],
            draft_lens=self.draft_lens[index],
            stop_ids=self.stop_ids[index],
            remaining=self.remaining[index],
            seeds=zeros,
            accept_counters=zeros,
            terminal_counters=zeros,
        )


def _bisect(predicate: Callable[[torch.Tensor], torch.Tensor], n: int) -> torch.Tensor:
    """[n] smallest grid point ``k`` in ``[0, GRID]`` with ``predicate(k)`` True (``GRID`` if none below).

    ``predicate`` maps grid points [n] int64 (each in ``[0, GRID)``) to [n] bool and must be monotone
    (False, ..., False, True, ..., True) per row. One predicate call per step, 54 steps.
    """
    lo = torch.full((n,), -1, dtype=torch.int64)
    hi = torch.full((n,), GRID, dtype=torch.int64)
    while n and bool((hi - lo > 1).any()):
        active = hi - lo > 1
        mid = torch.where(active, (lo + hi) // 2, 0)
        result = predicate(mid)
        hi = torch.where(active & result, mid, hi)
        lo = torch.where(active & ~result, mid, lo)
    return hi


def _grid_uniform(points: torch.Tensor) -> torch.Tensor:
    """Grid points [n] int64 -> float64 uniforms ``k / 2**53`` (exact)."""
    return points.to(_F64) / float(GRID)


@dataclass
class _Branch:
    case: int
    accepted: int
    """Leading tests the representative accepts (tests ``1..a``)."""
    reject: bool
    """Test ``a + 1`` is fed its first rejecting grid point."""
    prob: float
    uniforms: torch.Tensor  # [K] float64 representative accept uniforms
    uniform_list: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.uniform_list = [float(u) for u in self.uniforms.tolist()]


def enumerate_fixtures(
    tables: Sequence[FixtureTables], decide: DecideFn | None = None
) -> list[FixtureEnumeration]:
    """Run the exact oracle on every fixture; ``decide`` defaults to the real ``decide_from_uniforms``."""
    decide_fn = decide or _real_decide
    if not tables:
        return []
    cases = _Cases.build(tables)
    results = [FixtureEnumeration(tables=t) for t in tables]
    tallies = [LeafTally() for _ in tables]
    n_cases = len(cases.owner)
    k_max = cases.k_max
    all_cases = torch.arange(n_cases)

    # Phase 0: every test fed u = 0 tells which tests are reached when all earlier ones accept.
    zero = decide_fn(
        cases.batch(all_cases), torch.zeros(n_cases, k_max, dtype=_F64), torch.zeros(n_cases, dtype=_F64)
    )
    reached = ~torch.isnan(zero.accept_uniforms)  # [C, K]

    # Phase 1: acceptance thresholds of every reached test, by bisection on its uniform.
    probe_case, probe_level = reached.nonzero(as_tuple=True)  # [n1], [n1]
    probe_batch = cases.batch(probe_case)

    def rejects(points: torch.Tensor) -> torch.Tensor:
        u = torch.zeros(points.shape[0], k_max, dtype=_F64)
        u[torch.arange(points.shape[0]), probe_level] = _grid_uniform(points)
        dec = decide_fn(probe_batch, u, torch.zeros(points.shape[0], dtype=_F64))
        return dec.accepted <= probe_level

    first_reject = _bisect(rejects, int(probe_case.shape[0]))  # [n1]
    threshold = torch.full((n_cases, k_max), -1, dtype=torch.int64)  # [C, K] grid count, -1 unreached
    threshold[probe_case, probe_level] = first_reject

    # Phase 2: branches of every case and their representative uniforms.
    branches = _branches(cases, reached, threshold)
    if not branches:
        return results
    branch_case = torch.tensor([b.case for b in branches], dtype=torch.int64)
    branch_u = torch.stack([b.uniforms for b in branches])  # [nb, K]
    branch_batch = cases.batch(branch_case)
    rep = decide_fn(branch_batch, branch_u, torch.zeros(len(branches), dtype=_F64))
    drawing = (rep.terminal_draws == 1).tolist()

    # Phase 3: terminal breakpoints b_v (first grid point with token >= v) of every drawing branch.
    vocab = [cases.tables[cases.owner[b.case]].fixture.vocab_size for b in branches]
    probe_rows = [(j, v) for j, b in enumerate(branches) if drawing[j] for v in range(1, vocab[j])]
    breakpoints = {j: [0] + [GRID] * (vocab[j] - 1) + [GRID] for j in range(len(branches)) if drawing[j]}
    if probe_rows:
        rows_j = torch.tensor([j for j, _ in probe_rows], dtype=torch.int64)
        rows_v = torch.tensor([v for _, v in probe_rows], dtype=torch.int64)
        terminal_batch = cases.batch(branch_case[rows_j])
        terminal_u = branch_u[rows_j]
        terminal_at = rep.accepted[rows_j]  # column of the terminal token

        def token_at_least(points: torch.Tensor) -> torch.Tensor:
            dec = decide_fn(terminal_batch, terminal_u, _grid_uniform(points))
            token = dec.output_ids.gather(1, terminal_at[:, None]).squeeze(1)
            return token >= rows_v

        found = _bisect(token_at_least, len(probe_rows)).tolist()
        for (j, v), point in zip(probe_rows, found, strict=True):
            breakpoints[j][v] = point

    # Phase 4: leaves (branch, token) evaluated at both ends of their interval.
    _leaves(cases, branches, breakpoints, branch_u, decide_fn, results, tallies)
    mine: dict[int, list[int]] = defaultdict(list)
    for c, f in enumerate(cases.owner):
        mine[f].append(c)
    for f, result in enumerate(results):
        paths = [cases.tables[f].paths[cases.path_index[c]] for c in mine[f]]
        finish_fixture(result, tallies[f], paths, threshold[mine[f]].tolist() if mine[f] else [])
    return results


def _branches(cases: _Cases, reached: torch.Tensor, threshold: torch.Tensor) -> list[_Branch]:
    """Every first-rejection branch and the through branch (all accepted, or ended by a stop) per case."""
    out: list[_Branch] = []
    k_max = cases.k_max
    reached_l = reached.tolist()
    threshold_l = threshold.tolist()
    lens = cases.draft_lens.tolist()
    for c in range(len(cases.owner)):
        k = lens[c]
        prob = 1.0
        for a in range(k + 1):
            if a == k or not reached_l[c][a]:
                out.append(_Branch(c, a, False, prob, torch.zeros(k_max, dtype=_F64)))
                break
            count = threshold_l[c][a]
            if count < GRID:
                u = torch.zeros(k_max, dtype=_F64)
                u[a] = count / GRID
                out.append(_Branch(c, a, True, prob * ((GRID - count) / GRID), u))
            prob *= count / GRID
            if prob == 0.0:
                break
    return out


def _leaves(
    cases: _Cases,
    branches: list[_Branch],
    breakpoints: dict[int, list[int]],
    branch_u: torch.Tensor,
    decide_fn: DecideFn,
    results: list[FixtureEnumeration],
    tallies: list[LeafTally],
) -> None:
    """Evaluate every leaf at both ends of its interval and accumulate the round-output law per fixture."""
    leaf_branch: list[int] = []
    leaf_token: list[int] = []
    leaf_lo: list[int] = []
    leaf_hi: list[int] = []
    leaf_mass: list[float] = []
    for j, b in enumerate(branches):
        points = breakpoints.get(j)
        if points is None:  # no terminal draw: one leaf, the whole terminal range
            leaf_branch.append(j)
            leaf_token.append(PAD_ID)
            leaf_lo.append(0)
            leaf_hi.append(GRID - 1)
            leaf_mass.append(b.prob)
            continue
        for v in range(len(points) - 1):
            width = points[v + 1] - points[v]
            if width > 0:
                leaf_branch.append(j)
                leaf_token.append(v)
                leaf_lo.append(points[v])
                leaf_hi.append(points[v + 1] - 1)
                leaf_mass.append(b.prob * (width / GRID))
            elif width < 0:
                tallies[cases.owner[b.case]].fail("monotone terminal")
    index = torch.tensor(leaf_branch, dtype=torch.int64)
    case_index = torch.tensor([branches[j].case for j in leaf_branch], dtype=torch.int64)
    batch = cases.batch(case_index)
    u_lo = branch_u[index]  # [L, K]
    low = decide_fn(batch, u_lo, _grid_uniform(torch.tensor(leaf_lo, dtype=torch.int64)))
    # Move every uniform the decision reports as unreached to the top of the grid: nothing may change.
    columns = torch.arange(cases.k_max)
    u_hi = torch.where(columns[None, :] < low.accept_draws[:, None], u_lo, _TOP)
    high = decide_fn(batch, u_hi, _grid_uniform(torch.tensor(leaf_hi, dtype=torch.int64)))

    lo_fields = _as_lists(low)
    hi_fields = _as_lists(high)
    for n, j in enumerate(leaf_branch):
        branch = branches[j]
        f = cases.owner[branch.case]
        _leaf(
            cases,
            results[f],
            tallies[f],
            branch,
            n,
            leaf_token[n],
            leaf_lo[n],
            leaf_hi[n],
            leaf_mass[n],
            lo_fields,
            hi_fields,
        )


def _as_lists(dec: SamplerDecision) -> dict[str, list[Any]]:
    return {
        "output_ids": dec.output_ids.tolist(),
        "emitted": dec.emitted.tolist(),
        "accepted": dec.accepted.tolist(),
        "finished": dec.finished.tolist(),
        "accept_draws": dec.accept_draws.tolist(),
        "terminal_draws": dec.terminal_draws.tolist(),
        "terminal": dec.terminal.tolist(),
        "residual_mass": dec.residual_mass.tolist(),
        "before": dec.terminal_mass_before.tolist(),
        "token_mass": dec.terminal_token_mass.tolist(),
        "degenerate": dec.degenerate_correction.tolist(),
    }


_OUTCOME_FIELDS = ("output_ids", "emitted", "accepted", "finished", "accept_draws", "terminal_draws")


def _stop_distance(tokens: Sequence[int], stop_sets: Sequence[frozenset[int]], budget: int) -> int:
    """First 1-based position whose token stops (stop set of that position, or the budget); 0 if none."""
    for i, token in enumerate(tokens, start=1):
        if token in stop_sets[i - 1] or i == budget:
            return i
    return 0


def _leaf(
    cases: _Cases,
    result: FixtureEnumeration,
    tally: LeafTally,
    branch: _Branch,
    n: int,
    token: int,
    lo_point: int,
    hi_point: int,
    mass: float,
    lo: dict[str, list[Any]],
    hi: dict[str, list[Any]],
) -> None:
    """Check leaf ``n`` (one branch and terminal token) and add its mass to the fixture's joint."""
    tables = result.tables
    fixture = tables.fixture
    path = tables.paths[cases.path_index[branch.case]]
    k = fixture.draft_len
    tally.leaves += 1
    emitted = int(lo["emitted"][n])
    output = [int(x) for x in lo["output_ids"][n]][:emitted]
    finished = bool(lo["finished"][n])
    accepted = int(lo["accepted"][n])
    drew = int(lo["terminal_draws"][n]) == 1

    # Both ends of the interval, and unreached uniforms moved: the same outcome (monotone, no hidden reads).
    for name in _OUTCOME_FIELDS:
        if lo[name][n] != hi[name][n]:
            tally.fail("unreached uniforms and interval ends leave the outcome unchanged")
            break
    if drew and output and output[-1] != token:
        tally.fail("monotone terminal")

    # INV-10 / INV-2 / INV-3 re-derived from the oracle's own rows and stop sets.
    a = 0
    while a < k and branch.uniform_list[a] < path.p_draft[a] / path.q_draft[a]:
        a += 1
    prefix_stop = _stop_distance(path.tokens[:a], path.stop_sets, fixture.budget)
    if prefix_stop:
        expected = list(path.tokens[:prefix_stop])
        expected_finished, expected_draws, expected_terminal = True, prefix_stop, 0
    else:
        terminal = output[-1] if drew and output else PAD_ID
        expected = [*path.tokens[:a], terminal]
        expected_finished = _stop_distance(expected, path.stop_sets, fixture.budget) == a + 1
        expected_draws, expected_terminal = min(a + 1, k), 1
    if output != expected:
        tally.fail("INV-10 emitted = accepted drafts + terminal")
    if emitted != len(expected) or finished != expected_finished:
        tally.fail("INV-2 progress = min(A + 1, H)")
    if int(lo["accept_draws"][n]) != expected_draws or int(lo["terminal_draws"][n]) != expected_terminal:
        tally.fail("INV-3 draws = reached tests + terminal")

    if drew:
        # The decision's own inverse-CDF bracket must be the interval the oracle located.
        z = float(lo["residual_mass"][n])
        before = float(lo["before"][n])
        own = float(lo["token_mass"][n])
        gap = max(abs(before / z - lo_point / GRID), abs((before + own) / z - (hi_point + 1) / GRID))
        tally.error("INV-10 bracket = located interval", gap)
        tally.brackets += 1
        law_mass = (hi_point + 1 - lo_point) / GRID
        node = path.tokens[: branch.accepted]
        if branch.reject and not bool(lo["degenerate"][n]):
            result.correction_laws.setdefault(node, {})[token] = law_mass
            result.correction_mass[node] = z
        elif not branch.reject and branch.accepted == k:
            result.bonus_laws.setdefault(path.tokens, {})[token] = law_mass

    weight = path.q_mass * mass
    result.accepted_pmf[accepted] = result.accepted_pmf.get(accepted, 0.0) + weight
    result.emitted_pmf[emitted] = result.emitted_pmf.get(emitted, 0.0) + weight
    prefix = tuple(output)
    if finished:
        key = prefix + (STOPPED,) * (fixture.horizon - len(prefix))
        result.speculative_joint[key] = result.speculative_joint.get(key, 0.0) + weight
    else:
        tables.completion(prefix, weight, result.speculative_joint)
