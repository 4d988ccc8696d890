"""``specround bench e2e --engine transformers``: :func:`specround.hf.generate` vs transformers' generate.

On SmolLM2-135M (the GGUF loaded by transformers, fp32, CPU) with its bfloat16-rounded copy as a separate
assistant model, for every prompt class, greedy, at B = 1 (each prompt alone) and B = 4 (the class's first
four prompts, cycled when a class holds fewer, left-padded); ``--batch-sizes`` chooses other sizes (B > 1:
the first B prompts, cycled):

``transformers plain``
    ``model.generate`` (B = 4: one batched call).
``transformers assistant K=<k>`` / ``transformers prompt-lookup K=<k>``
    assisted generation (``num_assistant_tokens=K``, constant schedule, no confidence cut-off, all three set
    on the assistant's own ``generation_config``, which is where transformers reads them) and prompt
    lookup (``prompt_lookup_num_tokens=K``, ``max_matching_ngram_size=3``); they refuse batches, so B = 4
    runs the four prompts one by one.
``specround.hf assistant K=<k>`` / ``specround.hf prompt-lookup K=<k>``
    the same draft and K through :func:`specround.hf.generate` (B = 4: one batched call), every round
    published to a SQLite log.

``transformers prompt-lookup K=<k> (A/A)``
    the control: transformers' prompt lookup once more, paired with its first run; its ratio (draft
    ``(A/A)``) is the noise of the run, against which the other ratios are read.

Each case runs once untimed (warm-up), then ``repeats`` times, the cases of successive repetitions
alternately in order and in reverse (:func:`~specround.bench.case_order.case_order`; an even ``repeats``
balances them); tokens per second are generated tokens (up to
each row's end) over wall-clock and over this process's CPU time (one torch thread). The ratios are medians
of specround's rate over its transformers counterpart's, repetition by repetition.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

__all__ = ["HfBenchCase", "HfBenchReport", "run_hf_e2e_bench"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class HfBenchCase(BaseModel):
    """One case on one prompt class at one batch size."""

    model_config = _FROZEN

    prompt_class: str
    batch: int
    case: str
    tokens: int
    """Generated tokens per repetition."""
    wall_tokens_per_s: float
    cpu_tokens_per_s: float
    acceptance: float | None = None


class HfBenchRatio(BaseModel):
    """specround.hf over its transformers counterpart (median of paired ratios)."""

    model_config = _FROZEN

    prompt_class: str
    batch: int
    draft: str
    versus: str
    wall_ratio: float
    cpu_ratio: float


class HfBenchReport(BaseModel):
    """Every case and the paired ratios."""

    model_config = _FROZEN

    k: int
    max_tokens: int
    repeats: int
    threads: int
    cases: tuple[HfBenchCase, ...]
    ratios: tuple[HfBenchRatio, ...]


def _generated(sequences: torch.Tensor, width: int, eos: int | None) -> int:
    total = 0
    for row in sequences[:, width:].tolist():
        total += row.index(eos) + 1 if eos is not None and eos in row else len(row)
    return total


Encoded = list[tuple[torch.Tensor, torch.Tensor]]


def _hf_run(
    model: Any,
    encoded: Encoded,
    eos: int | None,
    common: dict[str, Any],
    extra: dict[str, Any],
    one_by_one: bool,
) -> int:
    """Run transformers' generate over every group (one by one: each row alone, unpadded)."""
    made = 0
    for ids, mask in encoded:
        rows = (
            [(ids[i : i + 1], mask[i : i + 1]) for i in range(ids.shape[0])] if one_by_one else [(ids, mask)]
        )
        for r_ids, r_mask in rows:
            if one_by_one:
                count = int(r_mask.sum())
                r_ids, r_mask = r_ids[:, -count:], r_mask[:, -count:]
            out = model.generate(r_ids, attention_mask=r_mask, pad_token_id=eos, **common, **extra)
            made += _generated(out, r_ids.shape[1], eos)
    return made


def _our_run(
    generate: Callable[..., Any],
    model: Any,
    encoded: Encoded,
    eos: int | None,
    common: dict[str, Any],
    log: str,
    k: int,
    accept: dict[str, list[float]],
    label: str,
    extra: dict[str, Any],
) -> int:
    """Run specround.hf.generate over every group (one batched call per group)."""
    made = 0
    for ids, mask in encoded:
        out = generate(
            model, ids, attention_mask=mask, log=log, k=k, return_dict_in_generate=True, **common, **extra
        )
        made += _generated(out.sequences, ids.shape[1], eos)
        if out.totals.acceptance_rate is not None:
            accept.setdefault(label, []).append(out.totals.acceptance_rate)
    return made


_CONTROL = "(A/A)"
"""Suffix of the control case: transformers' prompt lookup run a second time, paired with the first."""


def _paired_ratio(
    prompt_class: str,
    batch: int,
    draft: str,
    versus: str,
    mine: Sequence[tuple[float, float]],
    theirs: Sequence[tuple[float, float]],
) -> HfBenchRatio:
    """Medians of the repetition-by-repetition ratios of two cases' (wall, CPU) rates."""
    return HfBenchRatio(
        prompt_class=prompt_class,
        batch=batch,
        draft=draft,
        versus=versus,
        wall_ratio=statistics.median(m[0] / t[0] for m, t in zip(mine, theirs, strict=True)),
        cpu_ratio=statistics.median(m[1] / t[1] for m, t in zip(mine, theirs, strict=True)),
    )


def run_hf_e2e_bench(
    *,
    classes: Sequence[str],
    k: int,
    max_tokens: int,
    repeats: int,
    batches: Sequence[int] = (1, 4),
    prompts_dir: Path | None = None,
    threads: int = 1,
    progress: Callable[[str], None] | None = None,
) -> HfBenchReport:
    """Run the cases (module docstring) and return the report."""
    from specround.bench.case_order import case_order
    from specround.bench.e2e import default_prompts_dir, load_prompt_classes
    from specround.hf import generate
    from specround.hf.cli_run import load_causal_lm, rounded_copy
    from specround.hf.generation_settings import set_assistant_draft_length

    torch.set_num_threads(threads)
    say = progress or (lambda line: None)
    loaded = load_causal_lm(None)
    model, tokenizer = loaded.model, loaded.tokenizer
    assistant = rounded_copy(model, torch.bfloat16)
    eos = tokenizer.eos_token_id
    tokenizer.padding_side = "left"
    texts = load_prompt_classes(prompts_dir or default_prompts_dir(), classes)
    log_dir = Path(tempfile.mkdtemp(prefix="specround-hf-bench-"))
    common: dict[str, Any] = {"max_new_tokens": max_tokens, "do_sample": False}
    set_assistant_draft_length(assistant, k)  # where transformers reads it (not ``generate``'s arguments)
    hf_lookup = {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 3}

    def encode(batch: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        rendered = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            )
            for t in batch
        ]
        enc = tokenizer(rendered, return_tensors="pt", padding=True)
        return enc["input_ids"], enc["attention_mask"]

    cases: list[HfBenchCase] = []
    ratios: list[HfBenchRatio] = []
    for name, prompts in texts.items():
        for b in batches:
            cycled = [prompts[i % len(prompts)] for i in range(max(b, 4))]  # a class may hold fewer than 4
            groups = [cycled[:b]] if b > 1 else [[p] for p in prompts[:4]]
            encoded = [encode(g) for g in groups]
            accept: dict[str, list[float]] = {}

            hf = partial(_hf_run, model, encoded, eos, common)
            log = str(log_dir / f"{name}-{b}.sqlite")
            ours = partial(_our_run, generate, model, encoded, eos, common, log, k, accept)
            runs: dict[str, Callable[[], int]] = {
                "transformers plain": partial(hf, {}, False),
                f"transformers assistant K={k}": partial(hf, {"assistant_model": assistant}, True),
                f"transformers prompt-lookup K={k}": partial(hf, hf_lookup, True),
                f"specround.hf assistant K={k}": partial(ours, "assistant", {"assistant_model": assistant}),
                f"specround.hf prompt-lookup K={k}": partial(
                    ours, "lookup", {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 3}
                ),
                f"transformers prompt-lookup K={k} {_CONTROL}": partial(hf, hf_lookup, True),
            }
            rates: dict[str, list[tuple[float, float]]] = {case: [] for case in runs}
            made: dict[str, int] = {}
            for rep in range(repeats + 1):
                for case, run in case_order(list(runs.items()), rep):
                    wall, cpu = time.perf_counter(), time.process_time()
                    tokens = run()
                    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                    if rep:
                        rates[case].append((tokens / wall, tokens / cpu))
                        made[case] = tokens
                say(f"{name} B={b} repetition {rep}/{repeats} done")
            for case, values in rates.items():
                label = "assistant" if "assistant" in case else "lookup" if "lookup" in case else None
                ours_case = case.startswith("specround")
                acc = accept.get(label or "", []) if ours_case else []
                cases.append(
                    HfBenchCase(
                        prompt_class=name,
                        batch=b,
                        case=case,
                        tokens=made[case],
                        wall_tokens_per_s=statistics.median(v[0] for v in values),
                        cpu_tokens_per_s=statistics.median(v[1] for v in values),
                        acceptance=statistics.fmean(acc) if acc else None,
                    )
                )
            pairs = [
                (draft, f"specround.hf {draft} K={k}", other)
                for draft in ("assistant", "prompt-lookup")
                for other in [f"transformers {draft} K={k}"] + (["transformers plain"] if b > 1 else [])
            ]
            pairs.append(
                (
                    _CONTROL,
                    f"transformers prompt-lookup K={k} {_CONTROL}",
                    f"transformers prompt-lookup K={k}",
                )
            )
            for draft, mine, other in pairs:
                ratios.append(_paired_ratio(name, b, draft, other, rates[mine], rates[other]))
    return HfBenchReport(
        k=k, max_tokens=max_tokens, repeats=repeats, threads=threads, cases=tuple(cases), ratios=tuple(ratios)
    )
