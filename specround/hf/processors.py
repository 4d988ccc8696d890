"""GenerationSettings as specround processor chains, in the order transformers applies its processors.

Order (transformers' ``_get_logits_processor``): repetition penalty, no-repeat n-grams, banned sequences,
minimum length, suppressed tokens; then, when sampling, temperature, top-k, top-p and min-p, or, when not
sampling, the argmax (:class:`~specround.sampling.processors.Greedy`). Stop strings are a stop automaton at
the end; end-of-sequence tokens are the request's stop tokens. The same function builds the target's chain
(p) and, from the assistant's settings, the assistant's (q): both advance over the prompt, then over
published tokens only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specround.errors import InvalidRequestError
from specround.hf.generation_settings import GenerationSettings
from specround.sampling.processors.history import BannedSequences, MinLength, NoRepeatNGram, SuppressTokens
from specround.sampling.processors.penalties import RepetitionPenalty
from specround.sampling.processors.processor import LogitProcessor
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.processors.stateless import Greedy, MinP, Temperature, TopK, TopP
from specround.sampling.processors.stop_strings import StopStrings

__all__ = ["build_chain", "stop_strings_processor"]


def stop_strings_processor(
    settings: GenerationSettings, tokenizer: Any, vocab_size: int
) -> StopStrings | None:
    """The stop-strings automaton of the settings (None without stop strings); needs the tokenizer."""
    if not settings.stop_strings:
        return None
    if tokenizer is None:
        raise InvalidRequestError("stop_strings needs the tokenizer: pass tokenizer=... to generate")
    return StopStrings.from_tokenizer(settings.stop_strings, tokenizer, vocab_size)


def build_chain(
    settings: GenerationSettings,
    vocab_size: int,
    *,
    input_length: int,
    prompt_length: int,
    stop_strings: StopStrings | None = None,
) -> ProcessorChain:
    """The declared chain of one row (before it is advanced over the prompt).

    ``input_length`` is the padded width of ``input_ids`` (transformers counts ``min_length`` on it);
    ``prompt_length`` is the row's own prompt length (the chain's minimum-length counter starts there).
    """
    eos = [t for t in settings.eos_token_ids if 0 <= t < vocab_size]
    processors: list[LogitProcessor] = []
    if settings.repetition_penalty is not None:
        processors.append(RepetitionPenalty(settings.repetition_penalty))
    if settings.no_repeat_ngram_size is not None:
        processors.append(NoRepeatNGram(settings.no_repeat_ngram_size))
    banned: Sequence[tuple[int, ...]] = [
        seq for seq in settings.bad_words_ids if not (len(seq) == 1 and seq[0] in eos)
    ]
    if banned:
        processors.append(BannedSequences(banned))
    min_new = settings.min_new(input_length)
    if min_new and eos:
        processors.append(MinLength(prompt_length + min_new, eos))
    if settings.suppress_tokens:
        processors.append(SuppressTokens(settings.suppress_tokens))
    if settings.do_sample:
        if settings.temperature != 1.0:
            processors.append(Temperature(settings.temperature))
        if settings.top_k is not None:
            processors.append(TopK(min(settings.top_k, vocab_size)))
        if settings.top_p is not None:
            processors.append(TopP(settings.top_p))
        if settings.min_p is not None:
            processors.append(MinP(settings.min_p))
    else:
        processors.append(Greedy())
    if stop_strings is not None:
        processors.append(stop_strings)
    return ProcessorChain(processors, vocab_size=vocab_size)
