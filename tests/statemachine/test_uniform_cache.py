"""Precomputed uniform windows serve exactly the Philox uniforms the sampler would draw (INV-3, INV-10)."""

from __future__ import annotations

import math
import random

import torch

from specround.sampling.rng import uniforms
from specround.sampling.types import Stream
from specround.statemachine.uniform_cache import ACCEPT_WINDOW, WINDOW, UniformWindow, batch_uniforms

CPU = torch.device("cpu")


def _expected(seed: int, stream: Stream, counter: int) -> float:
    return float(uniforms(seed, stream, counter))


def test_windows_serve_the_philox_uniforms_across_refills() -> None:
    rng = random.Random(7)
    seeds = [0, -1, 2**63 - 1, -(2**63), 12345]
    accept = [0, 5, 2**40, 3, 70]
    terminal = [0, 2, 9, 2**33, 1]
    windows: list[UniformWindow | None] = [None] * len(seeds)
    refills = 0
    for _ in range(200):  # enough rounds to cross window boundaries
        lens = [rng.randint(0, 4) for _ in seeds]
        k_max = max(lens)
        drawn = batch_uniforms(windows, seeds, accept, terminal, lens, k_max, CPU)
        assert drawn is not None
        accept_u, terminal_u, kept = drawn
        assert accept_u.shape == (len(seeds), k_max) and accept_u.dtype == torch.float64
        for b, seed in enumerate(seeds):
            for i in range(k_max):
                value = float(accept_u[b, i])
                if i < lens[b]:  # exactly Philox(seed, ACCEPT, counter + i)
                    assert value == _expected(seed, Stream.ACCEPT, accept[b] + i)
                else:  # beyond the draft length no test reads it
                    assert math.isnan(value)
            assert float(terminal_u[b]) == _expected(seed, Stream.TERMINAL, terminal[b])
        refills += sum(old is not new for old, new in zip(windows, kept, strict=True))
        windows = list(kept)
        for b in range(len(seeds)):  # counters move forward as rounds consume draws
            accept[b] += rng.randint(0, lens[b])
            terminal[b] += rng.randint(0, 1)
    assert refills > len(seeds)  # windows were reused and refilled


def test_a_window_is_refilled_when_counters_move_back() -> None:
    [window] = batch_uniforms([None], [3], [100], [50], [4], 4, CPU)[2]  # type: ignore[index]
    assert window.covers(100, 4, 50) and not window.covers(99, 1, 50)
    drawn = batch_uniforms([window], [3], [99], [50], [4], 4, CPU)  # a retry from an earlier state
    assert drawn is not None
    assert float(drawn[0][0, 0]) == _expected(3, Stream.ACCEPT, 99)
    assert drawn[2][0] is not window and drawn[2][0].accept_start == 99


def test_counters_near_the_int64_end_are_left_to_the_sampler() -> None:
    end = 2**63
    assert batch_uniforms([None], [1], [end - ACCEPT_WINDOW + 1], [0], [1], 1, CPU) is None
    assert batch_uniforms([None], [1], [0], [end - WINDOW + 1], [1], 1, CPU) is None
    assert batch_uniforms([None], [1], [0], [end - 2], [1], 1, CPU) is None
