"""Verdicts: one :class:`CheckResult` per named check, prompt and setting; a :class:`ConformanceReport`.

Check names (each explained, with what it proves and cannot prove, in ``specs/conformance-kit.md``):
``law`` (black box: chi-square and TV against the exact target law), ``stop`` (nothing after EOS),
``seed-reproducible`` and ``batch-invariance`` (the RNG contract), and the white-box round checks
``q-sampled`` (with the advisory ``q-declared``), ``decisions`` and ``processor-state``; ``audit`` is an
engine's own log audit (specround's engines).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["CHECKS", "CheckResult", "ConformanceReport"]

CHECKS: tuple[str, ...] = (
    "law",
    "stop",
    "seed-reproducible",
    "batch-invariance",
    "q-sampled",
    "q-declared",
    "decisions",
    "processor-state",
    "audit",
)
"""Every check name, in the order verdict tables list them."""


@dataclass(frozen=True)
class CheckResult:
    """One check on one prompt and setting."""

    check: str
    prompt: int
    """Index of the prompt in the run."""
    setting: str
    """The setting's label."""
    passed: bool
    statistic: float
    """Chi-square statistic for ``law``; the number of violations for the other checks."""
    p_value: float | None = None
    tv: float | None = None
    tv_low: float | None = None
    tv_high: float | None = None
    detectable_tv: float | None = None
    """``law`` only: the smallest TV on its cells the test rejects with the stated power."""
    checked: int = 0
    """Samples, requests or rounds the check looked at."""
    detail: str = ""
    advisory: bool = False
    """An advisory check (``q-declared``) reports a weakness that leaves the output exact: it never fails
    the report."""

    @property
    def verdict(self) -> str:
        """``PASS``, ``FAIL``, or ``WARN`` (a failed advisory check)."""
        if self.passed:
            return "PASS"
        return "WARN" if self.advisory else "FAIL"

    def to_json(self) -> dict[str, Any]:
        """JSON-able fields (infinite statistics as the string ``"inf"``), with the verdict."""
        data = asdict(self)
        data["verdict"] = self.verdict
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                data[key] = str(value)
        return data


@dataclass
class ConformanceReport:
    """Every check of one engine."""

    engine: str
    alpha: float
    samples: int
    horizon: int
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """Every check passed (advisory ones aside)."""
        return all(r.passed or r.advisory for r in self.results)

    def failed(self) -> list[str]:
        """Names of the failed checks, advisory ones aside (each once, in table order)."""
        names = {r.check for r in self.results if not r.passed and not r.advisory}
        return [c for c in CHECKS if c in names] + sorted(names - set(CHECKS))

    def result(self, check: str, prompt: int = 0, setting: str | None = None) -> CheckResult:
        """The result of ``check`` on one prompt (and setting, when several were run)."""
        for r in self.results:
            if r.check == check and r.prompt == prompt and (setting is None or r.setting == setting):
                return r
        raise KeyError(f"no {check!r} result for prompt {prompt} and setting {setting!r}")

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-able data."""
        return {
            "engine": self.engine,
            "alpha": self.alpha,
            "samples": self.samples,
            "horizon": self.horizon,
            "passed": self.passed,
            "failed": self.failed(),
            "results": [r.to_json() for r in self.results],
        }
