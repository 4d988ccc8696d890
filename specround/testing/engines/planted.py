"""Planted-bug engines: the reference engine broken in one place each, as real engines have been.

Each bug is named after the failure reports it reproduces, and :data:`EXPECTED_FAILURE` names the check of
the kit that must catch it (other checks may fail too; this one must):

* ``correction-from-p``: after a rejection, draws the correction from p, not from max(p - q, 0);
  caught by ``decisions``.
* ``bonus-from-q``: after a full acceptance, draws the bonus from the draft's row; ``decisions``.
* ``raw-q-under-top-k``: samples drafts from the processed row but uses the raw softmax as q in the
  acceptance test; ``q-sampled``.
* ``continue-after-rejection``: after a rejection, emits the correction and keeps testing the later
  drafts; ``decisions``.
* ``penalty-over-rejected``: advances the target-side penalty state over every drafted token, rejected
  ones included; ``processor-state``.
* ``eos-continued``: an EOS accepted inside the block does not end the round; ``stop``.
* ``seed-ignored-in-batch``: every request of a batch draws with the first request's seed;
  ``batch-invariance``.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum

import torch

from specround.sampling.processors.processor_chain import ProcessorChain
from specround.testing.engine_contract import EngineRequest
from specround.testing.engines.reference import ReferenceEngine, RequestRun
from specround.testing.models import LogitsModel

__all__ = ["EXPECTED_FAILURE", "PlantedBug", "PlantedBugEngine"]


class PlantedBug(StrEnum):
    """The planted bugs."""

    CORRECTION_FROM_P = "correction-from-p"
    BONUS_FROM_Q = "bonus-from-q"
    RAW_Q_UNDER_TOP_K = "raw-q-under-top-k"
    CONTINUE_AFTER_REJECTION = "continue-after-rejection"
    PENALTY_OVER_REJECTED = "penalty-over-rejected"
    EOS_CONTINUED = "eos-continued"
    SEED_IGNORED_IN_BATCH = "seed-ignored-in-batch"


EXPECTED_FAILURE: dict[PlantedBug, str] = {
    PlantedBug.CORRECTION_FROM_P: "decisions",
    PlantedBug.BONUS_FROM_Q: "decisions",
    PlantedBug.RAW_Q_UNDER_TOP_K: "q-sampled",
    PlantedBug.CONTINUE_AFTER_REJECTION: "decisions",
    PlantedBug.PENALTY_OVER_REJECTED: "processor-state",
    PlantedBug.EOS_CONTINUED: "stop",
    PlantedBug.SEED_IGNORED_IN_BATCH: "batch-invariance",
}
"""The check that must name each bug."""


class PlantedBugEngine(ReferenceEngine):
    """The reference engine with one planted bug."""

    def __init__(self, bug: PlantedBug | str, target: LogitsModel, draft: LogitsModel, *, k: int = 3) -> None:
        self.bug = PlantedBug(bug)
        super().__init__(target, draft, k=k, name=f"planted:{self.bug.value}")

    def seed_of(self, request: EngineRequest, batch: Sequence[EngineRequest]) -> int:
        """The first request's seed for the whole batch under ``seed-ignored-in-batch``."""
        if self.bug is PlantedBug.SEED_IGNORED_IN_BATCH and batch:
            return batch[0].seed
        return request.seed

    def q_rows(
        self, run: RequestRun, logits: torch.Tensor, chain: ProcessorChain
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The raw softmax as q under ``raw-q-under-top-k``."""
        sample_row, q_row = super().q_rows(run, logits, chain)
        if self.bug is PlantedBug.RAW_Q_UNDER_TOP_K:
            q_row = torch.softmax(logits.to(torch.float64), dim=-1)
        return sample_row, q_row

    def advance_target_state(self, run: RequestRun, drafts: Sequence[int], emitted: Sequence[int]) -> None:
        """Advance over the drafts, rejected ones included, under ``penalty-over-rejected``."""
        if self.bug is not PlantedBug.PENALTY_OVER_REJECTED:
            super().advance_target_state(run, drafts, emitted)
            return
        accepted = 0
        while accepted < min(len(drafts), len(emitted)) and drafts[accepted] == emitted[accepted]:
            accepted += 1
        run.target_state.advance_many([*drafts, *emitted[accepted:]])

    def terminal_row(
        self, p: torch.Tensor, q: torch.Tensor | None, bonus_q: torch.Tensor | None
    ) -> torch.Tensor:
        """Use p for a correction, or the draft's row for a bonus, under the two terminal bugs."""
        if self.bug is PlantedBug.CORRECTION_FROM_P and q is not None:
            return p
        if self.bug is PlantedBug.BONUS_FROM_Q and q is None and bonus_q is not None:
            return bonus_q
        return super().terminal_row(p, q, bonus_q)

    def continue_after_rejection(self) -> bool:
        """True under ``continue-after-rejection``."""
        return self.bug is PlantedBug.CONTINUE_AFTER_REJECTION

    def stop_at_eos(self) -> bool:
        """False under ``eos-continued``."""
        return self.bug is not PlantedBug.EOS_CONTINUED
