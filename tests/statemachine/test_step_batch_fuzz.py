"""The batch step under a seeded fuzz: one malformed row never harms another, a malformed batch moves nothing.

Bounded for ``make test`` (a few hundred steps per backend, seconds); ``SPECROUND_FUZZ_STEPS`` runs more.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog
from specround.audit import audit_log
from specround.statemachine.ports import EventLog
from tests.statemachine.batch_step_fuzz import BATCH_EDITS, ROW_EDITS, fuzz_batch_steps

STEPS = int(os.environ.get("SPECROUND_FUZZ_STEPS", "0")) or None


@pytest.mark.parametrize(("backend", "steps"), [("memory", 300), ("sqlite", 120)])
def test_fuzzed_batch_steps_harm_no_neighbour(backend: str, steps: int, tmp_path: Path) -> None:
    log: EventLog = (
        MemoryEventLog() if backend == "memory" else SqlEventLog.open(str(tmp_path / "fuzz.sqlite"))
    )
    try:
        counts = fuzz_batch_steps(log, STEPS or steps, seed=11)
        assert counts.failures() == dict.fromkeys(counts.failures(), 0), counts.examples
        # the fuzz exercised both kinds of refusal, and the valid rounds beside them were published
        assert counts.refused_batches > 0.2 * counts.steps and counts.refused_rows > 0.4 * counts.steps
        report = audit_log(log)
        assert report.ok, report.findings[:5]
        assert report.rounds > counts.steps  # every row-edit step published its valid neighbours
    finally:
        log.close()


def test_the_fuzz_knows_enough_kinds_of_damage() -> None:
    assert len(BATCH_EDITS) >= 20 and len(ROW_EDITS) >= 20
