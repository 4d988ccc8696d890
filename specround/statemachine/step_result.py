"""What :meth:`~specround.statemachine.controller.RoundController.step_batch` hands back: batched tensors.

An engine reads the step's outcome as tensors over the batch rows, in the order it handed them in::

    out = ctl.step_batch(ids, draft_ids, draft_lens, q, p)
    out.emitted_ids      # [B, K+1] int64, PAD_ID padded: the tokens each row published
    out.keep             # [B] int64: leading branch K/V rows to commit (0: discard the branch)
    out.finished         # [B] bool

and :meth:`StepResult.results` (or indexing) gives the per-request :class:`RoundResult` records for callers
that want objects. Rows that did not publish (refused, aborted, fenced out) have ``published`` False, no
emitted tokens, ``keep`` 0 and ``terminal`` -1; their result record carries the error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch

from specround.sampling.types import PAD_ID, TerminalKind
from specround.statemachine.rounds import RoundResult, RoundStatus
from specround.statemachine.state import FinishReason, TerminalName

if TYPE_CHECKING:
    from specround.statemachine.controller import RoundController

__all__ = ["TERMINAL_CODES", "PendingStep", "RowDecision", "StepResult"]

TERMINAL_CODES: dict[str, int] = {
    "correction": int(TerminalKind.CORRECTION),
    "bonus": int(TerminalKind.BONUS),
    "stop": int(TerminalKind.STOP),
}
"""Terminal kinds by name, as the small integers of :class:`~specround.sampling.types.TerminalKind`."""

_DELIVERED = (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)


class StepResult:
    """The outcome of one batch step: per-row tensors (host, int64/bool) and the per-request records."""

    def __init__(
        self,
        request_ids: tuple[str, ...],
        width: int,
        results: Sequence[RoundResult],
        rollback_to: Sequence[int] | None = None,
    ) -> None:
        """Internal: built by ``step_batch`` (or a pending step) from the step's results in row order."""
        self.request_ids = request_ids
        """Row b's request id."""
        self._width = width
        self._results = tuple(results)
        self._rollback_to = list(rollback_to) if rollback_to is not None else [-1] * len(self._results)

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, row: int) -> RoundResult:
        return self._results[row]

    def __iter__(self) -> Iterator[RoundResult]:
        return iter(self._results)

    def results(self) -> list[RoundResult]:
        """Every row's :class:`RoundResult`, in row order."""
        return list(self._results)

    @cached_property
    def rollback_to(self) -> torch.Tensor:
        """[B] int64: the cache length to crop a pipelined row's K/V back to, else -1.

        A pipelined row that did not become durable after the engine acted on its decision is cropped back
        to its last durable state. Built on first read, as the other tensors are (a synchronous step's
        caller rarely reads it).
        """
        return torch.tensor(self._rollback_to, dtype=torch.int64)

    @cached_property
    def published(self) -> torch.Tensor:
        """[B] bool: the row's round is durable (published now, or acknowledged as published before)."""
        return torch.tensor([r.status in _DELIVERED for r in self._results], dtype=torch.bool)

    @cached_property
    def emitted_ids(self) -> torch.Tensor:
        """[B, K+1] int64 tokens each row published, ``PAD_ID`` padded."""
        width = self._width + 1
        return torch.tensor(
            [[*r.emitted_ids, *[PAD_ID] * (width - len(r.emitted_ids))] for r in self._results],
            dtype=torch.int64,
        ).reshape(len(self._results), width)

    @cached_property
    def _counts(self) -> torch.Tensor:
        """[5, B] int64: emitted, accepted, terminal code, keep, new frontier."""
        rows = []
        for r in self._results:
            kv = r.kv if r.status in _DELIVERED else None
            rows.append(
                (
                    len(r.emitted_ids),
                    r.accepted,
                    TERMINAL_CODES[r.terminal] if r.terminal is not None else -1,
                    kv.keep if kv is not None else 0,
                    kv.new_frontier if kv is not None and kv.new_frontier is not None else PAD_ID,
                )
            )
        return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 5).T

    @property
    def emitted(self) -> torch.Tensor:
        """[B] int64 number of tokens each row published."""
        return self._counts[0]

    @property
    def accepted(self) -> torch.Tensor:
        """[B] int64 accepted drafts each row emitted."""
        return self._counts[1]

    @property
    def terminal(self) -> torch.Tensor:
        """[B] int64 :class:`~specround.sampling.types.TerminalKind` codes, -1 where nothing published."""
        return self._counts[2]

    @property
    def keep(self) -> torch.Tensor:
        """[B] int64 leading branch K/V rows to commit (the rest are discarded; 0 discards the branch)."""
        return self._counts[3]

    @property
    def new_frontier(self) -> torch.Tensor:
        """[B] int64 the emitted token that has no K/V row yet, ``PAD_ID`` where nothing published."""
        return self._counts[4]

    @cached_property
    def finished(self) -> torch.Tensor:
        """[B] bool: the row's request finished with this round."""
        return torch.tensor([r.finished and r.status in _DELIVERED for r in self._results], dtype=torch.bool)


@dataclass(frozen=True, slots=True)
class RowDecision:
    """One row's staged decision, before its round is durable."""

    emitted_ids: tuple[int, ...]
    accepted: int
    terminal: TerminalName
    finished: bool
    keep: int
    new_frontier: int | None
    reached: int
    """Acceptance tests the round reached (its ACCEPT draws, INV-3)."""
    finish_reason: FinishReason | None
    """Why the request finished with this round (None while it runs on)."""


class PendingStep:
    """A submitted step: each row's decision now, its durable outcome from :meth:`wait`.

    The decision tensors say what the engine needs for its next forward (the same fields as
    :class:`StepResult`, for the rows that reached staging). They are not yet durable: stream or return
    tokens only from :meth:`wait`'s result.
    """

    def __init__(
        self,
        controller: RoundController,
        request_ids: tuple[str, ...],
        width: int,
        decisions: Sequence[RowDecision | None],
    ) -> None:
        """Internal: built by ``submit_batch``."""
        self.request_ids = request_ids
        """Row b's request id."""
        self._controller = controller
        self._width = width
        self._decisions = tuple(decisions)
        self._result: StepResult | None = None

    @property
    def decisions(self) -> tuple[RowDecision | None, ...]:
        """Per row: its staged decision, or None for a row refused or aborted before its write."""
        return self._decisions

    @property
    def submitted(self) -> list[bool]:
        """Per row: whether its round reached staging and was handed to the writer."""
        return [d is not None for d in self._decisions]

    @property
    def done(self) -> bool:
        """Whether the durable outcome is settled (:meth:`wait` returns at once)."""
        return self._result is not None

    def wait(self) -> StepResult:
        """Wait for this step's durable write (and every earlier one) and return the durable outcome."""
        while self._result is None:
            self._controller._settle_oldest()
        return self._result

    def _finish(self, results: Sequence[RoundResult], rollback_to: Sequence[int]) -> None:
        self._result = StepResult(self.request_ids, self._width, results, rollback_to)

    @cached_property
    def _columns(self) -> torch.Tensor:
        """[5, B] int64: emitted, accepted, terminal code, keep, new frontier (staged decisions)."""
        rows = [
            (
                len(d.emitted_ids),
                d.accepted,
                TERMINAL_CODES[d.terminal],
                d.keep,
                d.new_frontier if d.new_frontier is not None else PAD_ID,
            )
            if d is not None
            else (0, 0, -1, 0, PAD_ID)
            for d in self._decisions
        ]
        return torch.tensor(rows, dtype=torch.int64).reshape(len(rows), 5).T

    @cached_property
    def emitted_ids(self) -> torch.Tensor:
        """[B, K+1] int64 staged emitted tokens, ``PAD_ID`` padded (empty for rows not submitted)."""
        width = self._width + 1
        rows = [d.emitted_ids if d is not None else () for d in self._decisions]
        return torch.tensor([[*r, *[PAD_ID] * (width - len(r))] for r in rows], dtype=torch.int64).reshape(
            len(rows), width
        )

    @property
    def keep(self) -> torch.Tensor:
        """[B] int64 branch K/V rows to commit for the next forward (0 for rows not submitted)."""
        return self._columns[3]

    @property
    def new_frontier(self) -> torch.Tensor:
        """[B] int64 the staged frontier token, ``PAD_ID`` for rows not submitted."""
        return self._columns[4]

    @property
    def accepted(self) -> torch.Tensor:
        """[B] int64 accepted drafts of each staged row."""
        return self._columns[1]

    @property
    def terminal(self) -> torch.Tensor:
        """[B] int64 terminal kind codes, -1 for rows not submitted."""
        return self._columns[2]

    @cached_property
    def finished(self) -> torch.Tensor:
        """[B] bool: the staged round finishes its request."""
        return torch.tensor([d is not None and d.finished for d in self._decisions], dtype=torch.bool)
