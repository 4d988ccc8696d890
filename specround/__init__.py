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

The top level exports what an embedder or an auditor uses: the controller and its step API, the request
and round types, the configuration types, the event-log port and its backends, the audit and replay
entry points, and the errors. Everything else is imported from the module that defines it: the sampler
kernels from ``specround.sampling.exact``, the layouts from ``specround.sampling.layouts``, the model
ports from ``specround.statemachine.model_ports``, the checkers from ``specround.model_check``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specround._lazy_exports import LazyExports as _LazyExports

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
    # configuration: layouts, processors, fault injection
    "PAD_ID": "specround.sampling.types",
    "Layout": "specround.sampling.types",
    "TerminalKind": "specround.sampling.types",
    "ProcessorChain": "specround.sampling.processors.processor_chain",
    "sampling_chain": "specround.sampling.processors.processor_chain",
    "FaultPlan": "specround.statemachine.faults",
    "FaultPoint": "specround.statemachine.faults",
    # requests and their published state
    "RequestConfig": "specround.statemachine.state",
    "RequestState": "specround.statemachine.state",
    "SpeculativeCommit": "specround.statemachine.state",
    "RoundCoordinate": "specround.sampling.coordinate",
    # the controller and its step API
    "RoundController": "specround.statemachine.controller",
    "Step": "specround.statemachine.step",
    "StepResult": "specround.statemachine.step_result",
    "PendingStep": "specround.statemachine.step_result",
    "RoundInput": "specround.statemachine.rounds",
    "RoundProposal": "specround.statemachine.rounds",
    "RoundVerification": "specround.statemachine.rounds",
    "RoundResult": "specround.statemachine.rounds",
    "RoundStatus": "specround.statemachine.rounds",
    "KvInstruction": "specround.statemachine.rounds",
    # event logs
    "EventLog": "specround.statemachine.ports",
    "MemoryEventLog": "specround.adapters.memory_log",
    "SqlEventLog": "specround.adapters.sql",
    # audit and replay
    "audit_log": "specround.audit",
    "AuditReport": "specround.audit",
    "AuditFinding": "specround.audit",
    "replay_log": "specround.statemachine.replay",
    "verify_chain": "specround.statemachine.chain_verification",
}

__all__ = [
    "PAD_ID",
    "AuditFinding",
    "AuditReport",
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
    "PendingStep",
    "ProcessorChain",
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
    "SpecroundError",
    "SpeculativeCommit",
    "SqlEventLog",
    "StaleCoordinateError",
    "StaleGenerationError",
    "Step",
    "StepResult",
    "TerminalKind",
    "audit_log",
    "replay_log",
    "sampling_chain",
    "verify_chain",
]

__version__ = "0.1.0"

if TYPE_CHECKING:
    from specround.adapters.memory_log import MemoryEventLog
    from specround.adapters.sql import SqlEventLog
    from specround.audit import AuditFinding, AuditReport, audit_log
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
    from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain
    from specround.sampling.types import PAD_ID, Layout, TerminalKind
    from specround.statemachine.chain_verification import verify_chain
    from specround.statemachine.controller import RoundController
    from specround.statemachine.faults import FaultPlan, FaultPoint
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
    from specround.statemachine.step import Step
    from specround.statemachine.step_result import PendingStep, StepResult


_LAZY = _LazyExports("specround", _EXPORTS, globals())


def __getattr__(name: str) -> Any:
    """Import a public name from the module that defines it, on first use."""
    return _LAZY.resolve(name)


def __dir__() -> list[str]:
    return _LAZY.names()
