"""Session-wide test configuration: Hypothesis profiles."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

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
