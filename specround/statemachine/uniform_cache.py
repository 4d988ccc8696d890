"""Per-request windows of precomputed uniforms, so that a step rarely runs Philox.

A uniform is a pure function of ``(seed, stream, counter)`` (:mod:`specround.sampling.rng`), and a request's
ACCEPT and TERMINAL counters only move forward by a few draws per round. So instead of running Philox for the
``K + 1`` uniforms of every round (about 150 tensor ops, the largest fixed cost of a small step), the
controller computes the next :data:`ACCEPT_WINDOW` ACCEPT and :data:`WINDOW` TERMINAL uniforms of a request at
once and serves the following rounds from those windows; a step refills, in one batched Philox evaluation on
the host (:func:`~specround.sampling.rng.uniforms_host`, the same values bit for bit), only the windows that
do not cover its rounds. The uniforms are handed to the sampler as host tensors, whatever device the rows are
on: the decision's control runs on the host. The decision is then
:func:`~specround.sampling.exact.decide_from_uniforms` on exactly the values
:func:`~specround.sampling.exact.round_uniforms` would have produced for the tests a round can reach (the
uniforms of positions beyond a request's draft length, which no test reads, are NaN).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from specround.sampling.rng import uniforms_host
from specround.sampling.types import Stream

__all__ = ["ACCEPT_WINDOW", "WINDOW", "UniformWindow", "batch_uniforms"]

WINDOW = 64
"""TERMINAL uniforms precomputed per request (a round uses at most one), and the longest draft a window
must hold the ACCEPT uniforms of."""
ACCEPT_WINDOW = 4 * WINDOW
"""ACCEPT uniforms precomputed per request: a round uses up to K of them, so this window lasts about as
many rounds as the TERMINAL one at K = 4. A refill's fixed cost (numpy's per-call overhead over Philox's
rounds) dominates at this width, so wider windows refill less often."""

_COUNTER_END = 2**63
"""Counters are int64: a window never reaches past this."""
_NAN = float("nan")


@dataclass(slots=True)
class UniformWindow:
    """Uniforms of one request: ACCEPT counters ``accept_start + i``, TERMINAL ``terminal_start + i``."""

    seed: int
    """The request seed as int64 (the bit pattern the sampler uses)."""
    accept_start: int
    accept: list[float]
    terminal_start: int
    terminal: list[float]

    def covers(self, accept_counter: int, draws: int, terminal_counter: int) -> bool:
        """Whether ACCEPT ``accept_counter + [0, draws)`` and TERMINAL ``terminal_counter`` are held."""
        a = accept_counter - self.accept_start
        t = terminal_counter - self.terminal_start
        return a >= 0 and a + draws <= len(self.accept) and 0 <= t < len(self.terminal)


_STREAMS = np.array([int(Stream.ACCEPT)] * ACCEPT_WINDOW + [int(Stream.TERMINAL)] * WINDOW, dtype=np.int64)
"""[A + W] the stream of each window entry: ACCEPT then TERMINAL."""
_OFFSETS = np.concatenate((np.arange(ACCEPT_WINDOW), np.arange(WINDOW))).astype(np.int64)
"""[A + W] each window entry's counter offset from its stream's start."""


def _refill(seeds: list[int], accept_starts: list[int], terminal_starts: list[int]) -> list[UniformWindow]:
    """New windows for the given requests, from ONE batched Philox evaluation on the host.

    :func:`~specround.sampling.rng.uniforms_host` gives the values of the torch Philox bit for bit, with no
    tensor op (on an accelerator the torch form would be some 150 kernels per refill).
    """
    starts = np.where(
        np.arange(ACCEPT_WINDOW + WINDOW) < ACCEPT_WINDOW,
        np.array(accept_starts, dtype=np.int64)[:, None],
        np.array(terminal_starts, dtype=np.int64)[:, None],
    )  # [R, A + W]
    seed_a = np.array(seeds, dtype=np.int64)[:, None]  # [R, 1]
    drawn = uniforms_host(seed_a, _STREAMS[None, :], starts + _OFFSETS).tolist()  # [R, A + W]
    return [
        UniformWindow(seed, a, row[:ACCEPT_WINDOW], t, row[ACCEPT_WINDOW:])
        for seed, a, t, row in zip(seeds, accept_starts, terminal_starts, drawn, strict=True)
    ]


def batch_uniforms(
    windows: Sequence[UniformWindow | None],
    seeds: Sequence[int],
    accept_counters: Sequence[int],
    terminal_counters: Sequence[int],
    draft_lens: Sequence[int],
    k_max: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor, list[UniformWindow]] | None:
    """The uniforms of a batch of rounds: accept [B, K] and terminal [B] float64, and the windows to keep.

    ``windows`` are the requests' current windows (None: none yet); windows that do not cover a round (or
    were made for another seed) are refilled together. Returns None when a counter is too close to the int64
    end for a window (the caller then lets the sampler draw the uniforms itself).
    """
    kept: list[UniformWindow | None] = list(windows)
    stale = [
        b
        for b, window in enumerate(kept)
        if window is None
        or window.seed != seeds[b]
        or not window.covers(accept_counters[b], draft_lens[b], terminal_counters[b])
    ]
    if stale:
        if any(
            accept_counters[b] > _COUNTER_END - ACCEPT_WINDOW or terminal_counters[b] > _COUNTER_END - WINDOW
            for b in stale
        ):
            return None
        fresh = _refill(
            [seeds[b] for b in stale],
            [accept_counters[b] for b in stale],
            [terminal_counters[b] for b in stale],
        )
        for b, window in zip(stale, fresh, strict=True):
            kept[b] = window
    accept_rows: list[list[float]] = []
    terminal_values: list[float] = []
    held = [window for window in kept if window is not None]  # every stale window was refilled
    assert len(held) == len(kept)
    for b, window in enumerate(held):
        a = accept_counters[b] - window.accept_start
        k = draft_lens[b]
        accept_rows.append(window.accept[a : a + k] + [_NAN] * (k_max - k))
        terminal_values.append(window.terminal[terminal_counters[b] - window.terminal_start])
    accept = torch.tensor(accept_rows, dtype=torch.float64, device=device).reshape(len(kept), k_max)  # [B, K]
    terminal = torch.tensor(terminal_values, dtype=torch.float64, device=device)  # [B]
    return accept, terminal, held
