"""A real request as the z3 model sees it: its configuration, its processed tokens, the witness limits.

Also the defaults every conformance scenario shares: the event log it writes (:data:`LogFactory`) and the
request seeds derived from scenario names (:func:`seed_for`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

from specround.errors import InputError
from specround.model_check.z3.protocol_state import ProtocolConfig
from specround.statemachine.invariants import processors_after
from specround.statemachine.ports import EventLog
from specround.statemachine.state import RequestConfig, RequestState

__all__ = [
    "UNMATCHED_PROCESSORS",
    "WITNESS_MAX_DRAFT",
    "WITNESS_MAX_NEW",
    "WITNESS_MAX_PROMPT",
    "WITNESS_VOCAB",
    "LogFactory",
    "memory_log",
    "model_config",
    "model_config_args",
    "processed_tokens",
    "seed_for",
]

WITNESS_VOCAB = 8
"""Vocabulary of the witness requests (token ids of a witness lie in ``[0, WITNESS_VOCAB)``)."""
WITNESS_MAX_DRAFT = 4
"""Largest draft length z3 may choose for a witness round."""
WITNESS_MAX_PROMPT = 4
"""Longest witness prompt."""
WITNESS_MAX_NEW = 10
"""Largest witness output budget."""
UNMATCHED_PROCESSORS = -2
"""The processed-token list of a state whose processor digest matches no chain advanced over its generated
tokens (a value no token id takes, so the model's INV-4 comparison fails on it)."""


LogFactory = Callable[[], EventLog]
"""Makes a fresh, empty event log (the memory log by default)."""


def memory_log() -> EventLog:
    """A fresh in-memory event log with a fixed clock (the default :data:`LogFactory`)."""
    from specround.adapters.memory_log import MemoryEventLog

    return MemoryEventLog(clock=lambda: 0.0)


def seed_for(name: str) -> int:
    """A request seed derived from a scenario's name (stable across runs)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little")


def _stop_ids(config: RequestConfig) -> tuple[int, ...]:
    """Single-token stop ids of a request (the model knows no longer stop sequences)."""
    stops: set[int] = set()
    for spec in config.processors:
        if spec["kind"] != "stop_sequences":
            continue
        for sequence in spec["params"]["sequences"]:
            if len(sequence) != 1:
                raise InputError(
                    f"request {config.request_id!r} has the stop sequence {sequence}; the z3 model knows "
                    "single-token stops only"
                )
            stops.add(int(sequence[0]))
    return tuple(sorted(stops))


def model_config_args(config: RequestConfig, max_draft: int) -> dict[str, Any]:
    """The keyword arguments of :meth:`ProtocolConfig.concrete` for a real request."""
    return {
        "max_draft": max_draft,
        "layout": config.layout,
        "prompt_len": len(config.prompt_ids),
        "max_new": config.max_new_tokens,
        "stop_ids": _stop_ids(config),
    }


def model_config(config: RequestConfig, max_draft: int) -> ProtocolConfig:
    """The z3 configuration of a real request for rounds of at most ``max_draft`` drafts."""
    return ProtocolConfig.concrete(**model_config_args(config, max_draft))


def processed_tokens(config: RequestConfig, state: RequestState) -> tuple[int, ...]:
    """G as the model sees it: the generated tokens if the processors were advanced over exactly them.

    Returns ``(UNMATCHED_PROCESSORS,)`` when the state's processor digest is not the declared chain's after
    those tokens (advanced over something else, or in another order).
    """
    matched = processors_after(config, state).digest() == state.processors_digest
    return state.generated if matched else (UNMATCHED_PROCESSORS,)
