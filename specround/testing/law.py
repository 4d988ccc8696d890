"""The exact target law of the first H generated tokens, computed from the target model itself.

The law is a prefix tree. Its root is the prompt; a node is a prefix of generated tokens; expanding a node
runs the target on ``prompt + prefix`` and processes the row with the kit's processor chain advanced over
exactly ``prompt + prefix`` (stateful penalties included), which gives the conditional law of the next
token. H = 1 is the processed row of the prompt; for H >= 2 the tree is expanded along the prefixes that
occur, i.e. every node the N samples are expected to visit at least ``min_expected`` times
(``N * P(prefix) >= min_expected``), level by level in one batched model call per level. The partition
depends on the target and N only, never on the samples, so the chi-square test over it is valid.

The cells of the law are the leaves: a complete sequence (H tokens, or ended by EOS) or an unexpanded
prefix, which holds every continuation of it. :meth:`CellLaw.cell_of` maps a sample to its cell, or to
``None`` when the target gives it probability 0 (a token outside the processed support, a token after
EOS, a sequence ending early).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specround.errors import InvalidRequestError
from specround.testing.models import LogitsModel
from specround.testing.settings import SamplingSettings

__all__ = ["DEFAULT_MAX_NODES", "CellLaw", "target_law"]

DEFAULT_MAX_NODES = 2048
"""At most this many nodes are expanded (most probable first within a level): bounds the model calls."""


@dataclass(frozen=True)
class CellLaw:
    """The target's law of the first ``horizon`` tokens on a partition into prefix cells."""

    prompt: tuple[int, ...]
    horizon: int
    eos_token_id: int | None
    cells: dict[tuple[int, ...], float]
    """Cell prefix -> probability; the probabilities sum to one."""
    rows: dict[tuple[int, ...], torch.Tensor] = field(repr=False)
    """Expanded node -> its processed next-token row ``[V]`` float64."""

    def complete(self, prefix: tuple[int, ...]) -> bool:
        """Whether ``prefix`` is a whole sequence (horizon reached or ended by EOS)."""
        ended = bool(prefix) and self.eos_token_id is not None and prefix[-1] == self.eos_token_id
        return len(prefix) >= self.horizon or ended

    def cell_of(self, sample: Sequence[int]) -> tuple[int, ...] | None:
        """The cell holding ``sample``, or None when the target gives it probability 0."""
        seq = tuple(sample)
        if len(seq) > self.horizon:
            return None
        node: tuple[int, ...] = ()
        for token in seq:
            if self.complete(node):
                return None  # a token after EOS
            row = self.rows.get(node)
            if row is None:
                return node  # an unexpanded cell holds every continuation
            if not 0 <= token < row.shape[0] or float(row[token]) <= 0.0:
                return None
            node = (*node, token)
        if not self.complete(node):
            return None if node in self.rows else node  # ended early (EOS missing) or unexpanded
        return node

    @property
    def expanded(self) -> int:
        """Number of expanded nodes (target rows computed)."""
        return len(self.rows)


def target_law(
    model: LogitsModel,
    settings: SamplingSettings,
    prompt: Sequence[int],
    horizon: int,
    *,
    samples: int | None = None,
    min_expected: float = 5.0,
    max_nodes: int = DEFAULT_MAX_NODES,
) -> CellLaw:
    """The exact law of ``horizon`` tokens after ``prompt`` under ``settings``, expanded for ``samples``.

    ``samples = None`` expands every node of positive probability (the full joint; feasible for tiny
    vocabularies only). Otherwise a node is expanded when ``samples * P(node) >= min_expected``.
    """
    if horizon < 1:
        raise InvalidRequestError(f"horizon must be >= 1, got {horizon}")
    if not prompt:
        raise InvalidRequestError("the prompt must hold at least one token")
    prompt_ids = tuple(int(t) for t in prompt)
    base = settings.chain(model.vocab_size)
    base.advance_many(prompt_ids)
    law = CellLaw(prompt_ids, horizon, settings.eos_token_id, {}, {})
    level: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    budget = max_nodes
    while level:
        expand = [
            (prefix, mass)
            for prefix, mass in level
            if not law.complete(prefix) and (samples is None or samples * mass >= min_expected)
        ]
        expand.sort(key=lambda item: -item[1])
        expand = expand[: max(0, budget)]
        budget -= len(expand)
        chosen = {prefix for prefix, _ in expand}
        for prefix, mass in level:
            if prefix not in chosen:
                law.cells[prefix] = law.cells.get(prefix, 0.0) + mass
        if not expand:
            break
        logits = model.next_logits([prompt_ids + prefix for prefix, _ in expand])  # [n, V]
        nxt: list[tuple[tuple[int, ...], float]] = []
        for (prefix, mass), row in zip(expand, logits, strict=True):
            chain = base.clone()
            chain.advance_many(prefix)
            probs = chain.distribution(row.to(torch.float64))  # [V]
            law.rows[prefix] = probs
            for token in torch.nonzero(probs > 0).flatten().tolist():
                nxt.append(((*prefix, int(token)), mass * float(probs[token])))
        level = nxt
    return law
