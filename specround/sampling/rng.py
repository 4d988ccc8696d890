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
"""

from __future__ import annotations

import torch

from specround.sampling.types import Stream

__all__ = [
    "MASK32",
    "philox4x32",
    "uniforms",
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
