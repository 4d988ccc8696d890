"""``specround bench e2e``: end-to-end tokens per second, speculative against plain and against transformers.

Measured on SmolLM2 (fp32, CPU) in one run.

Cases, for every prompt class (``benchmarks/prompts/<class>.txt``, prompts separated by ``---`` lines) and
every temperature (greedy and 0.7 by default):

``specround plain``
    The serving loop with K = 0 (plain decoding through the controller and the SQLite log).
``specround plain (A/A)``
    The same case again, as a control: its ``vs_plain`` is a ratio of two identical engines, so how far it
    strays from 1.0 is the run's noise, measured rather than guessed (it is never a target, nor the "best
    specround case").
``specround <draft> K=<k>`` and ``specround <draft> K=auto``
    Each proposer (n-gram lookup, early exit, the target's bfloat16-rounded copy as draft model) with the
    fixed K and with the adaptive policy.
``specround plain pipelined`` and ``specround <draft> K=auto pipelined`` (with ``pipelined``)
    The same as the synchronous cases on the pipelined loop: each round's write runs while the next round
    drafts and verifies. The gain is a wall-clock one (the CPU work is the same); compare the wall ratios.
``transformers plain``, ``transformers prompt-lookup K=<k>``, ``transformers assistant K=<k>``
    ``model.generate`` on the same prompt ids, K and sampling (``prompt_lookup_num_tokens=K`` with
    ``max_matching_ngram_size=3`` like our lookup; ``assistant_model`` = the same bfloat16-rounded copy,
    ``num_assistant_tokens=K`` with the constant schedule and no confidence cut-off).

Every case runs every prompt once per repetition, interleaved (a repetition runs all cases back to back,
successive prompts alternately in order and in reverse: :func:`~specround.bench.case_order.case_order`),
after one untimed warm-up run per case. A sample's tokens per second is its generated tokens over its time,
prompt prefill included, model loading excluded, measured twice: wall clock, and this process's CPU time
(with one torch thread, the compute the generation itself used; on a shared machine it is far less
disturbed by other load than the wall clock). Ratios are medians of *paired* ratios (same prompt, seed and
repetition, run back to back); the targets are judged on CPU-time ratios, with the wall-clock ratios
reported beside them. Generation stops at EOS or the token budget in both engines. Once both models are
loaded, the heap is frozen for the timed runs of both engines alike
(:func:`~specround.serving.collector.serving_collector`, as ``specround generate`` runs).

For specround cases the report puts the measured acceptance (accepted / proposed, ``alpha_j^reach``) and
the speedup ledger's *predicted* seconds per token beside the measured ones: predicted = mean logged round
time / mean ``E[G](K_round)`` from the measured ``alpha^reach`` (:mod:`specround.ledger`); measured = the
rounds' logged time / tokens, and wall time / tokens.
"""

from __future__ import annotations

import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from specround.bench.case_order import case_order
from specround.errors import InvalidRequestError
from specround.ledger import expected_progress, survival_from_reach
from specround.sampling.processors.processor_chain import sampling_chain
from specround.sampling.types import Layout
from specround.serving.collector import serving_collector
from specround.serving.drafts import (
    DraftSpec,
    build_proposer,
    draft_cost_hint,
    parse_draft_spec,
    vocabulary_digest,
)
from specround.serving.loop import GenerationRequest, ServingLoop
from specround.serving.pipelined_loop import PipelinedServingLoop
from specround.serving.policy import AdaptiveDraftLength, DraftLengthPolicy, FixedDraftLength
from specround.serving.run_stats import AcceptanceStats, RoundOutcome
from specround.statemachine.model_ports import Proposer

__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_PROPOSERS",
    "E2EReport",
    "E2EResult",
    "E2ETarget",
    "default_prompts_dir",
    "load_prompt_classes",
    "run_e2e_bench",
]

DEFAULT_CLASSES = ("copy", "code", "prose")
"""Prompt classes: copy-heavy (copy/rewrite given text), code, free prose."""
DEFAULT_PROPOSERS = ("ngram", "early-exit:24", "model:bf16")
"""Drafts compared (24 of SmolLM2's 30 layers: shallower exits rarely agree with the full model)."""
HF_LOOKUP_NGRAM = 3
"""``max_matching_ngram_size`` given to transformers' prompt lookup (our lookup's longest n-gram)."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")


def default_prompts_dir() -> Path:
    """``benchmarks/prompts`` of the source checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "benchmarks" / "prompts"


def load_prompt_classes(directory: Path, classes: Sequence[str]) -> dict[str, list[str]]:
    """Prompts per class from ``<directory>/<class>.txt`` (separated by lines holding ``---``)."""
    out: dict[str, list[str]] = {}
    for name in classes:
        path = directory / f"{name}.txt"
        if not path.is_file():
            raise InvalidRequestError(f"no prompt file {path} for class {name!r}")
        prompts = [p.strip() for p in path.read_text(encoding="utf-8").split("\n---\n") if p.strip()]
        if not prompts:
            raise InvalidRequestError(f"{path} holds no prompt")
        out[name] = prompts
    return out


class E2EResult(BaseModel):
    """One case on one prompt class at one temperature, over every prompt and repetition."""

    model_config = _FROZEN

    prompt_class: str
    temperature: float
    case: str
    engine: str
    draft: str | None
    k: str
    samples: int
    generated_tokens: int
    """Median generated tokens per sample."""
    tokens_per_s: float
    """Median over samples."""
    tokens_per_s_min: float
    tokens_per_s_max: float
    tokens_per_cpu_s: float
    """Median over samples of generated tokens per CPU second of this process."""
    vs_plain: float | None = None
    """Median of paired ratios (same prompt, seed and repetition) of tokens per CPU second against
    ``specround plain``."""
    vs_plain_wall: float | None = None
    """The same in wall-clock tokens per second."""
    vs_transformers: float | None = None
    """Median of paired CPU-time ratios against transformers with the same draft and K."""
    vs_transformers_wall: float | None = None
    """The same in wall-clock tokens per second."""
    rounds: int | None = None
    proposed: int | None = None
    accepted: int | None = None
    acceptance_rate: float | None = None
    alpha_reach: list[float] | None = None
    tokens_per_round: float | None = None
    mean_k: float | None = None
    predicted_s_per_token: float | None = None
    logged_s_per_token: float | None = None
    wall_s_per_token: float | None = None
    time_split: dict[str, float] | None = None


class E2ETarget(BaseModel):
    """A stated target and whether this run met it (judged on CPU-time ratios, wall-clock beside)."""

    model_config = _FROZEN

    name: str
    value: float
    value_wall: float | None
    threshold: float
    met: bool


class E2EReport(BaseModel):
    """Everything one ``bench e2e`` run measured."""

    model_config = _FROZEN

    model_id: str
    torch_threads: int
    torch_version: str
    transformers_version: str | None
    machine: str
    max_tokens: int
    repeats: int
    k: int
    layout: str
    temperatures: list[float]
    classes: dict[str, int]
    """Prompt count per class."""
    results: list[E2EResult]
    targets: list[E2ETarget]
    all_targets_met: bool
    log_audited_clean: bool | None
    seconds: float


@dataclass(frozen=True, slots=True)
class _Case:
    name: str
    engine: str
    draft: str | None
    k: str
    pipelined: bool = False
    """Run the specround case on :class:`~specround.serving.pipelined_loop.PipelinedServingLoop`."""


@dataclass(slots=True)
class _Sample:
    tokens: int
    seconds: float
    """Wall seconds."""
    cpu_seconds: float
    """This process's CPU seconds (one torch thread: the compute the generation itself used)."""
    rounds: list[RoundOutcome] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else math.inf

    @property
    def cpu_rate(self) -> float:
        return self.tokens / self.cpu_seconds if self.cpu_seconds > 0 else math.inf


class _Specround:
    """Our side: one target, one proposer per draft, every run logged to one SQLite log."""

    def __init__(self, bundle: Any, drafts: Sequence[str], log_path: Path, layout: Layout) -> None:
        from specround.adapters.llama import LlamaTarget
        from specround.adapters.sql import SqlEventLog
        from specround.statemachine.controller import RoundController

        self.target = LlamaTarget(bundle.model, model_id=bundle.model_id)
        self.stop_ids = tuple(bundle.tokenizer.stop_ids)
        digest = vocabulary_digest(bundle.tokenizer, self.target.vocab_size)
        self.specs: dict[str, DraftSpec] = {d: parse_draft_spec(d) for d in drafts}
        self.proposers: dict[str, Proposer | None] = {
            d: build_proposer(spec, self.target, vocab_digest=digest) for d, spec in self.specs.items()
        }
        self.log = SqlEventLog.open(log_path)
        self.controller = RoundController(self.log)
        self.layout = layout
        self._runs = 0

    def run(
        self, case: _Case, prompt: tuple[int, ...], temperature: float, seed: int, max_tokens: int
    ) -> _Sample:
        proposer = self.proposers[case.draft] if case.draft is not None else None
        policy: DraftLengthPolicy
        if case.k == "auto" and case.draft is not None:
            hint = draft_cost_hint(self.specs[case.draft], self.target, proposer)
            policy = AdaptiveDraftLength(self.layout, draft_cost_hint=hint)
        else:
            policy = FixedDraftLength(int(case.k) if case.k != "auto" else 0)
        rounds: list[RoundOutcome] = []
        kind = PipelinedServingLoop if case.pipelined else ServingLoop
        loop = kind(
            self.controller, self.target, proposer, policy=policy, layout=self.layout, on_round=rounds.append
        )
        self._runs += 1
        start, cpu = time.perf_counter(), time.process_time()
        rid = loop.submit(
            GenerationRequest(
                prompt,
                max_tokens,
                seed=seed,
                processors=sampling_chain(self.target.vocab_size, temperature=temperature),
                stop_token_ids=self.stop_ids,
                request_id=f"e2e-{self._runs}",
            )
        )
        loop.run()
        loop.close()
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return _Sample(len(loop.state(rid).generated), seconds, cpu, rounds)


class _Transformers:
    """transformers' ``generate``: plain, prompt lookup, and the bfloat16-rounded copy as assistant."""

    def __init__(self, need_assistant: bool) -> None:
        import copy

        from transformers import AutoModelForCausalLM

        from specround.adapters.llama import default_gguf_path

        path = default_gguf_path()
        self.model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )
        self.model.eval()  # type: ignore[no-untyped-call]
        self.assistant = None
        if need_assistant:
            twin = copy.deepcopy(self.model)
            with torch.no_grad():
                for parameter in twin.parameters():
                    parameter.copy_(parameter.to(torch.bfloat16).to(torch.float32))
            self.assistant = twin

    def run(
        self,
        case: _Case,
        prompt: tuple[int, ...],
        temperature: float,
        seed: int,
        max_tokens: int,
        stop_ids: tuple[int, ...],
        k: int,
    ) -> _Sample:
        ids = torch.tensor([list(prompt)], dtype=torch.int64)  # [1, T]
        kwargs: dict[str, Any] = {
            "max_new_tokens": max_tokens,
            "eos_token_id": list(stop_ids),
            "pad_token_id": stop_ids[0],
            "attention_mask": torch.ones_like(ids),
            "top_k": 0,
            "top_p": 1.0,
        }
        if temperature == 0:
            kwargs["do_sample"] = False
        else:
            kwargs.update(do_sample=True, temperature=temperature)
        if case.draft == "prompt-lookup":
            kwargs.update(prompt_lookup_num_tokens=k, max_matching_ngram_size=HF_LOOKUP_NGRAM)
        elif case.draft == "assistant":
            assert self.assistant is not None
            config = self.assistant.generation_config
            config.num_assistant_tokens = k
            config.num_assistant_tokens_schedule = "constant"
            config.assistant_confidence_threshold = 0.0
            kwargs["assistant_model"] = self.assistant
        torch.manual_seed(seed)
        start, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            out = self.model.generate(ids, **kwargs)
        seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
        return _Sample(int(out.shape[1] - ids.shape[1]), seconds, cpu)


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _paired(samples: Sequence[_Sample], others: Sequence[_Sample], cpu: bool) -> float:
    """Median of per-pair ratios of tokens per second over repetitions and prompts.

    A pair shares prompt, seed and repetition; pairing cancels most of the drift of a shared machine.
    """
    ratios = [
        (a.cpu_rate / b.cpu_rate) if cpu else (a.rate / b.rate)
        for a, b in zip(samples, others, strict=True)
        if b.tokens and a.tokens
    ]
    return _median(ratios) if ratios else math.nan


def _summarise(
    cls: str,
    temperature: float,
    case: _Case,
    samples: Sequence[_Sample],
    plain: Sequence[_Sample] | None,
    counterpart: Sequence[_Sample] | None,
) -> E2EResult:
    extra: dict[str, Any] = {}
    if plain is not None:
        extra["vs_plain"] = _paired(samples, plain, cpu=True)
        extra["vs_plain_wall"] = _paired(samples, plain, cpu=False)
    if counterpart is not None:
        extra["vs_transformers"] = _paired(samples, counterpart, cpu=True)
        extra["vs_transformers_wall"] = _paired(samples, counterpart, cpu=False)
    rounds = [r for s in samples for r in s.rounds]
    if case.engine == "specround" and rounds:
        stats = AcceptanceStats()
        stats.extend(rounds)
        alpha = list(stats.alpha_reach)
        # Ledger prediction: E[T_round] / E[G(K_round)] with E[G] from the measured alpha^reach.
        gains = [expected_progress(survival_from_reach(alpha[: min(r.drafted, len(alpha))])) for r in rounds]
        mean_round = stats.logged_seconds / stats.rounds
        wall = math.fsum(s.seconds for s in samples)
        tokens = sum(s.tokens for s in samples)
        extra.update(
            rounds=stats.rounds,
            proposed=stats.proposed,
            accepted=stats.accepted,
            acceptance_rate=stats.acceptance_rate,
            alpha_reach=alpha,
            tokens_per_round=stats.tokens_per_round,
            mean_k=sum(r.drafted for r in rounds) / len(rounds),
            predicted_s_per_token=mean_round / (math.fsum(gains) / len(gains)),
            logged_s_per_token=stats.logged_seconds / stats.generated,
            wall_s_per_token=wall / tokens if tokens else None,
            time_split={
                "draft_s": stats.draft_s,
                "verify_s": stats.verify_s,
                "state_s": stats.state_s,
                "queue_s": stats.queue_s,
            },
        )
    rates = [s.rate for s in samples]
    return E2EResult(
        prompt_class=cls,
        temperature=temperature,
        case=case.name,
        engine=case.engine,
        draft=case.draft,
        k=case.k,
        samples=len(samples),
        generated_tokens=int(_median([s.tokens for s in samples])),
        tokens_per_s=_median(rates),
        tokens_per_s_min=min(rates),
        tokens_per_s_max=max(rates),
        tokens_per_cpu_s=_median([s.cpu_rate for s in samples]),
        **extra,
    )


AA_CASE = "specround plain (A/A)"
"""The control case: plain decoding again (its ratio to ``specround plain`` is the run's noise)."""

PIPELINED_CASE = "specround plain pipelined"
"""Plain decoding with each round's write pipelined behind the next round (its ``vs_plain`` is the gain)."""


def _counterpart(case: _Case, k: int) -> str | None:
    """The transformers case with the same draft and K as a specround case."""
    if case.engine != "specround" or case.k == "auto":
        return None
    if case.draft is None:
        return "transformers plain"
    spec = parse_draft_spec(case.draft)
    if case.k == str(k) and spec.kind == "ngram":
        return f"transformers prompt-lookup K={k}"
    if case.k == str(k) and spec.kind == "copy" and spec.dtype == torch.bfloat16:
        return f"transformers assistant K={k}"
    return None


def run_e2e_bench(
    *,
    classes: Sequence[str] = DEFAULT_CLASSES,
    temperatures: Sequence[float] = (0.0, 0.7),
    drafts: Sequence[str] = DEFAULT_PROPOSERS,
    k: int = 4,
    max_tokens: int = 96,
    repeats: int = 3,
    skip_hf: bool = False,
    layout: Layout | str = Layout.REPLAY_FRONTIER,
    prompts_dir: Path | None = None,
    threads: int | None = 1,
    seed: int = 0,
    pipelined: bool = False,
    progress: Callable[[str], None] | None = None,
) -> E2EReport:
    """Run every case (see the module docstring) and return the report."""
    from specround.adapters.llama import load_llama
    from specround.audit import audit_log

    began = time.perf_counter()
    if threads is not None:
        torch.set_num_threads(threads)
    layout = Layout(layout)
    prompts_by_class = load_prompt_classes(prompts_dir or default_prompts_dir(), classes)
    bundle = load_llama()
    assert bundle.tokenizer is not None and bundle.chat is not None
    encoded = {
        cls: [
            tuple(
                bundle.tokenizer.encode(bundle.chat.render([{"role": "user", "content": p}]), add_bos=False)
            )
            for p in prompts
        ]
        for cls, prompts in prompts_by_class.items()
    }
    cases = [_Case("specround plain", "specround", None, "0"), _Case(AA_CASE, "specround", None, "0")]
    if pipelined:
        cases.append(_Case(PIPELINED_CASE, "specround", None, "0", pipelined=True))
    for draft in drafts:
        cases.append(_Case(f"specround {draft} K={k}", "specround", draft, str(k)))
        cases.append(_Case(f"specround {draft} K=auto", "specround", draft, "auto"))
        if pipelined:
            cases.append(
                _Case(f"specround {draft} K=auto pipelined", "specround", draft, "auto", pipelined=True)
            )
    specs = {d: parse_draft_spec(d) for d in drafts}
    lookup = next((d for d, s in specs.items() if s.kind == "ngram"), None)
    copy_draft = next((d for d, s in specs.items() if s.kind == "copy" and s.dtype == torch.bfloat16), None)
    hf: _Transformers | None = None
    hf_version = None
    if not skip_hf:
        import transformers

        hf_version = transformers.__version__
        if progress:
            progress("loading the transformers model")
        hf = _Transformers(need_assistant=copy_draft is not None)
        cases.append(_Case("transformers plain", "transformers", None, "0"))
        if lookup is not None:
            cases.append(_Case(f"transformers prompt-lookup K={k}", "transformers", "prompt-lookup", str(k)))
        if copy_draft is not None:
            cases.append(_Case(f"transformers assistant K={k}", "transformers", "assistant", str(k)))

    with tempfile.TemporaryDirectory(prefix="specround-e2e-") as scratch, serving_collector():
        ours = _Specround(bundle, drafts, Path(scratch) / "e2e.sqlite", layout)
        stop_ids = ours.stop_ids

        def run(
            case: _Case, prompt: tuple[int, ...], temperature: float, run_seed: int, budget: int
        ) -> _Sample:
            if case.engine == "specround":
                return ours.run(case, prompt, temperature, run_seed, budget)
            assert hf is not None
            return hf.run(case, prompt, temperature, run_seed, budget, stop_ids, k)

        first = encoded[next(iter(encoded))][0]
        for case in cases:  # warm-up: one short untimed run per case
            if progress:
                progress(f"warm-up {case.name}")
            run(case, first, 0.7, seed, min(8, max_tokens))
        samples: dict[tuple[str, float, str], list[_Sample]] = {}
        block = 0
        for rep in range(repeats):
            for cls, prompts in encoded.items():
                for index, prompt in enumerate(prompts):
                    for temperature in temperatures:
                        run_seed = seed + 1000 * rep + index
                        block += 1
                        for case in case_order(cases, block):
                            if progress:
                                label = f"{cls}[{index}] T={temperature} {case.name}"
                                progress(f"repetition {rep + 1}/{repeats}: {label}")
                            sample = run(case, prompt, temperature, run_seed, max_tokens)
                            samples.setdefault((cls, temperature, case.name), []).append(sample)
        audited = audit_log(ours.log).ok
        ours.log.close()

    names = {case.name for case in cases}
    results = []
    for cls in encoded:
        for temperature in temperatures:
            for case in cases:
                other = _counterpart(case, k)
                results.append(
                    _summarise(
                        cls,
                        temperature,
                        case,
                        samples[(cls, temperature, case.name)],
                        samples[(cls, temperature, "specround plain")],
                        samples[(cls, temperature, other)] if other in names else None,
                    )
                )
    targets = _targets(results, k, lookup, copy_draft)
    return E2EReport(
        model_id=bundle.model_id,
        torch_threads=torch.get_num_threads(),
        torch_version=torch.__version__,
        transformers_version=hf_version,
        machine=f"{platform.machine()} {platform.processor() or ''}".strip(),
        max_tokens=max_tokens,
        repeats=repeats,
        k=k,
        layout=layout.value,
        temperatures=list(temperatures),
        classes={cls: len(p) for cls, p in encoded.items()},
        results=results,
        targets=targets,
        all_targets_met=all(t.met for t in targets),
        log_audited_clean=audited,
        seconds=time.perf_counter() - began,
    )


def _targets(results: list[E2EResult], k: int, lookup: str | None, copy_draft: str | None) -> list[E2ETarget]:
    targets: list[E2ETarget] = []
    for r in results:
        where = f"{r.prompt_class} T={r.temperature}"
        same_draft = r.engine == "specround" and r.draft in (lookup, copy_draft) and r.k == str(k)
        if same_draft and r.vs_transformers is not None:
            targets.append(
                E2ETarget(
                    name=f"{r.case} / transformers same draft and K, {where}",
                    value=r.vs_transformers,
                    value_wall=r.vs_transformers_wall,
                    threshold=1.0,
                    met=r.vs_transformers >= 1.0,
                )
            )
        if r.engine == "specround" and r.k == "auto" and r.vs_plain is not None:
            targets.append(
                E2ETarget(
                    name=f"{r.case} / plain decode, {where}",
                    value=r.vs_plain,
                    value_wall=r.vs_plain_wall,
                    threshold=0.97,
                    met=r.vs_plain >= 0.97,
                )
            )
    copy_rows = [
        r for r in results if r.prompt_class == "copy" and r.engine == "specround" and r.draft is not None
    ]
    for temperature in sorted({r.temperature for r in copy_rows}):
        best = max((r for r in copy_rows if r.temperature == temperature), key=lambda r: r.vs_plain or 0.0)
        value = best.vs_plain or 0.0
        targets.append(
            E2ETarget(
                name=f"best specround case ({best.case}) / plain decode, copy T={temperature}",
                value=value,
                value_wall=best.vs_plain_wall,
                threshold=1.8,
                met=value >= 1.8,
            )
        )
    return targets
