"""The per-fixture checks of the exact enumeration oracle, once its leaves are enumerated.

Contract: contract#prefix-induction, contract#exact-enumeration.

Each step reads what :mod:`specround.model_check.enumeration` measured (grid thresholds, correction and bonus
laws, the speculative joint, the leaf tally) and appends its :class:`CheckResult` rows to the fixture:
the sampler-law identities per position, the tallied leaf checks, the processor-row parity and the joint.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specround.model_check.check_results import CheckResult, within
from specround.model_check.enumeration_results import (
    GRID,
    IDENTITY_TOLERANCE,
    JOINT_TOLERANCE,
    PARITY_TOLERANCE,
    THRESHOLD_TOLERANCE,
    FixtureEnumeration,
    LeafTally,
)
from specround.model_check.fixture_tables import DraftPath

__all__ = ["LEAF_CHECKS", "finish_fixture"]

LEAF_CHECKS = (
    "monotone terminal",
    "unreached uniforms and interval ends leave the outcome unchanged",
    "INV-10 emitted = accepted drafts + terminal",
    "INV-2 progress = min(A + 1, H)",
    "INV-3 draws = reached tests + terminal",
)
"""The leaf-level checks tallied per fixture, in report order."""

_BRACKET = "INV-10 bracket = located interval"

Node = tuple[int, ...]


@dataclass
class _ReachedNodes:
    """Measured acceptance of every reached draft at each node, with that node's (p, q) rows."""

    accept: dict[Node, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    rows: dict[Node, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def finish_fixture(
    result: FixtureEnumeration,
    tally: LeafTally,
    paths: Sequence[DraftPath],
    thresholds: Sequence[Sequence[int]],
) -> None:
    """Append every per-fixture check: identities, tallied leaf checks, processor rows, the joint.

    ``paths`` are the fixture's cases in batch order and ``thresholds`` their grid counts [cases, K]
    (``-1`` for an unreached test).
    """
    nodes = _threshold_checks(result, paths, thresholds)
    _total_variation_check(result, nodes)
    _correction_check(result, nodes)
    _bonus_check(result)
    _leaf_checks(result, tally)
    _processor_checks(result)
    _joint_checks(result)


def _threshold_checks(
    result: FixtureEnumeration, paths: Sequence[DraftPath], thresholds: Sequence[Sequence[int]]
) -> _ReachedNodes:
    """Acceptance thresholds against min(1, p/q) of the oracle's rows; p == q never corrects."""
    fixture = result.tables.fixture
    nodes = _ReachedNodes()
    gap = 0.0
    tests = 0
    equal_rows = 0
    equal_rows_rejecting = 0
    for path, counts in zip(paths, thresholds, strict=True):
        for i in range(fixture.draft_len):
            count = counts[i]
            if count < 0:
                continue
            ratio = min(1.0, path.p_draft[i] / path.q_draft[i])
            gap = max(gap, abs(count / GRID - ratio))
            tests += 1
            if torch.equal(path.p_rows[i], path.q_rows[i]):
                equal_rows += 1
                equal_rows_rejecting += count != GRID
            node = path.tokens[:i]
            nodes.accept[node][path.tokens[i]] = count / GRID
            nodes.rows[node] = (path.p_rows[i], path.q_rows[i])
            result.thresholds[path.tokens[: i + 1]] = count / GRID
    name = fixture.name
    result.checks.append(
        within(name, "acceptance = min(1, p/q)", gap, THRESHOLD_TOLERANCE, f"{tests} reached tests")
    )
    if equal_rows:
        result.checks.append(
            CheckResult(
                name,
                "p == q never corrects",
                equal_rows_rejecting == 0,
                float(equal_rows_rejecting),
                0.0,
                f"rejecting tests among {equal_rows} with p == q",
            )
        )
    return nodes


def _total_variation_check(result: FixtureEnumeration, nodes: _ReachedNodes) -> None:
    """One-position identity at every reached node: sum_x q(x) a(x) = 1 - TV(p, q)."""
    tv_gap = 0.0
    for node, accept in nodes.accept.items():
        p_row, q_row = nodes.rows[node]
        if len(accept) != int((q_row > 0).sum()):
            continue  # some drafts of this node are unreachable through the paths; skip the sum
        shared = sum(float(q_row[x]) * t for x, t in accept.items())
        tv = 0.5 * float((p_row - q_row).abs().sum())
        tv_gap = max(tv_gap, abs(shared - (1.0 - tv)))
    result.checks.append(
        within(
            result.name, "acceptance = 1 - TV(p, q)", tv_gap, IDENTITY_TOLERANCE, f"{len(nodes.accept)} nodes"
        )
    )


def _law_gap(law: dict[int, float], expected: Sequence[float]) -> float:
    """Largest |measured - expected| over the token ids of ``expected``."""
    return max(abs(law.get(x, 0.0) - e) for x, e in enumerate(expected))


def _correction_check(result: FixtureEnumeration, nodes: _ReachedNodes) -> None:
    """Each measured correction law (and its reported mass Z) is the normalised max(p - q, 0)."""
    if not result.correction_laws:
        return
    residual_gap = 0.0
    for node, law in result.correction_laws.items():
        if node not in nodes.rows:
            residual_gap = math.inf
            continue
        p_row, q_row = nodes.rows[node]
        residual = (p_row - q_row).clamp_min(0.0)
        z = float(residual.sum())
        residual_gap = max(residual_gap, abs(result.correction_mass[node] - z))
        residual_gap = max(residual_gap, _law_gap(law, (residual / z).tolist()))
    result.checks.append(
        within(
            result.name,
            "correction = normalised max(p - q, 0)",
            residual_gap,
            IDENTITY_TOLERANCE,
            f"{len(result.correction_laws)} nodes",
        )
    )


def _bonus_check(result: FixtureEnumeration) -> None:
    """Each measured bonus law after a full path is the target row p_{K+1} of that path."""
    if not result.bonus_laws:
        return
    tables = result.tables
    by_tokens = {p.tokens: p for p in tables.paths}
    bonus_gap = 0.0
    for path_tokens, law in result.bonus_laws.items():
        expected = by_tokens[path_tokens].p_rows[tables.fixture.draft_len].tolist()
        bonus_gap = max(bonus_gap, _law_gap(law, expected))
    result.checks.append(
        within(
            result.name, "bonus = p_{K+1}", bonus_gap, IDENTITY_TOLERANCE, f"{len(result.bonus_laws)} paths"
        )
    )


def _leaf_checks(result: FixtureEnumeration, tally: LeafTally) -> None:
    """The tallied leaf-level checks, and the bracket cross-check of every terminal draw."""
    for check_name in LEAF_CHECKS:
        count = tally.failures.get(check_name, 0)
        result.checks.append(
            CheckResult(
                result.name, check_name, count == 0, float(count), 0.0, f"failing of {tally.leaves} leaves"
            )
        )
    if tally.brackets:
        result.checks.append(
            within(
                result.name,
                _BRACKET,
                tally.errors.get(_BRACKET, 0.0),
                IDENTITY_TOLERANCE,
                f"{tally.brackets} terminal draws",
            )
        )


def _processor_checks(result: FixtureEnumeration) -> None:
    """Processor rows: ``rows_along`` against per-prefix rows, and both softmax backends."""
    tables = result.tables
    name = result.name
    result.checks.append(
        within(name, "rows_along = per-prefix rows", tables.rows_along_error, PARITY_TOLERANCE)
    )
    result.checks.append(
        within(name, "softmax parity (max-shift vs online)", tables.softmax_parity_error, PARITY_TOLERANCE)
    )


def _joint_checks(result: FixtureEnumeration) -> None:
    """The speculative joint against the target joint over every sequence of the horizon."""
    target = result.tables.target_joint
    keys = set(result.speculative_joint) | set(target)
    result.joint_error = max(
        (abs(result.speculative_joint.get(key, 0.0) - target.get(key, 0.0)) for key in keys),
        default=0.0,
    )
    total = math.fsum(result.speculative_joint.values())
    result.checks.append(
        within(
            result.name,
            "speculative joint = target joint",
            result.joint_error,
            JOINT_TOLERANCE,
            f"{len(keys)} sequences",
        )
    )
    result.checks.append(
        within(result.name, "speculative joint sums to 1", abs(total - 1.0), JOINT_TOLERANCE)
    )
