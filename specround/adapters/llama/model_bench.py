"""``specround bench model``: start-up, decode speed and verification cost of the compact Llama, in one run.

Measured cases (fp32, CPU, this process's torch thread count):

``startup``
    ``load_llama()`` through the start-up cache plus the first token: prefill of a chat prompt and the
    first one-row decode. ``--cold`` first converts the GGUF into a fresh temporary cache and reports that
    conversion separately.
``decode_1``
    One-row decode on a committed cache (a replay verification with no drafts, then discard).
``verify_5``
    A five-row verification (frontier + 4 drafts) at the same cache state, then discard.
``packed_4x5``
    Four requests' five-row verifications in one packed forward.

Repetitions are interleaved (each repetition runs every case once, in order) after warm-up repetitions;
medians are reported with ratios taken in this run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from pydantic import BaseModel, ConfigDict

from specround.adapters.llama.loader import load_llama
from specround.adapters.llama.target import LlamaTarget
from specround.sampling.types import Layout
from specround.statemachine.model_ports import VerifyRequest

__all__ = ["ModelBenchReport", "run_model_bench"]

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_PROMPT = "Write one sentence about the sea."


class ModelBenchReport(BaseModel):
    """Timings (seconds or milliseconds as named) and ratios of one run."""

    model_config = _FROZEN

    model_id: str
    torch_threads: int
    prompt_tokens: int
    cold_convert_s: float | None
    startup_s: float
    """Load through the cache + first token (prefill + one-row decode)."""
    load_from_cache: bool
    decode_1_ms: float
    verify_5_ms: float
    packed_4x5_ms: float
    decode_tokens_per_s: float
    verify_5_over_decode_1: float
    packed_4x5_over_verify_5: float
    repeats: int


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def run_model_bench(*, repeats: int = 9, warmup: int = 2, cold: bool = False) -> ModelBenchReport:
    """Run every case and return the report (see the module docstring)."""
    cold_s = None
    if cold:
        with tempfile.TemporaryDirectory() as scratch:
            start = time.perf_counter()
            load_llama(cache_dir=scratch)
            cold_s = time.perf_counter() - start

    start = time.perf_counter()
    bundle = load_llama()
    assert bundle.tokenizer is not None and bundle.chat is not None
    prompt = bundle.tokenizer.encode(bundle.chat.render([{"role": "user", "content": _PROMPT}]))
    target = LlamaTarget(bundle.model, model_id=bundle.model_id)
    target.prefill({"r0": prompt[:-1]})
    (first,) = target.verify([VerifyRequest("r0", Layout.REPLAY_FRONTIER, prompt[-1], ())])
    first_token = int(first.logits[-1].argmax())
    startup = time.perf_counter() - start
    target.commit("r0", first.branch, 1)
    output = [*prompt, first_token]

    others = {f"r{i}": prompt[: len(prompt) - 2 * i] for i in range(1, 4)}
    target.prefill({rid: ids[:-1] for rid, ids in others.items()})
    drafts = (13, 314, 28, 9)

    def one(request_id: str, frontier: int, draft_ids: tuple[int, ...]) -> Callable[[], None]:
        def run() -> None:
            (res,) = target.verify([VerifyRequest(request_id, Layout.REPLAY_FRONTIER, frontier, draft_ids)])
            target.discard(request_id, res.branch)

        return run

    def packed() -> None:
        reqs = [VerifyRequest("r0", Layout.REPLAY_FRONTIER, output[-1], drafts)] + [
            VerifyRequest(rid, Layout.REPLAY_FRONTIER, ids[-1], drafts) for rid, ids in others.items()
        ]
        for res in target.verify(reqs):
            target.discard(res.request_id, res.branch)

    cases: dict[str, Callable[[], None]] = {
        "decode_1": one("r0", output[-1], ()),
        "verify_5": one("r0", output[-1], drafts),
        "packed_4x5": packed,
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(warmup + repeats):
        for name, case in cases.items():
            t0 = time.perf_counter()
            case()
            if rep >= warmup:
                samples[name].append(time.perf_counter() - t0)
    decode, verify5, packed4 = (_median_ms(samples[n]) for n in ("decode_1", "verify_5", "packed_4x5"))
    return ModelBenchReport(
        model_id=bundle.model_id,
        torch_threads=torch.get_num_threads(),
        prompt_tokens=len(prompt),
        cold_convert_s=cold_s,
        startup_s=startup,
        load_from_cache=bundle.from_cache,
        decode_1_ms=decode,
        verify_5_ms=verify5,
        packed_4x5_ms=packed4,
        decode_tokens_per_s=1e3 / decode,
        verify_5_over_decode_1=verify5 / decode,
        packed_4x5_over_verify_5=packed4 / verify5,
        repeats=repeats,
    )
