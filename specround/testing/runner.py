"""Run every check of the kit on one engine: :func:`conform`.

For each prompt and setting the engine generates ``samples`` requests (seeds ``base_seed + i``) in batches
of ``batch_size``; the kit computes the target law from the target model, runs the ``law`` test and the
``stop`` check on every sample, the RNG checks on the first ``rng_requests`` requests, and, for a
:class:`~specround.testing.engine_contract.TracingEngine`, the white-box round checks on the first
``trace_requests`` requests run alone. An engine with a ``self_audit()`` method (specround's own) also
gets an ``audit`` row from it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specround.errors import InvalidRequestError
from specround.testing.blackbox import check_batch_invariance, check_seed_reproducible, check_stop_samples
from specround.testing.engine_contract import Engine, EngineRequest, TracingEngine
from specround.testing.law import target_law
from specround.testing.lawtest import law_test
from specround.testing.models import LogitsModel
from specround.testing.round_checks import (
    Traced,
    check_decisions,
    check_processor_state,
    check_q_sampled,
    check_stop_rounds,
)
from specround.testing.settings import SamplingSettings
from specround.testing.verdicts import CheckResult, ConformanceReport

__all__ = ["Progress", "conform"]

Progress = Callable[[str], None]
"""Receives one line of progress at a time (the CLI prints them to stderr)."""


def _verdict(
    check: str,
    prompt: int,
    setting: str,
    found: Sequence[str],
    checked: int,
    what: str,
    *,
    advisory: bool = False,
) -> CheckResult:
    detail = f"{len(found)} of {checked} {what}" + (f"; first: {found[0]}" if found else "")
    return CheckResult(
        check,
        prompt,
        setting,
        not found,
        float(len(found)),
        checked=checked,
        detail=detail,
        advisory=advisory,
    )


def conform(
    engine: Engine,
    target: LogitsModel,
    *,
    settings: Sequence[SamplingSettings],
    prompts: Sequence[Sequence[int]],
    samples: int,
    horizon: int,
    alpha: float = 0.01,
    draft: LogitsModel | None = None,
    base_seed: int = 0,
    batch_size: int = 256,
    rng_requests: int = 8,
    trace_requests: int = 32,
    progress: Progress | None = None,
) -> ConformanceReport:
    """Every check on ``engine`` against ``target`` (and ``draft`` for ``q-sampled``)."""
    if samples < 1 or horizon < 1 or batch_size < 1:
        raise InvalidRequestError("samples, horizon and batch_size must be positive")
    if not 0.0 < alpha < 1.0:
        raise InvalidRequestError(f"alpha must lie in (0, 1), got {alpha}")
    if not prompts or not settings:
        raise InvalidRequestError("give at least one prompt and one setting")
    say = progress or (lambda line: None)
    report = ConformanceReport(engine.name, alpha, samples, horizon)
    for s_index, setting in enumerate(settings):
        label = setting.label()
        for p_index, prompt in enumerate(prompts):
            requests = [
                EngineRequest(tuple(prompt), setting, base_seed + 1_000_003 * s_index + i, horizon)
                for i in range(samples)
            ]
            outputs: list[tuple[int, ...]] = []
            for start in range(0, samples, batch_size):
                outputs.extend(engine.generate(requests[start : start + batch_size]))
                say(f"{engine.name} [{label}] prompt {p_index}: {len(outputs)}/{samples} samples")
            law = target_law(target, setting, prompt, horizon, samples=samples)
            test = law_test(law, outputs, alpha)
            report.results.append(
                CheckResult(
                    "law",
                    p_index,
                    label,
                    test.passed,
                    test.statistic,
                    p_value=test.p_value,
                    tv=test.tv,
                    tv_low=test.tv_low,
                    tv_high=test.tv_high,
                    detectable_tv=test.detectable_tv,
                    checked=test.samples,
                    detail=(
                        f"df {test.df} over {test.cells} pooled cells ({law.expanded} target rows); "
                        f"{test.impossible} impossible samples; TV CI at {test.confidence:g}; "
                        f"TV >= {test.detectable_tv:.3g} detected with power {test.power:g}"
                    ),
                )
            )
            rounds_found: list[str] = []
            traced: list[Traced] = []
            if isinstance(engine, TracingEngine):
                say(f"{engine.name} [{label}] prompt {p_index}: tracing {trace_requests} requests")
                traced = [(r, engine.trace(r)[1]) for r in requests[:trace_requests]]
                rounds_found, _ = check_stop_rounds(traced)
            stop_found = check_stop_samples(requests, outputs) + rounds_found
            report.results.append(_verdict("stop", p_index, label, stop_found, samples, "samples/rounds"))
            head, head_out = requests[:rng_requests], outputs[:rng_requests]
            found = check_seed_reproducible(engine, head, head_out)
            report.results.append(_verdict("seed-reproducible", p_index, label, found, len(head), "requests"))
            found = check_batch_invariance(engine, head, head_out)
            report.results.append(_verdict("batch-invariance", p_index, label, found, len(head), "requests"))
            if traced:
                found, advisory, n = check_q_sampled(traced, draft)
                report.results.append(_verdict("q-sampled", p_index, label, found, n, "drafted rounds"))
                if draft is not None:
                    report.results.append(
                        _verdict("q-declared", p_index, label, advisory, n, "drafted rounds", advisory=True)
                    )
                found, n = check_decisions(traced, target.vocab_size)
                report.results.append(_verdict("decisions", p_index, label, found, n, "rounds"))
                found, n = check_processor_state(traced, target)
                report.results.append(_verdict("processor-state", p_index, label, found, n, "rounds"))
            audit = getattr(engine, "self_audit", None)
            if callable(audit):
                found = list(audit())
                report.results.append(
                    CheckResult(
                        "audit",
                        p_index,
                        label,
                        not found,
                        float(len(found)),
                        checked=samples,
                        detail=f"{len(found)} findings in the engine's logs"
                        + (f"; first: {found[0]}" if found else ""),
                    )
                )
    return report
