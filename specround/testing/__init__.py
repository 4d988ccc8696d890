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
  ``processor-state`` (:mod:`specround.testing.round_checks`), plus the advisory ``q-declared``.

Shipped engines: transformers' assisted generation (:mod:`specround.testing.hf_engine`), specround's own
serving loop (:mod:`specround.testing.specround_engine`), a correct reference engine and planted-bug engines
(:mod:`specround.testing.engines`). The command line is ``specround conform ...``. What each check proves,
and what it cannot, is in ``specs/conformance-kit.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from specround._lazy_exports import LazyExports as _LazyExports

if TYPE_CHECKING:
    from specround.testing.engine_contract import Engine, EngineRequest, RoundTrace, TracingEngine
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
    from specround.testing.runner import conform
    from specround.testing.settings import SamplingSettings
    from specround.testing.verdicts import CHECKS, CheckResult, ConformanceReport

_EXPORTS: dict[str, str] = {
    "CHECKS": "specround.testing.verdicts",
    "CellLaw": "specround.testing.law",
    "CheckResult": "specround.testing.verdicts",
    "CompactLlamaLogits": "specround.testing.models",
    "ConformanceReport": "specround.testing.verdicts",
    "DISTORTIONS": "specround.testing.power",
    "Engine": "specround.testing.engine_contract",
    "EngineRequest": "specround.testing.engine_contract",
    "FunctionLogits": "specround.testing.models",
    "LawTest": "specround.testing.lawtest",
    "LogitsModel": "specround.testing.models",
    "PowerCheck": "specround.testing.power",
    "RoundTrace": "specround.testing.engine_contract",
    "SamplingSettings": "specround.testing.settings",
    "TracingEngine": "specround.testing.engine_contract",
    "TransformersLogits": "specround.testing.models",
    "conform": "specround.testing.runner",
    "detectable_tv": "specround.testing.lawtest",
    "distort": "specround.testing.power",
    "law_test": "specround.testing.lawtest",
    "logits_after": "specround.testing.models",
    "rejection_rate": "specround.testing.power",
    "target_law": "specround.testing.law",
    "tv_half_width": "specround.testing.lawtest",
}
"""Public name -> defining module; imported on first use, so ``specround conform --help`` loads no torch."""

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


_LAZY = _LazyExports("specround.testing", _EXPORTS, globals())


def __getattr__(name: str) -> Any:
    """Import a public name from the module that defines it, on first use."""
    return _LAZY.resolve(name)


def __dir__() -> list[str]:
    return _LAZY.names()
