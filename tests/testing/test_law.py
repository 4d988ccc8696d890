"""The kit's target law: the prefix-cell tree equals the full enumeration, and samples map to cells."""

from __future__ import annotations

import math

import pytest

from specround.adapters.llama import LlamaBundle
from specround.errors import InvalidRequestError
from specround.model_check.sequence_law import exact_sequence_law
from specround.testing import CompactLlamaLogits, SamplingSettings, target_law
from specround.testing.engines import ToyLM
from tests.testing.conftest import EOS, PROMPT, SETTING


@pytest.mark.parametrize("horizon", [1, 2, 3])
def test_full_tree_equals_the_enumerated_joint(tiny: LlamaBundle, horizon: int) -> None:
    law = target_law(CompactLlamaLogits(tiny.model), SETTING, PROMPT, horizon)
    expected = exact_sequence_law(tiny.model.logits, SETTING.chain(8), PROMPT, horizon, EOS)
    assert set(law.cells) == set(expected)
    for cell, p in expected.items():
        assert math.isclose(law.cells[cell], p, rel_tol=1e-9, abs_tol=1e-15)


def test_expansion_follows_the_expected_counts(toy_target: ToyLM) -> None:
    law = target_law(toy_target, SETTING, PROMPT, 3, samples=500, min_expected=5.0)
    assert math.isclose(sum(law.cells.values()), 1.0, rel_tol=1e-12)
    for prefix in law.rows:  # every expanded node is expected >= 5 times
        mass = 1.0
        for i in range(len(prefix)):
            mass *= float(law.rows[prefix[:i]][prefix[i]])
        assert 500 * mass >= 5.0
    unexpanded = [c for c in law.cells if not law.complete(c)]
    assert unexpanded and all(500 * law.cells[c] < 5.0 for c in unexpanded)


def test_samples_map_to_their_cell_or_to_impossible(toy_target: ToyLM) -> None:
    law = target_law(toy_target, SETTING, PROMPT, 2)
    row = law.rows[()]
    allowed = [t for t in range(8) if float(row[t]) > 0]
    masked = [t for t in range(8) if float(row[t]) == 0]  # top-k = 5 masks three tokens
    assert len(masked) == 3
    a = next(t for t in allowed if t != EOS)
    b = next(t for t in range(8) if float(law.rows[(a,)][t]) > 0)
    assert law.cell_of((a, b)) == (a, b)
    assert law.cell_of((masked[0], b)) is None  # outside the processed support
    assert law.cell_of((a,)) is None  # ended early without EOS
    assert law.cell_of((a, b, b)) is None  # longer than the horizon
    if EOS in allowed:
        assert law.cell_of((EOS,)) == (EOS,)
        assert law.cell_of((EOS, a)) is None  # a token after EOS


def test_bad_input_is_refused(toy_target: ToyLM) -> None:
    with pytest.raises(InvalidRequestError):
        target_law(toy_target, SETTING, (), 2)
    with pytest.raises(InvalidRequestError):
        target_law(toy_target, SETTING, PROMPT, 0)
    with pytest.raises(InvalidRequestError):
        SamplingSettings(temperature=0.0)
    with pytest.raises(InvalidRequestError):
        SamplingSettings(top_p=1.5)


def test_the_kit_exports_resolve_lazily() -> None:
    import importlib
    import subprocess
    import sys

    import specround.testing as kit

    assert set(kit.__all__) == set(kit._EXPORTS)
    for name, module in kit._EXPORTS.items():
        assert getattr(kit, name) is getattr(importlib.import_module(module), name), name
    code = "import sys, specround.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]  # registering `specround conform` loads no torch
