"""z3 model of one round of the protocol (0x06A-0x06E) and its proofs: INV-1..INV-10, F-1..F-6.

The model, in the style of mypyvy: a symbolic **state**, a **transition relation** for one round attempt
built from the state and symbolic **round inputs**, declarative **invariants**, and proofs that the initial
state satisfies them, that every transition preserves them (``INV and T and not INV'`` is unsat, per INV,
per layout, K = 8), that publication is idempotent and fenced, and that bounded runs of six attempts with
arbitrary faults, retries and stale writers reach no violation. Sat-trace regressions keep the interesting
behaviours reachable so that an over-constrained relation cannot pass vacuously, and deliberate mutations
(:class:`ProtocolMutation`) show that each inductive proof can fail.

State (:class:`ProtocolState`): output O and committed cache C as token arrays with lengths, frontier F,
position P, the tokens the processors advanced over G (its length is the processor-advance count), RNG
counters (proposal, accept, terminal), generation V, finished flag, the number of published round records
in the log, and the id of the last published transaction. Lists are z3 arrays plus a length, which z3
decides quickly; the sequence theory times out on symbolic truncation.

One round (:func:`round_outcome`), following the project's layout decision: between rounds ``C == O[:-1]``
and ``F == O[-1]`` in both layouts. The target reports the logical branch rows ``[F, d_1..d_k]`` at
positions ``P..P+k`` (row 0 replayed by the verify pass under ``replay_frontier``, retained beside the
cache from a prior one-row call under ``retained_frontier``). Emission scans ``d_1..d_A`` then the terminal
token and stops after the first stop token or when the budget is reached (``n = min(A + 1, H)`` tokens);
the round commits the rows of ``[F] + d_1..d_(n-1)`` (= ``[F] + d_1..d_A`` whenever the terminal token is
emitted; the final token of a finished request never gets a row) after validating their token identities
and positions, and the last emitted token is the new frontier. RNG: ``accept += min(A + 1, k)`` (or ``n``
when a stop at accepted position ``n`` ends the request), ``terminal += 1`` (0 on such a stop),
``proposal +=`` the proposer's draws. Processors advance over the emitted tokens. Publication is a
compare-and-swap on the generation: a fault at F-1..F-5 (or failed validation, or bad input) leaves the
state as it was; F-6 publishes but the acknowledgement is lost; re-publishing the same transaction at the
generation it already moved is acknowledged without change; any other stale generation is refused.

The log's hash chain (INV-9) is a separate bounded model (:class:`ChainModel`): six events, a collision-free
uninterpreted hash, and every edit, drop, duplicate, reorder, insert and recomputed rewrite at every
position fails the audit against the anchored head. Re-deriving accept/reject decisions and the terminal
draw from logged uniforms (INV-10) is proved in :mod:`specround.model_check.z3_coupling` (``decision.*``).

Conformance: ``round_relation(pre, inputs, post, config)`` is one z3 term, so concrete (before, after)
pairs observed from the real state machine can be checked against it (:func:`conforms`), with states,
inputs and configuration built from plain Python values (:meth:`ProtocolState.concrete`,
:meth:`ProtocolState.from_request_state`, :meth:`RoundInputs.concrete`, :meth:`ProtocolConfig.concrete`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from functools import partial
from typing import TypeAlias

import z3

from specround.errors import InputError
from specround.model_check.proofs import Obligation, Proof, ProofKind, Shown
from specround.sampling.types import PAD_ID, Layout, TerminalKind
from specround.statemachine.state import RequestConfig, RequestState

__all__ = [
    "BMC_MAX_DRAFT",
    "BMC_ROUNDS",
    "CHAIN_EVENTS",
    "FAULT_POINTS",
    "MAX_MODEL_DRAFT",
    "NO_TXN",
    "ChainModel",
    "LoggedRound",
    "ProtocolConfig",
    "ProtocolMutation",
    "ProtocolState",
    "RoundInputs",
    "RoundOutcome",
    "TokenList",
    "conforms",
    "expected_post",
    "fault_code",
    "initial_state",
    "protocol_proofs",
    "replay_round",
    "round_obligations",
    "round_outcome",
    "round_relation",
    "state_invariants",
    "state_values",
]

MAX_MODEL_DRAFT = 8
"""Largest draft length K the model is built for (the proofs use exactly this K)."""
BMC_ROUNDS = 6
"""Rounds of the bounded model check from the initial state."""
FAULT_POINTS = ("F-1", "F-2", "F-3", "F-4", "F-5", "F-6")
"""Fault points by name; the model encodes F-n as the integer n and "no fault" as 0."""
NO_TXN = -1
"""``last_txn`` of a request that has published nothing."""
BMC_MAX_DRAFT = 2
"""Draft length of the bounded runs: each round emits 1..K+1 tokens and the cost grows like (K + 2)^rounds,
so the bounded runs use a small K while the inductive proofs use ``MAX_MODEL_DRAFT``."""

Int: TypeAlias = z3.ArithRef
Bool: TypeAlias = z3.BoolRef
_ARRAY = z3.ArraySort(z3.IntSort(), z3.IntSort())


def fault_code(point: str | None) -> int:
    """The model's integer for a fault point name (``None`` -> 0)."""
    if point is None:
        return 0
    if point not in FAULT_POINTS:
        raise InputError(f"unknown fault point {point!r}; expected one of {FAULT_POINTS}")
    return FAULT_POINTS.index(point) + 1


def _select(items: Sequence[Int], index: Int, first: int = 1) -> Int:
    """``items[index - first]`` for a symbolic ``index`` in ``[first, first + len(items))``."""
    result = items[0]
    for offset in range(1, len(items)):
        result = z3.If(index == first + offset, items[offset], result)
    return result


def _first(conditions: Sequence[Bool], default: Int) -> Int:
    """The smallest 1-based ``j`` with ``conditions[j - 1]``, else ``default``."""
    result = default
    for j in reversed(range(1, len(conditions) + 1)):
        result = z3.If(conditions[j - 1], z3.IntVal(j), result)
    return result


@dataclass(frozen=True)
class TokenList:
    """A list of token ids: a z3 array and a length (entries at and beyond the length are don't-care)."""

    tokens: z3.ArrayRef
    length: Int

    @classmethod
    def symbolic(cls, name: str) -> TokenList:
        """Unconstrained list named ``name``."""
        return cls(z3.Const(name, _ARRAY), z3.Int(f"{name}_len"))

    @classmethod
    def concrete(cls, values: Iterable[int]) -> TokenList:
        """The list of ``values``; entries beyond it hold ``PAD_ID``."""
        tokens = z3.K(z3.IntSort(), z3.IntVal(PAD_ID))
        count = 0
        for index, value in enumerate(values):
            tokens = z3.Store(tokens, index, int(value))
            count = index + 1
        return cls(tokens, z3.IntVal(count))

    def at(self, index: Int | int) -> Int:
        """The token at ``index``."""
        return self.tokens[index]

    def last(self) -> Int:
        """The final token."""
        return self.tokens[self.length - 1]

    def extended(self, items: Sequence[Int], count: Int) -> TokenList:
        """The list followed by ``items[:count]`` for a symbolic ``0 <= count <= len(items)``."""
        tokens = self.tokens
        for j, item in enumerate(items):
            position = self.length + j
            tokens = z3.Store(tokens, position, z3.If(j < count, item, self.tokens[position]))
        return TokenList(tokens, self.length + count)

    def identical(self, other: TokenList) -> Bool:
        """Same length and the same array (what the relation requires of a successor)."""
        return z3.And(self.length == other.length, self.tokens == other.tokens)

    def choose(self, condition: Bool, other: TokenList) -> TokenList:
        """``self`` when ``condition`` holds, else ``other``."""
        return TokenList(
            z3.If(condition, self.tokens, other.tokens), z3.If(condition, self.length, other.length)
        )


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


class ProtocolMutation(StrEnum):
    """Deliberately broken variants of the round (failure classes of 0x07); each must be caught."""

    COMMIT_REJECTED_ROW = "commit_rejected_row"
    """Commit the rejected draft's K/V row as well (INV-5)."""
    SKIP_FRONTIER_ROW = "skip_frontier_row"
    """Commit only the accepted draft rows, never the frontier row (INV-5, INV-1)."""
    SKIP_ROW_VALIDATION = "skip_row_validation"
    """Trust the target's reported rows without checking token identities and positions (INV-5)."""
    CONTINUE_AFTER_STOP = "continue_after_stop"
    """Keep emitting after a stop token (INV-2)."""
    ROUND_AFTER_FINISH = "round_after_finish"
    """Run rounds for a finished request (INV-2)."""
    EXTRA_ACCEPT_DRAW = "extra_accept_draw"
    """Count every drafted position's acceptance uniform, reached or not (INV-3)."""
    TERMINAL_DRAW_ON_PREFIX_STOP = "terminal_draw_on_prefix_stop"
    """Consume a TERMINAL uniform even when a stop inside the accepted prefix ends the request (INV-3)."""
    ADVANCE_OVER_DRAFTS = "advance_over_drafts"
    """Advance the processors over every verified draft instead of the emitted tokens (INV-4)."""
    NO_GENERATION_FENCE = "no_generation_fence"
    """Publish without comparing the generation (INV-6)."""
    STAGE_IN_PLACE = "stage_in_place"
    """Write the committed K/V rows into the authoritative cache at F-3 instead of at publication (INV-7)."""
    ADVANCE_RNG_ON_ABORT = "advance_rng_on_abort"
    """Keep the consumed RNG counters when the round aborts (INV-7)."""


@dataclass(frozen=True)
class LoggedRound:
    """What a published round's log record carries (emitted ids, committed K/V ids, counters, ...)."""

    emitted: tuple[Int, ...]
    emitted_count: Int
    committed: tuple[Int, ...]
    committed_count: Int
    rng_after: tuple[Int, Int, Int]
    """(proposal, accept, terminal)."""
    finished: Bool
    txn: Int


@dataclass(frozen=True)
class RoundOutcome:
    """One round attempt: its decision, record, successor and the authoritative state afterwards."""

    well_formed: Bool
    retry: Bool
    """Same transaction re-published at the generation it already moved (idempotent path)."""
    stale: Bool
    """Refused by the fence (StaleGenerationError)."""
    refused_finished: Bool
    """Refused because the request had finished (RequestFinishedError)."""
    runs: Bool
    """The round was computed (fresh generation, unfinished, well-formed input)."""
    rows_valid: Bool
    aborted: Bool
    """A fault at F-1..F-5 or a failed staging validation."""
    published: Bool
    acknowledged: Bool
    """The caller saw success (a publication whose acknowledgement was not lost, or an idempotent retry)."""
    candidates: tuple[Int, ...]
    """e_1..e_{K+1}: d_1..d_A then the terminal token (positions beyond A + 1 are don't-care)."""
    emitted_count: Int
    """n = min(A + 1, H)."""
    last_token: Int
    terminal_kind: Int
    """A :class:`~specround.sampling.types.TerminalKind` code."""
    accept_draws: Int
    terminal_draws: Int
    committed_rows: Int
    """Logical branch rows committed (the frontier row counts)."""
    verify_rows: Int
    """Input rows computed by the verification pass (k + 1 under replay, k under retained)."""
    finishes: Bool
    record: LoggedRound
    successor: ProtocolState
    """The staged S_1 (meaningful when ``runs``)."""
    post: ProtocolState
    """The authoritative state after the attempt."""


def round_outcome(
    pre: ProtocolState,
    inputs: RoundInputs,
    config: ProtocolConfig,
    mutations: Iterable[ProtocolMutation] = (),
) -> RoundOutcome:
    """Build the z3 terms of one round attempt from ``pre`` and ``inputs`` (see the module docstring)."""
    mutated = frozenset(ProtocolMutation(m) for m in mutations)
    big_k = config.max_draft
    if len(inputs.drafts) != big_k or len(inputs.row_tokens) != big_k + 1:
        raise InputError("round inputs were built for a different max_draft")
    k, accepted, terminal = inputs.draft_len, inputs.accepted, inputs.terminal_token
    drafts = inputs.drafts
    is_stop = config.is_stop
    remaining = config.max_new - (pre.output.length - config.prompt_len)

    candidates = (*[z3.If(j <= accepted, drafts[j - 1], terminal) for j in range(1, big_k + 1)], terminal)
    # Emission scan: e_1, e_2, ... stopping after a stop token or when the budget is reached.
    count: Int = accepted + 1
    for j in reversed(range(1, big_k + 2)):
        ends_here = j == remaining
        if ProtocolMutation.CONTINUE_AFTER_STOP not in mutated:
            ends_here = z3.Or(is_stop(candidates[j - 1]), ends_here)
        count = z3.If(z3.And(j <= accepted + 1, ends_here), j, count)
    last = _select(candidates, count)
    terminal_emitted = count == accepted + 1
    finishes = z3.Or(is_stop(last), count == remaining)
    kind = z3.If(
        terminal_emitted,
        z3.If(accepted < k, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)),
        int(TerminalKind.STOP),
    )

    accept_draws = z3.If(terminal_emitted, z3.If(accepted < k, accepted + 1, k), count)
    if ProtocolMutation.EXTRA_ACCEPT_DRAW in mutated:
        accept_draws = k
    terminal_draws = z3.If(terminal_emitted, 1, 0)
    if ProtocolMutation.TERMINAL_DRAW_ON_PREFIX_STOP in mutated:
        terminal_draws = z3.IntVal(1)

    # K/V: commit logical rows [F, d_1..d_(n-1)] of the branch, validated by identity and position.
    expected_rows = (pre.frontier, *drafts)
    rows, row_offset = inputs.row_tokens, 0
    commit_count: Int = count
    if ProtocolMutation.COMMIT_REJECTED_ROW in mutated:
        commit_count = z3.If(z3.And(terminal_emitted, accepted < k), count + 1, count)
    if ProtocolMutation.SKIP_FRONTIER_ROW in mutated:
        rows, row_offset, commit_count = inputs.row_tokens[1:], 1, count - 1
    rows_valid = z3.And(
        inputs.row_base == pre.position,
        *[z3.Implies(j < commit_count, rows[j] == expected_rows[j + row_offset]) for j in range(len(rows))],
    )
    if ProtocolMutation.SKIP_ROW_VALIDATION in mutated:
        rows_valid = z3.BoolVal(True)
    verify_rows = k + 1 if config.layout is Layout.REPLAY_FRONTIER else k

    processed = pre.processed.extended(candidates, count)
    if ProtocolMutation.ADVANCE_OVER_DRAFTS in mutated:
        processed = pre.processed.extended(drafts, k)

    rng_after = (
        pre.rng_proposal + inputs.proposal_draws,
        pre.rng_accept + accept_draws,
        pre.rng_terminal + terminal_draws,
    )
    record = LoggedRound(
        emitted=candidates,
        emitted_count=count,
        committed=tuple(rows),
        committed_count=commit_count,
        rng_after=rng_after,
        finished=finishes,
        txn=inputs.txn,
    )
    successor = ProtocolState(
        output=pre.output.extended(candidates, count),
        cache=pre.cache.extended(rows, commit_count),
        frontier=last,
        position=pre.position + commit_count,
        processed=processed,
        rng_proposal=rng_after[0],
        rng_accept=rng_after[1],
        rng_terminal=rng_after[2],
        generation=pre.generation + 1,
        finished=finishes,
        log_rounds=pre.log_rounds + 1,
        last_txn=inputs.txn,
    )

    fault = inputs.fault
    well_formed = z3.And(
        k >= 0,
        k <= big_k,
        accepted >= 0,
        accepted <= k,
        *[z3.Implies(j < k, drafts[j] >= 0) for j in range(big_k)],
        terminal >= 0,
        inputs.proposal_draws >= 0,
        fault >= 0,
        fault <= len(FAULT_POINTS),
    )
    retry = z3.And(
        pre.generation >= 1,
        inputs.expected_generation == pre.generation - 1,
        inputs.txn == pre.last_txn,
    )
    fresh = inputs.expected_generation == pre.generation
    if ProtocolMutation.NO_GENERATION_FENCE in mutated:
        fresh = z3.BoolVal(True)
    gate_finished = pre.finished
    if ProtocolMutation.ROUND_AFTER_FINISH in mutated:
        gate_finished = z3.BoolVal(False)
    stale = z3.And(z3.Not(retry), z3.Not(fresh))
    refused_finished = z3.And(z3.Not(retry), fresh, gate_finished)
    runs = z3.And(z3.Not(retry), fresh, z3.Not(gate_finished), well_formed)
    before_publication = z3.And(fault >= 1, fault <= 5)
    aborted = z3.And(runs, z3.Or(before_publication, z3.Not(rows_valid)))
    published = z3.And(runs, rows_valid, z3.Or(fault == 0, fault == 6))
    acknowledged = z3.Or(z3.And(published, fault != 6), z3.And(retry, well_formed, fault == 0))

    post = successor.choose(published, pre)
    if ProtocolMutation.STAGE_IN_PLACE in mutated:
        staged_kv = z3.And(runs, rows_valid, z3.Or(fault == 0, fault >= 4))
        post = replace(post, cache=successor.cache.choose(staged_kv, pre.cache))
    if ProtocolMutation.ADVANCE_RNG_ON_ABORT in mutated:
        post = replace(
            post,
            rng_proposal=z3.If(runs, successor.rng_proposal, pre.rng_proposal),
            rng_accept=z3.If(runs, successor.rng_accept, pre.rng_accept),
            rng_terminal=z3.If(runs, successor.rng_terminal, pre.rng_terminal),
        )

    return RoundOutcome(
        well_formed=well_formed,
        retry=retry,
        stale=stale,
        refused_finished=refused_finished,
        runs=runs,
        rows_valid=rows_valid,
        aborted=aborted,
        published=published,
        acknowledged=acknowledged,
        candidates=candidates,
        emitted_count=count,
        last_token=last,
        terminal_kind=kind,
        accept_draws=accept_draws,
        terminal_draws=terminal_draws,
        committed_rows=commit_count,
        verify_rows=verify_rows,
        finishes=finishes,
        record=record,
        successor=successor,
        post=post,
    )


def round_relation(
    pre: ProtocolState,
    inputs: RoundInputs,
    post: ProtocolState,
    config: ProtocolConfig,
    mutations: Iterable[ProtocolMutation] = (),
) -> Bool:
    """T(pre, inputs, post): ``post`` is the authoritative state after one round attempt on ``pre``."""
    return post.identical(round_outcome(pre, inputs, config, mutations).post)


def replay_round(pre: ProtocolState, record: LoggedRound) -> ProtocolState:
    """Apply a published round's log record to the state before it (what replaying the log does)."""
    emitted_last = _select(record.emitted, record.emitted_count)
    return ProtocolState(
        output=pre.output.extended(record.emitted, record.emitted_count),
        cache=pre.cache.extended(record.committed, record.committed_count),
        frontier=emitted_last,
        position=pre.position + record.committed_count,
        processed=pre.processed.extended(record.emitted, record.emitted_count),
        rng_proposal=record.rng_after[0],
        rng_accept=record.rng_after[1],
        rng_terminal=record.rng_after[2],
        generation=pre.generation + 1,
        finished=record.finished,
        log_rounds=pre.log_rounds + 1,
        last_txn=record.txn,
    )


def conforms(
    pre: ProtocolState,
    inputs: RoundInputs,
    post: ProtocolState,
    config: ProtocolConfig,
    *,
    timeout_s: float = 10.0,
) -> bool:
    """Whether an observed (pre, inputs, post) is allowed by the round relation.

    Concrete values decide it by evaluation; symbolic ones ask whether some assignment allows it.
    """
    solver = z3.Solver()
    solver.set("timeout", int(timeout_s * 1000))
    solver.add(config.constraints(), round_relation(pre, inputs, post, config))
    return bool(solver.check() == z3.sat)


def _numeral(term: z3.ExprRef) -> int | bool:
    value = z3.simplify(term)
    if z3.is_int_value(value):
        return int(value.as_long())
    if z3.is_true(value) or z3.is_false(value):
        return bool(z3.is_true(value))
    raise InputError(f"not a concrete value: {value}")


def state_values(state: ProtocolState) -> dict[str, int | bool | tuple[int, ...]]:
    """A concrete state's fields as plain Python values (``InputError`` if any field is symbolic)."""

    def tokens(tokens: TokenList) -> tuple[int, ...]:
        length = _numeral(tokens.length)
        return tuple(int(_numeral(tokens.at(i))) for i in range(int(length)))

    return {
        "output": tokens(state.output),
        "cache": tokens(state.cache),
        "frontier": _numeral(state.frontier),
        "position": _numeral(state.position),
        "processed": tokens(state.processed),
        "rng": (
            int(_numeral(state.rng_proposal)),
            int(_numeral(state.rng_accept)),
            int(_numeral(state.rng_terminal)),
        ),
        "generation": _numeral(state.generation),
        "finished": _numeral(state.finished),
        "log_rounds": _numeral(state.log_rounds),
        "last_txn": _numeral(state.last_txn),
    }


def expected_post(
    pre: ProtocolState, inputs: RoundInputs, config: ProtocolConfig
) -> dict[str, int | bool | tuple[int, ...]]:
    """The authoritative state the relation allows after a concrete round attempt, as plain values."""
    return state_values(round_outcome(pre, inputs, config).post)


# --- invariants -----------------------------------------------------------------------------------------


def _index() -> Int:
    return z3.Int("i")


def initial_state(s: ProtocolState, config: ProtocolConfig) -> Bool:
    """The state a request is opened in: O = the prompt, C = O[:-1], F = O[-1], nothing generated."""
    i = _index()
    return z3.And(
        s.output.length == config.prompt_len,
        s.cache.length == s.output.length - 1,
        z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < s.cache.length), s.cache.at(i) == s.output.at(i))),
        s.frontier == s.output.last(),
        s.position == s.cache.length,
        s.processed.length == 0,
        s.rng_proposal == 0,
        s.rng_accept == 0,
        s.rng_terminal == 0,
        s.generation == 0,
        z3.Not(s.finished),
        s.log_rounds == 0,
        s.last_txn == NO_TXN,
    )


def state_invariants(s: ProtocolState, config: ProtocolConfig) -> dict[str, Bool]:
    """The state invariants, by number (INV-5, INV-7, INV-8 and INV-10 are properties of a round)."""
    i = _index()
    out, cache, processed = s.output, s.cache, s.processed
    generated = out.length - config.prompt_len
    last = out.last()
    is_stop = config.is_stop
    return {
        # INV-1 is stated for unfinished requests; the project keeps the same shape after the final round
        # (the last token's row is never materialised), so the model checks it in every state.
        "INV-1": z3.And(
            out.length >= 1,
            cache.length == out.length - 1,
            z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < cache.length), cache.at(i) == out.at(i))),
            s.frontier == last,
            s.position == cache.length,
        ),
        "INV-2": z3.And(
            generated >= 0,
            generated <= config.max_new,
            z3.ForAll(
                [i],
                z3.Implies(z3.And(config.prompt_len <= i, i < out.length - 1), z3.Not(is_stop(out.at(i)))),
            ),
            z3.Implies(
                z3.Not(s.finished),
                z3.And(generated < config.max_new, z3.Or(generated == 0, z3.Not(is_stop(last)))),
            ),
            z3.Implies(s.finished, z3.And(generated >= 1, z3.Or(is_stop(last), generated == config.max_new))),
        ),
        # Every published round draws its terminal uniform, except a final round that a stop inside the
        # accepted prefix ended: so terminal == V while unfinished, and V - 1 <= terminal <= V after.
        "INV-3": z3.And(
            s.rng_proposal >= 0,
            s.rng_accept >= 0,
            s.rng_accept <= config.max_draft * s.generation,
            z3.Implies(z3.Not(s.finished), s.rng_terminal == s.generation),
            z3.Implies(
                s.finished, z3.And(s.rng_terminal <= s.generation, s.rng_terminal >= s.generation - 1)
            ),
        ),
        "INV-4": z3.And(
            processed.length == generated,
            z3.ForAll(
                [i],
                z3.Implies(
                    z3.And(i >= 0, i < processed.length), processed.at(i) == out.at(config.prompt_len + i)
                ),
            ),
        ),
        "INV-6": z3.And(
            s.generation >= 0,
            s.log_rounds == s.generation,
            z3.Implies(s.generation == 0, s.last_txn == NO_TXN),
        ),
    }


def round_obligations(
    pre: ProtocolState,
    inputs: RoundInputs,
    post: ProtocolState,
    config: ProtocolConfig,
    mutations: Iterable[ProtocolMutation] = (),
) -> dict[str, Bool]:
    """What every round attempt must satisfy, by INV number, stated declaratively over (pre, inputs, post).

    ``post`` is constrained by the relation elsewhere; the outcome is consulted only for what the caller
    observes (acknowledgement) and what the round logs (its record and committed row count).
    """
    mutations = tuple(mutations)
    outcome = round_outcome(pre, inputs, config, mutations)
    no_fault = round_outcome(pre, inputs.with_fault(0), config, mutations)
    after = state_invariants(post, config)
    i = _index()
    big_k = config.max_draft
    k, accepted, terminal, drafts = inputs.draft_len, inputs.accepted, inputs.terminal_token, inputs.drafts
    is_stop = config.is_stop

    published = post.generation == pre.generation + 1
    growth = post.output.length - pre.output.length
    # d_1..d_A then the terminal token, 1-based.
    emitted = [z3.If(j <= accepted, drafts[j - 1], terminal) for j in range(1, big_k + 1)] + [terminal]
    first_stop = _first(
        [z3.And(j <= accepted + 1, is_stop(emitted[j - 1])) for j in range(1, big_k + 2)], big_k + 2
    )
    remaining = config.max_new - (pre.output.length - config.prompt_len)
    stop_distance = z3.If(first_stop < remaining, first_stop, remaining)
    expected_growth = z3.If(accepted + 1 < stop_distance, accepted + 1, stop_distance)
    prefix_stop = growth <= accepted
    reached_tests = z3.Sum(
        [
            z3.If(z3.And(t <= k, t <= accepted + 1, z3.Or(z3.Not(prefix_stop), t <= growth)), 1, 0)
            for t in range(1, big_k + 1)
        ]
        or [z3.IntVal(0)]
    )
    committed_drafts = z3.If(accepted < growth - 1, accepted, growth - 1)
    retry = z3.And(
        pre.generation >= 1, inputs.expected_generation == pre.generation - 1, inputs.txn == pre.last_txn
    )
    stale = z3.And(inputs.expected_generation != pre.generation, z3.Not(retry))
    c_len = pre.cache.length

    return {
        "INV-1": after["INV-1"],
        "INV-2": z3.And(
            after["INV-2"],
            z3.Implies(pre.finished, post.identical(pre)),
            z3.Implies(published, growth == expected_growth),
        ),
        "INV-3": z3.And(
            after["INV-3"],
            z3.Implies(
                published,
                z3.And(
                    post.rng_accept - pre.rng_accept == reached_tests,
                    post.rng_terminal - pre.rng_terminal == z3.If(prefix_stop, 0, 1),
                    post.rng_proposal - pre.rng_proposal == inputs.proposal_draws,
                ),
            ),
        ),
        "INV-4": z3.And(
            after["INV-4"],
            z3.Implies(
                published,
                z3.And(
                    post.processed.length == pre.processed.length + growth,
                    z3.ForAll(
                        [i],
                        z3.Implies(
                            z3.And(i >= 0, i < pre.processed.length),
                            post.processed.at(i) == pre.processed.at(i),
                        ),
                    ),
                ),
            ),
        ),
        "INV-5": z3.Implies(
            published,
            z3.And(
                post.cache.length == c_len + 1 + committed_drafts,
                z3.ForAll([i], z3.Implies(z3.And(i >= 0, i < c_len), post.cache.at(i) == pre.cache.at(i))),
                post.cache.at(c_len) == pre.frontier,
                *[
                    z3.Implies(j <= committed_drafts, post.cache.at(c_len + j) == drafts[j - 1])
                    for j in range(1, big_k + 1)
                ],
                post.position == pre.position + 1 + committed_drafts,
                outcome.committed_rows == 1 + committed_drafts,
            ),
        ),
        "INV-6": z3.And(
            after["INV-6"],
            z3.Or(post.generation == pre.generation, published),
            z3.Implies(
                published,
                z3.And(
                    inputs.expected_generation == pre.generation,
                    post.log_rounds == pre.log_rounds + 1,
                    post.last_txn == inputs.txn,
                ),
            ),
            z3.Implies(post.generation == pre.generation, post.identical(pre)),
            z3.Implies(inputs.expected_generation != pre.generation, post.identical(pre)),
            z3.Implies(z3.And(retry, outcome.well_formed, inputs.fault == 0), outcome.acknowledged),
            z3.Implies(stale, z3.Not(outcome.acknowledged)),
        ),
        "INV-7": z3.And(
            z3.Implies(
                z3.And(inputs.fault >= 1, inputs.fault <= 5),
                z3.And(post.identical(pre), z3.Not(outcome.acknowledged)),
            ),
            z3.Implies(
                inputs.fault == 6,
                z3.And(
                    post.identical(no_fault.post),
                    z3.Implies(no_fault.published, z3.Not(outcome.acknowledged)),
                ),
            ),
        ),
        "INV-8": z3.Implies(published, post.identical(replay_round(pre, outcome.record))),
        "INV-10": z3.Implies(
            published,
            z3.And(
                *[
                    z3.Implies(j < growth, post.output.at(pre.output.length + j) == emitted[j])
                    for j in range(big_k + 1)
                ],
                outcome.terminal_kind
                == z3.If(
                    prefix_stop,
                    int(TerminalKind.STOP),
                    z3.If(accepted < k, int(TerminalKind.CORRECTION), int(TerminalKind.BONUS)),
                ),
            ),
        ),
    }


# --- proofs -----------------------------------------------------------------------------------------------

_STATE_INVARIANTS = ("INV-1", "INV-2", "INV-3", "INV-4", "INV-6")
_ROUND_INVARIANTS = ("INV-1", "INV-2", "INV-3", "INV-4", "INV-5", "INV-6", "INV-7", "INV-8", "INV-10")
_LAYOUTS = (Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER)
_MUTANT_TARGETS = {
    ProtocolMutation.COMMIT_REJECTED_ROW: "INV-5",
    ProtocolMutation.SKIP_FRONTIER_ROW: "INV-5",
    ProtocolMutation.SKIP_ROW_VALIDATION: "INV-5",
    ProtocolMutation.CONTINUE_AFTER_STOP: "INV-2",
    ProtocolMutation.ROUND_AFTER_FINISH: "INV-2",
    ProtocolMutation.EXTRA_ACCEPT_DRAW: "INV-3",
    ProtocolMutation.TERMINAL_DRAW_ON_PREFIX_STOP: "INV-3",
    ProtocolMutation.ADVANCE_OVER_DRAFTS: "INV-4",
    ProtocolMutation.NO_GENERATION_FENCE: "INV-6",
    ProtocolMutation.STAGE_IN_PLACE: "INV-7",
    ProtocolMutation.ADVANCE_RNG_ON_ABORT: "INV-7",
}
"""The invariant whose inductive step must refute each mutation."""


def _show_round(
    pre: ProtocolState, inputs: RoundInputs, outcome: RoundOutcome, config: ProtocolConfig, tag: str = ""
) -> tuple[tuple[str, Shown], ...]:
    return (
        (f"{tag}k", inputs.draft_len),
        (f"{tag}A", inputs.accepted),
        (f"{tag}drafts", inputs.drafts),
        (f"{tag}terminal_token", inputs.terminal_token),
        (f"{tag}fault", inputs.fault),
        (f"{tag}expected_generation", inputs.expected_generation),
        (f"{tag}generation", pre.generation),
        (f"{tag}emitted", outcome.emitted_count),
        (f"{tag}terminal_kind", outcome.terminal_kind),
        (f"{tag}finishes", outcome.finishes),
        (f"{tag}published", outcome.published),
        (f"{tag}len_O", pre.output.length),
        ("prompt_len", config.prompt_len),
        ("max_new", config.max_new),
        ("stop_ids", config.stop_ids),
    )


def _init(invariant: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, Layout.REPLAY_FRONTIER)
    s0 = ProtocolState.symbolic("s0")
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=state_invariants(s0, config)[invariant],
        show=(("len_O", s0.output.length), ("prompt_len", config.prompt_len)),
    )


def _step(layout: Layout, invariant: str, mutations: tuple[ProtocolMutation, ...] = ()) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre, post = ProtocolState.symbolic("pre"), ProtocolState.symbolic("post")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    premises = (
        config.constraints(),
        *state_invariants(pre, config).values(),
        round_relation(pre, inputs, post, config, mutations),
    )
    goal = round_obligations(pre, inputs, post, config, mutations)[invariant]
    outcome = round_outcome(pre, inputs, config, mutations)
    return Obligation(premises=premises, goal=goal, show=_show_round(pre, inputs, outcome, config))


def _fault(layout: Layout, point: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    code = fault_code(point)
    outcome = round_outcome(pre, inputs, config)
    clean = round_outcome(pre, inputs.with_fault(0), config)
    premises = (config.constraints(), *state_invariants(pre, config).values(), inputs.fault == code)
    if code <= 5:
        goal = z3.And(outcome.post.identical(pre), z3.Not(outcome.published), z3.Not(outcome.acknowledged))
    else:
        goal = z3.And(
            outcome.post.identical(clean.post),
            z3.Implies(clean.published, z3.And(outcome.published, z3.Not(outcome.acknowledged))),
        )
    return Obligation(premises=premises, goal=goal, show=_show_round(pre, inputs, outcome, config))


def _idempotent(layout: Layout) -> Obligation:
    """Publish (acknowledged, or with the acknowledgement lost at F-6), then publish the same transaction."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    first = round_outcome(s0, inputs, config)
    clean = round_outcome(s0, inputs.with_fault(0), config)
    s1 = first.post
    again = round_outcome(s1, inputs.with_fault(0), config)
    premises = (
        config.constraints(),
        *state_invariants(s0, config).values(),
        z3.Or(inputs.fault == 0, inputs.fault == 6),
        clean.published,
    )
    goal = z3.And(
        s1.identical(clean.post),
        z3.Implies(inputs.fault == 6, z3.Not(first.acknowledged)),
        again.retry,
        again.acknowledged,
        z3.Not(again.published),
        again.post.identical(s1),
    )
    return Obligation(premises=premises, goal=goal, show=_show_round(s0, inputs, first, config))


def _stale(layout: Layout) -> Obligation:
    """An attempt whose expected generation is not the current one publishes and appends nothing.

    Only the idempotent re-publication of the last transaction is acknowledged.
    """
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(pre, inputs, config)
    premises = (
        config.constraints(),
        *state_invariants(pre, config).values(),
        inputs.expected_generation != pre.generation,
    )
    goal = z3.And(
        z3.Not(outcome.published),
        outcome.post.identical(pre),
        z3.Implies(z3.Not(outcome.retry), z3.And(outcome.stale, z3.Not(outcome.acknowledged))),
    )
    return Obligation(premises=premises, goal=goal, show=_show_round(pre, inputs, outcome, config))


def _two_writers(layout: Layout) -> Obligation:
    """Writer B publishes first; writer A's different transaction from the same snapshot is refused."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    in_b, in_a = RoundInputs.symbolic("b", MAX_MODEL_DRAFT), RoundInputs.symbolic("a", MAX_MODEL_DRAFT)
    b = round_outcome(s0, in_b, config)
    a = round_outcome(b.post, in_a, config)
    premises = (
        config.constraints(),
        *state_invariants(s0, config).values(),
        b.published,
        in_a.expected_generation == s0.generation,
        in_a.txn != in_b.txn,
    )
    goal = z3.And(a.stale, z3.Not(a.published), z3.Not(a.acknowledged), a.post.identical(b.post))
    return Obligation(premises=premises, goal=goal, show=_show_round(s0, in_a, a, config))


def _layout_equivalence(retained_mutations: tuple[ProtocolMutation, ...] = ()) -> Obligation:
    """Both layouts publish the same successor and acknowledgement from the same state and inputs (0x06C).

    ``retained_mutations`` break the retained layout only (the classic "retained commits the accepted draft
    rows only" bug), for the refutation check.
    """
    replay = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, Layout.REPLAY_FRONTIER)
    retained = replace(replay, layout=Layout.RETAINED_FRONTIER)
    pre = ProtocolState.symbolic("pre")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    a = round_outcome(pre, inputs, replay)
    b = round_outcome(pre, inputs, retained, retained_mutations)
    premises = (replay.constraints(), *state_invariants(pre, replay).values())
    goal = z3.And(
        a.post.identical(b.post),
        a.acknowledged == b.acknowledged,
        a.committed_rows == b.committed_rows,
    )
    return Obligation(premises=premises, goal=goal, show=_show_round(pre, inputs, b, retained))


def _bmc(layout: Layout, invariant: str, rounds: int, max_draft: int) -> Obligation:
    """Every run of ``rounds`` attempts from the initial state: the last attempt meets ``invariant``.

    Attempts at F-1..F-5 stutter (``protocol.stutter``), so any run of ``m <= rounds`` attempts that ends in
    a violation extends, by stuttering first, to a run of exactly ``rounds`` attempts whose *last* step
    violates: checking the last step of every ``rounds``-long run covers every depth up to ``rounds``.
    One query per invariant (a conjunction of all of them is an order of magnitude slower).
    """
    config = ProtocolConfig.symbolic(max_draft, layout)
    states = [ProtocolState.symbolic(f"s{n}") for n in range(rounds + 1)]
    inputs = [RoundInputs.symbolic(f"in{n}", max_draft) for n in range(rounds)]
    premises = [config.constraints(), initial_state(states[0], config)]
    for n in range(rounds):
        premises.append(round_relation(states[n], inputs[n], states[n + 1], config))
    last = rounds - 1
    goal = round_obligations(states[last], inputs[last], states[rounds], config)[invariant]
    show = tuple((f"s{n}.V", s.generation) for n, s in enumerate(states))
    show += tuple((f"in{n}.fault", x.fault) for n, x in enumerate(inputs))
    show += tuple((f"s{n}.len_O", s.output.length) for n, s in enumerate(states))
    return Obligation(premises=tuple(premises), goal=goal, show=show)


def _stutter(layout: Layout) -> Obligation:
    """From the initial state, an attempt that fails at F-1..F-5 leaves the state exactly as it was."""
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    premises = (config.constraints(), initial_state(s0, config), inputs.fault >= 1, inputs.fault <= 5)
    return Obligation(
        premises=premises, goal=outcome.post.identical(s0), show=_show_round(s0, inputs, outcome, config)
    )


# --- sat-trace regressions ------------------------------------------------------------------------------

Condition: TypeAlias = Callable[[ProtocolState, RoundInputs, RoundOutcome, ProtocolConfig], Bool]


def _growth(pre: ProtocolState, outcome: RoundOutcome) -> Int:
    return outcome.post.output.length - pre.output.length


_REACH_ONE: dict[str, Condition] = {
    "zero_accept_correction": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len >= 1,
        x.accepted == 0,
        o.terminal_kind == int(TerminalKind.CORRECTION),
        z3.Not(o.finishes),
        _growth(s, o) == 1,
        o.committed_rows == 1,
    ),
    "full_accept_bonus": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len == c.max_draft,
        x.accepted == c.max_draft,
        o.terminal_kind == int(TerminalKind.BONUS),
        z3.Not(o.finishes),
        _growth(s, o) == c.max_draft + 1,
    ),
    "stop_inside_prefix": lambda s, x, o, c: z3.And(
        o.published,
        o.terminal_kind == int(TerminalKind.STOP),
        c.is_stop(o.last_token),
        o.emitted_count >= 2,
        o.emitted_count < x.accepted,
        _growth(s, o) < c.max_new,
        o.terminal_draws == 0,
    ),
    "eos_as_bonus": lambda s, x, o, c: z3.And(
        o.published,
        x.draft_len >= 2,
        _growth(s, o) < c.max_new,
        o.terminal_kind == int(TerminalKind.BONUS),
        c.is_stop(x.terminal_token),
        o.finishes,
    ),
    "eos_as_correction": lambda s, x, o, c: z3.And(
        o.published,
        x.accepted >= 1,
        _growth(s, o) < c.max_new,
        o.terminal_kind == int(TerminalKind.CORRECTION),
        c.is_stop(x.terminal_token),
        o.finishes,
    ),
    "length_cap_inside_prefix": lambda s, x, o, c: z3.And(
        o.published,
        o.emitted_count >= 2,
        o.emitted_count < x.accepted,
        o.terminal_kind == int(TerminalKind.STOP),
        z3.Not(c.is_stop(o.last_token)),
        o.finishes,
    ),
    "length_cap_at_terminal": lambda s, x, o, c: z3.And(
        o.published,
        x.accepted >= 1,
        o.terminal_kind != int(TerminalKind.STOP),
        z3.Not(c.is_stop(o.last_token)),
        o.finishes,
    ),
    "plain_decode_k0": lambda s, x, o, c: z3.And(o.published, x.draft_len == 0, _growth(s, o) == 1),
    "invalid_rows_abort": lambda s, x, o, c: z3.And(
        o.runs,
        x.fault == 0,
        z3.Not(o.rows_valid),
        z3.Not(o.published),
        o.post.identical(s),
    ),
}


def _reach_one(layout: Layout, condition: Condition) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    premises = (config.constraints(), initial_state(s0, config))
    return Obligation(
        premises=premises,
        goal=condition(s0, inputs, outcome, config),
        show=_show_round(s0, inputs, outcome, config),
    )


def _reach_fault(layout: Layout, point: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    inputs = RoundInputs.symbolic("in", MAX_MODEL_DRAFT)
    outcome = round_outcome(s0, inputs, config)
    clean = round_outcome(s0, inputs.with_fault(0), config)
    goal = z3.And(inputs.fault == fault_code(point), clean.published, z3.Not(outcome.acknowledged))
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=goal,
        show=_show_round(s0, inputs, outcome, config),
    )


def _reach_two(layout: Layout, scenario: str) -> Obligation:
    config = ProtocolConfig.symbolic(MAX_MODEL_DRAFT, layout)
    s0 = ProtocolState.symbolic("s0")
    first_in, second_in = (
        RoundInputs.symbolic("in0", MAX_MODEL_DRAFT),
        RoundInputs.symbolic("in1", MAX_MODEL_DRAFT),
    )
    first = round_outcome(s0, first_in, config)
    second = round_outcome(first.post, second_in, config)
    if scenario == "retry_after_lost_ack":
        goal = z3.And(
            first_in.fault == 6,
            first_in.accepted >= 1,
            z3.Not(first.finishes),
            first.published,
            z3.Not(first.acknowledged),
            second_in.expected_generation == 0,
            second_in.txn == first_in.txn,
            second_in.fault == 0,
            second.retry,
            second.acknowledged,
            second.post.identical(first.post),
        )
    elif scenario == "stale_writer_refused":
        goal = z3.And(
            first.published,
            second_in.expected_generation == 0,
            second_in.txn != first_in.txn,
            second.stale,
            z3.Not(second.acknowledged),
        )
    elif scenario == "finished_request_refused":
        goal = z3.And(
            first.published,
            first.finishes,
            second_in.expected_generation == 1,
            second.refused_finished,
            second.post.identical(first.post),
        )
    else:
        third_in = RoundInputs.symbolic("in2", MAX_MODEL_DRAFT)
        third = round_outcome(second.post, third_in, config)
        goal = z3.And(
            *[o.published for o in (first, second, third)],
            *[z3.Not(o.finishes) for o in (first, second, third)],
            _growth(s0, first) >= 2,
            _growth(first.post, second) >= 2,
            _growth(second.post, third) >= 2,
        )
    return Obligation(
        premises=(config.constraints(), initial_state(s0, config)),
        goal=goal,
        show=(
            *_show_round(s0, first_in, first, config, "r0."),
            *_show_round(first.post, second_in, second, config, "r1."),
        ),
    )


_REACH_TWO = ("retry_after_lost_ack", "stale_writer_refused", "finished_request_refused", "three_rounds")


# --- the hash chain (INV-9) -------------------------------------------------------------------------

CHAIN_EVENTS = 6
"""Events in the bounded hash-chain proofs."""

ChainRow: TypeAlias = tuple[z3.ExprRef, z3.ExprRef, Int]
"""One stored event: (previous hash, hash, payload)."""


class ChainModel:
    """A per-request hash chain ``hash = H(prev_hash, event)`` with a collision-free ``H``.

    ``H`` is uninterpreted over an uninterpreted digest sort. Collision resistance is modelled by inverse
    functions (``H(a, e)`` determines ``a`` and ``e``) and acyclicity by a depth that grows by one per link
    (no chain returns to an earlier digest). The axioms are added as ground instances for every ``H`` term
    built through :meth:`link`, so queries stay quantifier-free.
    """

    def __init__(self) -> None:
        self.digest = z3.DeclareSort("Digest")
        self.genesis = z3.Const("genesis", self.digest)
        self.hash = z3.Function("chain_hash", self.digest, z3.IntSort(), self.digest)
        self.depth = z3.Function("chain_depth", self.digest, z3.IntSort())
        self.prev_of = z3.Function("chain_prev", self.digest, self.digest)
        self.event_of = z3.Function("chain_event", self.digest, z3.IntSort())
        self.facts: list[Bool] = [self.depth(self.genesis) == 0]

    def link(self, prev: z3.ExprRef, event: Int) -> z3.ExprRef:
        """``H(prev, event)``, recording the axiom instances for it."""
        digest = self.hash(prev, event)
        self.facts += [
            self.prev_of(digest) == prev,
            self.event_of(digest) == event,
            self.depth(digest) == self.depth(prev) + 1,
        ]
        return digest

    def build(self, events: Sequence[Int], prev: z3.ExprRef | None = None) -> list[ChainRow]:
        """Rows of an honestly appended chain of ``events`` (after ``prev``, genesis by default)."""
        rows: list[ChainRow] = []
        previous = self.genesis if prev is None else prev
        for event in events:
            digest = self.link(previous, event)
            rows.append((previous, digest, event))
            previous = digest
        return rows

    def verify(self, rows: Sequence[ChainRow]) -> Bool:
        """What an audit checks: the first row links to genesis, each hash recomputes, each row links."""
        if not rows:
            return z3.BoolVal(True)
        checks = [rows[0][0] == self.genesis]
        checks += [digest == self.link(prev, event) for prev, digest, event in rows]
        checks += [rows[i + 1][0] == rows[i][1] for i in range(len(rows) - 1)]
        return z3.And(*checks)

    def head(self, rows: Sequence[ChainRow]) -> z3.ExprRef:
        """The last hash (genesis for an empty chain)."""
        return rows[-1][1] if rows else self.genesis


def _chain_tampers(
    model: ChainModel, rows: list[ChainRow], kind: str
) -> tuple[list[list[ChainRow]], list[Bool]]:
    """Every tampered variant of ``rows`` of one kind, and what makes each a real change."""
    n = len(rows)
    events = [row[2] for row in rows]
    variants: list[list[ChainRow]] = []
    changed: list[Bool] = []
    if kind == "edit":  # a payload rewritten in place, its stored hashes kept
        for j in range(n):
            x = z3.Int(f"edit{j}")
            variants.append([*rows[:j], (rows[j][0], rows[j][1], x), *rows[j + 1 :]])
            changed.append(x != events[j])
    elif kind == "drop":
        variants = [[*rows[:j], *rows[j + 1 :]] for j in range(n)]
    elif kind == "duplicate":
        variants = [[*rows[: j + 1], rows[j], *rows[j + 1 :]] for j in range(n)]
    elif kind == "reorder":
        variants = [[*rows[:j], rows[j + 1], rows[j], *rows[j + 2 :]] for j in range(n - 1)]
    elif kind == "insert":  # a forged row with any stored values, at any position
        for j in range(n + 1):
            forged = (z3.Const(f"ins_prev{j}", model.digest), z3.Const(f"ins_hash{j}", model.digest))
            variants.append([*rows[:j], (*forged, z3.Int(f"ins_event{j}")), *rows[j:]])
    elif kind == "rewrite":  # a payload edited and every later hash recomputed
        for j in range(n):
            x = z3.Int(f"rewrite{j}")
            tail = model.build([x, *events[j + 1 :]], prev=rows[j][0])
            variants.append([*rows[:j], *tail])
            changed.append(x != events[j])
    else:
        raise InputError(f"unknown tamper kind {kind!r}")
    return variants, changed


_CHAIN_TAMPERS = ("edit", "drop", "duplicate", "reorder", "insert", "rewrite")


def _chain_detects(kind: str) -> Obligation:
    """Every tamper of ``kind`` at every position fails the audit against the anchored head.

    The chain alone catches every change that leaves a stored link behind it; a truncated or extended tail
    and a rewrite that recomputes every later hash are caught only against the head hash recorded when the
    last round was published, which the audit compares as well.
    """
    model = ChainModel()
    rows = model.build([z3.Int(f"e{i}") for i in range(CHAIN_EVENTS)])
    head = model.head(rows)
    variants, changed = _chain_tampers(model, rows, kind)
    goal = z3.And(*[z3.Not(z3.And(model.verify(v), model.head(v) == head)) for v in variants])
    return Obligation(premises=(*model.facts, *changed), goal=goal)


def _chain_reach(scenario: str) -> Obligation:
    model = ChainModel()
    rows = model.build([z3.Int(f"e{i}") for i in range(CHAIN_EVENTS)])
    if scenario == "honest_log_verifies":
        goal = z3.And(model.verify(rows), model.head(rows) == model.head(rows))
    else:  # the limitation the head anchor exists for: a forged tail append passes the links alone
        extended = [*rows, *model.build([z3.Int("forged")], prev=model.head(rows))]
        goal = model.verify(extended)
    return Obligation(premises=tuple(model.facts), goal=goal)


def protocol_proofs() -> list[Proof]:
    """The registered protocol proofs: init, inductive steps, faults, fencing, BMC, reachability, mutants."""
    proofs = [
        Proof(
            name=f"protocol.init.{inv}",
            covers=(inv,),
            kind=ProofKind.VALID,
            build=partial(_init, inv),
            description="the initial state satisfies the invariant",
        )
        for inv in _STATE_INVARIANTS
    ]
    for layout in _LAYOUTS:
        tag = layout.value
        proofs += [
            Proof(
                name=f"protocol.step.{tag}.{inv}",
                covers=(inv, "0x06A", "0x06C") if inv in ("INV-1", "INV-5") else (inv,),
                kind=ProofKind.VALID,
                build=partial(_step, layout, inv),
                description=f"INV and T and not {inv}' is unsat (K = {MAX_MODEL_DRAFT})",
            )
            for inv in _ROUND_INVARIANTS
        ]
        proofs += [
            Proof(
                name=f"protocol.fault.{tag}.{point}",
                covers=("INV-7", point, "0x06E"),
                kind=ProofKind.VALID,
                build=partial(_fault, layout, point),
                description="a fault here leaves state and log unchanged"
                if point != "F-6"
                else "F-6 publishes the successor but the caller sees no acknowledgement",
            )
            for point in FAULT_POINTS
        ]
        proofs += [
            Proof(
                name=f"protocol.idempotent_publication.{tag}",
                covers=("INV-6", "INV-7", "F-6", "0x06E"),
                kind=ProofKind.VALID,
                build=partial(_idempotent, layout),
                description="re-publishing the same transaction returns the same successor, appends nothing",
            ),
            Proof(
                name=f"protocol.stale_generation.{tag}",
                covers=("INV-6",),
                kind=ProofKind.VALID,
                build=partial(_stale, layout),
                description="a stale generation cannot publish",
            ),
            Proof(
                name=f"protocol.two_writers.{tag}",
                covers=("INV-6",),
                kind=ProofKind.VALID,
                build=partial(_two_writers, layout),
                description="the loser of a publication race is refused and appends nothing",
            ),
            Proof(
                name=f"protocol.stutter.{tag}",
                covers=("INV-7",),
                kind=ProofKind.VALID,
                build=partial(_stutter, layout),
                description="failed attempts stutter (the premise of the bounded runs' depth argument)",
            ),
        ]
        proofs += [
            Proof(
                name=f"protocol.bmc.{tag}.{inv}",
                covers=(inv, *FAULT_POINTS),
                kind=ProofKind.VALID,
                build=partial(_bmc, layout, inv, BMC_ROUNDS, BMC_MAX_DRAFT),
                description=f"every run of <= {BMC_ROUNDS} attempts from the initial state with arbitrary "
                f"faults, retries and stale writers keeps {inv} (K = {BMC_MAX_DRAFT})",
                uses=(f"protocol.stutter.{tag}",),
            )
            for inv in _ROUND_INVARIANTS
        ]
        proofs += [
            Proof(
                name=f"protocol.reach.{tag}.{name}",
                covers=("vacuity",),
                kind=ProofKind.REACHABLE,
                build=partial(_reach_one, layout, condition),
                description=f"sat-trace regression: {name.replace('_', ' ')} stays reachable",
            )
            for name, condition in _REACH_ONE.items()
        ]
        proofs += [
            Proof(
                name=f"protocol.reach.{tag}.fault_{point}",
                covers=("vacuity", point),
                kind=ProofKind.REACHABLE,
                build=partial(_reach_fault, layout, point),
                description=f"sat-trace regression: a publishable round can fail at {point}",
            )
            for point in FAULT_POINTS
        ]
        proofs += [
            Proof(
                name=f"protocol.reach.{tag}.{scenario}",
                covers=("vacuity",),
                kind=ProofKind.REACHABLE,
                build=partial(_reach_two, layout, scenario),
                description=f"sat-trace regression: {scenario.replace('_', ' ')} stays reachable",
            )
            for scenario in _REACH_TWO
        ]
    proofs.append(
        Proof(
            name="protocol.layout_equivalence",
            covers=("INV-5", "0x06C"),
            kind=ProofKind.VALID,
            build=_layout_equivalence,
            description="both layouts publish the same successor from the same state and inputs",
        )
    )
    proofs.append(
        Proof(
            name="protocol.mutant.retained_skips_frontier_row",
            covers=("INV-5", "0x06C", "0x07"),
            kind=ProofKind.REFUTABLE,
            build=partial(_layout_equivalence, (ProtocolMutation.SKIP_FRONTIER_ROW,)),
            description="layout equivalence must refute a retained layout that commits only the draft rows",
        )
    )
    proofs += [
        Proof(
            name=f"protocol.chain.detects.{kind}",
            covers=("INV-9",),
            kind=ProofKind.VALID,
            build=partial(_chain_detects, kind),
            description=f"every {kind} of a {CHAIN_EVENTS}-event chain, at every position, fails the audit",
        )
        for kind in _CHAIN_TAMPERS
    ]
    proofs += [
        Proof(
            name=f"protocol.chain.reach.{scenario}",
            covers=("INV-9", "vacuity"),
            kind=ProofKind.REACHABLE,
            build=partial(_chain_reach, scenario),
            description=f"sat-trace regression: {scenario.replace('_', ' ')}",
        )
        for scenario in ("honest_log_verifies", "tail_append_passes_links_alone")
    ]
    proofs += [
        Proof(
            name=f"protocol.mutant.{mutation.value}",
            covers=(inv, "0x07"),
            kind=ProofKind.REFUTABLE,
            build=partial(_step, Layout.REPLAY_FRONTIER, inv, (mutation,)),
            description=f"the {inv} step proof must refute this mutation",
        )
        for mutation, inv in _MUTANT_TARGETS.items()
    ]
    return proofs
