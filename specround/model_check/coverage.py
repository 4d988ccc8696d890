"""The coverage table of ``specround check``: what stands behind each invariant INV-n and fault point F-n.

For every item of ``specs/invariants.md`` and ``specs/faults.md`` (INV-n, F-n, and the pipelined
publication cells of ``specround faults``, :data:`~specround.audit.pipelined_faults.PIPELINED_CELLS`):

* **proofs**: registered z3 proofs whose ``covers`` name it
  (:func:`~specround.model_check.z3.proofs.all_proofs` builds the registry without solving anything; the
  statuses are added when the proofs ran);
* **tests**: test functions that cite it, found by scanning ``tests/`` for ``INV-n`` / ``F-n`` and for a
  pipelined cell's name in quotes (``"write fails"``), in the repository checkout's ``tests`` directory
  beside the package (an installed package has none, and the column is empty);
* **mutations**: mutation-lab mutations whose failure class violates it, with their verdicts, when the lab
  ran;
* **conformance**: the conformance scenarios that exercise it (the fault witnesses for F-n, the walk's
  invariant checks for INV-n, the walk's pipelined rule for the items it checks), when the conformance run
  happened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specround.audit.pipelined_faults import PIPELINED_CELLS
from specround.statemachine.faults import FaultPoint
from specround.statemachine.invariants import CHECKED_INVARIANTS, INVARIANT_TITLES

__all__ = [
    "ITEMS",
    "PIPELINED_TITLES",
    "PIPELINED_WALK_ITEMS",
    "RELATION_INVARIANTS",
    "WALK_INVARIANTS",
    "CoverageRow",
    "build_coverage",
    "default_tests_directory",
    "scan_tests",
]

PIPELINED_TITLES: dict[str, str] = {
    "write fails": "pipelined: t's write fails while t + 1 is in flight",
    "write conflicts": "pipelined: t loses the fence while t + 1 is in flight",
    "F-5 in flight": "pipelined: F-5 on t + 1 while t's write runs",
    "ack lost in flight": "pipelined: F-6 on t while t + 1 is in flight",
}
"""A one-line title per pipelined fault cell (specs/faults.md, "Pipelined publication")."""
ITEMS: dict[str, str] = {
    **INVARIANT_TITLES,
    **{point.value: point.stage_title for point in FaultPoint},
    **{cell: PIPELINED_TITLES[cell] for cell in PIPELINED_CELLS},
}
"""Every invariant, fault point and pipelined cell, with a one-line title (numbering fixed by specs/)."""

WALK_INVARIANTS = CHECKED_INVARIANTS
"""The invariants the state-machine walk checks after every rule (those of the shared invariant checks)."""
PIPELINED_WALK_ITEMS = ("INV-5", "INV-6", "INV-7", "F-5")
"""What the walk's pipelined rule checks (:meth:`~.conformance.MachineWalk.pipelined`): the decision and K/V
instruction handed over before the write (INV-5), the fence and the synchronous successors (INV-6), a lost
write changing nothing (INV-7) and step t + 1 aborted at F-5 while t's write runs."""
RELATION_INVARIANTS = ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6", "INV-7", "INV-8", "INV-10")
"""The invariants the z3 round relation encodes (INV-10 through the witnesses' planned decisions)."""

_CITATION = re.compile(r"\b(INV-(?:10|[1-9])|F-[1-6])\b")
_CELL_CITATION = re.compile("[\"'](" + "|".join(re.escape(cell) for cell in PIPELINED_CELLS) + ")[\"']")
_TEST_DEF = re.compile(r"^\s*(?:async\s+)?def\s+(test_\w+)")
_OTHER_DEF = re.compile(r"^(?:def|class)\s+")


def default_tests_directory() -> Path | None:
    """The checkout's ``tests`` directory beside the ``specround`` package, if there is one."""
    candidate = Path(__file__).resolve().parents[2] / "tests"
    return candidate if candidate.is_dir() else None


def scan_tests(directory: Path | None) -> dict[str, list[str]]:
    """Test citations of every item: ``tests/<file>.py::<test function>`` (or the file, outside a test)."""
    found: dict[str, set[str]] = {item: set() for item in ITEMS}
    if directory is None:
        return {item: [] for item in ITEMS}
    base = directory.parent
    for path in sorted(directory.rglob("test_*.py")):
        name = path.relative_to(base).as_posix()
        current: str | None = None
        for line in path.read_text(encoding="utf-8").splitlines():
            match = _TEST_DEF.match(line)
            if match:
                current = match.group(1)
            elif _OTHER_DEF.match(line):
                current = None  # a module-level helper or class: cite the file
            for item in (*_CITATION.findall(line), *_CELL_CITATION.findall(line)):
                found[item].add(f"{name}::{current}" if current else name)
    return {item: sorted(hits) for item, hits in found.items()}


@dataclass(frozen=True)
class CoverageRow:
    """The evidence behind one invariant or fault point."""

    item: str
    title: str
    proofs: tuple[str, ...]
    proofs_ok: bool | None
    """Whether every one of these proofs held (None when the proofs did not run)."""
    tests: tuple[str, ...]
    mutations: tuple[str, ...] = ()
    """``name (verdict)`` of each lab mutation that violates the item."""
    conformance: tuple[str, ...] = field(default_factory=tuple)

    @property
    def proved(self) -> bool:
        """At least one registered proof covers the item, and none of them failed (when they ran)."""
        return bool(self.proofs) and self.proofs_ok is not False

    @property
    def exercised(self) -> bool:
        """Executable evidence besides the proofs: a citing test, a lab mutation or a conformance scenario."""
        return bool(self.tests or self.mutations or self.conformance)

    @property
    def covered(self) -> bool:
        """Proved and exercised."""
        return self.proved and self.exercised

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "item": self.item,
            "title": self.title,
            "covered": self.covered,
            "proved": self.proved,
            "exercised": self.exercised,
            "proofs": list(self.proofs),
            "proofs_ok": self.proofs_ok,
            "tests": list(self.tests),
            "mutations": list(self.mutations),
            "conformance": list(self.conformance),
        }


def build_coverage(
    *,
    proof_statuses: Mapping[str, bool] | None = None,
    mutations: Sequence[tuple[str, Sequence[str], str]] = (),
    conformance_kinds: Iterable[str] = (),
    conforming_pairs: int = 0,
    walk_ran: bool = False,
    walk_rules: Sequence[str] = (),
    tests_directory: Path | None = None,
) -> list[CoverageRow]:
    """One row per item of :data:`ITEMS`.

    ``proof_statuses`` maps proof names to ok when the proofs ran; ``mutations`` holds ``(name, violates,
    verdict)`` of the lab's rows; ``conformance_kinds`` the witness kinds that conformed,
    ``conforming_pairs`` how many observed pairs satisfied the z3 relation (0 when any did not);
    ``walk_ran`` says whether the walk's invariant checks ran, ``walk_rules`` the rules it ran (one entry
    per rule applied).
    """
    from specround.model_check.z3.proofs import all_proofs

    registry = all_proofs()
    tests = scan_tests(tests_directory if tests_directory is not None else default_tests_directory())
    kinds = set(conformance_kinds)
    rows = []
    for item, title in ITEMS.items():
        proofs = tuple(p.name for p in registry if item in p.covers)
        proofs_ok = None if proof_statuses is None else all(proof_statuses.get(p, False) for p in proofs)
        killed = tuple(f"{name} ({verdict})" for name, violates, verdict in mutations if item in violates)
        evidence: list[str] = []
        if conforming_pairs and item in RELATION_INVARIANTS:
            evidence.append(f"{conforming_pairs} z3 relation pairs")
        if item.startswith("F-") and f"fault_{item}" in kinds:
            evidence.append(f"witness fault_{item}")
        if item == "F-6" and "retry_after_lost_ack" in kinds:
            evidence.append("witness retry_after_lost_ack")
        if walk_ran and (item in WALK_INVARIANTS or item.startswith("F-")):
            evidence.append("walk invariants")
        pipelined = walk_rules.count("pipelined")
        if pipelined and item in PIPELINED_WALK_ITEMS:
            evidence.append(f"walk pipelined rule x{pipelined}")
        rows.append(
            CoverageRow(
                item=item,
                title=title,
                proofs=proofs,
                proofs_ok=proofs_ok,
                tests=tuple(tests[item]),
                mutations=killed,
                conformance=tuple(evidence),
            )
        )
    return rows
