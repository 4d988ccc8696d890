"""What :func:`specround.hf.generate` returns, in transformers' conventions.

``sequences`` is ``[B, L_in + N]``: the caller's ``input_ids`` (left padding kept) followed by each row's
generated tokens, padded with ``pad_token_id`` after the row's end (``N`` is the longest row). With
``return_dict_in_generate=True`` the caller gets :class:`SpecroundGenerateOutput`, which also carries, when
asked, ``scores`` (per emitted position ``[B, V]`` log-probabilities of the processed target distribution:
transformers' processed scores up to a per-row constant) and ``logits`` (the raw target logits ``[B, V]``);
a row that has already finished holds NaN there. specround's per-round statistics come with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specround.errors import InvalidRequestError
from specround.serving.run_stats import AcceptanceStats, RoundOutcome

__all__ = ["SpecroundGenerateOutput", "pad_sequences", "stack_positions"]


@dataclass(frozen=True, slots=True)
class SpecroundGenerateOutput:
    """transformers' ``GenerateDecoderOnlyOutput`` fields plus specround's statistics."""

    sequences: torch.Tensor
    """[B, L_in + N] int64."""
    scores: tuple[torch.Tensor, ...] | None
    """N tensors [B, V]: log-probabilities of the processed target rows (when ``output_scores``)."""
    logits: tuple[torch.Tensor, ...] | None
    """N tensors [B, V]: raw target logits (when ``output_logits``)."""
    request_ids: tuple[str, ...]
    """The log's request id of every row."""
    rounds: tuple[tuple[RoundOutcome, ...], ...]
    """Every published round of every row."""
    stats: tuple[AcceptanceStats, ...]
    """Per-row acceptance statistics."""
    totals: AcceptanceStats
    """Statistics over every row."""
    finish_reasons: tuple[str | None, ...]
    """Why each row stopped (``stop_token``, ``max_new_tokens``, ...)."""
    log: str
    """Where the event log is: a SQLite path, a URL (password hidden), or ``memory``."""
    wall_s: float
    """Seconds spent in generation (prefill included)."""


def pad_sequences(
    input_ids: torch.Tensor, generated: Sequence[Sequence[int]], pad_token_id: int | None
) -> torch.Tensor:
    """``input_ids`` then each row's tokens, right-padded with ``pad_token_id``, on ``input_ids``' device.

    transformers returns its sequences where the caller's ids are (an accelerator's, for a model there).
    """
    width = max((len(g) for g in generated), default=0)
    if pad_token_id is None and any(len(g) != width for g in generated):
        raise InvalidRequestError("rows finished at different lengths and no pad_token_id is set")
    tail = torch.full((len(generated), width), pad_token_id or 0, dtype=torch.int64)  # [B, N]
    for b, tokens in enumerate(generated):
        if tokens:
            tail[b, : len(tokens)] = torch.tensor(list(tokens), dtype=torch.int64)
    return torch.cat((input_ids.to(torch.int64), tail.to(input_ids.device)), dim=1)


def stack_positions(rows: Sequence[Sequence[torch.Tensor]], vocab_size: int) -> tuple[torch.Tensor, ...]:
    """Per position ``[B, V]`` from each row's list of ``[V]`` tensors; rows that ended hold NaN.

    The frames are float32 on the rows' device (the target's), as transformers returns its scores.
    """
    width = max((len(r) for r in rows), default=0)
    device = next((r[0].device for r in rows if r), torch.device("cpu"))
    out = []
    for j in range(width):
        frame = torch.full(
            (len(rows), vocab_size), float("nan"), dtype=torch.float32, device=device
        )  # [B, V]
        for b, row in enumerate(rows):
            if j < len(row):
                frame[b] = row[j].to(torch.float32)
        out.append(frame)
    return tuple(out)
