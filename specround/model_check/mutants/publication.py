"""Publication failure classes: the log's fence or idempotence is missing, or the writer drops no dependant.

Contract: contract#fenced-publication, INV-6, specs/faults.md ("Pipelined publication").

The log's seam is :meth:`MemoryEventLog.publish <specround.adapters.memory_log.MemoryEventLog.publish>`; the
wrong variant moves what the real fence compares against (the head's generation, the record of published
round ids) just before calling it, so the real append path runs. The pipelined writer's seam is
:meth:`PublicationWriter._write <specround.statemachine.writer.PublicationWriter._write>`, called with the
parents of the publications dropped, so the real write runs without its dependency check. The pipelined
step's seam is :meth:`Step.decisions <specround.statemachine.step.Step.decisions>`, called with the rounds
aborted after staging counted as live for the duration of the call.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from specround.adapters.memory_log import MemoryEventLog
from specround.model_check.mutants.mutation import Mutation, Scratch, Seam
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.step import Step
from specround.statemachine.writer import PublicationWriter

__all__ = ["PUBLICATION_MUTATIONS"]


def _no_fence(original: Any, _scratch: Scratch) -> Any:
    """A different transaction with a stale generation is appended anyway (last writer wins)."""

    def publish(self: Any, publications: Any) -> Any:
        for publication in publications:
            entry = self._requests.get(publication.request_id)
            if entry is None or publication.round_id in entry.round_generation or entry.head.finished:
                continue
            if entry.head.generation != publication.expected_generation:
                entry.head = replace(entry.head, generation=publication.expected_generation)
        return original(self, publications)

    return publish


def _append_twice(original: Any, _scratch: Scratch) -> Any:
    """Re-publishing an already published transaction appends its events again."""

    def publish(self: Any, publications: Any) -> Any:
        for publication in publications:
            entry = self._requests.get(publication.request_id)
            if entry is None:
                continue
            if entry.round_commit.get(publication.round_id) == publication.commit_digest:
                del entry.round_generation[publication.round_id], entry.round_commit[publication.round_id]
                entry.head = replace(entry.head, generation=publication.expected_generation, finished=False)
        return original(self, publications)

    return publish


def _parents_forgotten(original: Any, _scratch: Scratch) -> Any:
    """The writer is told no publication was built on a pending round, so it drops none of them."""

    def write(self: Any, build: Any, keys: Any, parents: Any) -> Any:
        return original(self, build, keys, [None] * len(parents))

    return write


def _aborted_rows_decided(original: Any, _scratch: Scratch) -> Any:
    """A row aborted after staging (at F-5, before its write) still hands the engine its staged decision."""

    def decisions(self: Any) -> Any:
        aborted = [r for r in self._rounds if r.phase is RoundPhase.ABORTED and r.successor is not None]
        saved = [(r, r.phase, r.result) for r in aborted]
        for rnd in aborted:
            rnd.phase, rnd.result = RoundPhase.STAGED, None
        try:
            return original(self)
        finally:
            for rnd, phase, result in saved:
                rnd.phase, rnd.result = phase, result

    return decisions


PUBLICATION_MUTATIONS = (
    Mutation(
        "publication without the generation fence",
        "publication",
        "a round prepared at a stale generation is appended instead of refused",
        ("INV-6", "contract#fenced-publication"),
        (Seam(MemoryEventLog, MemoryEventLog.publish, _no_fence),),
    ),
    Mutation(
        "double publish appends twice",
        "publication",
        "publishing the same transaction again appends it a second time instead of acknowledging it",
        ("INV-6", "contract#fenced-publication"),
        (Seam(MemoryEventLog, MemoryEventLog.publish, _append_twice),),
    ),
    Mutation(
        "writer publishes rounds built on a failed round",
        "publication",
        "a pipelined round built on a round whose write failed or lost the fence is written anyway; the "
        "generation fence lets it through onto the other writer's published state",
        ("INV-6", "contract#fenced-publication"),
        (Seam(PublicationWriter, PublicationWriter._write, _parents_forgotten),),
    ),
    Mutation(
        "decision handed out for a row aborted at F-5",
        "publication",
        "a pipelined step hands the engine the staged decision and K/V instruction of a row that was aborted "
        "before its write was handed over, and reports it submitted (so its rollback is asked for too)",
        ("INV-7", "contract#fenced-publication"),
        (Seam(Step, Step.decisions, _aborted_rows_decided),),
    ),
)
"""Failure classes of generation-fenced, idempotent publication."""
