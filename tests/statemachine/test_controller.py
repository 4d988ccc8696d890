"""The round controller end to end on synthetic rows: outcomes, stops, K/V instructions, fences, replay."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from specround.errors import (
    DraftIdOutOfVocabError,
    IllegalTransitionError,
    InvalidProcessorError,
    InvalidRequestError,
    LogUnavailableError,
    NonFiniteProbabilityError,
    RequestFinishedError,
    ShapeMismatchError,
    StaleCoordinateError,
    StaleGenerationError,
    UnknownLayoutError,
    ZeroProposalProbabilityError,
)
from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.lifecycle import RoundPhase
from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication
from specround.statemachine.replay import replay_states
from specround.statemachine.rounds import RoundStatus
from specround.statemachine.state import RequestState
from tests.statemachine._synthetic import log_fingerprint, random_input, scripted_input
from tests.statemachine.conftest import LogFactory

V = 16
EOS = 15
PROMPT = (1, 2, 3)
LAYOUTS = [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER]


def _controller(log: EventLog, layout: Layout = Layout.REPLAY_FRONTIER, **kwargs: object) -> RoundController:
    controller = RoundController(log)
    options: dict[str, object] = {"max_new_tokens": 32, "stop_token_ids": [EOS], **kwargs}
    controller.open_request(PROMPT, seed=11, vocab_size=V, layout=layout, request_id="r", **options)  # type: ignore[arg-type]
    return controller


def assert_frontier_shape(state: RequestState) -> None:
    """INV-1: C == O[:-1], F == O[-1] by token identity, P == len(C)."""
    assert state.cache == state.output[:-1]
    assert state.frontier == state.output[-1]
    assert state.position == len(state.cache)


# --- opening -------------------------------------------------------------------------------------------


def test_open_request_builds_the_generation_zero_state(event_log: EventLog) -> None:
    controller = _controller(event_log)
    state = controller.state("r")
    assert state.output == PROMPT and state.generation == 0 and not state.finished
    assert_frontier_shape(state)
    assert state.rng.as_tuple() == (0, 0, 0)
    head = event_log.head("r")
    assert head is not None and head.state_digest == state.digest() and head.generation == 0
    assert [e.kind for e in event_log.events("r")] == ["request_opened"]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"prompt_ids": []}, InvalidRequestError),
        ({"prompt_ids": [1, V]}, InvalidRequestError),
        ({"max_new_tokens": 0}, InvalidRequestError),
        ({"seed": 2**64}, InvalidRequestError),
        ({"layout": "sideways"}, UnknownLayoutError),
        ({"vocab_size": None}, InvalidRequestError),
        ({"coordinate": {"colour": "red"}}, InvalidRequestError),
        ({"processors": [{"kind": "temperature", "params": {"temperature": -1.0}}]}, InvalidProcessorError),
        ({"stop_token_ids": [V + 3]}, InvalidProcessorError),
        ({"request_id": ""}, InvalidRequestError),
    ],
)
def test_open_request_refuses_bad_input_before_logging(
    event_log: EventLog, kwargs: dict[str, object], error: type[Exception]
) -> None:
    controller = RoundController(event_log)
    arguments: dict[str, object] = {"prompt_ids": PROMPT, "seed": 1, "max_new_tokens": 4, "vocab_size": V}
    arguments.update(kwargs)
    with pytest.raises(error):
        controller.open_request(**arguments)  # type: ignore[arg-type]
    assert event_log.request_ids() == []


def test_reopening_is_idempotent_and_a_different_config_is_refused(event_log: EventLog) -> None:
    controller = _controller(event_log)
    again = controller.open_request(
        PROMPT, seed=11, vocab_size=V, request_id="r", max_new_tokens=32, stop_token_ids=[EOS]
    )
    assert again == controller.state("r")
    with pytest.raises(InvalidRequestError):
        controller.open_request(PROMPT, seed=12, vocab_size=V, request_id="r", max_new_tokens=32)
    assert len(list(event_log.events("r"))) == 1


# --- outcomes on both layouts --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    ("drafts", "accepted", "terminal", "expected"),
    [
        ((5, 6, 7), 0, 9, "correction"),  # A = 0
        ((5, 6, 7), 2, 9, "correction"),  # partial acceptance
        ((5, 6, 7), 3, 9, "bonus"),  # full acceptance + bonus
        ((), 0, 9, "bonus"),  # k = 0: plain target sampling
    ],
)
def test_outcomes_commit_the_frontier_and_accepted_rows_only(
    event_log: EventLog,
    layout: Layout,
    dtype: torch.dtype,
    drafts: tuple[int, ...],
    accepted: int,
    terminal: int,
    expected: str,
) -> None:
    controller = _controller(event_log, layout)
    s0 = controller.state("r")
    result = controller.run_round(scripted_input(controller, "r", drafts, accepted, terminal, dtype=dtype))
    emitted = (*drafts[:accepted], terminal)
    assert result.status is RoundStatus.PUBLISHED and result.phase is RoundPhase.PUBLISHED
    assert (result.emitted_ids, result.accepted, result.terminal) == (emitted, accepted, expected)
    state = result.state
    assert state is not None and state == controller.state("r")
    # INV-1 / INV-2
    assert_frontier_shape(state)
    assert state.output == s0.output + emitted and len(emitted) == accepted + 1
    # INV-3: reached tests = A + 1 after a rejection, k after full acceptance; one terminal draw.
    reached = accepted + 1 if accepted < len(drafts) else len(drafts)
    assert state.rng.as_tuple() == (0, reached, 1)
    # INV-5: the frontier row always, the accepted rows, never the rejected or later ones.
    kv = result.kv
    assert kv is not None and kv.layout is layout
    assert kv.keep == accepted + 1
    assert kv.committed_token_ids == (s0.frontier, *drafts[:accepted])
    assert kv.discarded_rows == tuple(range(accepted + 1, len(drafts) + 1))
    assert kv.discarded_token_ids == drafts[accepted:]
    assert kv.new_frontier == terminal and kv.new_frontier_position == len(state.cache)
    assert kv.materialize_frontier is (layout is Layout.RETAINED_FRONTIER)
    assert kv.branch is not None and kv.branch.generation == 0
    # INV-6: the fence moved by one; the head publishes the live state.
    assert state.generation == 1
    head = event_log.head("r")
    assert head is not None and head.state_digest == state.digest() and head.generation == 1
    kinds = [e.kind for e in event_log.events("r")][1:]
    assert kinds == ["round_ready", "round_verified", "round_decided", "round_staged", "round_published"]
    assert result.commit is not None and result.commit.accepted_draft_count == accepted


def test_both_layouts_publish_the_same_logical_successor(event_log: EventLog) -> None:
    states = []
    for layout in LAYOUTS:
        controller = RoundController(event_log)
        rid = f"r-{layout.value}"
        controller.open_request(
            PROMPT, seed=5, vocab_size=V, layout=layout, request_id=rid, max_new_tokens=32
        )
        generator = torch.Generator().manual_seed(3)
        for _ in range(4):
            controller.run_round(random_input(controller, rid, 3, generator))
        states.append(controller.state(rid))
    a, b = states
    assert (a.output, a.cache, a.frontier, a.position, a.rng, a.processors_digest) == (
        b.output,
        b.cache,
        b.frontier,
        b.position,
        b.rng,
        b.processors_digest,
    )


# --- stops and the length cap --------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_eos_inside_the_accepted_prefix_truncates_and_finishes(event_log: EventLog, layout: Layout) -> None:
    controller = _controller(event_log, layout)
    s0 = controller.state("r")
    result = controller.run_round(scripted_input(controller, "r", (5, EOS, 7), 3, 9))
    assert result.emitted_ids == (5, EOS) and result.accepted == 2 and result.terminal == "stop"
    assert result.finished and result.finish_reason == "stop"
    state = result.state
    assert state is not None and state.finished and state.finish_reason == "stop"
    assert_frontier_shape(state)  # the final token keeps the shape and gets no row
    # INV-3: two acceptance tests reached, no terminal draw after a stop inside the prefix.
    assert state.rng.as_tuple() == (0, 2, 0)
    kv = result.kv
    assert kv is not None and kv.keep == 2
    assert kv.committed_token_ids == (s0.frontier, 5) and kv.discarded_token_ids == (EOS, 7)
    assert not kv.materialize_frontier


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("accepted", "terminal"), [(1, "correction"), (3, "bonus")])
def test_eos_as_the_correction_or_bonus_finishes(
    event_log: EventLog, layout: Layout, accepted: int, terminal: str
) -> None:
    controller = _controller(event_log, layout)
    result = controller.run_round(scripted_input(controller, "r", (5, 6, 7), accepted, EOS))
    assert result.terminal == terminal and result.emitted_ids[-1] == EOS
    assert result.finished and result.finish_reason == "stop"
    assert result.state is not None and result.state.rng.terminal == 1


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cap", [1, 2, 3, 4, 5])
def test_length_cap_at_every_position(event_log: EventLog, layout: Layout, cap: int) -> None:
    controller = _controller(event_log, layout, max_new_tokens=cap)
    result = controller.run_round(scripted_input(controller, "r", (5, 6, 7), 3, 9))
    full = (5, 6, 7, 9)
    emitted = full[:cap]
    assert result.emitted_ids == emitted
    assert result.finished is (cap <= 4)
    if cap <= 3:  # the cap falls inside the accepted prefix: no terminal draw (INV-2, INV-3)
        assert result.terminal == "stop" and result.state is not None
        assert result.state.rng.as_tuple() == (0, cap, 0)
    else:
        assert result.terminal == "bonus"
    if cap <= 4:
        assert result.finish_reason == "length"
        assert controller.remaining("r") == 0
        # A finished request gets no further round (INV-2), and nothing is logged.
        before = log_fingerprint(event_log)
        with pytest.raises(RequestFinishedError):
            controller.run_round(scripted_input(controller, "r", (5,), 1, 9))
        assert log_fingerprint(event_log) == before
    else:
        assert controller.remaining("r") == 1


# --- fences ----------------------------------------------------------------------------------------------


def test_publishing_the_same_round_again_is_acknowledged_and_appends_nothing(event_log: EventLog) -> None:
    controller = _controller(event_log)
    item = scripted_input(controller, "r", (5, 6), 1, 9)
    first = controller.run_round(item)
    before = log_fingerprint(event_log)
    again = controller.run_round(item)  # INV-6: same transaction again
    assert again.status is RoundStatus.ACKNOWLEDGED
    assert again.state == first.state and again.commit == first.commit and again.kv == first.kv
    assert log_fingerprint(event_log) == before
    # A different transaction bound to the same (now stale) generation is refused.
    other = replace(item, draft_ids=(5, 7), q_rows=scripted_input(controller, "r", (5, 7), 1, 9).q_rows)
    with pytest.raises(StaleGenerationError):
        controller.run_round(other)
    assert log_fingerprint(event_log) == before
    assert controller.state("r") == first.state


def test_a_stale_publisher_is_refused_and_can_refresh(event_log_factory: LogFactory, tmp_path: Path) -> None:
    log = event_log_factory.new(tmp_path)
    winner = _controller(log)
    loser = RoundController(event_log_factory.reopen(log))
    assert loser.state("r") == winner.state("r")  # loaded by replay
    stale_item = scripted_input(loser, "r", (5, 6), 2, 9)
    winner.run_round(scripted_input(winner, "r", (4,), 0, 8))
    before = log_fingerprint(log)
    [result] = loser.step([stale_item])
    assert result.status is RoundStatus.ABORTED and isinstance(result.error, StaleGenerationError)
    assert log_fingerprint(log) == before
    assert loser.refresh("r") == winner.state("r")
    assert loser.run_round(scripted_input(loser, "r", (5, 6), 2, 9)).status is RoundStatus.PUBLISHED


def test_a_stale_coordinate_is_refused(event_log: EventLog) -> None:
    controller = _controller(event_log)
    old_digest = controller.coordinate_digest("r")
    controller.run_round(scripted_input(controller, "r", (5,), 1, 9))
    controller.run_round(scripted_input(controller, "r", (5,), 1, 9))
    before = log_fingerprint(event_log)
    stale = replace(scripted_input(controller, "r", (5,), 1, 9), coordinate_digest=old_digest)
    with pytest.raises(StaleCoordinateError):
        controller.run_round(stale)
    with pytest.raises(StaleCoordinateError):
        controller.run_round(replace(stale, coordinate_digest="0" * 64))
    assert log_fingerprint(event_log) == before


def test_coordinate_digest_is_the_round_coordinate_digest(event_log: EventLog) -> None:
    controller = _controller(
        event_log, coordinate={"target_model_id": "toy", "backend": {"dtype": "float64"}}
    )
    for _ in range(2):
        coordinate = controller.coordinate("r")
        assert coordinate.digest() == controller.coordinate_digest("r")
        assert coordinate.generation == controller.state("r").generation
        assert coordinate.target_model_id == "toy" and coordinate.backend.dtype == "float64"
        controller.run_round(scripted_input(controller, "r", (5,), 1, 9))


# --- batches -----------------------------------------------------------------------------------------------


def test_a_bad_round_aborts_alone_and_the_rest_of_the_step_publishes(event_log: EventLog) -> None:
    controller = RoundController(event_log)
    for rid in ("good", "zero-q", "nan-p", "bad-id", "bad-shape"):
        controller.open_request(PROMPT, seed=1, vocab_size=V, request_id=rid, max_new_tokens=8)
    good = scripted_input(controller, "good", (5, 6), 1, 9)
    zero_q = scripted_input(controller, "zero-q", (5, 6), 1, 9)
    zero_q = replace(zero_q, q_rows=torch.roll(zero_q.q_rows, 1, dims=1))  # q(d) = 0 for the drafts
    nan_p = scripted_input(controller, "nan-p", (5, 6), 1, 9)
    nan_p.p_rows[0, 5] = float("nan")
    bad_id = replace(scripted_input(controller, "bad-id", (5,), 1, 9), draft_ids=(V + 1,))
    bad_shape = replace(scripted_input(controller, "bad-shape", (5,), 1, 9), p_rows=torch.ones(3, V))
    before = {rid: controller.state(rid) for rid in controller.load_all()}
    results = controller.step([good, zero_q, nan_p, bad_id, bad_shape])
    assert [r.request_id for r in results] == ["good", "zero-q", "nan-p", "bad-id", "bad-shape"]
    assert results[0].status is RoundStatus.PUBLISHED
    assert isinstance(results[1].error, ZeroProposalProbabilityError)
    assert isinstance(results[2].error, NonFiniteProbabilityError)
    assert isinstance(results[3].error, DraftIdOutOfVocabError)
    assert isinstance(results[4].error, ShapeMismatchError)
    for result in results[1:]:
        assert result.status is RoundStatus.ABORTED and result.state is None
        assert controller.state(result.request_id) == before[result.request_id]  # INV-7
        assert len(list(event_log.events(result.request_id))) == 1
    # The refused rounds can be retried with corrected input.
    assert controller.run_round(scripted_input(controller, "nan-p", (5, 6), 1, 9)).ok


def test_a_batch_with_ragged_draft_lengths_decides_each_request_on_its_own(event_log: EventLog) -> None:
    controller = RoundController(event_log)
    for rid in ("a", "b", "c"):
        controller.open_request(PROMPT, seed=1, vocab_size=V, request_id=rid, max_new_tokens=8)
    items = [
        scripted_input(controller, "a", (), 0, 4),
        scripted_input(controller, "b", (5, 6, 7, 8), 4, 10),
        scripted_input(controller, "c", (5, 6), 0, 11),
    ]
    results = controller.step(items)
    assert [r.emitted_ids for r in results] == [(4,), (5, 6, 7, 8, 10), (11,)]
    assert [r.terminal for r in results] == ["bonus", "bonus", "correction"]


def test_step_phases_are_driven_in_order(event_log: EventLog) -> None:
    controller = _controller(event_log)
    item = scripted_input(controller, "r", (5,), 1, 9)
    before = log_fingerprint(event_log)
    with controller.begin_step([item.proposal()]) as step:
        assert step.phase is RoundPhase.ROUND_READY and step.request_ids == ["r"]
        with pytest.raises(IllegalTransitionError):
            step.decide()
        step.verify([item.verification()])
        assert step.phase is RoundPhase.VERIFIED_TEMPORARY
        # Another round for a request with a round in flight is refused on its own.
        [refused] = controller.step([item])
        assert isinstance(refused.error, IllegalTransitionError)
        step.decide()
        assert step.phase is RoundPhase.DECIDED
    # Leaving the block aborts: nothing published, state and log unchanged (INV-7).
    assert step.phase is RoundPhase.ABORTED
    [aborted] = step.results()
    assert aborted.status is RoundStatus.ABORTED and aborted.kv is not None and aborted.kv.keep == 0
    assert log_fingerprint(event_log) == before
    assert controller.run_round(item).status is RoundStatus.PUBLISHED


class _FailingLog:
    """Delegates to a log but fails every publish like an unreachable database."""

    def __init__(self, inner: EventLog) -> None:
        self.inner = inner
        self.failing = True

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def publish(self, publications: list[RoundPublication]) -> list[PublishOutcome]:
        if self.failing:
            raise LogUnavailableError("database is locked")
        return self.inner.publish(publications)


def test_a_failed_group_commit_aborts_every_round_and_changes_nothing(event_log: EventLog) -> None:
    failing = _FailingLog(event_log)
    controller = RoundController(failing)  # type: ignore[arg-type]
    for rid in ("a", "b"):
        controller.open_request(PROMPT, seed=1, vocab_size=V, request_id=rid, max_new_tokens=8)
    items = [scripted_input(controller, rid, (5,), 1, 9) for rid in ("a", "b")]
    before = log_fingerprint(event_log)
    results = controller.step(items)
    assert all(isinstance(r.error, LogUnavailableError) and r.status is RoundStatus.ABORTED for r in results)
    assert log_fingerprint(event_log) == before
    assert all(controller.state(rid).generation == 0 for rid in ("a", "b"))
    failing.failing = False
    assert all(r.status is RoundStatus.PUBLISHED for r in controller.step(items))


# --- processors and replay ------------------------------------------------------------------------------


def test_stateful_processors_advance_over_published_tokens_only(event_log: EventLog) -> None:
    chain = sampling_chain(V, presence_penalty=0.5, repetition_penalty=1.3)
    controller = RoundController(event_log)
    controller.open_request(PROMPT, seed=2, processors=chain, request_id="r", max_new_tokens=32)
    generator = torch.Generator().manual_seed(8)
    for _ in range(5):
        item = random_input(controller, "r", 3, generator)
        controller.run_round(item)
    state = controller.state("r")
    # INV-4: G = G_0 advanced over the prompt and then the emitted tokens, never over rejected drafts.
    expected = chain.clone()
    expected.advance_many(state.output)
    assert state.processors == expected.to_spec() and state.processors_digest == expected.digest()
    rebuilt = ProcessorChain.from_spec(state.processors, vocab_size=V)
    assert rebuilt.digest() == state.processors_digest


def test_a_fresh_controller_over_the_same_log_reproduces_the_live_states(
    event_log_factory: LogFactory, tmp_path: Path
) -> None:
    log = event_log_factory.new(tmp_path)
    controller = RoundController(log)
    generator = torch.Generator().manual_seed(4)
    for index, layout in enumerate(LAYOUTS * 2):
        controller.open_request(
            PROMPT,
            seed=index,
            vocab_size=V,
            layout=layout,
            request_id=f"q{index}",
            max_new_tokens=12,
            stop_token_ids=[EOS],
        )
    for _ in range(5):
        items = [
            random_input(controller, rid, int(torch.randint(0, 4, (1,), generator=generator)), generator)
            for rid in sorted(controller.load_all())
            if not controller.state(rid).finished
        ]
        controller.step(items)
    live = controller.load_all()
    # INV-8: the crash loses the in-memory projection; replay rebuilds it exactly.
    reopened = RoundController(event_log_factory.reopen(log))
    rebuilt = reopened.load_all()
    assert rebuilt == live
    assert {rid: s.digest() for rid, s in rebuilt.items()} == {rid: s.digest() for rid, s in live.items()}
    assert replay_states(log) == live
    unfinished = [rid for rid, s in rebuilt.items() if not s.finished]
    if unfinished:
        rid = unfinished[0]
        assert reopened.run_round(random_input(reopened, rid, 2, generator)).ok


def test_row_digests_are_logged_when_asked(event_log: EventLog) -> None:
    controller = RoundController(event_log, row_digests=True)
    controller.open_request(PROMPT, seed=1, vocab_size=V, request_id="r", max_new_tokens=8)
    controller.run_round(scripted_input(controller, "r", (5, 6), 1, 9))
    payloads = {e.kind: e.payload for e in event_log.events("r")}
    assert len(payloads["round_ready"]["q_rows_digest"]) == 64
    assert len(payloads["round_verified"]["p_rows_digest"]) == 64


class _BrokenLog(_FailingLog):
    """Fails publish with an exception that is not part of the library's tree (a bug in an adapter)."""

    def publish(self, publications: list[RoundPublication]) -> list[PublishOutcome]:
        if self.failing:
            raise RuntimeError("driver bug")
        return self.inner.publish(publications)


def test_an_unexpected_error_aborts_the_step_and_leaves_the_controller_usable(event_log: EventLog) -> None:
    broken = _BrokenLog(event_log)
    controller = RoundController(broken)  # type: ignore[arg-type]
    controller.open_request(PROMPT, seed=1, vocab_size=V, request_id="r", max_new_tokens=8)
    item = scripted_input(controller, "r", (5,), 1, 9)
    before = log_fingerprint(event_log)
    with pytest.raises(RuntimeError):
        controller.step([item])
    assert log_fingerprint(event_log) == before and controller.state("r").generation == 0
    broken.failing = False
    assert controller.run_round(item).status is RoundStatus.PUBLISHED  # no round left in flight
