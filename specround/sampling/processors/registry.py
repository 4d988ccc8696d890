"""The registry of processor kinds: build a processor by name, or rebuild one from its logged spec."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from specround.errors import InvalidProcessorError
from specround.sampling.processors.grammar import TokenGrammar
from specround.sampling.processors.history import BannedSequences, MinLength, NoRepeatNGram, SuppressTokens
from specround.sampling.processors.penalties import FrequencyPenalty, PresencePenalty, RepetitionPenalty
from specround.sampling.processors.processor import LogitProcessor
from specround.sampling.processors.stateless import Greedy, LogitBias, MinP, Temperature, TopK, TopP
from specround.sampling.processors.stop import StopSequences
from specround.sampling.processors.stop_strings import StopStrings

__all__ = ["PROCESSOR_KINDS", "build_processor", "processor_from_spec"]

PROCESSOR_KINDS: Mapping[str, type[LogitProcessor]] = MappingProxyType(
    {
        cls.kind: cls
        for cls in (
            Temperature,
            Greedy,
            TopK,
            TopP,
            MinP,
            LogitBias,
            RepetitionPenalty,
            FrequencyPenalty,
            PresencePenalty,
            StopSequences,
            TokenGrammar,
            NoRepeatNGram,
            BannedSequences,
            SuppressTokens,
            MinLength,
            StopStrings,
        )
    }
)
"""Every processor kind by its registry name (read-only)."""


def _kind_class(kind: Any) -> type[LogitProcessor]:
    if not isinstance(kind, str) or kind not in PROCESSOR_KINDS:
        raise InvalidProcessorError(f"unknown processor kind {kind!r}; known: {sorted(PROCESSOR_KINDS)}")
    return PROCESSOR_KINDS[kind]


def build_processor(kind: str, **params: Any) -> LogitProcessor:
    """A fresh processor of ``kind`` from its declared parameters, e.g. ``build_processor("top_k", k=40)``."""
    return _kind_class(kind).from_spec(dict(params), {})


def processor_from_spec(spec: Mapping[str, Any]) -> LogitProcessor:
    """Rebuild a processor from ``{"kind", "params", "state"}`` (``state`` may be omitted or ``{}``)."""
    if not isinstance(spec, Mapping):
        raise InvalidProcessorError(f"a processor spec must be a mapping, got {type(spec).__name__}")
    unknown = set(spec) - {"kind", "params", "state"}
    if unknown or "kind" not in spec:
        raise InvalidProcessorError(
            f"a processor spec needs 'kind' and allows 'params', 'state'; got {sorted(spec)}"
        )
    params = spec.get("params", {})
    state = spec.get("state", {})
    if not isinstance(params, Mapping) or not isinstance(state, Mapping):
        raise InvalidProcessorError("processor params and state must be mappings")
    return _kind_class(spec["kind"]).from_spec(dict(params), dict(state))
