"""The mutation lab's checks on the tiny Llama: the model's K/V rows, its q rows, and the serving law.

See :mod:`.mutation_lab` for what each check asserts. The references (the tiny models and the exact law)
are computed once, by :func:`prepare_model_references`, before any mutation is applied.
"""

from __future__ import annotations

import time
from collections import Counter
from functools import cache
from typing import Any

import torch

from specround.model_check.lab_checks import CheckOutcome, digest, failed_outcome

__all__ = [
    "MODEL_LAW_LEVEL",
    "MODEL_LAW_SAMPLES",
    "model_checks",
    "model_law_check",
    "prepare_model_references",
]

MODEL_LAW_SAMPLES = 400
"""Requests of the tiny-model law check."""
MODEL_LAW_LEVEL = 1e-3
"""Level of the tiny-model chi-square test."""
MODEL_PROMPT = (1, 2, 3, 1, 2)
"""Prompt of every tiny-model request (repeated tokens, so the repetition penalty matters)."""
MODEL_STOP = 7
"""The tiny-model requests' stop token."""
MODEL_DRAFT = 2
"""Draft length K of the model-law check (the K/V check drafts 3)."""
MODEL_HORIZON = MODEL_DRAFT + 1
"""Tokens per request of the model-law check."""


@cache
def _tiny_models() -> tuple[Any, Any]:
    from specround.adapters.llama import tiny_llama

    return tiny_llama(seed=0), tiny_llama(seed=1)


MODEL_TEMPERATURE = 0.6
"""Temperature of the tiny-model checks' chain (sharp enough that raw and processed rows differ)."""


def _model_chain(temperature: float = MODEL_TEMPERATURE) -> Any:
    from specround.sampling.processors import sampling_chain

    return sampling_chain(8, temperature=temperature, top_k=4, repetition_penalty=1.3)


def _serving_loop(layout: Any, draft: int) -> tuple[Any, Any, Any]:
    from specround.adapters.llama import LlamaTarget
    from specround.adapters.memory_log import MemoryEventLog
    from specround.adapters.proposers import ModelProposer
    from specround.serving import FixedDraftLength, ServingLoop
    from specround.statemachine.controller import RoundController

    tiny, drafter = _tiny_models()
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = ModelProposer(LlamaTarget(drafter.model, model_id=drafter.model_id))
    loop = ServingLoop(
        RoundController(MemoryEventLog(clock=lambda: 0.0)),
        target,
        proposer,
        policy=FixedDraftLength(draft),
        layout=layout,
        clock=lambda: 0.0,
    )
    return loop, target, tiny


def _frontier_logits(target: Any, rid: str, layout: Any, frontier: int) -> torch.Tensor:
    """What the target's cache gives for the row after the frontier (its retained or replayed row)."""
    from specround.sampling.types import Layout
    from specround.statemachine.model_ports import VerifyRequest

    if layout is Layout.RETAINED_FRONTIER:
        row: torch.Tensor = target.materialize_frontier({rid: frontier})[rid]
        return row
    [result] = target.verify([VerifyRequest(rid, layout, frontier, ())])
    target.discard(rid, result.branch)
    logits: torch.Tensor = result.logits[0]
    return logits


def _q_row_problems(loop: Any, drafter: Any, rid: str) -> tuple[list[str], list[float]]:
    """Re-derive every logged q(d_i) from a fresh forward of the draft model and the request's chain.

    The proposer must hand the controller the processed row that sampled each draft
    (contract#degenerate-cases, contract#processed-rows): row i is the chain at ``O_0 + d_1..d_{i-1}`` applied
    to the draft model's logits after that prefix.
    """
    from specround.statemachine.staging import chain_from_config

    controller = loop.controller
    config = controller.config(rid)
    chain = chain_from_config(config)
    output = list(config.prompt_ids)
    chain.advance_many(output)
    problems: list[str] = []
    seen: list[float] = []
    for event in controller.log.events(rid):
        if event.kind == "round_ready":
            drafts = [int(d) for d in event.payload["draft_ids"]]
            logged = [float(q) for q in event.payload["q_draft"]]
            walker = chain.clone()
            for i, draft in enumerate(drafts):
                logits = drafter.model.logits(torch.tensor(output + drafts[:i]))[-1].double()  # [V]
                q = float(walker.distribution(logits)[draft])
                seen.append(round(logged[i], 6))
                if abs(q - logged[i]) > 1e-4:
                    problems.append(
                        f"{rid[:8]} q(d_{i + 1} = {draft}) logged {logged[i]:.6g}, the row gives {q:.6g}"
                    )
                walker.advance(draft)
        elif event.kind == "round_decided":
            emitted = [int(t) for t in event.payload["emitted_ids"]]
            output += emitted
            chain.advance_many(emitted)
    return problems, seen


def model_checks() -> list[CheckOutcome]:
    """``model K/V`` and ``model q rows``: the serving loop on the tiny Llama, both layouts."""
    from specround.sampling.types import Layout
    from specround.serving import GenerationRequest

    started = time.perf_counter()
    problems: list[str] = []
    q_problems: list[str] = []
    seen: list[Any] = []
    q_seen: list[float] = []
    try:
        _, drafter = _tiny_models()
        for layout in Layout:
            loop, target, tiny = _serving_loop(layout, 3)
            rids = [
                loop.submit(
                    GenerationRequest(
                        MODEL_PROMPT, 12, seed=50 + i, processors=_model_chain(), stop_token_ids=(MODEL_STOP,)
                    )
                )
                for i in range(4)
            ]
            for _ in range(16):
                if not loop.active:
                    break
                loop.step()
                for rid in loop.active:
                    state = loop.state(rid)
                    ids = target.committed_token_ids(rid)
                    if ids != state.cache:
                        problems.append(f"{layout.value} {rid[:8]}: cache holds {ids}, C = {state.cache}")
                        continue
                    got = _frontier_logits(target, rid, layout, state.frontier)
                    want = tiny.model.logits(torch.tensor(state.output))[-1]  # [V] a fresh forward over O
                    error = float((got - want).abs().max())
                    seen.append((layout.value, state.generated, round(error, 4)))
                    if error > 1e-4:
                        problems.append(
                            f"{layout.value} {rid[:8]}: frontier logits off a fresh forward by {error:.3g}"
                        )
            problems += [f"{layout.value} {rid[:8]}: {err!r}" for rid, err in loop.errors.items()]
            seen += [
                (rid in loop.errors, loop.state(rid).generated) for rid in rids if rid not in loop.errors
            ]
            for rid in rids:
                found, values = _q_row_problems(loop, drafter, rid)
                q_problems += [f"{layout.value} {p}" for p in found]
                q_seen += values
    except Exception as error:
        crashed = failed_outcome("model K/V", error, started)
        return [crashed, CheckOutcome("model q rows", False, crashed.detail, crashed.observation)]
    seconds = time.perf_counter() - started
    kv = CheckOutcome(
        "model K/V",
        not problems,
        f"{len(seen)} probes" + (f"; {len(problems)} problems, first: {problems[0]}" if problems else ""),
        digest(seen, problems),
        seconds,
    )
    rows = CheckOutcome(
        "model q rows",
        bool(q_seen) and not q_problems,
        f"{len(q_seen)} q(d) re-derived"
        + (f"; {len(q_problems)} differ, first: {q_problems[0]}" if q_problems else ""),
        digest(q_seen, q_problems),
    )
    return [kv, rows]


@cache
def _exact_model_law(temperature: float = MODEL_TEMPERATURE) -> dict[tuple[int, ...], float]:
    """P(first MODEL_HORIZON tokens) under the tiny target alone (a sequence ends early at the stop).

    Computed once, on first use (the lab computes it in its baseline, before any mutation is applied), by
    enumerating the target's processed conditionals token by token: a reference that does not run the
    serving path it checks.
    """
    from specround.model_check.sequence_law import exact_sequence_law

    tiny, _ = _tiny_models()
    return exact_sequence_law(
        tiny.model.logits, _model_chain(temperature), MODEL_PROMPT, MODEL_HORIZON, MODEL_STOP
    )


def model_law_check() -> CheckOutcome:
    """The first tokens generated through the serving loop follow the exact target law (chi-square)."""
    from specround.model_check.chi_square import chi_square_test
    from specround.sampling.types import Layout
    from specround.serving import GenerationRequest

    started = time.perf_counter()
    try:
        law = _exact_model_law()
        loop, _, _ = _serving_loop(Layout.REPLAY_FRONTIER, MODEL_DRAFT)
        rids = [
            loop.submit(
                GenerationRequest(
                    MODEL_PROMPT,
                    MODEL_HORIZON,
                    seed=10_000 + i,
                    processors=_model_chain(),
                    stop_token_ids=(MODEL_STOP,),
                )
            )
            for i in range(MODEL_LAW_SAMPLES)
        ]
        finished = loop.run()
        counts = Counter(finished[rid].generated for rid in rids if rid in finished)
    except Exception as error:
        return failed_outcome("model law", error, started)
    outside = sum(n for seq, n in counts.items() if seq not in law)
    cells = sorted(law)
    alternative = _exact_model_law(1.25 * MODEL_TEMPERATURE)
    test = chi_square_test(
        [law[c] for c in cells],
        [counts[c] for c in cells],
        MODEL_LAW_LEVEL,
        {"temperature x1.25": [alternative.get(c, 0.0) for c in cells]},
    )
    missing = MODEL_LAW_SAMPLES - sum(counts.values())
    ok = test.passed and outside == 0 and missing == 0
    return CheckOutcome(
        "model law",
        ok,
        f"N = {MODEL_LAW_SAMPLES}, chi2 = {test.statistic:.1f}, df = {test.df}, p = {test.p_value:.3g}, "
        f"power {test.power.get('temperature x1.25', 0.0):.2f} vs temperature x1.25"
        + (f", {outside} outside the support" if outside else "")
        + (f", {missing} requests failed" if missing else ""),
        digest(sorted(counts.items())),
        time.perf_counter() - started,
    )


def prepare_model_references() -> None:
    """Load the tiny models and compute the exact laws the model-law check compares against."""
    _tiny_models()
    _exact_model_law()
    _exact_model_law(1.25 * MODEL_TEMPERATURE)
