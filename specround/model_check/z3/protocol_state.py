"""The protocol model's state, a request's configuration, and what one round attempt receives.

State (:class:`ProtocolState`): output O and committed cache C as token arrays with lengths, frontier F,
position P, the tokens the processors advanced over G (its length is the processor-advance count), RNG
counters (proposal, accept, terminal), generation V, finished flag, the number of published round records
in the log, and the id of the last published transaction.

Each type is built symbolically (for the proofs) or from plain Python values (for conformance:
:meth:`ProtocolState.concrete`, :meth:`ProtocolState.from_request_state`, :meth:`RoundInputs.concrete`,
:meth:`ProtocolConfig.concrete`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import z3

from specround.errors import InputError
from specround.model_check.z3.terms import Bool, Int, TokenList
from specround.sampling.types import PAD_ID, Layout
from specround.statemachine.faults import NO_FAULT, FaultPoint
from specround.statemachine.state import RequestConfig, RequestState

__all__ = [
    "FAULT_POINTS",
    "FIRST_FAULT",
    "LAST_ABORTING_FAULT",
    "LOST_ACK_FAULT",
    "MAX_MODEL_DRAFT",
    "NO_FAULT",
    "NO_TXN",
    "ProtocolConfig",
    "ProtocolState",
    "RoundInputs",
    "fault_code",
]

MAX_MODEL_DRAFT = 8
"""Largest draft length K the model is built for (the proofs use exactly this K)."""
FAULT_POINTS: tuple[str, ...] = tuple(point.value for point in FaultPoint)
"""Fault points by name; the model encodes F-n as :attr:`FaultPoint.number` and "no fault" as ``NO_FAULT``."""
FIRST_FAULT = FaultPoint.AFTER_VERIFICATION.number
"""The model's code of the earliest fault point."""
LAST_ABORTING_FAULT = FaultPoint.BEFORE_PUBLICATION.number
"""The model's code of the last fault point that aborts the round (F-1..F-5 abort)."""
LOST_ACK_FAULT = FaultPoint.AFTER_PUBLICATION.number
"""The model's code of the fault after publication: durable, but the caller is not acknowledged."""
NO_TXN = -1
"""``last_txn`` of a request that has published nothing."""


def fault_code(point: str | None) -> int:
    """The model's integer for a fault point name (``None`` -> 0)."""
    if point is None:
        return NO_FAULT
    if point not in FAULT_POINTS:
        raise InputError(f"unknown fault point {point!r}; expected one of {FAULT_POINTS}")
    return FaultPoint(point).number


@dataclass(frozen=True)
class ProtocolState:
    """S = (O, C, F, P, G, R, V) plus the finished flag and the log's view of the request."""

    output: TokenList
    """O, prompt included."""
    cache: TokenList
    """C: tokens whose target K/V rows are committed, in position order."""
    frontier: Int
    """F."""
    position: Int
    """P: absolute position of the next input row."""
    processed: TokenList
    """G: the tokens the stateful processors advanced over, in order (length = advance count)."""
    rng_proposal: Int
    rng_accept: Int
    rng_terminal: Int
    generation: Int
    """V."""
    finished: Bool
    log_rounds: Int
    """Published round records in the log for this request."""
    last_txn: Int
    """Transaction id (an abstraction of the commit digest) of the last published round."""

    @classmethod
    def symbolic(cls, name: str) -> ProtocolState:
        """An unconstrained state whose constants are prefixed by ``name``."""
        return cls(
            output=TokenList.symbolic(f"{name}_O"),
            cache=TokenList.symbolic(f"{name}_C"),
            frontier=z3.Int(f"{name}_F"),
            position=z3.Int(f"{name}_P"),
            processed=TokenList.symbolic(f"{name}_G"),
            rng_proposal=z3.Int(f"{name}_rng_proposal"),
            rng_accept=z3.Int(f"{name}_rng_accept"),
            rng_terminal=z3.Int(f"{name}_rng_terminal"),
            generation=z3.Int(f"{name}_V"),
            finished=z3.Bool(f"{name}_finished"),
            log_rounds=z3.Int(f"{name}_log"),
            last_txn=z3.Int(f"{name}_txn"),
        )

    @classmethod
    def concrete(
        cls,
        *,
        output: Sequence[int],
        cache: Sequence[int],
        frontier: int,
        position: int,
        processed: Sequence[int],
        rng: tuple[int, int, int],
        generation: int,
        finished: bool,
        log_rounds: int | None = None,
        last_txn: int = NO_TXN,
    ) -> ProtocolState:
        """A state from plain values.

        ``rng`` is ``(proposal, accept, terminal)`` as in
        :meth:`~specround.statemachine.state.RngCounters.as_tuple`; ``log_rounds`` defaults to the
        generation; ``processed`` lists the tokens the processors consumed (for a chain advanced exactly
        over the generated tokens, the output after the prompt).
        """
        proposal, accept, terminal = rng
        return cls(
            output=TokenList.concrete(output),
            cache=TokenList.concrete(cache),
            frontier=z3.IntVal(frontier),
            position=z3.IntVal(position),
            processed=TokenList.concrete(processed),
            rng_proposal=z3.IntVal(proposal),
            rng_accept=z3.IntVal(accept),
            rng_terminal=z3.IntVal(terminal),
            generation=z3.IntVal(generation),
            finished=z3.BoolVal(finished),
            log_rounds=z3.IntVal(generation if log_rounds is None else log_rounds),
            last_txn=z3.IntVal(last_txn),
        )

    @classmethod
    def from_request_state(
        cls,
        state: RequestState,
        *,
        processed: Sequence[int],
        log_rounds: int | None = None,
        last_txn: int = NO_TXN,
    ) -> ProtocolState:
        """The model of a real :class:`~specround.statemachine.state.RequestState`.

        The state does not record which tokens its processors consumed, nor the log's view; a conformance
        harness passes them (``processed``: the tokens given to the chain's ``advance``).
        """
        if state.frontier is None:
            raise InputError(f"request {state.request_id!r} has no frontier; the model requires F == O[-1]")
        return cls.concrete(
            output=state.output,
            cache=state.cache,
            frontier=state.frontier,
            position=state.position,
            processed=processed,
            rng=state.rng.as_tuple(),
            generation=state.generation,
            finished=state.finished,
            log_rounds=log_rounds,
            last_txn=last_txn,
        )

    def identical(self, other: ProtocolState) -> Bool:
        """Every field equal (lists as arrays)."""
        return z3.And(
            self.output.identical(other.output),
            self.cache.identical(other.cache),
            self.frontier == other.frontier,
            self.position == other.position,
            self.processed.identical(other.processed),
            self.rng_proposal == other.rng_proposal,
            self.rng_accept == other.rng_accept,
            self.rng_terminal == other.rng_terminal,
            self.generation == other.generation,
            self.finished == other.finished,
            self.log_rounds == other.log_rounds,
            self.last_txn == other.last_txn,
        )

    def choose(self, condition: Bool, other: ProtocolState) -> ProtocolState:
        """``self`` when ``condition`` holds, else ``other``, field by field."""
        return ProtocolState(
            output=self.output.choose(condition, other.output),
            cache=self.cache.choose(condition, other.cache),
            frontier=z3.If(condition, self.frontier, other.frontier),
            position=z3.If(condition, self.position, other.position),
            processed=self.processed.choose(condition, other.processed),
            rng_proposal=z3.If(condition, self.rng_proposal, other.rng_proposal),
            rng_accept=z3.If(condition, self.rng_accept, other.rng_accept),
            rng_terminal=z3.If(condition, self.rng_terminal, other.rng_terminal),
            generation=z3.If(condition, self.generation, other.generation),
            finished=z3.If(condition, self.finished, other.finished),
            log_rounds=z3.If(condition, self.log_rounds, other.log_rounds),
            last_txn=z3.If(condition, self.last_txn, other.last_txn),
        )


@dataclass(frozen=True)
class ProtocolConfig:
    """What a request was opened with, as far as the protocol model needs it."""

    max_draft: int
    """K: the largest draft length of a round (Python int, 0..MAX_MODEL_DRAFT)."""
    layout: Layout
    prompt_len: Int
    max_new: Int
    """The output budget (``max_new_tokens``)."""
    stop_ids: tuple[Int, ...]
    """Single-token stop ids (EOS and the like)."""

    def __post_init__(self) -> None:
        if not 0 <= self.max_draft <= MAX_MODEL_DRAFT:
            raise InputError(f"max_draft must lie in [0, {MAX_MODEL_DRAFT}], got {self.max_draft}")

    @classmethod
    def symbolic(cls, max_draft: int, layout: Layout, *, stops: int = 2, name: str = "cfg") -> ProtocolConfig:
        """Symbolic prompt length, budget and ``stops`` symbolic stop ids."""
        return cls(
            max_draft=max_draft,
            layout=Layout(layout),
            prompt_len=z3.Int(f"{name}_prompt_len"),
            max_new=z3.Int(f"{name}_max_new"),
            stop_ids=tuple(z3.Int(f"{name}_stop_{i}") for i in range(stops)),
        )

    @classmethod
    def concrete(
        cls, *, max_draft: int, layout: Layout | str, prompt_len: int, max_new: int, stop_ids: Sequence[int]
    ) -> ProtocolConfig:
        """A configuration from plain values."""
        return cls(
            max_draft=max_draft,
            layout=Layout(layout),
            prompt_len=z3.IntVal(prompt_len),
            max_new=z3.IntVal(max_new),
            stop_ids=tuple(z3.IntVal(s) for s in stop_ids),
        )

    @classmethod
    def from_request_config(
        cls, config: RequestConfig, *, max_draft: int, stop_ids: Sequence[int]
    ) -> ProtocolConfig:
        """The model of a real :class:`~specround.statemachine.state.RequestConfig`.

        Stop ids come from its processor chain, which the model does not interpret.
        """
        return cls.concrete(
            max_draft=max_draft,
            layout=config.layout,
            prompt_len=len(config.prompt_ids),
            max_new=config.max_new_tokens,
            stop_ids=stop_ids,
        )

    def is_stop(self, token: Int) -> Bool:
        """Whether emitting ``token`` ends the request."""
        return z3.Or(*[token == s for s in self.stop_ids]) if self.stop_ids else z3.BoolVal(False)

    def constraints(self) -> Bool:
        """What every request satisfies: a non-empty prompt, a positive budget, token ids >= 0."""
        return z3.And(self.prompt_len >= 1, self.max_new >= 1, *[s >= 0 for s in self.stop_ids])


@dataclass(frozen=True)
class RoundInputs:
    """Everything one round attempt receives, beyond the state: proposal, verification, decision, faults."""

    draft_len: Int
    """k: drafts in this round (0 <= k <= K)."""
    drafts: tuple[Int, ...]
    """d_1..d_K (entries beyond k are ignored)."""
    accepted: Int
    """A: accepted drafts before the first rejection (0 <= A <= k), before stop truncation."""
    terminal_token: Int
    """The correction (A < k) or bonus (A == k) token the sampler drew."""
    row_tokens: tuple[Int, ...]
    """The K+1 logical branch rows ``[F, d_1..d_k]`` as reported by the target (validated, not trusted)."""
    row_base: Int
    """The position of branch row 0 as reported by the target."""
    proposal_draws: Int
    """PROPOSAL uniforms the proposer consumed."""
    fault: Int
    """0 for none, n for F-n."""
    expected_generation: Int
    """The generation the caller's snapshot S_0 had (the compare-and-swap operand)."""
    txn: Int
    """Transaction id (an abstraction of the commit digest: same id, same transaction)."""

    @classmethod
    def symbolic(cls, name: str, max_draft: int) -> RoundInputs:
        """Unconstrained inputs named by ``name``."""
        return cls(
            draft_len=z3.Int(f"{name}_k"),
            drafts=tuple(z3.Int(f"{name}_d{j}") for j in range(1, max_draft + 1)),
            accepted=z3.Int(f"{name}_A"),
            terminal_token=z3.Int(f"{name}_t"),
            row_tokens=tuple(z3.Int(f"{name}_row{j}") for j in range(max_draft + 1)),
            row_base=z3.Int(f"{name}_row_base"),
            proposal_draws=z3.Int(f"{name}_proposal_draws"),
            fault=z3.Int(f"{name}_fault"),
            expected_generation=z3.Int(f"{name}_expected_V"),
            txn=z3.Int(f"{name}_txn"),
        )

    @classmethod
    def concrete(
        cls,
        *,
        max_draft: int,
        drafts: Sequence[int],
        accepted: int,
        terminal_token: int,
        row_tokens: Sequence[int],
        row_base: int,
        expected_generation: int,
        txn: int,
        proposal_draws: int = 0,
        fault: str | None = None,
    ) -> RoundInputs:
        """Inputs from plain values (drafts and rows are padded to K and K+1 with ``PAD_ID``).

        ``row_tokens`` and ``row_base`` are what the target's branch handle reports (its ``token_ids``
        and ``base_len``).
        """
        if len(drafts) > max_draft or len(row_tokens) > max_draft + 1:
            raise InputError(f"more drafts or rows than max_draft={max_draft} allows")
        padded_drafts = [*drafts, *[PAD_ID] * (max_draft - len(drafts))]
        padded_rows = [*row_tokens, *[PAD_ID] * (max_draft + 1 - len(row_tokens))]
        return cls(
            draft_len=z3.IntVal(len(drafts)),
            drafts=tuple(z3.IntVal(d) for d in padded_drafts),
            accepted=z3.IntVal(accepted),
            terminal_token=z3.IntVal(terminal_token),
            row_tokens=tuple(z3.IntVal(r) for r in padded_rows),
            row_base=z3.IntVal(row_base),
            proposal_draws=z3.IntVal(proposal_draws),
            fault=z3.IntVal(fault_code(fault)),
            expected_generation=z3.IntVal(expected_generation),
            txn=z3.IntVal(txn),
        )

    def with_fault(self, code: int | Int) -> RoundInputs:
        """The same inputs with another fault code."""
        return replace(self, fault=z3.IntVal(code) if isinstance(code, int) else code)
