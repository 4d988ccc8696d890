"""Self-test of the power statement: sample from planted distortions of a law and count rejections.

A distortion moves total variation ``delta`` of mass between the cells of a law:

* ``least-favourable``: the cells split into two groups of about equal mass; one group is scaled up and
  the other down in proportion to each cell's probability. Its chi-square divergence is ``4 delta^2`` up
  to the imbalance of the split, the smallest any law at TV ``delta`` can have, so it is the hardest
  alternative for the test;
* ``shift``: ``delta`` of mass moves from the most probable cell to the second most probable one (the
  shape of a correction drawn from the wrong row).

:func:`rejection_rate` draws ``repetitions`` multinomial samples of size N (a fixed torch generator seed)
from a law and reports how often :func:`~specround.testing.lawtest.law_test` rejects at level alpha: under
the law itself that estimates the size (about alpha), under a distortion at the stated detectable TV it
estimates the power (at least the stated power, up to Monte Carlo error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.errors import InvalidRequestError
from specround.model_check.chi_square import pool_cells
from specround.testing.law import CellLaw
from specround.testing.lawtest import law_test

__all__ = ["DISTORTIONS", "PowerCheck", "distort", "rejection_rate"]

DISTORTIONS = ("least-favourable", "shift")
"""The named planted distortions."""


def distort(probs: Sequence[float], delta: float, kind: str) -> list[float]:
    """Cell probabilities at total variation exactly ``delta`` from ``probs`` (a named distortion)."""
    p = [float(x) for x in probs]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    if kind == "shift":
        if len(p) < 2 or p[order[0]] < delta:
            raise InvalidRequestError(f"cannot shift {delta} of mass: largest cell holds {p[order[0]]}")
        out = list(p)
        out[order[0]] -= delta
        out[order[1]] += delta
        return out
    if kind == "least-favourable":
        up: list[int] = []
        mass_up = 0.0
        for i in order:  # largest first into the lighter group: two groups of about half the mass each
            if not up or mass_up + p[i] <= 0.5:
                up.append(i)
                mass_up += p[i]
        mass_down = 1.0 - mass_up
        if not up or mass_down <= delta or mass_up <= 0:
            raise InvalidRequestError("the law has too few cells for a least-favourable distortion")
        chosen = set(up)
        return [
            x * (1 + delta / mass_up) if i in chosen else x * (1 - delta / mass_down) for i, x in enumerate(p)
        ]
    raise InvalidRequestError(f"unknown distortion {kind!r}; known: {', '.join(DISTORTIONS)}")


@dataclass(frozen=True)
class PowerCheck:
    """Rejection counts of the law test over repeated samples from one law."""

    distortion: str
    """``none`` (the target itself) or a name of :data:`DISTORTIONS`."""
    delta: float
    samples: int
    repetitions: int
    rejections: int

    @property
    def rate(self) -> float:
        """Fraction of repetitions rejected."""
        return self.rejections / self.repetitions


def rejection_rate(
    law: CellLaw,
    samples: int,
    alpha: float,
    *,
    distortion: str = "none",
    delta: float = 0.0,
    repetitions: int = 200,
    seed: int = 0,
) -> PowerCheck:
    """How often the law test rejects samples drawn from ``law`` (distorted by ``delta``)."""
    names = sorted(law.cells)
    probs = [law.cells[c] for c in names]
    drawn = probs if distortion == "none" else _distort_pooled(probs, samples, delta, distortion)
    weights = torch.tensor(drawn, dtype=torch.float64).clamp_min(0.0)
    gen = torch.Generator().manual_seed(seed)
    rejections = 0
    for _ in range(repetitions):
        idx = torch.multinomial(weights, samples, replacement=True, generator=gen).tolist()
        outcome = law_test(law, [names[i] for i in idx], alpha)  # a cell's prefix lies in that cell
        rejections += 0 if outcome.passed else 1
    return PowerCheck(distortion, delta, samples, repetitions, rejections)


def _distort_pooled(probs: list[float], samples: int, delta: float, kind: str) -> list[float]:
    """Distort the law of the test's pooled cells by ``delta``, spreading each group's mass in proportion.

    The TV on the pooled cells (the one the power statement is about) is then exactly ``delta``.
    """
    m = len(probs)
    indicators = [[1.0 if j == i else 0.0 for j in range(m)] for i in range(m)]
    pooled = pool_cells([samples * p for p in probs], probs, *indicators)
    group_mass = pooled[1]
    member = [row.index(1.0) for row in pooled[2:]]  # cell -> its pooled group
    moved = distort(group_mass, delta, kind)
    return [
        p * moved[g] / group_mass[g] if group_mass[g] > 0 else 0.0 for p, g in zip(probs, member, strict=True)
    ]
