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
from functools import cached_property

import torch

from specround.sampling.types import PAD_ID, TerminalKind
from specround.statemachine.rounds import RoundResult, RoundStatus

__all__ = ["TERMINAL_CODES", "StepResult"]

TERMINAL_CODES: dict[str, int] = {
    "correction": int(TerminalKind.CORRECTION),
    "bonus": int(TerminalKind.BONUS),
    "stop": int(TerminalKind.STOP),
}
"""Terminal kinds by name, as the small integers of :class:`~specround.sampling.types.TerminalKind`."""

_DELIVERED = (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)


class StepResult:
    """The outcome of one batch step: per-row tensors (host, int64/bool) and the per-request records."""

    def __init__(self, request_ids: tuple[str, ...], width: int, results: Sequence[RoundResult]) -> None:
        """Internal: built by ``step_batch`` from the step's results in row order."""
        self.request_ids = request_ids
        """Row b's request id."""
        self._width = width
        self._results = tuple(results)

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
