"""Hand-built events and publications for log-level tests that need no controller."""

from __future__ import annotations

from specround.canonical import digest
from specround.sampling.types import Layout
from specround.statemachine.events import (
    RequestOpened,
    RoundDecided,
    RoundPublished,
    RoundReady,
    RoundStaged,
    RoundVerified,
)
from specround.statemachine.ports import RoundPublication
from specround.statemachine.state import RequestConfig


def opened_event(request_id: str = "req-0", prompt: tuple[int, ...] = (1, 2, 3)) -> RequestOpened:
    config = RequestConfig(
        request_id=request_id,
        prompt_ids=prompt,
        seed=7,
        max_new_tokens=16,
        layout=Layout.REPLAY_FRONTIER,
        vocab_size=8,
    )
    return RequestOpened(request_id=request_id, config=config, initial_state_digest="d" * 64)


def publication(
    request_id: str,
    round_id: str,
    expected_generation: int,
    *,
    token: int = 4,
    finished: bool = False,
) -> RoundPublication:
    """A structurally consistent one-token (k = 0, bonus) round."""
    successor_digest = digest({"request": request_id, "round": round_id, "token": token})
    commit_digest = digest({"commit": round_id, "token": token, "gen": expected_generation})
    common = {"request_id": request_id, "round_id": round_id}
    return RoundPublication(
        request_id=request_id,
        round_id=round_id,
        expected_generation=expected_generation,
        commit_digest=commit_digest,
        successor_digest=successor_digest,
        finished=finished,
        ready=RoundReady(
            **common,
            expected_generation=expected_generation,
            coordinate_digest="c" * 64,
            draft_ids=(),
            q_draft=(),
            proposal_before=0,
            proposal_after=0,
        ),
        verified=RoundVerified(**common, p_draft=(), verify_rows=1),
        decided=RoundDecided(
            **common,
            accepted=0,
            terminal="bonus",
            emitted_ids=(token,),
            accept_counter=0,
            accept_draws=0,
            accept_uniforms=(),
            terminal_counter=expected_generation,
            terminal_draws=1,
            terminal_uniform=0.5,
            terminal_row=0,
            finished=finished,
            finish_reason="length" if finished else None,
        ),
        staged=RoundStaged(
            **common,
            committed_kv_ids=(3,),
            discarded_kv_ids=(),
            processor_before="p" * 64,
            processor_after="p" * 64,
            rng_before=(0, 0, expected_generation),
            rng_after=(0, 0, expected_generation + 1),
            successor_digest=successor_digest,
        ),
        published=RoundPublished(**common, generation=expected_generation + 1, commit_digest=commit_digest),
    )
