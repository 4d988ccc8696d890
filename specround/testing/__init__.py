"""The conformance kit: it tells whether an engine's speculative decoding samples the target's law exactly.

Point it at any engine (:class:`Engine`: prompt ids, sampling settings and a seed in, the first H
generated tokens out) and its target model (:class:`LogitsModel`), and :func:`conform` answers by named
checks with stated power:

* ``law``: chi-square (pooled cells) and a TV estimate with a confidence interval against the exact target
  law computed from the target itself (:func:`target_law`, :func:`law_test`); the smallest TV detected at
  the chosen level and N is part of every verdict (:func:`detectable_tv`, self-tested by
  :func:`rejection_rate` against planted distortions);
* ``stop``, ``seed-reproducible``, ``batch-invariance``: nothing after EOS, and the RNG contract;
* for engines that expose their rounds (:class:`TracingEngine`), ``q-sampled``, ``decisions`` and
  ``processor-state`` (:mod:`specround.testing.rounds`), plus the advisory ``q-declared``.

Shipped engines: transformers' assisted generation (:mod:`specround.testing.hf_engine`), specround's own
serving loop (:mod:`specround.testing.specround_engine`), a correct reference engine and planted-bug engines
(:mod:`specround.testing.engines`). The command line is ``specround conform ...``. What each check proves,
and what it cannot, is in ``specs/conformance-kit.md``.
"""

from specround.testing.engine import Engine, EngineRequest, RoundTrace, TracingEngine
from specround.testing.law import CellLaw, target_law
from specround.testing.lawtest import LawTest, detectable_tv, law_test, tv_half_width
from specround.testing.models import (
    CompactLlamaLogits,
    FunctionLogits,
    LogitsModel,
    TransformersLogits,
    logits_after,
)
from specround.testing.power import DISTORTIONS, PowerCheck, distort, rejection_rate
from specround.testing.results import CHECKS, CheckResult, ConformanceReport
from specround.testing.runner import conform
from specround.testing.settings import SamplingSettings

__all__ = [
    "CHECKS",
    "DISTORTIONS",
    "CellLaw",
    "CheckResult",
    "CompactLlamaLogits",
    "ConformanceReport",
    "Engine",
    "EngineRequest",
    "FunctionLogits",
    "LawTest",
    "LogitsModel",
    "PowerCheck",
    "RoundTrace",
    "SamplingSettings",
    "TracingEngine",
    "TransformersLogits",
    "conform",
    "detectable_tv",
    "distort",
    "law_test",
    "logits_after",
    "rejection_rate",
    "target_law",
    "tv_half_width",
]
