"""The mutation lab on a fast subset: named failure classes, seams, activity, kills, a harmless survivor.

The full lab (every mutation through every check) runs in ``test_check_cli.py``'s slow test of
``specround check --json``.
"""

from __future__ import annotations

import pytest
import torch

import specround.sampling.exact as exact
from specround.model_check.mutants import MODEL_MUTATIONS, MUTATIONS, Mutation, Seam, mutation_named
from specround.model_check.mutation_lab import CHECKS, LabReport, prepare, run_checks_once, run_lab

# The failure classes the lab must hold (contract#failure-lab), each by the mutation that implements it.
FAILURE_CLASSES = {
    "shifted logit row (off by one)": "shifted logit row",
    "continuing acceptance after the first rejection": "continue after rejection",
    "bonus sampled from q": "bonus from q",
    "bonus sampled from a stale row": "bonus from a stale row",
    "correction sampled from p instead of the residual": "correction from p",
    "residual not renormalised": "residual not renormalised",
    "raw logits used as q while sampling from a processed q": "raw logits as q",
    "q = 0 proposal accepted": "q = 0 proposal accepted",
    "rejected draft KV committed": "rejected draft K/V committed",
    "correction token given the rejected token's KV row": "correction on the rejected token's K/V row",
    "frontier row duplicated": "frontier row duplicated",
    "processor state advanced over rejected tokens": "processors advanced over a rejected draft",
    "penalties applied over the last token only": "penalties over the last token only",
    "an extra RNG draw after a stop": "extra RNG draw after a stop",
    "a stop token inside the accepted prefix not ending the request": "stop inside the prefix ignored",
    "tokens after a stop published": "tokens after a stop published",
    "the bonus counted after an accepted EOS": "bonus counted after an accepted EOS",
    "a batch-dependent random stream": "batch-dependent random stream",
    "publication without the generation fence": "publication without the generation fence",
    "a double publish appending twice": "double publish appends twice",
    "a pipelined round built on a failed round written anyway": (
        "writer publishes rounds built on a failed round"
    ),
    "a decision handed to the engine for a pipelined row aborted at F-5": (
        "decision handed out for a row aborted at F-5"
    ),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> None:
    torch.set_num_threads(1)
    prepare()


def test_every_failure_class_is_a_named_mutation() -> None:
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names))
    assert set(FAILURE_CLASSES.values()) == set(names)
    every = [m.name for m in (*MUTATIONS, *MODEL_MUTATIONS)]
    assert len(every) == len(set(every))  # one registry, one name per mutation
    assert all(m.refuted_by is None for m in MUTATIONS)  # the lab's
    assert all(m.refuted_by for m in MODEL_MUTATIONS)  # each names the proof that must refute it


@pytest.mark.parametrize("mutation", (*MUTATIONS, *MODEL_MUTATIONS), ids=lambda m: m.name)
def test_every_seam_exists_and_is_restored(mutation: Mutation) -> None:
    names = [seam.attribute() for seam in mutation.seams]  # found by identity, not given as strings
    originals = [getattr(seam.owner, name) for seam, name in zip(mutation.seams, names, strict=True)]
    assert originals == [seam.target for seam in mutation.seams]
    with mutation.applied() as reach:
        patched = [getattr(seam.owner, name) for seam, name in zip(mutation.seams, names, strict=True)]
        assert all(p is not o for p, o in zip(patched, originals, strict=True))
    assert [getattr(seam.owner, seam.attribute()) for seam in mutation.seams] == originals
    assert set(reach.calls) == {seam.name for seam in mutation.seams} and not reach.reached
    assert mutation.violates and mutation.failure_class


def test_a_seam_whose_binding_is_gone_is_an_error_not_a_silent_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Renaming or re-binding the function a mutant patches disarms nothing silently: applying it fails."""
    from specround.model_check.mutants import SeamGoneError
    from specround.sampling import exact
    from specround.statemachine import step

    mutation = mutation_named("correction from p")
    monkeypatch.setattr(step, "decide_from_uniforms", lambda *a, **k: exact.decide_from_uniforms(*a, **k))
    with pytest.raises(SeamGoneError, match="no longer binds"), mutation.applied():
        pass
    report = run_lab([mutation], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "error" and "no longer binds" in str(row.error)


def test_a_mutation_the_checks_never_reach_is_an_error() -> None:
    from specround.statemachine import staging

    unreached = Mutation(
        "unreached",
        "test",
        "wraps a function the fixture checks never call",
        ("INV-1",),
        (Seam(staging, staging.stage_successor, lambda original, _scratch: original),),
    )
    report = run_lab([unreached], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "error" and "unreached" in str(row.error)
    assert not report.passed


def _killed(report: LabReport, name: str) -> tuple[str, ...]:
    [row] = [r for r in report.rows if r.name == name]
    assert row.active, f"{name} changed nothing observable"
    assert row.killed, f"{name} survived: {row.details}"
    return row.killed_by


def test_a_sampler_mutation_is_killed_by_the_oracle() -> None:
    report = run_lab([mutation_named("correction from p")], ("enumeration", "monte carlo"))
    assert report.baseline_passed
    assert set(_killed(report, "correction from p")) == {"enumeration", "monte carlo"}
    assert report.passed and report.score == 1.0


def test_controller_mutations_are_killed_by_conformance_and_the_audit() -> None:
    names = [
        "publication without the generation fence",
        "double publish appends twice",
        "q = 0 proposal accepted",
    ]
    report = run_lab([mutation_named(n) for n in names], ("z3 conformance", "audit"))
    assert "z3 conformance" in _killed(report, "publication without the generation fence")  # INV-6
    assert "audit" in _killed(report, "double publish appends twice")  # INV-6, INV-8
    assert _killed(report, "q = 0 proposal accepted") == ("z3 conformance",)  # the refusal scenario


def test_model_mutations_are_killed_on_the_tiny_model() -> None:
    names = ["rejected draft K/V committed", "correction on the rejected token's K/V row", "raw logits as q"]
    report = run_lab([mutation_named(n) for n in names], ("model K/V", "model q rows"))
    assert _killed(report, "rejected draft K/V committed") == ("model K/V",)  # INV-5
    assert _killed(report, "correction on the rejected token's K/V row") == ("model K/V",)  # INV-5
    assert _killed(report, "raw logits as q") == ("model q rows",)


def test_a_harmless_mutation_survives_and_fails_the_lab() -> None:
    from specround.model_check import enumeration
    from specround.sampling.exact import decide_from_uniforms

    harmless = Mutation(
        "harmless",
        "test",
        "replaces the oracle's decision function with itself",
        ("INV-10",),
        (Seam(enumeration, decide_from_uniforms, lambda original, _scratch: original),),
    )
    report = run_lab([harmless], ("enumeration",))
    [row] = report.rows
    assert report.baseline_passed
    assert not row.active and not row.killed and row.verdict == "survived"  # reached, but changes nothing
    assert not report.passed and report.score == 0.0


def test_a_mutation_whose_seam_is_gone_is_an_error() -> None:
    def no_such_function() -> None:
        """Never bound by the sampler module."""

    gone = Mutation(
        "gone",
        "test",
        "patches a function the module does not bind",
        (),
        (Seam(exact, no_such_function, lambda o, _s: o),),
    )
    report = run_lab([gone], ("enumeration",))
    [row] = report.rows
    assert row.verdict == "error" and "no_such_function" in (row.error or "")
    assert not report.passed
    assert not hasattr(exact, "no_such_function")


def test_checks_pass_on_the_unmutated_code() -> None:
    outcomes = run_checks_once(("enumeration", "model K/V", "model q rows"))
    assert all(o.passed for o in outcomes.values()), {k: o.detail for k, o in outcomes.items()}
    assert set(outcomes) <= set(CHECKS)
    with pytest.raises(KeyError):
        run_checks_once(("no such check",))


def test_report_json_names_the_killing_checks() -> None:
    report = run_lab([mutation_named("bonus from q")], ("enumeration",))
    payload = report.as_json()
    assert payload["score"] == 1.0 and payload["killed"] == 1
    [row] = payload["mutations"]
    assert row["verdict"] == "killed" and row["killed_by"] == ["enumeration"]
    assert row["seams"] and row["violates"]


def test_the_pipelined_path_kills_a_publication_without_the_fence() -> None:
    report = run_lab([mutation_named("publication without the generation fence")], ("pipelined faults",))
    assert report.baseline_passed
    assert _killed(report, "publication without the generation fence") == ("pipelined faults",)


def test_the_walk_and_the_pipelined_cells_kill_a_writer_that_drops_no_dependant() -> None:
    name = "writer publishes rounds built on a failed round"
    report = run_lab([mutation_named(name)], ("state-machine invariants", "pipelined faults"))
    assert report.baseline_passed
    assert set(_killed(report, name)) == {"state-machine invariants", "pipelined faults"}  # INV-6, INV-7


def test_only_the_walk_kills_a_decision_handed_out_for_a_row_aborted_at_f5() -> None:
    """The pipelined cells step one request at a time: only the walk's two-request F-5 step sees the row."""
    name = "decision handed out for a row aborted at F-5"
    report = run_lab([mutation_named(name)], ("state-machine invariants", "pipelined faults"))
    assert report.baseline_passed
    assert _killed(report, name) == ("state-machine invariants",)  # INV-7
