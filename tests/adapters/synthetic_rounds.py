"""Valid round publications built directly, without a model or the controller (for event-log tests).

A synthetic request has no processors and uses the ``replay_frontier`` layout. Each round drafts three
tokens derived from (request, generation, variant); acceptance follows INV-10 with the real Philox
uniforms (accept d_i iff u_i < p_i/q_i), a rejection emits a correction and a full acceptance a bonus, the
output budget truncates (INV-2), the RNG counters advance by the draws made (INV-3), the frontier row and
the accepted drafts are committed and the rest discarded (INV-5), and the successor satisfies INV-1.
Everything is a pure function of its inputs, so two processes that build "the same round" build the same
transaction (same commit digest), and a different ``variant`` builds a different one.

:func:`replay_state` rebuilds a request's state from its stored events alone (a minimal INV-8 replay).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from specround.canonical import digest
from specround.sampling.rng import uniforms
from specround.sampling.types import Layout, Stream
from specround.statemachine.events import (
    RequestOpened,
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundVerified,
    parse_event,
)
from specround.statemachine.ports import RoundPublication, StoredEvent
from specround.statemachine.state import RequestConfig, RequestState, RngCounters, SpeculativeCommit

DRAFTS = 3
VOCAB = 50


def _pick(*parts: object) -> int:
    text = "/".join(str(part) for part in parts).encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "little")


def _prob(*parts: object) -> float:
    """A deterministic probability in [1/64, 1] with an exact binary representation."""
    return (1 + _pick(*parts) % 64) / 64


def make_config(request_id: str, *, max_new_tokens: int = 12, seed: int | None = None) -> RequestConfig:
    """A request with a three-token prompt and no processors."""
    return RequestConfig(
        request_id=request_id,
        prompt_ids=(1, 2, 3),
        seed=_pick("seed", request_id) if seed is None else seed,
        max_new_tokens=max_new_tokens,
        layout=Layout.REPLAY_FRONTIER,
        vocab_size=VOCAB,
    )


def initial_state(config: RequestConfig) -> RequestState:
    """S_0 of a request: the prompt emitted, its last token the frontier."""
    prompt = config.prompt_ids
    return RequestState(
        request_id=config.request_id,
        output=prompt,
        prompt_len=len(prompt),
        cache=prompt[:-1],
        frontier=prompt[-1],
        position=len(prompt) - 1,
        processors=(),
        processors_digest=digest([]),
        rng=RngCounters(),
        generation=0,
    )


def open_request(config: RequestConfig) -> tuple[RequestOpened, RequestState]:
    """The ``request_opened`` event and the initial state (pass ``state.digest()`` to ``open_request``)."""
    state = initial_state(config)
    return RequestOpened(
        request_id=config.request_id, config=config, initial_state_digest=state.digest()
    ), state


def round_id_for(generation: int, variant: int = 0) -> str:
    """The default round id of the round that publishes ``generation + 1``."""
    return f"g{generation:05d}-v{variant}"


def build_round(
    config: RequestConfig, state: RequestState, *, variant: int = 0, round_id: str | None = None
) -> tuple[RoundPublication, RequestState]:
    """The publication of the next round of ``state`` and the successor it publishes."""
    if state.finished:
        raise ValueError("a finished request gets no further round (INV-2)")
    rid, gen = config.request_id, state.generation
    round_id = round_id or round_id_for(gen, variant)
    drafts = tuple(_pick("draft", rid, gen, variant, i) % VOCAB for i in range(DRAFTS))
    q = tuple(_prob("q", rid, gen, variant, i) for i in range(DRAFTS))
    p = tuple(_prob("p", rid, gen, variant, i) for i in range(DRAFTS))
    remaining = config.max_new_tokens - len(state.generated)
    rng = state.rng

    accept_uniforms: list[float] = []
    accepted = 0
    rejected = False
    for i in range(min(DRAFTS, remaining)):
        u = float(uniforms(config.seed, Stream.ACCEPT, rng.accept + i))
        accept_uniforms.append(u)
        if u < p[i] / q[i]:
            accepted += 1
        else:
            rejected = True
            break
    stop_in_prefix = not rejected and accepted == remaining
    if stop_in_prefix:
        emitted = drafts[:accepted]
        terminal, terminal_draws, terminal_u, terminal_row = "stop", 0, None, None
    else:
        terminal_u = float(uniforms(config.seed, Stream.TERMINAL, rng.terminal))
        terminal = "correction" if rejected else "bonus"
        token = (
            (drafts[accepted] + 1 + _pick("t", rid, gen, variant) % (VOCAB - 1)) % VOCAB
            if rejected
            else (_pick("bonus", rid, gen, variant) % VOCAB)
        )
        emitted = (*drafts[:accepted], token)
        terminal_draws, terminal_row = 1, accepted
    finished = len(state.generated) + len(emitted) >= config.max_new_tokens
    output = state.output + emitted
    committed = (state.frontier, *drafts[:accepted]) if state.frontier is not None else drafts[:accepted]
    rng_after = RngCounters(
        proposal=rng.proposal + DRAFTS,
        accept=rng.accept + len(accept_uniforms),
        terminal=rng.terminal + terminal_draws,
    )
    successor = RequestState(
        request_id=rid,
        output=output,
        prompt_len=state.prompt_len,
        cache=output[:-1],
        frontier=output[-1],
        position=len(output) - 1,
        processors=state.processors,
        processors_digest=state.processors_digest,
        rng=rng_after,
        generation=gen + 1,
        finished=finished,
        finish_reason="length" if finished else None,
    )
    successor_digest = successor.digest()
    coordinate_digest = digest({"request": rid, "generation": gen, "position": state.position})
    commit = SpeculativeCommit(
        request_id=rid,
        round_id=round_id,
        expected_generation=gen,
        layout=config.layout,
        accepted_draft_count=accepted,
        terminal_kind=terminal,
        emitted_token_ids=emitted,
        committed_kv_token_ids=committed,
        discarded_kv_token_ids=drafts[accepted:],
        rng_before=rng.as_tuple(),
        rng_after=rng_after.as_tuple(),
        processor_before_hash=state.processors_digest,
        processor_after_hash=successor.processors_digest,
        finished=finished,
        finish_reason=successor.finish_reason,
        coordinate_digest=coordinate_digest,
        successor_digest=successor_digest,
    )
    commit_digest = commit.digest()
    publication = RoundPublication(
        request_id=rid,
        round_id=round_id,
        expected_generation=gen,
        commit_digest=commit_digest,
        successor_digest=successor_digest,
        finished=finished,
        ready=RoundReady(
            request_id=rid,
            round_id=round_id,
            expected_generation=gen,
            coordinate_digest=coordinate_digest,
            draft_ids=drafts,
            q_draft=q,
            proposal_before=rng.proposal,
            proposal_after=rng_after.proposal,
        ),
        verified=RoundVerified(request_id=rid, round_id=round_id, p_draft=p, verify_rows=DRAFTS + 1),
        decided=RoundDecided(
            request_id=rid,
            round_id=round_id,
            accepted=accepted,
            terminal=terminal,
            emitted_ids=emitted,
            accept_counter=rng.accept,
            accept_draws=len(accept_uniforms),
            accept_uniforms=tuple(accept_uniforms),
            terminal_counter=rng.terminal,
            terminal_draws=terminal_draws,
            terminal_uniform=terminal_u,
            terminal_row=terminal_row,
            residual_mass=None if terminal_u is None else 1.0,
            terminal_mass_before=None if terminal_u is None else terminal_u / 2,
            terminal_token_mass=None if terminal_u is None else 1.0 - terminal_u / 2,
            finished=finished,
            finish_reason=successor.finish_reason,
        ),
        staged=RoundStaged(
            request_id=rid,
            round_id=round_id,
            committed_kv_ids=committed,
            discarded_kv_ids=drafts[accepted:],
            processor_before=state.processors_digest,
            processor_after=successor.processors_digest,
            rng_before=rng.as_tuple(),
            rng_after=rng_after.as_tuple(),
            successor_digest=successor_digest,
        ),
        published=RoundPublished(
            request_id=rid, round_id=round_id, generation=gen + 1, commit_digest=commit_digest
        ),
    )
    return publication, successor


def run_rounds(
    config: RequestConfig, state: RequestState, count: int
) -> list[tuple[RoundPublication, RequestState]]:
    """``count`` consecutive rounds from ``state`` (stopping early when the request finishes)."""
    out = []
    for _ in range(count):
        if state.finished:
            break
        publication, state = build_round(config, state)
        out.append((publication, state))
    return out


def replay_state(stored: Iterable[StoredEvent]) -> tuple[RequestConfig, RequestState]:
    """Rebuild a synthetic request's config and state from its stored events alone (INV-8)."""
    config: RequestConfig | None = None
    state: RequestState | None = None
    emitted: tuple[int, ...] = ()
    for item in stored:
        event = parse_event(item.payload)
        if isinstance(event, RequestOpened):
            config = event.config
            state = initial_state(config)
        elif state is None:
            raise AssertionError(f"{item.kind} before request_opened")
        elif isinstance(event, RoundDecided):
            emitted = event.emitted_ids
        elif isinstance(event, RoundStaged):
            output = state.output + emitted
            state = state.model_copy(
                update={
                    "output": output,
                    "cache": output[:-1],
                    "frontier": output[-1],
                    "position": len(output) - 1,
                    "rng": RngCounters(
                        proposal=event.rng_after[0], accept=event.rng_after[1], terminal=event.rng_after[2]
                    ),
                }
            )
        elif isinstance(event, RoundPublished):
            finished = len(state.generated) >= state_config(config).max_new_tokens
            state = state.model_copy(
                update={
                    "generation": event.generation,
                    "finished": finished,
                    "finish_reason": "length" if finished else None,
                }
            )
    if config is None or state is None:
        raise AssertionError("no request_opened event")
    return config, state


def state_config(config: RequestConfig | None) -> RequestConfig:
    if config is None:
        raise AssertionError("no request_opened event")
    return config
