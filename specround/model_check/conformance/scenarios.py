"""The conformance scenarios: witnesses replayed on the controller, malformed proposals, batch independence.

* :func:`run_witnesses` replays every :class:`~.witness.Witness` on a real controller with rows that force
  its planned decision (:func:`forced_input`); each attempt is checked with the plan as its input. The
  model's ``invalid_rows_abort`` branch (a target reporting branch rows of the wrong tokens or positions) has
  no witness here: the controller is handed p rows, not K/V rows, so every attempt's rows are modelled as
  ``[F, d_1..d_k]`` at ``P``; the adapter's rows are checked on the tiny model by the mutation lab.
* :func:`run_refusals`: malformed proposals must be refused with an :class:`~specround.errors.InputError`
  before any state changes (the relation's abort path, modelled as F-1).
* :func:`batch_independence`: the same rounds stepped together and one request at a time publish identical
  states (counter-based randomness).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from typing import Any

import torch

from specround.model_check.conformance.forced_rows import forced_rows, round_uniforms, spread
from specround.model_check.conformance.pairs import Attempt, ConformancePair, Harness
from specround.model_check.conformance.request_model import WITNESS_VOCAB, LogFactory, memory_log, seed_for
from specround.model_check.conformance.witness import BranchKind, Witness, WitnessRound, witness
from specround.model_check.random_rounds import seeded_random_input
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.types import Layout
from specround.statemachine.controller import RoundController
from specround.statemachine.faults import FaultPlan, FaultPoint, FaultRule
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput

__all__ = ["batch_independence", "forced_input", "run_refusals", "run_witness", "run_witnesses"]


def forced_input(controller: RoundController, rid: str, plan: WitnessRound) -> RoundInput:
    """The round input whose rows force ``plan`` on ``controller``'s current view of ``rid``."""
    config = controller.config(rid)
    state = controller.state(rid)
    accept_u, terminal_u = round_uniforms(config.seed, state, len(plan.drafts))
    q_rows, p_rows = forced_rows(
        config.vocab_size, plan.drafts, plan.accepted, plan.terminal_token, accept_u, terminal_u
    )
    return RoundInput(
        request_id=rid,
        coordinate_digest=controller.coordinate_digest(rid),
        draft_ids=plan.drafts,
        q_rows=q_rows,
        p_rows=p_rows,
        proposal_draws=plan.proposal_draws,
    )


def _witness_processors(vocab: int) -> tuple[dict[str, Any], ...]:
    """A stateful penalty on every witness request, so that G changes with every token it consumes."""
    return ProcessorChain.from_spec(
        [{"kind": "frequency_penalty", "params": {"penalty": 0.25}, "state": {}}], vocab_size=vocab
    ).to_spec()


def run_witness(witness_: Witness, log: EventLog, harness: Harness) -> None:
    """Replay one witness on real controllers over ``log``; its pairs go to ``harness``."""
    kind = witness_.kind
    rid = f"witness-{witness_.layout.value}-{kind.value}"
    plan = FaultPlan()
    controller = RoundController(log, faults=plan)
    controller.open_request(
        witness_.prompt,
        seed=seed_for(rid),
        max_new_tokens=witness_.max_new,
        vocab_size=WITNESS_VOCAB,
        processors=_witness_processors(WITNESS_VOCAB),
        layout=witness_.layout,
        stop_token_ids=witness_.stop_ids,
        request_id=rid,
    )
    stale = RoundController(log) if kind is BranchKind.STALE_WRITER else None
    if stale is not None:
        stale.state(rid)  # the stale writer has loaded generation 0
    first: RoundInput | None = None
    for n, round_plan in enumerate(witness_.rounds):
        writer = stale if (stale is not None and n == 1) else controller
        if kind is BranchKind.RETRY_AFTER_LOST_ACK and n == 1:
            assert first is not None
            item = first  # the very same transaction, bound to the old coordinate
        else:
            item = forced_input(writer, rid, round_plan)
        if round_plan.fault is not None:
            generation = writer.state(rid).generation + 1
            plan.add(
                FaultRule(
                    FaultPoint(round_plan.fault),
                    request_ids=frozenset({rid}),
                    generations=frozenset({generation}),
                )
            )
        attempt = Attempt(
            item=item,
            expected_generation=round_plan.expected_generation,
            fault=round_plan.fault,
            planned=(round_plan.accepted, round_plan.terminal_token),
        )
        harness.run(kind.value, writer, [attempt])
        first = first or item


Scenario = tuple[str, Callable[[], None]]
"""One labelled scenario step of a layout; a crash it raises is reported under its label."""


def _on_each_layout(
    layouts: Sequence[Layout],
    log_factory: LogFactory,
    scenarios: Callable[[Layout, EventLog, Harness], Iterable[Scenario]],
) -> tuple[list[ConformancePair], list[EventLog], list[str]]:
    """Run ``scenarios`` on a fresh log and harness per layout: pairs, the logs written, and failures."""
    pairs: list[ConformancePair] = []
    logs: list[EventLog] = []
    failures: list[str] = []
    for layout in map(Layout, layouts):
        log = log_factory()
        logs.append(log)
        harness = Harness(log)
        for label, run in scenarios(layout, log, harness):
            try:
                run()
            except Exception as error:  # a crash of the code under test is a finding, not an abort
                failures.append(f"{label} ({layout.value}): {type(error).__name__}: {error}")
        pairs += harness.pairs
    return pairs, logs, failures


def run_witnesses(
    layouts: Sequence[Layout] = tuple(Layout), log_factory: LogFactory = memory_log
) -> tuple[list[ConformancePair], list[EventLog], list[str]]:
    """Every :class:`BranchKind` witness on every layout: pairs, the logs written, and scenario failures."""

    def scenarios(layout: Layout, log: EventLog, harness: Harness) -> Iterator[Scenario]:
        for kind in BranchKind:
            yield f"witness {kind.value}", partial(_run_witness_of, kind, layout, log, harness)

    return _on_each_layout(layouts, log_factory, scenarios)


def _run_witness_of(kind: BranchKind, layout: Layout, log: EventLog, harness: Harness) -> None:
    """Build the witness of ``kind`` on ``layout`` and replay it."""
    run_witness(witness(kind, layout), log, harness)


def _refusal_inputs(controller: RoundController, rid: str) -> dict[str, RoundInput]:
    """Malformed proposals, each refused for one reason, by name."""
    vocab = controller.config(rid).vocab_size
    digest = controller.coordinate_digest(rid)
    drafts = (3, 5)
    q_rows, p_rows = forced_rows(vocab, drafts, 2, 1, [0.5, 0.5], 0.5)
    assert q_rows is not None

    def item(ids: Sequence[int], q: torch.Tensor | None, p: torch.Tensor) -> RoundInput:
        return RoundInput(request_id=rid, coordinate_digest=digest, draft_ids=tuple(ids), q_rows=q, p_rows=p)

    zero_q = q_rows.clone()
    zero_q[0] = spread(vocab, 4, 0.5)
    zero_q[0, 3] = 0.0  # q_1(d_1) = 0 while p_1(d_1) > 0: a proposal q could not have sampled
    zero_q[0] /= zero_q[0].sum()
    nan_p = p_rows.clone()
    nan_p[0, drafts[0]] = float("nan")  # p_1(d_1): a value the decision reads
    unnormalised = p_rows.clone()
    unnormalised[len(drafts)] *= 1.5  # the bonus row: read in full by the terminal draw
    return {
        "q(d) = 0": item(drafts, zero_q, p_rows),
        "NaN in p": item(drafts, q_rows, nan_p),
        "draft outside the vocabulary": item((3, vocab), q_rows, p_rows),
        "p rows of the wrong shape": item(drafts, q_rows, p_rows[:2]),
        "p row not normalised": item(drafts, q_rows, unnormalised),
    }


def run_refusals(
    layouts: Sequence[Layout] = tuple(Layout), log_factory: LogFactory = memory_log
) -> tuple[list[ConformancePair], list[EventLog], list[str]]:
    """Malformed proposals on every layout: each must be refused and change nothing."""

    def scenarios(layout: Layout, log: EventLog, harness: Harness) -> Iterator[Scenario]:
        controller = RoundController(log)
        rid = f"refusals-{layout.value}"
        controller.open_request(
            (1, 2, 3),
            seed=seed_for(rid),
            max_new_tokens=8,
            vocab_size=WITNESS_VOCAB,
            layout=layout,
            request_id=rid,
            stop_token_ids=(7,),
        )
        for name, item in _refusal_inputs(controller, rid).items():
            yield f"refusal {name!r}", partial(_run_refusal, harness, controller, rid, name, item)

    return _on_each_layout(layouts, log_factory, scenarios)


def _run_refusal(
    harness: Harness, controller: RoundController, rid: str, name: str, item: RoundInput
) -> None:
    """Submit one malformed proposal at the request's current generation; it must be refused."""
    generation = controller.state(rid).generation
    harness.run(f"refusal: {name}", controller, [Attempt(item, generation, refusal=True)])


def batch_independence(
    seed: int = 0, rounds: int = 4, log_factory: LogFactory = memory_log
) -> tuple[list[str], list[EventLog]]:
    """The same rounds stepped as one batch and one request at a time must publish identical states.

    Returns the requests whose states differ (one line each) and the two logs written.
    """
    together_log, alone_log = log_factory(), log_factory()
    together, alone = RoundController(together_log), RoundController(alone_log)
    layouts = (Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER, Layout.REPLAY_FRONTIER)
    rids = [f"batch-{n}" for n in range(len(layouts))]
    for n, (rid, layout) in enumerate(zip(rids, layouts, strict=True)):
        for controller in (together, alone):
            controller.open_request(
                (1, 2, 3),
                seed=seed * 1000 + 17 * n + 1,
                max_new_tokens=12,
                vocab_size=WITNESS_VOCAB,
                layout=layout,
                request_id=rid,
                stop_token_ids=(WITNESS_VOCAB - 1,),
            )
    findings: list[str] = []
    for r in range(rounds):
        active = [rid for rid in rids if not together.state(rid).finished]
        if not active:
            break
        ks = {rid: (r + n) % 4 + 1 for n, rid in enumerate(active)}
        row_seed = {rid: seed * 7919 + 101 * r + n for n, rid in enumerate(active)}
        together.step([seeded_random_input(together, rid, ks[rid], row_seed[rid]) for rid in active])
        for rid in active:
            alone.step([seeded_random_input(alone, rid, ks[rid], row_seed[rid])])
        for rid in active:
            a, b = together.state(rid), alone.state(rid)
            if a.digest() != b.digest():
                findings.append(
                    f"{rid} round {r + 1}: stepped in a batch it emits {a.generated}, alone {b.generated}"
                )
    return findings, [together_log, alone_log]
