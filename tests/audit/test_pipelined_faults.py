"""The pipelined fault cells hold on every backend; the writer's parent check makes one of them hold."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.sql import SqlEventLog
from specround.audit.pipelined_faults import PIPELINED_CELLS, run_pipelined_faults
from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication
from specround.statemachine.writer import PublicationWriter, RoundKey, WriteKey


def _log(backend: str, tmp_path: Path, url: str | None = None) -> EventLog:
    if backend == "memory":
        return MemoryEventLog()
    if backend == "sqlite":
        return SqlEventLog.open(str(tmp_path / "pipelined.sqlite"), create=True)
    assert url is not None
    return SqlEventLog.open(url, create=True)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_every_pipelined_cell_holds(backend: str, tmp_path: Path) -> None:
    log = _log(backend, tmp_path)
    try:
        cells = run_pipelined_faults(log)
    finally:
        log.close()
    assert len(cells) == len(PIPELINED_CELLS) * 2 * 5
    assert [c for c in cells if not c.ok] == []


@pytest.mark.postgres
def test_every_pipelined_cell_holds_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    log = _log("postgresql", tmp_path, postgres_url)
    try:
        cells = run_pipelined_faults(log)
    finally:
        log.close()
    assert [c for c in cells if not c.ok] == []


def test_without_the_parent_check_a_fenced_out_rounds_dependant_is_published(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The generation fence alone lets round t + 1 onto a rival's state: the cell must catch that."""
    original = PublicationWriter._write

    def no_parents(
        self: PublicationWriter,
        build: Callable[[], Sequence[RoundPublication]],
        keys: list[WriteKey],
        parents: list[RoundKey | None],
    ) -> list[PublishOutcome]:
        return original(self, build, keys, [None] * len(parents))

    monkeypatch.setattr(PublicationWriter, "_write", no_parents)
    cells = run_pipelined_faults(MemoryEventLog())
    broken = {c.point for c in cells if not c.ok}
    assert broken == {"write conflicts"}
    assert all("t + 1" in c.detail or not c.audit_clean for c in cells if not c.ok)
