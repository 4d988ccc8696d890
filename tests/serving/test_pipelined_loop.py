"""The pipelined serving loop on the tiny model: the same tokens as the synchronous loop, every released
round already durable, and the write failures that roll requests back (retried, output unchanged)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import NGramProposer, early_exit_proposer
from specround.audit import audit_log
from specround.errors import InjectedFaultError
from specround.sampling.processors import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.serving import DraftSlot, GenerationRequest, RoundOutcome, ServingLoop, StepCosts
from specround.serving.pipelined_loop import PipelinedServingLoop
from specround.serving.policy import FixedDraftLength
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint
from specround.statemachine.model_ports import Proposer
from specround.statemachine.ports import PublishOutcome, RoundPublication

V = 8
PROMPT = (1, 2, 3, 1, 2, 4)
SEEDS = (1, 2, 3)


def chain() -> ProcessorChain:
    return sampling_chain(V, temperature=0.9, top_k=6, top_p=0.95, repetition_penalty=1.2)


class FailingLog(MemoryEventLog):
    """A memory log whose ``publish`` raises an injected fault on the chosen calls (nothing appended)."""

    def __init__(self, fail_calls: Sequence[int]) -> None:
        super().__init__()
        self.calls = 0
        self.fail_calls = set(fail_calls)

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        self.calls += 1
        if self.calls in self.fail_calls:
            raise InjectedFaultError("write", f"publish call {self.calls} fails")
        return super().publish(publications)


class RecordingPolicy(FixedDraftLength):
    """K = 2 always; records what it has observed at each choice, and every ``forget``."""

    def __init__(self) -> None:
        super().__init__(2)
        self.observed: list[tuple[object, ...]] = []
        self.history_at_choice: list[tuple[tuple[object, ...], ...]] = []
        self.forgotten: list[str] = []
        self.events: list[tuple[str, str, int]] = []
        """("observe", request, generation) and ("forget", request, -1), in order."""

    def choose(self, slots: Sequence[DraftSlot]) -> list[int]:
        self.history_at_choice.append(tuple(self.observed))
        return super().choose(slots)

    def observe(self, outcomes: Sequence[RoundOutcome], costs: StepCosts) -> None:
        self.events += [("observe", o.request_id, o.generation) for o in outcomes]
        self.observed += [
            (
                o.request_id,
                o.generation,
                o.requested_k,
                o.drafted,
                o.accepted,
                o.reached,
                o.emitted_ids,
                o.terminal,
                o.finished,
                o.finish_reason,
            )
            for o in outcomes
        ]

    def forget(self, request_id: str) -> None:
        self.forgotten.append(request_id)
        self.events.append(("forget", request_id, -1))


def run(
    tiny: LlamaBundle,
    pipelined: bool,
    *,
    layout: Layout = Layout.REPLAY_FRONTIER,
    proposer: str = "ngram",
    log: MemoryEventLog | None = None,
    faults: FaultPlan | None = None,
    tokens: int = 14,
    policy: RecordingPolicy | None = None,
) -> tuple[dict[str, tuple[int, ...]], list[RoundOutcome], MemoryEventLog, ServingLoop]:
    """Generate for every seed of SEEDS; outputs by request id, released outcomes, the log and the loop."""
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    draft: Proposer = NGramProposer(V, max_ngram=2) if proposer == "ngram" else early_exit_proposer(target, 1)
    log = log if log is not None else MemoryEventLog()
    kind = PipelinedServingLoop if pipelined else ServingLoop
    loop = kind(RoundController(log, faults=faults), target, draft, layout=layout, policy=policy)
    released: list[RoundOutcome] = []

    def on_round(outcome: RoundOutcome) -> None:
        head = log.head(outcome.request_id)  # the round is in the log before anyone sees its tokens
        assert head is not None and head.generation >= outcome.generation
        released.append(outcome)

    loop.on_round = on_round
    for seed in SEEDS:
        loop.submit(GenerationRequest(PROMPT, tokens, seed=seed, processors=chain(), request_id=f"r{seed}"))
    finished = loop.run()
    loop.close()
    return {rid: state.output for rid, state in finished.items()}, released, log, loop


@pytest.mark.parametrize("layout", [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER])
@pytest.mark.parametrize("proposer", ["ngram", "early_exit"])
def test_pipelined_and_synchronous_loops_release_the_same_rounds(
    tiny: LlamaBundle, layout: Layout, proposer: str
) -> None:
    sync_out, sync_rounds, _, _ = run(tiny, False, layout=layout, proposer=proposer)
    pipe_out, pipe_rounds, log, loop = run(tiny, True, layout=layout, proposer=proposer)
    assert pipe_out == sync_out and len(pipe_out) == len(SEEDS)
    key = [(o.request_id, o.generation, o.emitted_ids) for o in sync_rounds]
    assert sorted(key) == sorted((o.request_id, o.generation, o.emitted_ids) for o in pipe_rounds)
    assert loop.stats.rounds == len(pipe_rounds) == len(sync_rounds)
    assert audit_log(log).ok and not loop.errors
    assert isinstance(loop, PipelinedServingLoop) and not loop.in_flight


def test_the_policy_chooses_each_k_from_the_history_the_synchronous_loop_gives_it(tiny: LlamaBundle) -> None:
    """Step t's rounds are observed when staged, before step t + 1's K is chosen: not one step late."""
    sync, pipe = RecordingPolicy(), RecordingPolicy()
    run(tiny, False, policy=sync, tokens=20)
    run(tiny, True, policy=pipe, tokens=20)
    assert len(sync.history_at_choice) > 3 and any(o[5] > o[4] for o in sync.observed)  # a rejection seen
    assert any(o[9] is not None for o in sync.observed)  # and a finish reason
    assert pipe.history_at_choice == sync.history_at_choice
    assert sorted(pipe.forgotten) == sorted(sync.forgotten) == sorted(f"r{seed}" for seed in SEEDS)


def test_a_rolled_back_round_is_forgotten_by_the_policy_before_its_redo(tiny: LlamaBundle) -> None:
    """The redo draws the uniforms the rolled-back round used: its K must not depend on their outcome."""
    policy = RecordingPolicy()
    faulted, _, _, loop = run(tiny, True, log=FailingLog((2,)), policy=policy)
    clean, _, _, _ = run(tiny, True)
    assert faulted == clean and not loop.errors
    # Step 2's rounds were observed when staged, before their write failed, and are observed again when
    # redone. (Whether step 3 was staged on them before the failure was known depends on the writer thread.)
    seen = Counter((rid, generation) for kind, rid, generation in policy.events if kind == "observe")
    assert {(f"r{s}", 2) for s in SEEDS} <= {key for key, count in seen.items() if count > 1}
    for seed in SEEDS:
        mine = [(kind, generation) for kind, rid, generation in policy.events if rid == f"r{seed}"]
        assert mine[-1][0] == "forget"  # finished
        for at, (kind, generation) in enumerate(mine):
            if kind == "observe" and ("observe", generation) in mine[:at]:  # a redo ...
                earlier = max(i for i in range(at) if mine[i] == ("observe", generation))
                assert ("forget", -1) in mine[earlier:at]  # ... only after its first try was forgotten


@pytest.mark.parametrize("fail_calls", [(2,), (3, 4), (5,)])
def test_a_failed_write_rolls_back_and_is_retried_with_the_same_tokens(
    tiny: LlamaBundle, fail_calls: tuple[int, ...]
) -> None:
    """The failed step's rounds and the next step's rounds built on them are redone from the durable state."""
    clean, _, _, _ = run(tiny, True)
    log = FailingLog(fail_calls)
    faulted, released, log, loop = run(tiny, True, log=log)
    assert log.calls > max(fail_calls)
    assert faulted == clean and not loop.errors
    assert audit_log(log).ok
    generations = [(o.request_id, o.generation) for o in released]
    assert len(generations) == len(set(generations))  # no round released twice


@pytest.mark.parametrize("point", [FaultPoint.BEFORE_PUBLICATION, FaultPoint.AFTER_PUBLICATION])
def test_faults_around_publication_leave_the_pipelined_output_unchanged(
    tiny: LlamaBundle, point: FaultPoint
) -> None:
    clean, _, _, _ = run(tiny, False)
    plan = FaultPlan.at(point, generations=[2, 3])
    faulted, _, log, loop = run(tiny, True, faults=plan)
    assert plan.fired
    assert faulted == clean and not loop.errors
    assert audit_log(log).ok


def test_a_failure_that_is_not_a_fault_fails_only_its_request_once(tiny: LlamaBundle) -> None:
    """A non-retryable abort fails the request with the first error; the dependants add no error."""
    log = FailingLog(range(3, 100))
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    loop = PipelinedServingLoop(RoundController(log), target, NGramProposer(V))
    rid = loop.submit(GenerationRequest(PROMPT, 30, seed=1, processors=chain(), request_id="r"))
    with pytest.raises(InjectedFaultError):
        for _ in range(40):  # injected faults are retried a bounded number of times, then the request fails
            loop.step()
            if rid in loop.errors:
                raise loop.errors[rid]
    assert rid in loop.errors and not loop.active
    assert audit_log(log).ok
