"""The pipelined serving loop on the tiny model: the same tokens as the synchronous loop, every released
round already durable, and the write failures that roll requests back (retried, output unchanged)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget
from specround.adapters.memory_log import MemoryEventLog
from specround.adapters.proposers import NGramProposer, early_exit_proposer
from specround.audit import audit_log
from specround.errors import InjectedFaultError
from specround.sampling.processors import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.serving import GenerationRequest, RoundOutcome, ServingLoop
from specround.serving.pipelined_loop import PipelinedServingLoop
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


def run(
    tiny: LlamaBundle,
    pipelined: bool,
    *,
    layout: Layout = Layout.REPLAY_FRONTIER,
    proposer: str = "ngram",
    log: MemoryEventLog | None = None,
    faults: FaultPlan | None = None,
    tokens: int = 14,
) -> tuple[dict[str, tuple[int, ...]], list[RoundOutcome], MemoryEventLog, ServingLoop]:
    """Generate for every seed of SEEDS; outputs by request id, released outcomes, the log and the loop."""
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    draft: Proposer = NGramProposer(V, max_ngram=2) if proposer == "ngram" else early_exit_proposer(target, 1)
    log = log if log is not None else MemoryEventLog()
    kind = PipelinedServingLoop if pipelined else ServingLoop
    loop = kind(RoundController(log, faults=faults), target, draft, layout=layout)
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
