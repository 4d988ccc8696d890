"""The one documented exception tree of specround.

Every error the library raises on purpose derives from :class:`SpecroundError`. Bad input is refused with
an :class:`InputError` subclass *before* any state changes; errors that report a broken protocol or a
damaged log have their own branches so that a caller can tell "you asked for something invalid" from
"someone else won the race" from "the log is not trustworthy".

```
SpecroundError
├── InputError (also ValueError)
│   ├── NonFiniteProbabilityError
│   ├── NegativeMassError
│   ├── NotNormalisedError
│   ├── ShapeMismatchError
│   ├── DraftIdOutOfVocabError
│   ├── ZeroProposalProbabilityError
│   ├── UnknownLayoutError
│   ├── InvalidProcessorError
│   ├── InvalidRequestError
│   │   └── UnsupportedGenerationConfigError
│   ├── ReportOptionError
│   └── LedgerDeclarationError
│       ├── UnreachableRateError
│       ├── MissingProgressTokenError
│       └── NegativeCostError
├── StaleCoordinateError
├── ProtocolError
│   ├── IllegalTransitionError
│   ├── StagingValidationError
│   ├── RequestFinishedError
│   └── CacheProtocolError
├── PublishConflictError
│   ├── StaleGenerationError
│   └── DuplicateRoundError
├── InjectedFaultError
├── EventLogError
│   ├── LogUnavailableError
│   ├── SchemaVersionError
│   ├── LogIntegrityError
│   └── InvalidLogUrlError (also InputError)
└── ModelError
    ├── ModelLoadError
    └── UnknownProposerError
```
"""

from __future__ import annotations

__all__ = [
    "CacheProtocolError",
    "DraftIdOutOfVocabError",
    "DuplicateRoundError",
    "EventLogError",
    "IllegalTransitionError",
    "InjectedFaultError",
    "InputError",
    "InvalidLogUrlError",
    "InvalidProcessorError",
    "InvalidRequestError",
    "LedgerDeclarationError",
    "LogIntegrityError",
    "LogUnavailableError",
    "MissingProgressTokenError",
    "ModelError",
    "ModelLoadError",
    "NegativeCostError",
    "NegativeMassError",
    "NonFiniteProbabilityError",
    "NotNormalisedError",
    "ProtocolError",
    "PublishConflictError",
    "ReportOptionError",
    "RequestFinishedError",
    "SchemaVersionError",
    "ShapeMismatchError",
    "SpecroundError",
    "StagingValidationError",
    "StaleCoordinateError",
    "StaleGenerationError",
    "UnknownLayoutError",
    "UnknownProposerError",
    "UnreachableRateError",
    "UnsupportedGenerationConfigError",
    "ZeroProposalProbabilityError",
]


class SpecroundError(Exception):
    """Root of every error specround raises deliberately."""


# --- bad input ------------------------------------------------------------------------------------------


class InputError(SpecroundError, ValueError):
    """Malformed input, refused before any state changed."""


class NonFiniteProbabilityError(InputError):
    """A probability row holds NaN or an infinity."""


class NegativeMassError(InputError):
    """A probability row holds a negative entry."""


class NotNormalisedError(InputError):
    """A probability row does not sum to one within the documented tolerance."""


class ShapeMismatchError(InputError):
    """Tensor shapes, vocabulary sizes or batch sizes disagree."""


class DraftIdOutOfVocabError(InputError):
    """A draft token id lies outside ``[0, V)``."""


class ZeroProposalProbabilityError(InputError):
    """A draft token has q(d) = 0: the proposal could not have sampled it (contract#degenerate-cases)."""


class UnknownLayoutError(InputError):
    """A verification layout other than ``replay_frontier`` or ``retained_frontier``."""


class InvalidProcessorError(InputError):
    """A logit processor was declared with invalid parameters."""


class InvalidRequestError(InputError):
    """A request or round was opened with invalid parameters (empty prompt, zero budget, ...)."""


class UnsupportedGenerationConfigError(InvalidRequestError):
    """A transformers ``GenerationConfig`` sets fields that specround cannot honour exactly.

    ``fields`` names every such field; nothing is ignored silently.
    """

    def __init__(self, fields: list[str], detail: str = "") -> None:
        self.fields = sorted(fields)
        """The refused fields, sorted."""
        message = "unsupported generation settings: " + ", ".join(self.fields)
        super().__init__(f"{message} ({detail})" if detail else message)


class ReportOptionError(InputError):
    """A report, telemetry or log-query option is refused (bad filter, time window or output path)."""


class LedgerDeclarationError(InputError):
    """A speedup-ledger declaration (profile, progress, costs, rounds) is refused: contract#speedup-ledger."""


class UnreachableRateError(LedgerDeclarationError):
    """An acceptance rate is not reach-conditioned, or is declared for a position no round can reach."""


class MissingProgressTokenError(LedgerDeclarationError):
    """Round progress omits the correction/bonus token: G is min(A + 1, H), not A: contract#round-progress."""


class NegativeCostError(LedgerDeclarationError):
    """A declared or observed cost term is negative (a hidden credit is not a cost, contract#time-ledger)."""


# --- provenance -----------------------------------------------------------------------------------------


class StaleCoordinateError(SpecroundError):
    """A proposal or verification bound to one round coordinate met another (contract#stale-coordinate)."""


# --- protocol -------------------------------------------------------------------------------------------


class ProtocolError(SpecroundError):
    """The round protocol was driven out of order or produced an inconsistent successor."""


class IllegalTransitionError(ProtocolError):
    """A lifecycle trigger that the round's current state does not allow."""


class StagingValidationError(ProtocolError):
    """A staged successor failed its token-identity validation (contract#staging) and was not published."""


class RequestFinishedError(ProtocolError):
    """A round was requested for a request that has already finished."""


class CacheProtocolError(ProtocolError):
    """A model's per-request K/V cache was driven out of order (contract#staging).

    An unknown or already open request, a stale or foreign branch handle, mixed layouts, or a retained
    frontier that does not match the frontier being verified.
    """


# --- publication fence ----------------------------------------------------------------------------------


class PublishConflictError(SpecroundError):
    """Publication was refused by the generation fence."""


class StaleGenerationError(PublishConflictError):
    """A different transaction already published at this generation (compare-and-swap lost)."""


class DuplicateRoundError(PublishConflictError):
    """A round id was reused for a different transaction."""


# --- failure injection ----------------------------------------------------------------------------------


class InjectedFaultError(SpecroundError):
    """Raised at a configured fault point F-n to simulate a crash or error there."""

    def __init__(self, point: str, message: str | None = None) -> None:
        super().__init__(message or f"injected fault at {point}")
        self.point = point


# --- event log ------------------------------------------------------------------------------------------


class EventLogError(SpecroundError):
    """The event log could not be read or written."""


class LogUnavailableError(EventLogError):
    """The database could not be reached, was locked past its timeout, or refused the operation."""


class SchemaVersionError(EventLogError):
    """An event or database schema version this release cannot read."""


class LogIntegrityError(EventLogError):
    """The log contradicts itself: a broken hash chain or an event sequence replay cannot accept."""


class InvalidLogUrlError(EventLogError, InputError):
    """An event-log location is neither a filesystem path nor a usable SQLAlchemy URL (or no driver)."""


# --- models ---------------------------------------------------------------------------------------------


class ModelError(SpecroundError):
    """A model or proposer could not be built or run."""


class ModelLoadError(ModelError):
    """Model weights, tokenizer or configuration could not be loaded."""


class UnknownProposerError(ModelError, InputError):
    """A draft specification names no known proposer."""
