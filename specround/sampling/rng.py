"""Counter-based randomness: Philox-4x32-10 written with torch integer ops.

A uniform is a pure function of ``(request seed, stream, counter)``. Nothing is carried between calls, so
the value a request sees does not depend on which other requests share its batch, on the device, or on
whether the round is being replayed by an auditor years later. The log stores counters, never generator
state.

Mapping onto Philox (Salmon et al., SC'11; Random123): the 64-bit seed is the key ``(lo32, hi32)``; the
counter block is ``(counter lo32, counter hi32, stream, 0)``. Two of the four output words make one float64
uniform in ``[0, 1)`` with 53 random bits: ``(w0 >> 5) * 2**26 + (w1 >> 6)`` divided by ``2**53``.

All arithmetic runs on int64 tensors holding 32-bit values. The 32x32 -> 64-bit products split the constant
multiplier into 16-bit halves so that no intermediate exceeds 2**49; the result is therefore exact on every
backend, without relying on wrap-around of signed overflow.

Op count (the fixed cost of a small batch is torch dispatch, not arithmetic): the two multiplied words
``(c0, c2)`` and the two passed-through words ``(c1, c3)`` are each stacked into one ``[2, ...]`` tensor and
the ten round keys are computed up front, so a round is 12 tensor ops (9 for both products, one swap, two
xors) instead of 26 on separate words.

:func:`uniforms_host` and :func:`round_uniforms_host` are the same function on the host, for the sampler's
CPU fast path: numpy unsigned 64-bit words (the 32x32 -> 64-bit product is exact, a round is five array
operations), or plain Python integers for a handful of uniforms. All implementations are tested equal bit
for bit on every kind of seed and counter.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import torch

from specround.sampling.types import Stream

__all__ = [
    "MASK32",
    "philox4x32",
    "round_uniforms_host",
    "uniforms",
    "uniforms_host",
    "words_to_uniform",
]

MASK32 = 0xFFFFFFFF
_MULT0 = 0xD2511F53
_MULT1 = 0xCD9E8D57
_WEYL0 = 0x9E3779B9
_WEYL1 = 0xBB67AE85
_ROUNDS = 10
_TWO_POW_53 = float(2**53)


_MULT_LO = (_MULT0 & 0xFFFF, _MULT1 & 0xFFFF)
_MULT_HI = (_MULT0 >> 16, _MULT1 >> 16)


def _mulhilo(a: torch.Tensor, m_lo: torch.Tensor, m_hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * (m_hi * 2**16 + m_lo)`` for 32-bit ``a`` and 16-bit ``m_*``."""
    low_part = a * m_lo  # < 2**48
    mid = a * m_hi + (low_part >> 16)  # < 2**48 + 2**32: the product shifted right by 16
    hi = mid >> 16
    lo = ((mid & 0xFFFF) << 16) | (low_part & 0xFFFF)
    return hi, lo


def _broadcast_shape(*tensors: torch.Tensor) -> tuple[int, ...]:
    """The broadcast shape of ``tensors`` (torch's rules; plain Python, no tensor op)."""
    ndim = max(t.dim() for t in tensors)
    shape = [1] * ndim
    for tensor in tensors:
        for axis, size in enumerate(tensor.shape, start=ndim - tensor.dim()):
            if size != 1:
                if shape[axis] not in (1, size):
                    raise ValueError(f"shapes {[tuple(t.shape) for t in tensors]} do not broadcast")
                shape[axis] = size
    return tuple(shape)


def _column(values: tuple[int, int], like: torch.Tensor) -> torch.Tensor:
    """``[2, 1, ..., 1]`` int64 tensor of two constants, broadcasting against ``like`` ``[2, ...]``."""
    return torch.tensor(values, dtype=torch.int64, device=like.device).reshape((2,) + (1,) * (like.dim() - 1))


def philox4x32(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    key: tuple[torch.Tensor, torch.Tensor],
    rounds: int = _ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32 bijection of Random123 on int64 tensors of 32-bit words (all broadcastable).

    ``counter`` is the four counter words, ``key`` the two key words; returns the four output words.
    """
    shape = _broadcast_shape(*counter, *key)
    c0, c1, c2, c3, k0, k1 = (w.expand(shape) for w in (*counter, *key))
    multiplied = torch.stack((c0, c2)) & MASK32  # [2, ...] (c0, c2)
    passed = torch.stack((c1, c3)) & MASK32  # [2, ...] (c1, c3)
    m_lo, m_hi = _column(_MULT_LO, multiplied), _column(_MULT_HI, multiplied)
    # Round keys k_r = (k + r * weyl) mod 2**32 for r = 0..rounds-1: [rounds, 2, ...].
    steps = torch.arange(rounds, dtype=torch.int64, device=multiplied.device).reshape(
        (rounds,) + (1,) * multiplied.dim()
    )
    keys = (torch.stack((k0, k1)) & MASK32) + steps * _column((_WEYL0, _WEYL1), multiplied)
    keys &= MASK32
    for round_key in keys.unbind(0):
        hi, lo = _mulhilo(multiplied, m_lo, m_hi)  # (hi0, hi1), (lo0, lo1)
        # (c0, c2) <- (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1); (c1, c3) <- (lo1, lo0)
        multiplied = hi.flip(0) ^ passed ^ round_key
        passed = lo.flip(0)
    return multiplied[0], passed[0], multiplied[1], passed[1]


def words_to_uniform(w0: torch.Tensor, w1: torch.Tensor) -> torch.Tensor:
    """Combine two 32-bit words into a float64 uniform in [0, 1) with 53 random bits."""
    bits = ((w0 >> 5) << 26) | (w1 >> 6)  # < 2**53, exact in float64
    return bits.to(torch.float64) / _TWO_POW_53


def uniforms(
    seeds: torch.Tensor | int,
    stream: torch.Tensor | Stream | int,
    counters: torch.Tensor | int,
    *,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Uniforms in [0, 1) for a batch of ``(seed, stream, counter)`` triples.

    Arguments broadcast against each other (int64 tensors or Python ints); the result is float64 with the
    broadcast shape, on ``device`` (default: the device of the first tensor argument, else CPU). Seeds are
    taken modulo 2**64 (negative int64 values name the same key as their unsigned reading); counters must
    be non-negative and below 2**63.
    """
    tensors = [t for t in (seeds, stream, counters) if isinstance(t, torch.Tensor)]
    target = torch.device(device) if device is not None else (tensors[0].device if tensors else None)

    def as_int64(value: torch.Tensor | int) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.to(device=target, dtype=torch.int64)
        return torch.tensor(int(value), dtype=torch.int64, device=target)

    seed_t = as_int64(seeds if not isinstance(seeds, int) else _signed64(seeds))
    stream_t = as_int64(int(stream) if not isinstance(stream, torch.Tensor) else stream)
    counter_t = as_int64(counters)
    if bool((counter_t < 0).any()):
        raise ValueError("RNG counters must be non-negative")
    key = (seed_t & MASK32, (seed_t >> 32) & MASK32)
    zero = torch.zeros_like(counter_t)
    block = (counter_t & MASK32, (counter_t >> 32) & MASK32, (stream_t & MASK32) + zero, zero)
    w0, w1, _, _ = philox4x32(block, key)
    return words_to_uniform(w0, w1)


def _signed64(value: int) -> int:
    """Read any integer modulo 2**64 as a signed int64 (the bit pattern torch stores)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= (1 << 63) else value


_U64 = np.uint64
_SHIFT32 = _U64(32)
_MASK32_U = _U64(MASK32)
_MASK64 = (1 << 64) - 1
_HOST_MULT = np.array([_MULT0, _MULT1], dtype=_U64)  # multipliers of (c0, c2)
_HOST_KEY_STEPS = np.arange(_ROUNDS, dtype=_U64)[:, None] * np.array([_WEYL0, _WEYL1], dtype=_U64)
"""[rounds, 2] the Weyl increments ``r * weyl`` of the round keys (below 2**36: no wrap-around)."""
_SCALAR_LIMIT = 16
"""Up to this many uniforms, plain Python integers are cheaper than numpy calls."""


def uniforms_host(
    seeds: npt.NDArray[np.int64], streams: npt.NDArray[np.int64], counters: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """:func:`uniforms` on numpy int64 arrays (broadcasting; the same values bit for bit), on the host.

    Seeds are read modulo 2**64; counters must be non-negative (not checked here: the caller validates).
    Returns float64 uniforms in [0, 1) of the broadcast shape.
    """
    seed_u, stream_u, counter_u = (
        np.asarray(a, dtype=np.int64).view(_U64) for a in (seeds, streams, counters)
    )
    shape = np.broadcast_shapes(seed_u.shape, stream_u.shape, counter_u.shape)
    if math.prod(shape) <= _SCALAR_LIMIT:
        seed_b, stream_b, counter_b = (np.broadcast_to(a, shape) for a in (seed_u, stream_u, counter_u))
        flat = [
            _uniform_scalar(int(s), int(t), int(c))
            for s, t, c in zip(seed_b.flat, stream_b.flat, counter_b.flat, strict=True)
        ]
        return np.array(flat, dtype=np.float64).reshape(shape)
    multiplied = np.empty((2, *shape), dtype=_U64)  # (c0, c2)
    np.bitwise_and(counter_u, _MASK32_U, out=multiplied[0])
    np.bitwise_and(stream_u, _MASK32_U, out=multiplied[1])
    passed = np.zeros((2, *shape), dtype=_U64)  # (c1, c3)
    np.right_shift(counter_u, _SHIFT32, out=passed[0])
    key = np.empty((2, *shape), dtype=_U64)
    np.bitwise_and(seed_u, _MASK32_U, out=key[0])
    np.right_shift(seed_u, _SHIFT32, out=key[1])
    tail = (1,) * len(shape)
    mult = _HOST_MULT.reshape((2, *tail))
    keys = (key[None] + _HOST_KEY_STEPS.reshape((_ROUNDS, 2, *tail))) & _MASK32_U  # [rounds, 2, ...]
    for round_key in keys:
        product = multiplied * mult  # exact: both factors < 2**32
        # (c0, c2) <- (hi1 ^ c1 ^ k0, hi0 ^ c3 ^ k1); (c1, c3) <- (lo1, lo0)
        multiplied = (product >> _SHIFT32)[::-1] ^ passed ^ round_key
        passed = (product & _MASK32_U)[::-1]
    bits = ((multiplied[0] >> _U64(5)) << _U64(26)) | (passed[0] >> _U64(6))
    return np.asarray(bits.astype(np.float64) / _TWO_POW_53, dtype=np.float64)


def round_uniforms_host(
    seeds: list[int], accept_counters: list[int], terminal_counters: list[int], k_max: int
) -> npt.NDArray[np.float64]:
    """[B, K+1] uniforms of one round: ACCEPT at ``accept_counters[b] + i`` for i < K, then TERMINAL.

    The same values as :func:`uniforms` on the same triples; plain Python integers for a small round.
    Counters must be non-negative and leave room for the round (the caller validates).
    """
    n_batch = len(seeds)
    if n_batch * (k_max + 1) <= _SCALAR_LIMIT:
        accept, terminal = int(Stream.ACCEPT), int(Stream.TERMINAL)
        rows = []
        for seed, first, last in zip(seeds, accept_counters, terminal_counters, strict=True):
            key = seed & _MASK64
            rows.append(
                [_uniform_scalar(key, accept, first + i) for i in range(k_max)]
                + [_uniform_scalar(key, terminal, last)]
            )
        return np.array(rows, dtype=np.float64).reshape(n_batch, k_max + 1)
    counters = np.empty((n_batch, k_max + 1), dtype=np.int64)
    counters[:, :k_max] = np.asarray(accept_counters, dtype=np.int64)[:, None] + np.arange(k_max)
    counters[:, k_max] = terminal_counters
    streams = np.full(k_max + 1, int(Stream.ACCEPT), dtype=np.int64)
    streams[k_max] = int(Stream.TERMINAL)
    return uniforms_host(np.asarray(seeds, dtype=np.int64)[:, None], streams[None, :], counters)


def _uniform_scalar(seed: int, stream: int, counter: int) -> float:
    """One uniform from Python integers (``seed`` and ``counter`` already read as unsigned 64-bit)."""
    # Literal constants (_MULT0, _MULT1, _WEYL0, _WEYL1, MASK32): no global look-ups inside the loop.
    c0, c1, c2, c3 = counter & 0xFFFFFFFF, counter >> 32, stream & 0xFFFFFFFF, 0
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return (((c0 >> 5) << 26) | (c1 >> 6)) / 9007199254740992.0
