"""Staging a round's successor off to the side from S_0, validated by token identities.

Contract: contract#staging, contract#reached-events, contract#fenced-publication.

Pure functions shared by the controller (which stages live rounds) and replay (which re-stages logged ones),
so that both derive a successor in exactly one way (INV-8):

* :func:`open_snapshot` — the generation-0 state of a request from its configuration alone.
* :func:`stage_kv` — which logical branch rows ``[F_0, d_1..d_k]`` the round commits and discards (INV-5):
  the first ``len(emitted)`` rows, i.e. the frontier row (always, even when A = 0) and the accepted drafts
  that precede the final emitted token. The correction/bonus token gets no row from the branch; the final
  token of a request that a stop ends gets none either (the state keeps ``C == O[:-1]``).
* :func:`stage_successor` — output, cache, frontier, position, processors (a clone of G_0 advanced over the
  emitted tokens only, INV-4), RNG counters (INV-3) and generation of S_1, with the staged cache checked
  against the staged output by token identity (INV-1).

Validation checks the round's *delta* against S_0. ``C_0 == O_0[:-1]`` itself holds by induction: S_0 was
either opened (checked here) or staged and validated by this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specround.errors import InvalidProcessorError, InvalidRequestError, StagingValidationError
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.statemachine.records import assemble
from specround.statemachine.state import (
    TOKEN_FOLD_SEED,
    FinishReason,
    RequestConfig,
    RequestState,
    RngCounters,
    fold_tokens,
    state_digest,
)
from specround.statemachine.tokens import Tokens

__all__ = [
    "KvStaging",
    "RequestSnapshot",
    "chain_from_config",
    "open_snapshot",
    "stage_kv",
    "stage_successor",
]


@dataclass(frozen=True, slots=True)
class RequestSnapshot:
    """A published state S together with what staging from it needs (never mutated)."""

    state: RequestState
    chain: ProcessorChain
    """The processor chain at ``state.processors``; staging advances clones of it, never it."""
    output_fold: bytes
    cache_fold: bytes
    _digest: list[str] = field(default_factory=list, repr=False, compare=False)
    """The state digest once computed (an empty list until :attr:`digest` is first read)."""

    @classmethod
    def of(
        cls, state: RequestState, chain: ProcessorChain, output_fold: bytes, cache_fold: bytes
    ) -> RequestSnapshot:
        """The snapshot of ``state`` with its token folds (the digest follows from them when first read)."""
        return cls(state, chain, output_fold, cache_fold)

    @property
    def digest(self) -> str:
        """``state.digest()``, computed from the folds on first use.

        The engine's critical path never reads it: the commit record and events that carry it are built
        by the durable write (on the writer thread for a pipelined step). Two threads reading it at once
        compute the same value.
        """
        if not self._digest:
            self._digest.append(state_digest(self.state, self.output_fold, self.cache_fold))
        return self._digest[0]


@dataclass(frozen=True, slots=True)
class KvStaging:
    """The branch rows of a round to commit and to discard (logical rows ``[F_0, d_1..d_k]``)."""

    keep: int
    committed_token_ids: tuple[int, ...]
    """``[F_0] + emitted[:-1]``: rows ``0 .. keep-1``."""
    discarded_rows: tuple[int, ...]
    """Logical row indices ``keep .. k``."""
    discarded_token_ids: tuple[int, ...]


def chain_from_config(config: RequestConfig) -> ProcessorChain:
    """The declared processor chain of a request, before any token was consumed."""
    return ProcessorChain.from_spec(config.processors, vocab_size=config.vocab_size, softmax=config.softmax)


def open_snapshot(config: RequestConfig) -> RequestSnapshot:
    """The generation-0 snapshot: ``O = prompt``, ``C = prompt[:-1]``, ``F = prompt[-1]``, counters zero.

    G_0 is the declared chain advanced over the prompt when ``config.prompt_advances_processors`` (else the
    declared chain itself). Raises :class:`InvalidRequestError` when the prompt is outside the vocabulary
    or the chain refuses it.
    """
    prompt = config.prompt_ids
    if any(not 0 <= token < config.vocab_size for token in prompt):
        raise InvalidRequestError(
            f"prompt token outside [0, {config.vocab_size}) in request {config.request_id!r}"
        )
    chain = chain_from_config(config)
    if config.prompt_advances_processors:
        try:
            chain.advance_many(prompt)
        except InvalidProcessorError as exc:
            raise InvalidRequestError(
                f"the processors refuse the prompt of {config.request_id!r}: {exc}"
            ) from exc
    state = RequestState(
        request_id=config.request_id,
        output=Tokens(prompt),
        prompt_len=len(prompt),
        cache=Tokens(prompt[:-1]),
        frontier=prompt[-1],
        position=len(prompt) - 1,
        processors=chain.to_spec(),
        processors_digest=chain.digest(),
        rng=RngCounters(),
        generation=0,
    )
    output_fold = fold_tokens(TOKEN_FOLD_SEED, state.output)
    cache_fold = fold_tokens(TOKEN_FOLD_SEED, state.cache)
    return RequestSnapshot.of(state, chain, output_fold, cache_fold)


def stage_kv(start: RequestState, draft_ids: Sequence[int], emitted: Sequence[int]) -> KvStaging:
    """Stage the K/V rows of a round from S_0, its drafts and its emitted tokens (INV-5).

    Validates by token identity that the emitted tokens before the final one are exactly the leading drafts
    (only accepted drafts own branch rows) and that S_0's frontier is ``O_0[-1]``; raises
    :class:`StagingValidationError` otherwise.
    """
    n_emitted, k = len(emitted), len(draft_ids)
    if not 1 <= n_emitted <= k + 1:
        raise StagingValidationError(f"a round with {k} drafts cannot emit {n_emitted} tokens")
    frontier = start.frontier
    if frontier is None or not start.output or start.output[-1] != frontier:
        raise StagingValidationError(f"S_0 of {start.request_id!r} has no frontier equal to O[-1]")
    accepted = tuple(emitted[:-1])
    if accepted != tuple(draft_ids[: n_emitted - 1]):
        raise StagingValidationError(
            f"emitted tokens {tuple(emitted)} do not start with the accepted drafts {tuple(draft_ids)}: "
            "only accepted drafts own branch rows"
        )
    return KvStaging(  # positional, in field order: keep, committed, discarded rows, discarded ids
        n_emitted,
        (frontier, *accepted),
        tuple(range(n_emitted, k + 1)),
        tuple(draft_ids[n_emitted - 1 :]),
    )


def stage_successor(
    start: RequestSnapshot,
    emitted: Sequence[int],
    committed: Sequence[int],
    rng_after: RngCounters,
    *,
    finished: bool,
    finish_reason: FinishReason | None,
) -> RequestSnapshot:
    """Assemble and validate S_1 off to the side from S_0 (contract#staging, contract#reached-events).

    ``committed`` are the token ids of the committed rows (:attr:`KvStaging.committed_token_ids`); the
    staged cache ``C_0 + committed`` must equal the staged output ``O_0 + emitted`` without its last token,
    token by token (INV-1), or :class:`StagingValidationError` is raised. The processor state is a clone of
    G_0 advanced over ``emitted`` only (INV-4); a token the processors refuse is a staging failure.
    """
    s0 = start.state
    emitted = tuple(emitted)
    committed = tuple(committed)
    # Token identities of the delta: C_1 = C_0 + committed must equal O_1[:-1] = O_0 + emitted[:-1], and
    # C_0 == O_0[:-1] holds by induction, so committed == [O_0[-1]] + emitted[:-1].
    if not emitted or committed != (s0.output[-1], *emitted[:-1]):
        raise StagingValidationError(
            f"staged cache delta {committed} does not match staged output delta {emitted} of "
            f"{s0.request_id!r}: C_1 != O_1[:-1]"
        )
    if finish_reason is not None and not finished:
        raise StagingValidationError("a finish reason for an unfinished request")
    chain = start.chain
    processors, processors_digest = s0.processors, s0.processors_digest
    if chain.processors and chain.stateful:
        chain = chain.clone()
        try:
            chain.advance_many(emitted)
        except InvalidProcessorError as exc:
            raise StagingValidationError(f"the processors refuse emitted tokens {emitted}: {exc}") from exc
        processors, processors_digest = chain.to_spec(), chain.digest()
    output = Tokens.of(s0.output).extended(emitted)  # O(emitted): the tokens are shared, not copied
    cache = Tokens.of(s0.cache).extended(committed)
    state = assemble(
        RequestState,
        {
            "request_id": s0.request_id,
            "output": output,
            "prompt_len": s0.prompt_len,
            "cache": cache,
            "frontier": output[-1],
            "position": len(cache),
            "processors": processors,
            "processors_digest": processors_digest,
            "rng": rng_after,
            "generation": s0.generation + 1,
            "finished": finished,
            "finish_reason": finish_reason,
        },
    )
    # C_1 == O_1[:-1] (checked above), so O_1's fold is C_1's fold extended by the final token alone.
    cache_fold = fold_tokens(start.cache_fold, committed)
    output_fold = fold_tokens(cache_fold, emitted[-1:])
    return RequestSnapshot.of(state, chain, output_fold, cache_fold)
