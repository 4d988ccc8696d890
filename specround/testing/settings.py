"""The sampling settings an engine is tested under, and the kit's processor chain for them.

One :class:`SamplingSettings` names the usual decoding knobs with the meaning Hugging Face's
``generate`` gives them (repetition penalty over the prompt and the generated tokens, then temperature,
top-k, top-p, min-p). :meth:`SamplingSettings.chain` builds specround's own processor chain for them
(:func:`specround.sampling.processors.sampling_chain`, the same order), from which the kit computes the
exact target law. The end-of-sequence token is not a processor: a sequence simply ends when it is emitted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specround.errors import InvalidRequestError
from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain

__all__ = ["SamplingSettings"]


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    """Decoding settings under test (``None`` leaves a knob off); validated on construction."""

    temperature: float = 1.0
    """Softmax temperature, > 0 (the kit tests sampling; greedy decoding has no law to test)."""
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    eos_token_id: int | None = None
    """The token that ends a sequence (None: only the horizon ends it)."""

    def __post_init__(self) -> None:
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise InvalidRequestError(f"temperature must be a finite number > 0, got {t!r}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or self.top_k < 1):
            raise InvalidRequestError(f"top_k must be a positive integer, got {self.top_k!r}")
        for name in ("top_p", "min_p"):
            value = getattr(self, name)
            if value is not None and not 0.0 < value <= 1.0:
                raise InvalidRequestError(f"{name} must lie in (0, 1], got {value!r}")
        penalty = self.repetition_penalty
        if penalty is not None and not (math.isfinite(penalty) and penalty > 0):
            raise InvalidRequestError(f"repetition_penalty must be a finite number > 0, got {penalty!r}")
        if self.eos_token_id is not None and self.eos_token_id < 0:
            raise InvalidRequestError(f"eos_token_id must be >= 0, got {self.eos_token_id!r}")

    def chain(self, vocab_size: int) -> ProcessorChain:
        """The processor chain for these settings over ``vocab_size`` tokens (not yet advanced)."""
        top_k = self.top_k if self.top_k is not None and self.top_k < vocab_size else None
        return sampling_chain(
            vocab_size,
            temperature=float(self.temperature),
            top_k=top_k,
            top_p=self.top_p if self.top_p is not None and self.top_p < 1.0 else None,
            min_p=self.min_p,
            repetition_penalty=self.repetition_penalty
            if self.repetition_penalty is not None and self.repetition_penalty != 1.0
            else None,
        )

    def label(self) -> str:
        """A short human-readable name, e.g. ``T=0.8 top_p=0.9``."""
        parts = [f"T={self.temperature:g}"]
        if self.top_k is not None:
            parts.append(f"top_k={self.top_k}")
        if self.top_p is not None:
            parts.append(f"top_p={self.top_p:g}")
        if self.min_p is not None:
            parts.append(f"min_p={self.min_p:g}")
        if self.repetition_penalty is not None:
            parts.append(f"rep={self.repetition_penalty:g}")
        return " ".join(parts)
