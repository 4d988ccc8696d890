"""Prompt-lookup (n-gram) proposer: continue the request's own text after an earlier copy of its suffix.

For n from ``max_ngram`` down to ``min_ngram``, the last n tokens of the context are searched for earlier in
the context; the most recent earlier occurrence wins (``earliest=True``: the first one, left to right, as
transformers' prompt lookup searches) and the tokens that followed it become the drafts (at most K, and no
more than the context holds after the match). No match gives zero drafts. The proposal
is a point mass, so each q row is one-hot, which is exact: acceptance is ``min(1, p(d))`` and the residual
is ``p`` with ``d`` removed. No randomness is used (zero PROPOSAL draws).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specround.errors import InvalidRequestError
from specround.statemachine.model_ports import Proposal, ProposalRequest

__all__ = ["NGramProposer", "lookup_continuation"]


def lookup_continuation(
    context: Sequence[int], k: int, max_ngram: int, min_ngram: int = 1, *, earliest: bool = False
) -> list[int]:
    """Up to ``k`` tokens that followed an earlier occurrence of the context's suffix.

    The longest matching n wins; among its occurrences the most recent, or with ``earliest`` the first one
    left to right.
    """
    if k <= 0:
        return []
    ids = [int(t) for t in context]
    length = len(ids)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        pattern = ids[length - n :]
        first = pattern[0]
        # Windows ids[s : s + n] with a successor (s + n <= length - 1), in search order; a plain int
        # comparison rules most starts out before a slice is compared.
        starts = range(length - n) if earliest else range(length - 1 - n, -1, -1)
        for s in starts:
            if ids[s] == first and ids[s : s + n] == pattern:
                return ids[s + n : s + n + k]
    return []


class NGramProposer:
    """Prompt lookup with one-hot q rows."""

    def __init__(self, vocab_size: int, *, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if vocab_size < 1 or not 1 <= min_ngram <= max_ngram:
            raise InvalidRequestError("need vocab_size >= 1 and 1 <= min_ngram <= max_ngram")
        self.vocab_size = vocab_size
        """V of the q rows."""
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @property
    def proposer_id(self) -> str:
        """``ngram:<min>-<max>``."""
        return f"ngram:{self.min_ngram}-{self.max_ngram}"

    def propose(self, requests: Sequence[ProposalRequest]) -> list[Proposal]:
        """Drafts and one-hot q rows [k, V] per request; ``proposal_draws`` is always 0."""
        for req in requests:
            if req.k < 0 or not req.context_ids:
                raise InvalidRequestError(f"request {req.request_id!r}: need k >= 0 and a non-empty context")
        out = []
        for req in requests:
            drafts = lookup_continuation(req.context_ids, req.k, self.max_ngram, self.min_ngram)
            draft_ids = torch.tensor(drafts, dtype=torch.int64)  # [k]
            q_rows = torch.zeros(len(drafts), self.vocab_size)  # [k, V]
            q_rows[torch.arange(len(drafts)), draft_ids] = 1.0
            out.append(Proposal(req.request_id, draft_ids, q_rows, proposal_draws=0))
        return out

    def on_published(self, request_id: str, output_ids: Sequence[int], cache_len: int) -> None:
        """Stateless: nothing to roll back."""
        del request_id, output_ids, cache_len

    def release(self, request_id: str) -> None:
        """Stateless: nothing to forget."""
        del request_id
