"""Processed rows of a fixture, the target joint over the horizon, and the round's inputs per draft path.

Every row comes from the real :class:`~specround.sampling.processors.processor_chain.ProcessorChain`:

* the **target tree** holds the processed target row at every prefix the target itself can reach (a clone
  of the round-start chain advanced over the prefix, then :meth:`ProcessorChain.distribution`), with the
  stop set there; it defines the target joint and the ordinary completions;
* the **draft tree** holds the processed draft row ``q`` at every prefix the drafter can reach within the
  draft length; draft paths are its root-to-depth-K walks through tokens of positive ``q``;
* the **round rows** of a draft path are what the verifier hands the sampler: ``p_1..p_{K+1}`` built with
  :meth:`ProcessorChain.rows_along` (each row at its own logical prefix, even after a token the target's
  grammar refuses) and the stop sets of :meth:`ProcessorChain.stop_sets_along`.

Sequences of the joint have exactly ``horizon`` entries: a sequence that stops (stop token or budget) is
padded with :data:`STOPPED`; a continuation the target cannot produce is padded with :data:`IMPOSSIBLE`
(it never appears in the target joint, so any mass there is an error).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from specround.model_check.fixtures import OracleFixture
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.softmax import SoftmaxBackend

__all__ = [
    "IMPOSSIBLE",
    "STOPPED",
    "DraftPath",
    "FixtureTables",
    "Joint",
    "RowTree",
    "build_tables",
]

STOPPED = -2
"""Joint padding after a sequence stopped (stop token or budget)."""
IMPOSSIBLE = -3
"""Joint padding after a prefix the target assigns probability zero (only an incorrect round emits it)."""

Joint = dict[tuple[int, ...], float]
"""Probability of each length-``horizon`` sequence (with padding symbols)."""

Prefix = tuple[int, ...]


@dataclass
class RowTree:
    """Processed rows ``[V]`` float64 and stop sets of one chain at every reachable prefix up to a depth."""

    rows: dict[Prefix, torch.Tensor]
    stops: dict[Prefix, frozenset[int]]


class _TreeBuilder:
    """Depth-first growth of a :class:`RowTree`, with the other softmax backend's row beside each row."""

    def __init__(self, fixture: OracleFixture, side: str, parity: bool) -> None:
        self.fixture = fixture
        self.side = side
        self.depth = fixture.horizon if side == "target" else fixture.draft_len
        self.stop_aware = side == "target"
        self.parity = parity
        self.tree = RowTree(rows={}, stops={})
        self.parity_error = 0.0
        table = fixture.target_logits if side == "target" else fixture.draft_logits
        self.logits = {prefix: torch.tensor(row, dtype=torch.float64) for prefix, row in table.items()}

    def grow(self, chain: ProcessorChain, prefix: Prefix) -> None:
        logits = self.logits[prefix]  # [V]
        row = chain.distribution(logits)  # [V]
        if self.parity:
            declared = chain.softmax
            chain.softmax = _OTHER_BACKEND[declared]
            try:
                twin = chain.distribution(logits)  # [V] same processors, the other softmax backend
            finally:
                chain.softmax = declared
            self.parity_error = max(self.parity_error, float((row - twin).abs().max()))
        self.tree.rows[prefix] = row
        stop_set = frozenset(chain.stop_tokens()) if self.stop_aware else frozenset()
        self.tree.stops[prefix] = stop_set
        if len(prefix) + 1 >= self.depth:
            return
        for token, mass in enumerate(row.tolist()):
            if mass <= 0.0:
                continue
            if self.stop_aware and (token in stop_set or len(prefix) + 1 >= self.fixture.budget):
                continue
            child = chain.clone()
            child.advance(token)
            self.grow(child, (*prefix, token))


_OTHER_BACKEND = {
    SoftmaxBackend.MAX_SHIFT: SoftmaxBackend.ONLINE,
    SoftmaxBackend.ONLINE: SoftmaxBackend.MAX_SHIFT,
}


def row_tree(fixture: OracleFixture, side: str, *, parity: bool = False) -> tuple[RowTree, float]:
    """Rows of ``side`` at every prefix it reaches: depth ``horizon`` (target) or ``K`` (draft).

    Returns the tree and, with ``parity``, the largest gap between the declared softmax backend's rows and
    the other backend's rows over the same processed logits (contract#backend-parity); 0.0 without.
    """
    builder = _TreeBuilder(fixture, side, parity)
    builder.grow(fixture.chain(side), ())
    return builder.tree, builder.parity_error


@dataclass(frozen=True)
class DraftPath:
    """One draft path with its q mass and the rows the verifier hands the sampler."""

    tokens: tuple[int, ...]
    """d_1..d_K."""
    q_mass: float
    """prod_i q_i(d_i)."""
    q_rows: torch.Tensor
    """[K, V] float64 processed draft rows that sampled the path."""
    p_rows: torch.Tensor
    """[K+1, V] float64 processed target rows along the path (``rows_along``)."""
    stop_sets: tuple[frozenset[int], ...]
    """K + 1 stop sets along the path (``stop_sets_along``)."""
    p_draft: tuple[float, ...]
    """p_i(d_i), i = 1..K, read from ``p_rows``."""
    q_draft: tuple[float, ...]
    """q_i(d_i), i = 1..K, read from ``q_rows``."""


@dataclass
class FixtureTables:
    """Everything the oracles need from one fixture's processor chains."""

    fixture: OracleFixture
    target: RowTree
    draft: RowTree
    paths: list[DraftPath]
    target_joint: Joint
    rows_along_error: float
    """Max |rows_along row - per-prefix distribution row| over path rows the target itself reaches."""
    softmax_parity_error: float
    """Max |max-shift row - online row| over every target and draft row of the fixture."""

    def completion(self, prefix: Prefix, mass: float, into: Joint) -> None:
        """Add ``mass`` times the target's continuation law from ``prefix`` (not stopped) into ``into``."""
        _complete(self, prefix, mass, into)


def _complete(tables: FixtureTables, prefix: Prefix, mass: float, into: Joint) -> None:
    fixture = tables.fixture
    if len(prefix) >= fixture.horizon:
        key = prefix[: fixture.horizon]
        into[key] = into.get(key, 0.0) + mass
        return
    row = tables.target.rows.get(prefix)
    if row is None:
        key = prefix + (IMPOSSIBLE,) * (fixture.horizon - len(prefix))
        into[key] = into.get(key, 0.0) + mass
        return
    stop_set = tables.target.stops[prefix]
    for token, p in enumerate(row.tolist()):
        if p <= 0.0:
            continue
        child = (*prefix, token)
        if token in stop_set or len(child) >= fixture.budget:
            key = child + (STOPPED,) * (fixture.horizon - len(child))
            into[key] = into.get(key, 0.0) + mass * p
        else:
            _complete(tables, child, mass * p, into)


def _draft_walks(draft: RowTree, k: int, prefix: Prefix = ()) -> Iterator[Prefix]:
    if len(prefix) == k:
        yield prefix
        return
    for token, q in enumerate(draft.rows[prefix].tolist()):
        if q > 0.0:
            yield from _draft_walks(draft, k, (*prefix, token))


def _path(fixture: OracleFixture, tables: FixtureTables, chain: ProcessorChain, tokens: Prefix) -> DraftPath:
    k = fixture.draft_len
    q_rows = torch.stack([tables.draft.rows[tokens[:i]] for i in range(k)])  # [K, V]
    q_mass = math.prod(float(q_rows[i, tokens[i]]) for i in range(k))
    logits = torch.tensor(
        [fixture.target_logits[tokens[:i]] for i in range(k + 1)], dtype=torch.float64
    )  # [K+1, V]
    p_rows = chain.rows_along(logits, tokens)  # [K+1, V]
    stop_sets = tuple(frozenset(s) for s in chain.stop_sets_along(tokens))
    p_list, q_list = p_rows.tolist(), q_rows.tolist()
    return DraftPath(
        tokens=tokens,
        q_mass=q_mass,
        q_rows=q_rows,
        p_rows=p_rows,
        stop_sets=stop_sets,
        p_draft=tuple(p_list[i][tokens[i]] for i in range(k)),
        q_draft=tuple(q_list[i][tokens[i]] for i in range(k)),
    )


def build_tables(fixture: OracleFixture, *, parity: bool = True) -> FixtureTables:
    """Build the trees, the draft paths with their round rows, the target joint and the parity errors."""
    target, target_parity = row_tree(fixture, "target", parity=parity)
    draft, draft_parity = row_tree(fixture, "draft", parity=parity)
    tables = FixtureTables(
        fixture=fixture,
        target=target,
        draft=draft,
        paths=[],
        target_joint={},
        rows_along_error=0.0,
        softmax_parity_error=max(target_parity, draft_parity),
    )
    chain = fixture.chain("target")
    tables.paths = [_path(fixture, tables, chain, walk) for walk in _draft_walks(draft, fixture.draft_len)]
    gap = 0.0
    for path in tables.paths:
        for i in range(fixture.draft_len + 1):
            reference = target.rows.get(path.tokens[:i])
            if reference is not None:
                gap = max(gap, float((path.p_rows[i] - reference).abs().max()))
    tables.rows_along_error = gap
    tables.completion((), 1.0, tables.target_joint)
    return tables
