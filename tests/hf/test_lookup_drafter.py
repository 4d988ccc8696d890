"""The drop-in's prompt lookup drafts exactly what transformers' own prompt lookup proposes."""

from __future__ import annotations

import random

import torch
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specround.adapters.proposers.ngram import lookup_continuation
from specround.hf.drafting import DraftAsk, LookupDrafter
from specround.sampling.processors.processor_chain import ProcessorChain


def _transformers_candidates(context: list[int], k: int, max_ngram: int, eos: int | None) -> list[int]:
    generator = PromptLookupCandidateGenerator(
        eos_token_id=None if eos is None else torch.tensor([eos]),
        num_output_tokens=k,
        max_matching_ngram_size=max_ngram,
        max_length=10_000,
    )
    ids = torch.tensor([context], dtype=torch.int64)
    candidates, _ = generator.get_candidates(ids)
    return [int(t) for t in candidates[0, len(context) :]]


def test_drafts_equal_transformers_prompt_lookup_on_random_contexts() -> None:
    """400 random contexts over small alphabets (many repeated n-grams), with and without an EOS id."""
    rng = random.Random(5)
    differing_orders = 0
    for case in range(400):
        context = [rng.randrange(rng.choice((2, 3, 6))) for _ in range(rng.randrange(2, 50))]
        k, max_ngram = rng.randrange(1, 6), rng.randrange(1, 4)
        eos = rng.choice((None, 0, 1))
        drafter = LookupDrafter(8, max_ngram=max_ngram, eos_token_ids=() if eos is None else (eos,))
        ask = DraftAsk(0, tuple(context), k, ProcessorChain(vocab_size=8), seed=0, counter=0)
        draft = drafter.propose([ask])[0]
        expected = _transformers_candidates(context, k, max_ngram, eos)
        assert list(draft.tokens) == expected, (case, context, k, max_ngram, eos)
        assert draft.draws == 0
        assert draft.q_rows.shape == (len(expected), 8)
        assert torch.equal(draft.q_rows.sum(dim=1), torch.ones(len(expected)))  # one-hot rows
        assert all(float(draft.q_rows[i, t]) == 1.0 for i, t in enumerate(expected))
        differing_orders += lookup_continuation(context, k, max_ngram) != lookup_continuation(
            context, k, max_ngram, earliest=True
        )
    assert differing_orders > 20  # the contexts do tell the first match from the latest one
