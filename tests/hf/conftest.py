"""The transformers tests need the optional ``transformers`` package and run single-threaded."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
