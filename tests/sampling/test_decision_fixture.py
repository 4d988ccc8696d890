"""The sampler reproduces the committed decision fixture bit for bit (uniforms, counters, rule, refusals).

The fixture was written by the sampler before its fast path existed; any later change to the sampler must
leave every case identical. Inputs are machine-independent (see :mod:`tests.sampling.decision_cases`), so
a mismatch is a change of the sampler, not of the machine; the input digest tells the two apart.
"""

from __future__ import annotations

import json

from tests.sampling.decision_cases import FIXTURE, N_INVALID, N_VALID, cases, input_digest, run_case


def test_every_case_reproduces_the_fixture() -> None:
    expected = json.loads(FIXTURE.read_text())["cases"]
    all_cases = cases()
    assert len(expected) == len(all_cases) == N_VALID + N_INVALID
    changed_inputs = [case.name for case in all_cases if expected[case.name]["inputs"] != input_digest(case)]
    assert not changed_inputs, f"the case generator changed: {changed_inputs[:5]}"
    mismatched = []
    for case in all_cases:
        want = {key: value for key, value in expected[case.name].items() if key != "inputs"}
        if run_case(case) != want:
            mismatched.append(case.name)
    assert not mismatched, f"{len(mismatched)} decisions differ from the fixture, first: {mismatched[:5]}"


def test_the_fixture_covers_every_outcome() -> None:
    """The fixture is only as strong as its cases: every terminal kind, stops, degenerate corrections and
    each family of refusal appear."""
    expected = json.loads(FIXTURE.read_text())["cases"]
    kinds: set[int] = set()
    degenerate = stopped_by_token = 0
    errors: set[str] = set()
    for entry in expected.values():
        if "error" in entry:
            errors.add(entry["error"])
            continue
        kinds.update(entry["terminal"])
        degenerate += sum(entry["degenerate_correction"])
        stopped_by_token += sum(entry["stopped_by_token"])
    assert kinds == {0, 1, 2}
    assert degenerate >= 5 and stopped_by_token >= 50
    assert errors >= {
        "InvalidRequestError",
        "ShapeMismatchError",
        "NonFiniteProbabilityError",
        "ZeroProposalProbabilityError",
        "NotNormalisedError",
        "NegativeMassError",
        "DraftIdOutOfVocabError",
    }
