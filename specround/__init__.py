"""specround: exact speculative decoding run as an audited, event-sourced transaction.

A cheap proposer drafts K tokens; the target scores them in one pass; the exact sampler accepts each with
min(1, p/q), corrects the first rejection from the normalised residual max(p - q, 0), and emits a bonus
target token when every draft survives. Each such **round** is a transaction
ROUND_READY -> VERIFIED_TEMPORARY -> DECIDED -> STAGED -> PUBLISHED | ABORTED whose events are appended to
a SQL log that an auditor can replay and re-check.

Vocabulary (the same words are used in ``specs/`` and throughout the code):

request
    One generation stream with its own seed, processors, stop rules and budget.
round
    One draft / verify / decide / stage / publish cycle of one request.
step
    One engine iteration that runs the rounds of a batch of requests together (one database transaction).
output O
    Every token the request has emitted (prompt included), in order.
committed cache C
    The tokens whose target K/V rows are authoritative.
frontier F
    The one emitted token that has no K/V row yet; for an unfinished request C == O[:-1] and F == O[-1].
position P
    The absolute position of the next input row (the length of C).
processor state G
    The ordered, declared logit processors with the state of the stateful ones (penalties, automata).
RNG counters R
    The next unused counter of each counter-based stream (PROPOSAL, ACCEPT, TERMINAL).
generation V
    The request's publication version; publishing is a compare-and-swap on it.
draft tokens d_1..d_K, q rows
    The proposal and the processed proposal distributions that actually sampled it.
p rows p_1..p_{K+1}
    The processed target distributions along the drafted path; p_{K+1} owns the bonus.
A
    The number of accepted drafts. **terminal**: correction | bonus | stop.
layout
    ``replay_frontier`` (the verify pass replays the frontier) or ``retained_frontier`` (the frontier's
    K/V row and p_1 already exist). Both publish the same successor.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Public name -> module that defines it. Imported on first use, so `import specround` stays cheap (the
# command line starts without loading SQLAlchemy, matplotlib or the model code it does not need).
_EXPORTS: dict[str, str] = {
    # errors
    "SpecroundError": "specround.errors",
    "InputError": "specround.errors",
    "StaleCoordinateError": "specround.errors",
    "PublishConflictError": "specround.errors",
    "StaleGenerationError": "specround.errors",
    "InjectedFaultError": "specround.errors",
    "EventLogError": "specround.errors",
    "LogIntegrityError": "specround.errors",
    # sampling
    "PAD_ID": "specround.sampling.types",
    "Layout": "specround.sampling.types",
    "SamplerBatch": "specround.sampling.types",
    "SamplerDecision": "specround.sampling.types",
    "Stream": "specround.sampling.types",
    "TerminalKind": "specround.sampling.types",
    "uniforms": "specround.sampling.rng",
    "accepts": "specround.sampling.exact",
    "decide": "specround.sampling.exact",
    "decide_from_uniforms": "specround.sampling.exact",
    "inverse_cdf": "specround.sampling.exact",
    "ProcessorChain": "specround.sampling.processors.chain",
    "sampling_chain": "specround.sampling.processors",
    "build_processor": "specround.sampling.processors",
    "SoftmaxBackend": "specround.sampling.softmax",
    "RoundCoordinate": "specround.sampling.coordinate",
    "extract_verification": "specround.sampling.layouts",
    "visibility_mask": "specround.sampling.layouts",
    # state machine
    "RequestConfig": "specround.statemachine.state",
    "RequestState": "specround.statemachine.state",
    "SpeculativeCommit": "specround.statemachine.state",
    "RoundController": "specround.statemachine.controller",
    "Step": "specround.statemachine.controller",
    "StepResult": "specround.statemachine.step_result",
    "RoundInput": "specround.statemachine.rounds",
    "RoundProposal": "specround.statemachine.rounds",
    "RoundVerification": "specround.statemachine.rounds",
    "RoundResult": "specround.statemachine.rounds",
    "RoundStatus": "specround.statemachine.rounds",
    "KvInstruction": "specround.statemachine.rounds",
    "FaultPlan": "specround.statemachine.faults",
    "FaultPoint": "specround.statemachine.faults",
    "EventLog": "specround.statemachine.ports",
    "TargetModel": "specround.statemachine.model_ports",
    "Proposer": "specround.statemachine.model_ports",
    "replay_log": "specround.statemachine.replay",
    "verify_chain": "specround.statemachine.chain",
    # adapters
    "MemoryEventLog": "specround.adapters.memory_log",
    "SqlEventLog": "specround.adapters.sql",
    # audit
    "audit_log": "specround.audit",
}

__all__ = [
    "PAD_ID",
    "EventLog",
    "EventLogError",
    "FaultPlan",
    "FaultPoint",
    "InjectedFaultError",
    "InputError",
    "KvInstruction",
    "Layout",
    "LogIntegrityError",
    "MemoryEventLog",
    "ProcessorChain",
    "Proposer",
    "PublishConflictError",
    "RequestConfig",
    "RequestState",
    "RoundController",
    "RoundCoordinate",
    "RoundInput",
    "RoundProposal",
    "RoundResult",
    "RoundStatus",
    "RoundVerification",
    "SamplerBatch",
    "SamplerDecision",
    "SoftmaxBackend",
    "SpecroundError",
    "SpeculativeCommit",
    "SqlEventLog",
    "StaleCoordinateError",
    "StaleGenerationError",
    "Step",
    "StepResult",
    "Stream",
    "TargetModel",
    "TerminalKind",
    "accepts",
    "audit_log",
    "build_processor",
    "decide",
    "decide_from_uniforms",
    "extract_verification",
    "inverse_cdf",
    "replay_log",
    "sampling_chain",
    "uniforms",
    "verify_chain",
    "visibility_mask",
]

__version__ = "0.1.0"

if TYPE_CHECKING:
    from specround.adapters.memory_log import MemoryEventLog
    from specround.adapters.sql import SqlEventLog
    from specround.audit import audit_log
    from specround.errors import (
        EventLogError,
        InjectedFaultError,
        InputError,
        LogIntegrityError,
        PublishConflictError,
        SpecroundError,
        StaleCoordinateError,
        StaleGenerationError,
    )
    from specround.sampling.coordinate import RoundCoordinate
    from specround.sampling.exact import accepts, decide, decide_from_uniforms, inverse_cdf
    from specround.sampling.layouts import extract_verification, visibility_mask
    from specround.sampling.processors import build_processor, sampling_chain
    from specround.sampling.processors.chain import ProcessorChain
    from specround.sampling.rng import uniforms
    from specround.sampling.softmax import SoftmaxBackend
    from specround.sampling.types import PAD_ID, Layout, SamplerBatch, SamplerDecision, Stream, TerminalKind
    from specround.statemachine.chain import verify_chain
    from specround.statemachine.controller import RoundController, Step
    from specround.statemachine.faults import FaultPlan, FaultPoint
    from specround.statemachine.model_ports import Proposer, TargetModel
    from specround.statemachine.ports import EventLog
    from specround.statemachine.replay import replay_log
    from specround.statemachine.rounds import (
        KvInstruction,
        RoundInput,
        RoundProposal,
        RoundResult,
        RoundStatus,
        RoundVerification,
    )
    from specround.statemachine.state import RequestConfig, RequestState, SpeculativeCommit
    from specround.statemachine.step_result import StepResult


def __getattr__(name: str) -> Any:
    """Import a public name from the module that defines it, on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specround' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
