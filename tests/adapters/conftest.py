"""Session-scoped model fixtures: each model is built once per test session.

``smollm`` and ``tiny`` live in ``tests/conftest.py`` (shared with the serving tests). ``hf_smollm`` loads
the SmolLM2 file through transformers (about 30 s, used only by the parity module).
"""

from __future__ import annotations

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget


@pytest.fixture(scope="session")
def hf_smollm():  # type: ignore[no-untyped-def]
    from specround.adapters.hf import HFTarget
    from specround.adapters.llama import default_gguf_path

    path = default_gguf_path()
    return HFTarget.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="session")
def hf_tokenizer():  # type: ignore[no-untyped-def]
    from transformers import AutoTokenizer

    from specround.adapters.llama import default_gguf_path

    path = default_gguf_path()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture
def tiny_target(tiny: LlamaBundle) -> LlamaTarget:
    return LlamaTarget(tiny.model, model_id=tiny.model_id)
