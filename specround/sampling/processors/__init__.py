"""Declared, ordered, hashed logit processors and the chain that turns logits into processed rows."""

from specround.sampling.processors.grammar import TokenGrammar
from specround.sampling.processors.history import BannedSequences, MinLength, NoRepeatNGram, SuppressTokens
from specround.sampling.processors.penalties import (
    FrequencyPenalty,
    PresencePenalty,
    RepetitionPenalty,
    TokenCountPenalty,
)
from specround.sampling.processors.processor import LogitProcessor, StopAutomaton
from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain
from specround.sampling.processors.registry import PROCESSOR_KINDS, build_processor, processor_from_spec
from specround.sampling.processors.stateless import Greedy, LogitBias, MinP, Temperature, TopK, TopP
from specround.sampling.processors.stop import StopSequences
from specround.sampling.processors.stop_strings import StopStrings

__all__ = [
    "PROCESSOR_KINDS",
    "BannedSequences",
    "FrequencyPenalty",
    "Greedy",
    "LogitBias",
    "LogitProcessor",
    "MinLength",
    "MinP",
    "NoRepeatNGram",
    "PresencePenalty",
    "ProcessorChain",
    "RepetitionPenalty",
    "StopAutomaton",
    "StopSequences",
    "StopStrings",
    "SuppressTokens",
    "Temperature",
    "TokenCountPenalty",
    "TokenGrammar",
    "TopK",
    "TopP",
    "build_processor",
    "processor_from_spec",
    "sampling_chain",
]
