"""Batched drafting for the transformers path: an assistant model, or prompt lookup.

:class:`AssistantDrafter` drafts every row of the batch with ONE assistant forward per draft step
(:class:`~specround.hf.batch_cache.BatchedCausalLM`): the first step feeds each row the published tokens its
cache lacks (at least the frontier), each later step one draft. Each step's last row is processed by the
row's assistant chain at the state advanced over the drafts so far, and the draft is drawn by inverse CDF
from that exact row with one PROPOSAL uniform ``(seed, PROPOSAL, counter + i)``; that row is q. After
publication each row's cache is cut back to the longest prefix of the published output it shares.

:class:`LookupDrafter` is transformers' prompt lookup: the tokens that followed the first earlier copy (left
to right) of the row's last n-gram, n from ``max_matching_ngram_size`` down to 1, cut before the first
end-of-sequence token, with one-hot q rows. transformers also crops a candidate that its logits processors
forbid; here such a draft is proposed and rejected by the exact rule (its p is 0), which costs acceptance,
never exactness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from specround.adapters.proposers.cache_prefix import rows_to_keep
from specround.adapters.proposers.ngram import lookup_continuation
from specround.errors import InvalidRequestError
from specround.hf.batch_cache import BatchedCausalLM
from specround.hf.draft_draws import draw_tokens, proposal_uniforms
from specround.sampling.processors.processor_chain import ProcessorChain

__all__ = ["AssistantDrafter", "Draft", "DraftAsk", "Drafter", "LookupDrafter"]


@dataclass(slots=True)
class DraftAsk:
    """What one row asks of the drafter this step."""

    row: int
    context: Sequence[int]
    """The published output ``O`` (prompt, generated tokens; the last one is the frontier)."""
    k: int
    chain: ProcessorChain
    """The row's q chain at its published state (a clone the drafter may advance)."""
    seed: int
    counter: int
    """The row's next PROPOSAL counter."""


@dataclass(frozen=True, slots=True)
class Draft:
    """One row's drafts and the q rows that drew them."""

    tokens: tuple[int, ...]
    q_rows: torch.Tensor
    """[k, V]"""
    draws: int
    """PROPOSAL uniforms used."""


class Drafter(Protocol):
    """A batched proposer."""

    @property
    def proposer_id(self) -> str:
        """Bound into every round coordinate as ``draft_model_id``."""
        ...

    @property
    def cost_hint(self) -> float | None:
        """Declared cost of one draft token relative to a target step (None: measure it)."""
        ...

    def propose(self, asks: Sequence[DraftAsk]) -> dict[int, Draft]:
        """Drafts for every row asked (k = 0 rows get none)."""
        ...

    def on_published(self, row: int, output: Sequence[int]) -> None:
        """The row published ``output``: roll back whatever it does not share."""
        ...

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Forget every row not in ``rows`` (finished)."""
        ...


class AssistantDrafter:
    """Drafts from an assistant model, all rows in one forward per draft step."""

    def __init__(self, model: Any, rows: Sequence[int], *, vocab_size: int, filler_id: int = 0) -> None:
        self.engine = BatchedCausalLM(model, rows, filler_id=filler_id)
        """The assistant over the batch."""
        if self.engine.vocab_size != vocab_size:
            raise InvalidRequestError(
                f"the assistant's vocabulary ({self.engine.vocab_size}) differs from the target's "
                f"({vocab_size})"
            )
        self._vocab = vocab_size
        name = getattr(model.config, "_name_or_path", "") or type(model).__name__
        self._proposer_id = f"hf-assistant:{name}"

    @property
    def proposer_id(self) -> str:
        """``hf-assistant:<name or class>``."""
        return self._proposer_id

    @property
    def cost_hint(self) -> float | None:
        """Unknown until measured."""
        return None

    def propose(self, asks: Sequence[DraftAsk]) -> dict[int, Draft]:
        """Draft ``k`` tokens per row (``max k`` assistant forwards for the whole batch)."""
        engine = self.engine
        active = [a for a in asks if a.k > 0]
        drafts: dict[int, list[int]] = {a.row: [] for a in asks}
        rows_q: dict[int, list[torch.Tensor]] = {a.row: [] for a in asks}
        feeds: dict[int, list[int]] = {}
        for ask in active:
            committed = engine.tokens[ask.row]
            keep = rows_to_keep(committed, ask.context)
            engine.truncate(ask.row, keep)
            feeds[ask.row] = list(ask.context[keep:])
        engine.tidy()
        # Every uniform of the call in one Philox evaluation: row a's draft i uses counter a.counter + i.
        u = proposal_uniforms(
            [a.seed for a in active], [a.counter for a in active], max((a.k for a in active), default=0)
        )  # [B, k_max]
        slot = {a.row: index for index, a in enumerate(active)}
        step = 0
        while active:
            logits = engine.forward({a.row: feeds[a.row] for a in active}, rows="last")
            engine.commit({a.row: len(feeds[a.row]) for a in active})
            q = torch.stack([a.chain.distribution(logits[a.row][-1]) for a in active])  # [B, V]
            u_step = u[[slot[a.row] for a in active], step]  # [B]
            tokens = draw_tokens(q, u_step).tolist()  # [B]
            for index, ask in enumerate(active):
                token = int(tokens[index])
                drafts[ask.row].append(token)
                rows_q[ask.row].append(q[index])
                ask.chain.advance(token)
                feeds[ask.row] = [token]
            step += 1
            active = [a for a in active if len(drafts[a.row]) < a.k]
        out = {}
        for ask in asks:
            got = rows_q[ask.row]
            q_rows = torch.stack(got) if got else torch.empty(0, self._vocab)
            out[ask.row] = Draft(tuple(drafts[ask.row]), q_rows, draws=len(got))
        return out

    def on_published(self, row: int, output: Sequence[int]) -> None:
        """Cut the row's cache to the longest prefix of ``output[:-1]`` it shares."""
        committed = self.engine.tokens.get(row)
        if committed is not None:
            keep = rows_to_keep(committed, output)
            self.engine.truncate(row, keep)

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Drop finished rows from the assistant's batch."""
        self.engine.tidy(rows)


class LookupDrafter:
    """transformers' prompt lookup with one-hot q rows (no randomness)."""

    def __init__(self, vocab_size: int, *, max_ngram: int = 2, eos_token_ids: Sequence[int] = ()) -> None:
        if max_ngram < 1:
            raise InvalidRequestError(f"max_matching_ngram_size must be >= 1, got {max_ngram}")
        self._vocab = vocab_size
        self.max_ngram = max_ngram
        """The longest n-gram matched."""
        self.eos_token_ids = frozenset(eos_token_ids)
        """The drafts stop before the first of these."""

    @property
    def proposer_id(self) -> str:
        """``hf-prompt-lookup:1-<n>``."""
        return f"hf-prompt-lookup:1-{self.max_ngram}"

    @property
    def cost_hint(self) -> float | None:
        """A lookup costs nothing next to a target step."""
        return 0.0

    def propose(self, asks: Sequence[DraftAsk]) -> dict[int, Draft]:
        """Up to ``k`` looked-up tokens per row."""
        out = {}
        for ask in asks:
            tokens = lookup_continuation(ask.context, ask.k, self.max_ngram, 1, earliest=True)
            for i, token in enumerate(tokens):
                if token in self.eos_token_ids:
                    del tokens[i:]
                    break
            q_rows = torch.zeros(len(tokens), self._vocab)  # [k, V]
            if tokens:
                q_rows[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
            out[ask.row] = Draft(tuple(tokens), q_rows, draws=0)
        return out

    def on_published(self, row: int, output: Sequence[int]) -> None:
        """Stateless."""
        del row, output

    def keep_rows(self, rows: Sequence[int]) -> None:
        """Stateless."""
        del rows
