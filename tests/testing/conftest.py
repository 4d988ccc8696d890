"""Fixtures of the conformance-kit tests: one torch thread, a toy target and draft, the kit's setting.

The toy LM (:class:`specround.testing.engines.ToyLM`, vocabulary 8) runs in microseconds, so the
statistical tests here take seconds. The setting turns on every part a planted bug can hide in: top-k
(raw logits as q), a repetition penalty (processor state), EOS (stops).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from specround.testing import SamplingSettings
from specround.testing.engines import ToyLM

V = 8
EOS = 7
PROMPT = (1, 2, 3)
SETTING = SamplingSettings(temperature=0.9, top_k=5, repetition_penalty=1.3, eos_token_id=EOS)


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def toy_target() -> ToyLM:
    return ToyLM(V, seed=0, scale=1.5)


@pytest.fixture(scope="module")
def toy_draft(toy_target: ToyLM) -> ToyLM:
    return toy_target.perturbed(0.8, seed=1)
