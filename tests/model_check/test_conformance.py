"""The real controller conforms to the z3 round relation: witnesses of every branch, refusals, the walk.

Every pair checked here is a real round attempt on a real ``RoundController`` compared with
``round_relation`` of the z3 model (INV-1..INV-8, INV-10 via the planned decisions, F-1..F-6).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specround.adapters.sql.log import SqlEventLog
from specround.errors import InputError, LogIntegrityError, SpecroundError
from specround.model_check.conformance import (
    PIPELINE_ENDINGS,
    UNMATCHED_PROCESSORS,
    WITNESS_VOCAB,
    Attempt,
    BranchKind,
    Harness,
    MachineWalk,
    RandomChooser,
    WitnessRound,
    batch_independence,
    bracket_row,
    forced_input,
    forced_rows,
    run_conformance,
    run_refusals,
    run_witnesses,
    witness,
)
from specround.model_check.mutants import mutation_named
from specround.model_check.random_rounds import seeded_random_input
from specround.sampling.exact import decide_from_uniforms, inverse_cdf
from specround.sampling.types import PAD_ID, Layout, SamplerBatch, TerminalKind
from specround.statemachine.invariants import log_fingerprint
from specround.statemachine.ports import EventLog

LAYOUTS = list(Layout)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


# --- the witnesses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_branch_kind_has_a_witness(layout: Layout) -> None:
    for kind in BranchKind:
        found = witness(kind, layout)
        assert len(found.rounds) == kind.rounds
        assert all(0 <= t < WITNESS_VOCAB for t in found.prompt)
        if kind.fault is not None:
            assert found.rounds[0].fault == kind.fault  # F-1..F-6


def test_witnesses_reach_their_branches() -> None:
    """Spot checks that the z3 witnesses are what their names say (guards the query conditions)."""
    layout = Layout.REPLAY_FRONTIER
    zero = witness(BranchKind.ZERO_ACCEPT, layout).rounds[0]
    assert zero.accepted == 0 and len(zero.drafts) >= 2
    full = witness(BranchKind.FULL_ACCEPT_BONUS, layout).rounds[0]
    assert full.accepted == len(full.drafts) >= 2
    eos = witness(BranchKind.EOS_LAST_DRAFT, layout)
    assert eos.rounds[0].drafts[-1] in eos.stop_ids and eos.rounds[0].accepted == len(eos.rounds[0].drafts)
    inside = witness(BranchKind.STOP_INSIDE_PREFIX, layout)
    plan = inside.rounds[0]
    stop_at = next(i for i, d in enumerate(plan.drafts) if d in inside.stop_ids)
    assert stop_at + 1 < plan.accepted  # a stop strictly inside the accepted prefix
    assert witness(BranchKind.PLAIN_DECODE, layout).rounds[0].drafts == ()
    retry = witness(BranchKind.RETRY_AFTER_LOST_ACK, layout).rounds
    assert retry[0].fault == "F-6" and retry[1].expected_generation == 0


@pytest.mark.parametrize("layout", LAYOUTS)
def test_witnesses_conform_on_the_controller(layout: Layout) -> None:
    pairs, logs, failures = run_witnesses([layout])
    assert failures == []
    assert {p.scenario for p in pairs} == {k.value for k in BranchKind}
    bad = [f"{p.scenario}: {p.attempt}: {p.detail}" for p in pairs if not p.conforms]
    assert bad == []
    statuses = {p.scenario: p.status for p in pairs}
    assert statuses["fault_F-6"] == "unacknowledged"  # F-6: published, acknowledgement lost
    assert statuses["fault_F-3"] == "aborted"  # F-1..F-5: nothing published (INV-7)
    retry = [p for p in pairs if p.scenario == "retry_after_lost_ack"]
    assert [p.status for p in retry] == ["unacknowledged", "acknowledged"]  # INV-6
    assert retry[0].observed == retry[1].observed
    stale = [p for p in pairs if p.scenario == "stale_writer"]
    assert [p.status for p in stale] == ["published", "aborted"]
    for log in logs:
        log.close()


def test_witnesses_conform_on_sqlite(tmp_path: Path) -> None:
    counter = itertools.count()

    def sqlite_log() -> EventLog:
        return SqlEventLog.open(tmp_path / f"log{next(counter)}.sqlite")

    pairs, logs, failures = run_witnesses([Layout.RETAINED_FRONTIER], sqlite_log)
    assert failures == [] and pairs
    assert [p.detail for p in pairs if not p.conforms] == []
    for log in logs:
        log.close()


# --- forcing a decision -------------------------------------------------------------------------------


@st.composite
def plans(draw: st.DrawFn) -> tuple[tuple[int, ...], int, int, list[float], float]:
    k = draw(st.integers(0, 4))
    drafts = tuple(draw(st.lists(st.integers(0, 7), min_size=k, max_size=k)))
    accepted = draw(st.integers(0, k))
    choices = [t for t in range(8) if accepted == k or t != drafts[accepted]]
    terminal = draw(st.sampled_from(choices))
    unit = st.floats(0.0, 1.0, exclude_max=True)
    return drafts, accepted, terminal, draw(st.lists(unit, min_size=k, max_size=k)), draw(unit)


@given(plans())
@settings(max_examples=80)
def test_forced_rows_force_the_plan_on_the_real_sampler(
    plan: tuple[tuple[int, ...], int, int, list[float], float],
) -> None:
    drafts, accepted, terminal, accept_u, terminal_u = plan
    q, p = forced_rows(8, drafts, accepted, terminal, accept_u, terminal_u)
    k = len(drafts)
    batch = SamplerBatch(
        p=p[None],
        q=(q if q is not None else torch.empty(0, 8, dtype=torch.float64))[None],
        draft_ids=torch.tensor([drafts], dtype=torch.int64).reshape(1, k),
        draft_lens=torch.tensor([k]),
        stop_ids=torch.empty((1, 0), dtype=torch.int64),
        remaining=torch.tensor([100]),
        seeds=torch.zeros(1, dtype=torch.int64),
        accept_counters=torch.zeros(1, dtype=torch.int64),
        terminal_counters=torch.zeros(1, dtype=torch.int64),
    )
    decision = decide_from_uniforms(
        batch,
        torch.tensor([accept_u], dtype=torch.float64).reshape(1, k),
        torch.tensor([terminal_u], dtype=torch.float64),
    )
    assert int(decision.accepted[0]) == accepted
    emitted = decision.output_ids[0, : int(decision.emitted[0])].tolist()
    assert emitted == [*drafts[:accepted], terminal]
    kind = TerminalKind.CORRECTION if accepted < k else TerminalKind.BONUS
    assert int(decision.terminal[0]) == int(kind)
    assert PAD_ID not in emitted


@given(st.data())
@settings(max_examples=60)
def test_hypothesis_plans_forced_on_the_controller_conform(data: st.DataObject) -> None:
    """Hypothesis picks a request (prompt, budget, stop tokens, layout) and a decision; the forced round
    must conform to the relation with the *planned* decision as input (INV-2, INV-3, INV-5, INV-10)."""
    from specround.adapters.memory_log import MemoryEventLog
    from specround.statemachine.controller import RoundController

    prompt = tuple(data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=3)))
    stops = tuple(data.draw(st.sets(st.integers(0, 7), max_size=2)))
    layout = data.draw(st.sampled_from(LAYOUTS))
    drafts, accepted, terminal, _, _ = data.draw(plans())
    log = MemoryEventLog()
    controller = RoundController(log)
    controller.open_request(
        prompt,
        seed=data.draw(st.integers(0, 2**32)),
        max_new_tokens=data.draw(st.integers(1, 8)),
        vocab_size=8,
        layout=layout,
        stop_token_ids=stops,
        request_id="h",
    )
    plan = WitnessRound(drafts, accepted, terminal, len(drafts), None, 0)
    harness = Harness(log)
    harness.run(
        "hypothesis",
        controller,
        [Attempt(forced_input(controller, "h", plan), 0, planned=(accepted, terminal))],
    )
    [pair] = harness.pairs
    assert pair.conforms, pair.detail
    assert pair.status == "published"


def test_bracket_rows_are_narrow_around_the_uniform() -> None:
    row = bracket_row(8, 5, 0.5, excluded=2)
    assert float(row.sum()) == pytest.approx(1.0) and float(row[2]) == 0.0
    assert int(inverse_cdf(row[None], torch.tensor([0.5])).tokens[0]) == 5
    assert int(inverse_cdf(row[None], torch.tensor([0.75])).tokens[0]) != 5  # another uniform leaves it
    with pytest.raises(InputError):
        bracket_row(8, 2, 0.5, excluded=2)
    with pytest.raises(InputError):
        forced_rows(8, (3, 4), 1, 4, [0.1, 0.2], 0.3)  # a correction equal to the rejected draft


# --- refusals, batch independence, the walk -----------------------------------------------------------


def test_malformed_proposals_are_refused_and_change_nothing() -> None:
    pairs, _, failures = run_refusals()
    assert failures == []
    assert len(pairs) == 10  # five malformed proposals per layout (INV-7)
    assert all(p.status == "aborted" and p.conforms for p in pairs), [p.detail for p in pairs]
    assert all(p.observed == p.pre for p in pairs)


def test_batch_composition_changes_nothing() -> None:
    findings, _ = batch_independence(seed=3)
    assert findings == []


def test_walk_keeps_every_invariant_and_conforms() -> None:
    walk = MachineWalk()
    walk.run(RandomChooser(0), 40)  # the seed and length of the mutation lab's walk
    assert [str(v) for v in walk.violations] == []
    assert {"step", "fault", "retry", "stale_publisher", "crash_and_replay", "pipelined"} <= set(
        walk.rules_run
    )
    assert len(walk.points_run) == 6  # F-1..F-6
    assert walk.endings_run == set(PIPELINE_ENDINGS)
    assert [p.detail for p in walk.pairs if not p.conforms] == []


class _DrawChooser:
    def __init__(self, data: st.DataObject) -> None:
        self.data = data

    def integer(self, low: int, high: int) -> int:
        return self.data.draw(st.integers(low, high))


@given(st.data())
@settings(max_examples=12)
def test_walk_driven_by_hypothesis_conforms(data: st.DataObject) -> None:
    walk = MachineWalk()
    walk.run(_DrawChooser(data), 12)
    assert [str(v) for v in walk.violations] == []
    assert [f"{p.scenario}: {p.detail}" for p in walk.pairs if not p.conforms] == []


# Two rounds that leave walk-0 unfinished; even seeds draw float64 rows, as seeded_random_input does.
PIPELINED_SHAPES = ((2, 12), (1, 14))


@pytest.mark.parametrize("ending", PIPELINE_ENDINGS)
def test_the_pipelined_rule_keeps_every_invariant(ending: str) -> None:
    """t's write held while t + 1 runs on its staged successor, then t ends (INV-5, INV-6, INV-7, F-5)."""
    walk = MachineWalk()
    fingerprint = log_fingerprint(walk.log)
    assert walk.pipelined(["walk-0"], ending, [PIPELINED_SHAPES], rival_seed=13) == 2  # t + 1 was submitted
    walk.check_invariants()
    assert [str(v) for v in walk.violations] == []
    state = walk.known["walk-0"]
    assert walk.controller.state("walk-0") == state
    assert (
        state.generation == {"durable": 2, "write fails": 0, "write conflicts": 1, "F-5 on t + 1": 1}[ending]
    )
    if ending == "write fails":  # the durable state and the log as before t
        assert log_fingerprint(walk.log) == fingerprint
    if ending == "write conflicts":  # the other writer's round is the head; t and t + 1 appended nothing
        rounds = {e.round_id for e in walk.log.events("walk-0") if e.kind == "round_published"}
        assert rounds == {"walk-rival-g1"}


COMPANION_SHAPES = ((1, 16), (2, 18))  # walk-1's rounds t and t + 1, leaving it unfinished


@pytest.mark.parametrize("ending", PIPELINE_ENDINGS)
def test_the_pipelined_rule_with_two_requests_loses_only_what_the_ending_loses(ending: str) -> None:
    walk = MachineWalk()
    shapes = [PIPELINED_SHAPES, COMPANION_SHAPES]
    assert walk.pipelined(["walk-0", "walk-1"], ending, shapes, rival_seed=13) == 2
    walk.check_invariants()
    assert [str(v) for v in walk.violations] == []
    # walk-1 shares t's group commit: lost only when the whole write fails, not when walk-0 is fenced out.
    assert walk.known["walk-1"].generation == (0 if ending == "write fails" else 2)


def test_pipelined_rounds_publish_what_two_synchronous_steps_publish() -> None:
    pipelined = MachineWalk()
    pipelined.pipelined(["walk-0"], "durable", [PIPELINED_SHAPES])
    synchronous = MachineWalk()  # the same requests, stepped one round at a time
    for k, seed in PIPELINED_SHAPES:
        [result] = synchronous.controller.step(
            [seeded_random_input(synchronous.controller, "walk-0", k, seed)]
        )
        assert result.state is not None
    assert pipelined.known["walk-0"].digest() == synchronous.controller.state("walk-0").digest()
    assert log_fingerprint(pipelined.log) == log_fingerprint(synchronous.log)


def test_the_pipelined_rule_catches_a_writer_that_publishes_on_a_fenced_out_round() -> None:
    walk = MachineWalk()
    with mutation_named("writer publishes rounds built on a failed round").applied() as reach:
        try:
            walk.pipelined(["walk-0"], "write conflicts", [PIPELINED_SHAPES], rival_seed=13)
            walk.check_invariants()
        except SpecroundError as error:  # the log no longer rebuilds the request (a walk records a crash)
            assert isinstance(error, LogIntegrityError), error
    assert reach.reached
    found = [str(v) for v in walk.violations]
    assert any("INV-7" in v and "did not become durable is published" in v for v in found), found  # t + 1
    assert any("INV-7" in v and "changed the log" in v for v in found), found


def test_the_pipelined_rule_catches_a_decision_for_a_row_aborted_at_f5() -> None:
    walk = MachineWalk()
    shapes = [PIPELINED_SHAPES, COMPANION_SHAPES]  # walk-1's round t + 1 is handed over beside walk-0's
    with mutation_named("decision handed out for a row aborted at F-5").applied() as reach:
        walk.pipelined(["walk-0", "walk-1"], "F-5 on t + 1", shapes)
        walk.check_invariants()
    assert reach.reached
    found = [str(v) for v in walk.violations]
    assert any("INV-7" in v and "aborted at F-5 handed the engine a decision" in v for v in found), found
    assert any("INV-7" in v and "aborted at F-5 has rollback_to" in v for v in found), found


def test_the_full_run_conforms() -> None:
    run = run_conformance(walk_rules=20)
    assert run.conforming, (run.failures, [p.detail for p in run.nonconforming])
    assert run.violations == []
    assert len(run.witnesses) == 2 * len(BranchKind)


# --- a non-conforming pair is reported with the expected successor ------------------------------------


def test_a_nonconforming_pair_names_the_expected_successor() -> None:
    with mutation_named("extra RNG draw after a stop").applied():
        pairs, _, _ = run_witnesses([Layout.REPLAY_FRONTIER])
    bad = {p.scenario: p for p in pairs if not p.conforms}
    pair = bad[BranchKind.STOP_INSIDE_PREFIX.value]
    assert pair.expected is not None and pair.observed is not None
    assert pair.expected["rng"][1] + 1 == pair.observed["rng"][1]  # one ACCEPT draw too many (INV-3)
    assert "rng: expected" in pair.detail
    assert pair.as_json()["expected"]["rng"] == list(pair.expected["rng"])


def test_pairs_recheck_with_the_relation_solver() -> None:
    """Each pair's verdict (the relation simplified on concrete values) equals conforms()' solver verdict."""
    good, _, _ = run_witnesses([Layout.RETAINED_FRONTIER])
    with mutation_named("tokens after a stop published").applied():
        bad, _, _ = run_witnesses([Layout.RETAINED_FRONTIER])
    relation_only = [
        p
        for p in good + bad
        if p.acknowledged == p.expected_acknowledged and "does not rebuild" not in p.detail
    ]
    assert any(not p.conforms for p in relation_only)
    for pair in relation_only:
        assert pair.recheck() == pair.conforms, pair.detail


def test_processor_state_off_the_published_tokens_is_unmatched() -> None:
    with mutation_named("processors advanced over a rejected draft").applied():
        pairs, _, _ = run_witnesses([Layout.REPLAY_FRONTIER])
    bad = {p.scenario: p for p in pairs if not p.conforms}
    pair = bad[BranchKind.ZERO_ACCEPT.value]
    assert pair.observed is not None and pair.observed["processed"] == (UNMATCHED_PROCESSORS,)  # INV-4


def test_harness_reads_decisions_back_from_the_log() -> None:
    from specround.adapters.memory_log import MemoryEventLog
    from specround.statemachine.controller import RoundController

    log = MemoryEventLog()
    controller = RoundController(log)
    controller.open_request((1, 2), seed=5, max_new_tokens=6, vocab_size=8, request_id="r")
    harness = Harness(log)
    q, p = forced_rows(8, (4, 6), 1, 2, [0.3, 0.6], 0.4)
    from specround.statemachine.rounds import RoundInput

    item = RoundInput("r", controller.coordinate_digest("r"), (4, 6), q, p)
    [result] = harness.run("readback", controller, [Attempt(item, 0)])
    [pair] = harness.pairs
    assert pair.conforms, pair.detail
    assert f"A={result.accepted}" in pair.attempt
