"""The z3 model's pipelined publication: concrete runs of each write outcome, its proofs and its mutants.

Round t (K = 2, A = 1: d_1 = 20 accepted, correction 30) is built on the prompt; round t + 1 (A = 0,
correction 50) on t's staged successor; the rival (k = 0, bonus 60) on the prompt. Each concrete case is
worked out by hand from specs/faults.md ("Pipelined publication") and compared with the relation; the
proofs show the same for every input within the model's bounds, and the mutants show that they can fail.
"""

from __future__ import annotations

import pytest
import z3

from specround.audit.pipelined_faults import PIPELINED_CELLS
from specround.model_check.mutants import MODEL_MUTATIONS, mutation_named
from specround.model_check.z3.pipelined_proofs import PIPELINED_MAX_DRAFT, cell_tag
from specround.model_check.z3.pipelined_rounds import (
    NO_ROLLBACK,
    WRITE_OUTCOMES,
    PipelinedInputs,
    PipelinedOutcome,
    PipelinedRound,
    pipelined_outcome,
)
from specround.model_check.z3.proof_runner import ProofStatus, run_proof
from specround.model_check.z3.proofs import ProofKind, all_proofs
from specround.model_check.z3.protocol_state import ProtocolConfig, ProtocolState, RoundInputs
from specround.model_check.z3.terms import Bool
from specround.model_check.z3.transition import state_values
from specround.sampling.types import Layout

K = PIPELINED_MAX_DRAFT
PROMPT = (10, 11, 12)
EOS = 2
LAYOUTS = [Layout.REPLAY_FRONTIER, Layout.RETAINED_FRONTIER]
PIPELINED_MUTANTS = {
    "t+1 on a fenced-out round": ("write conflicts",),
    "t+1 publishes although t failed": ("write fails",),
    "rollback ignores the failed round": ("write fails",),
    "release before durable": ("write fails", "write conflicts"),
}
"""The pipelined mutants and the write outcomes their counterexample may show."""

S0 = ProtocolState.concrete(
    output=PROMPT, cache=PROMPT[:-1], frontier=12, position=2, processed=(), rng=(0, 0, 0), generation=0,
    finished=False,
)  # fmt: skip
T = {"output": (*PROMPT, 20, 30), "cache": (*PROMPT, 20), "generation": 1, "last_txn": 7}
T1 = {"output": (*PROMPT, 20, 30, 50), "cache": (*PROMPT, 20, 30), "generation": 2, "last_txn": 8}
RIVAL = {"output": (*PROMPT, 60), "cache": PROMPT, "generation": 1, "last_txn": 9}


def run(cell: str, layout: Layout = Layout.REPLAY_FRONTIER) -> PipelinedOutcome:
    config = ProtocolConfig.concrete(max_draft=K, layout=layout, prompt_len=3, max_new=16, stop_ids=(EOS,))
    inputs = PipelinedInputs(
        first=RoundInputs.concrete(
            max_draft=K, drafts=(20, 21), accepted=1, terminal_token=30, row_tokens=(12, 20, 21), row_base=2,
            expected_generation=0, txn=7, proposal_draws=2,
        ),
        second=RoundInputs.concrete(
            max_draft=K, drafts=(40,), accepted=0, terminal_token=50, row_tokens=(30, 40), row_base=4,
            expected_generation=1, txn=8, proposal_draws=1,
        ),
        rival=RoundInputs.concrete(
            max_draft=K, drafts=(), accepted=0, terminal_token=60, row_tokens=(12,), row_base=2,
            expected_generation=0, txn=9,
        ),
        write=z3.IntVal(WRITE_OUTCOMES[cell]),
    )  # fmt: skip
    return pipelined_outcome(S0, inputs, config)


def holds(term: Bool) -> bool:
    value = z3.simplify(term)
    assert z3.is_true(value) or z3.is_false(value), value
    return bool(z3.is_true(value))


def flags(r: PipelinedRound) -> dict[str, bool | int]:
    """What the engine and the caller see of one round."""
    return {
        "submitted": holds(r.submitted),
        "durable": holds(r.durable),
        "acknowledged": holds(r.acknowledged),
        "aborted": holds(r.aborted),
        "released": holds(r.released),
        "rollback_to": z3.simplify(r.rollback_to).as_long(),
    }


def log_state(state: ProtocolState) -> dict[str, object]:
    values = state_values(state)
    return {key: values[key] for key in ("output", "cache", "generation", "last_txn")}


def published(acknowledged: bool = True) -> dict[str, bool | int]:
    return {
        "submitted": True,
        "durable": True,
        "acknowledged": acknowledged,
        "aborted": False,
        "released": acknowledged,
        "rollback_to": NO_ROLLBACK,
    }


def aborted(rollback_to: int, submitted: bool = True) -> dict[str, bool | int]:
    return {
        "submitted": submitted,
        "durable": False,
        "acknowledged": False,
        "aborted": True,
        "released": False,
        "rollback_to": rollback_to,
    }


def test_the_write_outcomes_are_the_pipelined_cells_of_specround_faults() -> None:
    assert tuple(cell for cell in WRITE_OUTCOMES if cell != "durable") == PIPELINED_CELLS


@pytest.mark.parametrize("layout", LAYOUTS)
def test_durable_pipeline_publishes_both_rounds(layout: Layout) -> None:
    o = run("durable", layout)
    assert flags(o.first) == flags(o.second) == published()
    assert log_state(o.after_first) == T and log_state(o.durable) == T1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_fails_aborts_both_rounds_and_crops_to_the_durable_cache(layout: Layout) -> None:
    o = run("write fails", layout)
    # both rounds were handed to the writer, so both crop to C of the durable state: len(PROMPT[:-1]) = 2
    assert flags(o.first) == flags(o.second) == aborted(rollback_to=2)
    assert state_values(o.durable) == state_values(S0)  # INV-7: the log is as before t
    with mutation_named("rollback ignores the failed round").applied():
        wrong = run("write fails", layout)
    assert flags(wrong.first)["rollback_to"] == 4  # t's staged cache, never written


@pytest.mark.parametrize("layout", LAYOUTS)
def test_write_conflicts_aborts_t_and_t_plus_1_the_log_holds_the_rival(layout: Layout) -> None:
    o = run("write conflicts", layout)
    assert flags(o.first) == flags(o.second) == aborted(rollback_to=2)
    assert log_state(o.durable) == RIVAL
    # t + 1 expects generation 1, which the rival's round holds: without the writer's parent check the
    # fence alone would publish it on the rival's round (INV-6)
    with mutation_named("t+1 on a fenced-out round").applied():
        wrong = run("write conflicts", layout)
    assert flags(wrong.second)["durable"] and log_state(wrong.durable) == T1


@pytest.mark.parametrize("layout", LAYOUTS)
def test_f5_in_flight_aborts_t_plus_1_alone_without_a_crop(layout: Layout) -> None:
    o = run("F-5 in flight", layout)
    assert flags(o.first) == published()
    assert flags(o.second) == aborted(rollback_to=NO_ROLLBACK, submitted=False)  # F-5: never handed over
    assert log_state(o.durable) == T


@pytest.mark.parametrize("layout", LAYOUTS)
def test_ack_lost_in_flight_t_is_durable_and_t_plus_1_publishes_on_it(layout: Layout) -> None:
    o = run("ack lost in flight", layout)
    assert flags(o.first) == published(acknowledged=False)  # F-6: durable, UNACKNOWLEDGED, not released
    assert flags(o.second) == published()
    assert log_state(o.durable) == T1
    with mutation_named("release before durable").applied():
        wrong = run("write fails", layout)
    assert flags(wrong.first)["released"] and not flags(wrong.first)["durable"]


def test_every_pipelined_cell_has_proofs_per_layout() -> None:
    proofs = {p.name: p for p in all_proofs()}
    for layout in LAYOUTS:
        for cell in WRITE_OUTCOMES:
            valid = proofs[f"protocol.pipelined.{layout.value}.{cell_tag(cell)}"]
            reach = proofs[f"protocol.reach.{layout.value}.pipelined_{cell_tag(cell)}"]
            assert valid.kind is ProofKind.VALID and reach.kind is ProofKind.REACHABLE
            assert cell == "durable" or (cell in valid.covers and cell in reach.covers)
        safety = proofs[f"protocol.pipelined.{layout.value}.safety"]
        assert set(PIPELINED_CELLS) <= set(safety.covers)


def test_the_pipelined_proofs_hold() -> None:
    proofs = [p for p in all_proofs() if ".pipelined" in p.name and ".mutant." not in p.name]
    assert len(proofs) == 2 * (2 * len(WRITE_OUTCOMES) + 2)
    results = [run_proof(p, timeout_s=60) for p in proofs]
    assert [r.name for r in results if not r.ok] == []
    assert {r.status for r in results} == {ProofStatus.PROVED, ProofStatus.REACHABLE}


def test_the_pipelined_mutants_are_refuted() -> None:
    by_name = {p.name: p for p in all_proofs()}
    assert {m.name for m in MODEL_MUTATIONS} >= set(PIPELINED_MUTANTS)
    for name, cells in PIPELINED_MUTANTS.items():
        mutation = mutation_named(name)
        assert mutation.refuted_by is not None and ".pipelined." in mutation.refuted_by
        assert set(cells) <= set(mutation.violates)
        result = run_proof(by_name[f"protocol.mutant.{name.replace(' ', '_')}"], timeout_s=60)
        assert result.status is ProofStatus.REFUTED and result.ok, name
        assert result.model["write"] in {str(WRITE_OUTCOMES[cell]) for cell in cells}, (name, result.model)
