"""``specround bench sampler``: the exact sampler against the memory it must read, in one run.

For each batch size B (K drafts, vocabulary V, float32 rows on CPU, or on the accelerator that ``device``
names) these operations are timed, interleaved repetition by repetition after warm-up repetitions, and
summarised by their medians:

``sampler``
    :func:`~specround.sampling.exact.decide` with the default ``validate="read"``.
``sampler_full``
    The same with ``validate="full"`` (every row checked).
``minimum_pass``
    The physical minimum the sampler must read: the gathered ``p_i(d_i)``, ``q_i(d_i)`` plus one ``p`` row and
    one ``q`` row per request (the terminal rows of the sampler's own decision), as a plain pass that sums
    those rows with float64 accumulation -- the accumulation the exact sampler is required to use
    (contract#degenerate-cases). The target is stated against this pass. ``minimum_read`` is the same pass
    accumulating in the rows' own dtype: the cheapest plain read of those bytes, a stricter floor.
``full_pass``
    One pass over all of ``p`` and ``q``, row sums with float64 accumulation; ``full_read`` is the same in the
    rows' own dtype.

``sampler_cold``
    The sampler again, started after an unrelated read of ``cold_sweep_mib`` MiB (256 by default: an
    engine's weights streaming through the caches) has pushed its rows out of them.

Cache state: every other operation starts with its batch's rows just read, outside the clock -- as the
forward's softmax leaves them for an engine's sampler, and the same for the sampler and the passes it is
compared with. (Without it, where an operation finds its rows depends on which one ran before it: a
B = 1 decision right after B = 64's 100 MB passes reads them from memory, one after its own warm-up from
cache.) ``sampler_cold`` shows what an evicted start adds. The rest of an operation's working set (the
sampler's buffers, the interpreter's and libraries' own state) is left as the operations before it left it.

The minimum read, stated: per request ``2 K`` gathered values and ``2 V`` row entries in the rows' dtype
(``minimum_read_bytes``: ``B * (2 K + 2 V) * itemsize``, 1.57 MB per request at K = 4, V = 49,152 in
float32). The issue-9 targets are checked in ``targets``: B = 1 at most 0.3 ms (``sampler``), at most 60
tensor ops per decision at every B (``sampler_ops``, counted by
:func:`~specround.sampling.op_count.count_tensor_ops`: every dispatched ATen operator, views included;
``sampler_compute_ops`` leaves the views out), and the largest B at most 1.5x ``minimum_read``.

With the environment variable ``SPECROUND_SAMPLER_COMPILE=1`` the run also times the sampler with its
terminal pass compiled by ``torch.compile`` (``sampler_compiled_ms``; ``compile_s`` is the first compiled
call of each batch size, compilation included); the eager timings are taken with it off.

Inputs are realistic and seeded: target rows are a softmax of random logits, draft rows a softmax of the
target logits plus noise (acceptance rates like a well-matched draft model), and drafts are sampled from
the draft rows. ``threads`` pins torch's intra-op threads for the run (default: leave them as they are);
on a machine shared with other work, one thread gives steadier medians.
"""

from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import torch
from pydantic import BaseModel, ConfigDict

from specround.bench.devices import bench_device, device_name, synchronizer
from specround.sampling.exact import decide
from specround.sampling.fast_path import COMPILE_ENV
from specround.sampling.op_count import count_tensor_ops
from specround.sampling.types import SamplerBatch, TerminalKind

__all__ = [
    "SAMPLER_TARGET_B1_MS",
    "SAMPLER_TARGET_OPS",
    "SAMPLER_TARGET_RATIO",
    "SamplerBenchCase",
    "SamplerBenchReport",
    "make_sampler_inputs",
    "run_sampler_bench",
]

SAMPLER_TARGET_RATIO = 1.5
"""Target: at the largest batch size the sampler takes at most this multiple of the native minimum read."""
SAMPLER_TARGET_B1_MS = 0.3
"""Target: one request (B = 1) decided in at most this many milliseconds on CPU."""
SAMPLER_TARGET_OPS = 60
"""Target: at most this many tensor ops per decision, at every batch size."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_OPERATIONS = (
    "sampler",
    "sampler_cold",
    "sampler_full",
    "minimum_pass",
    "minimum_read",
    "full_pass",
    "full_read",
)


class SamplerBenchCase(BaseModel):
    """Medians (milliseconds) and ratios for one batch size."""

    model_config = _FROZEN

    batch_size: int
    sampler_ms: float
    sampler_cold_ms: float
    """The sampler started with its rows evicted from the caches (the others start with them just read)."""
    sampler_full_ms: float
    minimum_pass_ms: float
    minimum_read_ms: float
    full_pass_ms: float
    full_read_ms: float
    sampler_over_minimum: float
    sampler_full_over_minimum: float
    sampler_over_minimum_read: float
    sampler_over_full_pass: float
    sampler_full_over_full_pass: float
    sampler_full_over_full_read: float
    minimum_over_full_pass: float
    minimum_read_bytes: int
    """Bytes the minimum read touches: ``B * (2 K + 2 V) * itemsize``."""
    sampler_ops: int
    """Tensor ops (every dispatched ATen operator) of one ``decide`` call."""
    sampler_compute_ops: int
    """Of which operators that compute or copy (views left out)."""
    sampler_full_ops: int
    """Tensor ops of one ``decide(validate="full")`` call."""
    sampler_compiled_ms: float | None = None
    """Median with the terminal pass compiled (only with ``SPECROUND_SAMPLER_COMPILE=1``)."""
    compile_s: float | None = None
    """Seconds of the first compiled call at this batch size, compilation included."""
    mean_accepted: float
    """Mean accepted drafts per request in the benchmark's decision (how realistic the inputs are)."""
    terminal_counts: dict[str, int]
    """Requests ending in a correction, a bonus or a stop."""


class SamplerBenchReport(BaseModel):
    """The JSON printed by ``specround bench sampler``."""

    model_config = _FROZEN

    benchmark: str = "sampler"
    device: str
    dtype: str
    draft_len: int
    vocab: int
    repeats: int
    warmup: int
    seed: int
    torch_version: str
    torch_threads: int
    machine: str
    target_ratio: float
    """Target: ``sampler_over_minimum_read <= target_ratio`` at the largest batch size."""
    meets_target: bool
    """Every target in :attr:`targets` is met."""
    targets: dict[str, bool]
    """Each issue-9 target: ``b1_ms`` (B = 1 within 0.3 ms, when B = 1 is measured), ``ops`` (at most 60
    tensor ops per decision at every B), ``largest_b_ratio`` (within ``target_ratio`` of the minimum read)."""
    cases: list[SamplerBenchCase]


def make_sampler_inputs(
    batch_size: int, draft_len: int, vocab: int, *, seed: int, dtype: torch.dtype = torch.float32
) -> SamplerBatch:
    """A seeded, realistic batch: softmax rows, drafts sampled from q, one stop token, a large budget."""
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch_size, draft_len + 1, vocab, generator=gen)  # [B, K+1, V]
    noise = 0.5 * torch.randn(batch_size, draft_len, vocab, generator=gen)  # [B, K, V]
    p = torch.softmax(logits, dim=-1).to(dtype)  # [B, K+1, V]
    q = torch.softmax(logits[:, :draft_len] + noise, dim=-1).to(dtype)  # [B, K, V]
    flat_q = q.reshape(batch_size * draft_len, vocab).to(torch.float64)
    if draft_len > 0:
        drafts = torch.multinomial(flat_q, 1, generator=gen).reshape(batch_size, draft_len)
    else:
        drafts = torch.zeros(batch_size, 0, dtype=torch.int64)
    index = torch.arange(batch_size, dtype=torch.int64)
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=drafts,
        draft_lens=torch.full((batch_size,), draft_len, dtype=torch.int64),
        stop_ids=torch.zeros(batch_size, 1, dtype=torch.int64),
        remaining=torch.full((batch_size,), 1 << 20, dtype=torch.int64),
        seeds=index + seed * 1_000_003,
        accept_counters=index * 7,
        terminal_counters=index * 3,
    )


def _reference_passes(batch: SamplerBatch) -> dict[str, Callable[[], object]]:
    """The plain reference passes over ``batch``: minimum and full, float64 or native accumulation."""
    p, q, ids = batch.p, batch.q, batch.draft_ids
    n_batch, k_max = ids.shape
    vocab = p.shape[2]
    decision = decide(batch)
    p_row = decision.terminal_row.clamp_min(0).to(p.device)  # [B] the row each request's terminal draw reads
    q_row = p_row.clamp(max=max(k_max - 1, 0))  # [B]
    p_flat = p.reshape(n_batch * (k_max + 1), vocab)
    q_flat = q.reshape(n_batch * k_max, vocab)
    batch_index = torch.arange(n_batch, device=p.device)
    p_index = batch_index * (k_max + 1) + p_row  # [B]
    q_index = batch_index * k_max + q_row  # [B]
    gather_index = ids.clamp_min(0)[:, :, None]  # [B, K, 1]
    # The gathered rows land in buffers allocated once: a fresh allocation of tens of MB is mapped anew on
    # every call, and its page faults (tens of ms at B = 256) are no part of a read.
    p_rows = p_flat.new_empty((n_batch, vocab))  # [B, V]
    q_rows = q_flat.new_empty((n_batch, vocab))  # [B, V]

    def minimum(accumulate: torch.dtype | None) -> object:
        p_at = p[:, :k_max].gather(2, gather_index).sum()  # [B, K] gathered p_i(d_i)
        q_at = q.gather(2, gather_index).sum()  # [B, K] gathered q_i(d_i)
        p_sum = torch.index_select(p_flat, 0, p_index, out=p_rows).sum(-1, dtype=accumulate)  # [B]
        if k_max > 0:
            q_sum = torch.index_select(q_flat, 0, q_index, out=q_rows).sum(-1, dtype=accumulate)  # [B]
        else:
            q_sum = p_sum
        return (p_at, q_at, p_sum, q_sum)

    def full(accumulate: torch.dtype | None) -> object:
        return (p.sum(-1, dtype=accumulate), q.sum(-1, dtype=accumulate))  # [B, K+1], [B, K]

    return {
        "minimum_pass": partial(minimum, torch.float64),
        "minimum_read": partial(minimum, None),
        "full_pass": partial(full, torch.float64),
        "full_read": partial(full, None),
    }


def run_sampler_bench(
    batch_sizes: Sequence[int] = (1, 8, 64),
    *,
    draft_len: int = 4,
    vocab: int = 49_152,
    repeats: int = 21,
    warmup: int = 3,
    seed: int = 0,
    threads: int | None = None,
    device: str = "cpu",
    cold_sweep_mib: int = 256,
) -> SamplerBenchReport:
    """Time the sampler and its reference passes for each batch size, interleaved, in this process.

    ``device`` is where the rows live (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...); a device torch cannot
    use is refused with :class:`ValueError` before anything is timed. ``cold_sweep_mib`` is the size of
    the unrelated read that evicts the rows before each ``sampler_cold`` call.
    """
    if not batch_sizes or min(batch_sizes) < 1 or repeats < 1 or warmup < 0 or vocab < 1 or draft_len < 0:
        raise ValueError("need batch sizes >= 1, repeats >= 1, warmup >= 0, vocab >= 1, draft_len >= 0")
    if cold_sweep_mib < 1:
        raise ValueError("cold_sweep_mib must be >= 1")
    if threads is not None and threads < 1:
        raise ValueError("threads must be >= 1")
    where = bench_device(device)
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    compiled = os.environ.get(COMPILE_ENV) == "1"
    try:
        os.environ[COMPILE_ENV] = "0"
        return _run(
            list(batch_sizes),
            draft_len,
            vocab,
            repeats,
            warmup,
            seed,
            compiled=compiled,
            device=where,
            cold_sweep_mib=cold_sweep_mib,
        )
    finally:
        torch.set_num_threads(previous_threads)
        if compiled:
            os.environ[COMPILE_ENV] = "1"
        else:
            os.environ.pop(COMPILE_ENV, None)


def _on_device(batch: SamplerBatch, device: torch.device) -> SamplerBatch:
    """``batch`` with every tensor moved to ``device`` (the same object on the CPU)."""
    if device.type == "cpu":
        return batch
    return SamplerBatch(**{f.name: getattr(batch, f.name).to(device) for f in dataclasses.fields(batch)})


def _read_rows(batch: SamplerBatch) -> None:
    """Read every entry of the batch's rows once (outside the clock), leaving them in the caches."""
    batch.p.sum()
    batch.q.sum()


def _decide_compiled(batch: SamplerBatch) -> object:
    """``decide(batch)`` with the compiled terminal pass."""
    os.environ[COMPILE_ENV] = "1"
    try:
        return decide(batch)
    finally:
        os.environ[COMPILE_ENV] = "0"


def _run(
    batch_sizes: list[int],
    draft_len: int,
    vocab: int,
    repeats: int,
    warmup: int,
    seed: int,
    *,
    compiled: bool,
    device: torch.device,
    cold_sweep_mib: int,
) -> SamplerBenchReport:
    """:func:`run_sampler_bench` with validated arguments and the thread count already set."""
    operations: dict[tuple[int, str], Callable[[], object]] = {}
    sweep = torch.ones(cold_sweep_mib << 18, dtype=torch.float32, device=device)  # 4-byte entries
    batches: dict[int, SamplerBatch] = {}
    compile_seconds: dict[int, float] = {}
    for size in batch_sizes:
        batch = _on_device(make_sampler_inputs(size, draft_len, vocab, seed=seed + size), device)
        batches[size] = batch
        if compiled:
            start = time.perf_counter()
            _decide_compiled(batch)
            compile_seconds[size] = time.perf_counter() - start
            operations[(size, "sampler_compiled")] = partial(_decide_compiled, batch)
        operations[(size, "sampler")] = partial(decide, batch)
        operations[(size, "sampler_cold")] = partial(decide, batch)
        operations[(size, "sampler_full")] = partial(decide, batch, validate="full")
        for name, operation in _reference_passes(batch).items():
            operations[(size, name)] = operation
    samples: dict[tuple[int, str], list[float]] = {key: [] for key in operations}
    synchronize = synchronizer(device)
    for repetition in range(warmup + repeats):
        for key, operation in operations.items():
            size, name = key
            if name == "sampler_cold":
                sweep.sum()  # an unrelated read pushes the rows out of the caches
            else:
                _read_rows(batches[size])  # the rows as the forward's softmax leaves them: just written
            synchronize()
            start = time.perf_counter()
            operation()
            synchronize()
            elapsed = time.perf_counter() - start
            if repetition >= warmup:
                samples[key].append(elapsed * 1e3)

    cases = []
    for size in batch_sizes:
        median = {name: statistics.median(samples[(size, name)]) for name in _OPERATIONS}
        batch = batches[size]
        decision = decide(batch)
        ops = count_tensor_ops(partial(decide, batch))
        full_ops = count_tensor_ops(partial(decide, batch, validate="full"))
        kinds = [TerminalKind(int(code)).name.lower() for code in decision.terminal]
        cases.append(
            SamplerBenchCase(
                batch_size=size,
                sampler_ms=median["sampler"],
                sampler_cold_ms=median["sampler_cold"],
                sampler_full_ms=median["sampler_full"],
                minimum_pass_ms=median["minimum_pass"],
                minimum_read_ms=median["minimum_read"],
                full_pass_ms=median["full_pass"],
                full_read_ms=median["full_read"],
                sampler_over_minimum=median["sampler"] / median["minimum_pass"],
                sampler_full_over_minimum=median["sampler_full"] / median["minimum_pass"],
                sampler_over_minimum_read=median["sampler"] / median["minimum_read"],
                sampler_over_full_pass=median["sampler"] / median["full_pass"],
                sampler_full_over_full_pass=median["sampler_full"] / median["full_pass"],
                sampler_full_over_full_read=median["sampler_full"] / median["full_read"],
                minimum_over_full_pass=median["minimum_pass"] / median["full_pass"],
                minimum_read_bytes=size * (2 * draft_len + 2 * vocab) * batch.p.element_size(),
                sampler_ops=ops.total,
                sampler_compute_ops=ops.compute,
                sampler_full_ops=full_ops.total,
                sampler_compiled_ms=(
                    statistics.median(samples[(size, "sampler_compiled")]) if compiled else None
                ),
                compile_s=compile_seconds.get(size),
                mean_accepted=float(decision.accepted.to(torch.float64).mean()),
                terminal_counts={kind.name.lower(): kinds.count(kind.name.lower()) for kind in TerminalKind},
            )
        )
    largest = max(cases, key=lambda case: case.batch_size)
    targets = {
        "ops": all(case.sampler_ops <= SAMPLER_TARGET_OPS for case in cases),
        "largest_b_ratio": largest.sampler_over_minimum_read <= SAMPLER_TARGET_RATIO,
    }
    single = [case for case in cases if case.batch_size == 1]
    if single and device.type == "cpu":
        targets["b1_ms"] = single[0].sampler_ms <= SAMPLER_TARGET_B1_MS
    return SamplerBenchReport(
        device=device_name(device),
        dtype="float32",
        draft_len=draft_len,
        vocab=vocab,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        torch_version=torch.__version__,
        torch_threads=torch.get_num_threads(),
        machine=platform.machine() or "unknown",
        target_ratio=SAMPLER_TARGET_RATIO,
        meets_target=all(targets.values()),
        targets=targets,
        cases=cases,
    )
