"""Serving tests run torch on one intra-op thread (restored afterwards).

The models here are small and the machine is shared: a second intra-op thread mostly waits for a busy core
(a one-row decode of SmolLM2 measured 5x slower with two threads under load than with one).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
