"""Parity of the two softmax backends and their handling of masks, large logits and dtypes.

Contract: contract#backend-parity.

Tolerance. Both backends compute ``p_i = exp(x_i - m) / l`` with the same exact row maximum ``m`` (a max
is exact) and the same rounded argument ``x_i - m``, so the numerators differ only by the exp
implementations (<= 2 ulp each). The normaliser ``l`` differs by summation order: recursive summation of
``V`` positive terms has relative error <= (V - 1)u; the online merge adds, per block, one rescale by
``exp(m - m')`` (<= 2u) and terms whose arguments were rounded relative to a running maximum
(absolute error <= u * a * exp(-a) <= u / e each, against ``l >= 1``). A first-order bound is therefore
``|p_a - p_b| <= (2V + 4 * blocks + 8) * u * max(p_a, p_b) + 4 * tiny`` with ``u`` the dtype's epsilon
and ``tiny`` its smallest normal number (results in the subnormal range only have absolute accuracy).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from specround.sampling.softmax import (
    DEFAULT_BLOCK_SIZE,
    SoftmaxBackend,
    softmax,
    softmax_max_shift,
    softmax_online,
)

NEG_INF = float("-inf")
DTYPES = [torch.float32, torch.float64]


def assert_parity(a: torch.Tensor, b: torch.Tensor, block_size: int) -> None:
    vocab = a.shape[-1]
    info = torch.finfo(a.dtype)
    blocks = math.ceil(vocab / block_size)
    rtol = (2 * vocab + 4 * blocks + 8) * info.eps
    atol = 4 * info.tiny
    bound = rtol * torch.maximum(a, b) + atol
    assert a.dtype == b.dtype
    assert torch.equal(torch.isnan(a), torch.isnan(b))
    finite = ~torch.isnan(a)
    assert bool(((a - b).abs() <= bound)[finite].all()), float((a - b).abs().max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("vocab", "block"), [(1, 4), (7, 3), (100, 7), (1000, 64), (4099, DEFAULT_BLOCK_SIZE)]
)
def test_online_matches_max_shift(dtype: torch.dtype, vocab: int, block: int) -> None:
    gen = torch.Generator().manual_seed(vocab * 31 + block)
    logits = (torch.randn(5, vocab, generator=gen, dtype=torch.float64) * 4).to(dtype)
    a = softmax_max_shift(logits)
    b = softmax_online(logits, block_size=block)
    assert_parity(a, b, block)
    # Both are distributions: the row sum is within the summation bound of 1.
    sums = b.to(torch.float64).sum(-1)
    assert bool(((sums - 1).abs() <= (vocab + 8) * torch.finfo(dtype).eps).all())


@pytest.mark.parametrize("dtype", DTYPES)
def test_large_logits_do_not_overflow(dtype: torch.dtype) -> None:
    big = 3e38 if dtype == torch.float32 else 1e300
    logits = torch.tensor([[big, big * 0.5, -big, 0.0, big]], dtype=dtype)
    for probs in (softmax_max_shift(logits), softmax_online(logits, block_size=2)):
        assert probs.dtype == dtype
        assert torch.equal(probs, torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.5]], dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masks_one_hot_and_empty_rows(dtype: torch.dtype) -> None:
    logits = torch.tensor(
        [
            [NEG_INF, NEG_INF, 2.5, NEG_INF, NEG_INF],  # exactly one finite logit
            [NEG_INF] * 5,  # nothing allowed: no distribution
            [0.0, NEG_INF, 0.0, NEG_INF, NEG_INF],  # two equal survivors
        ],
        dtype=dtype,
    )
    for probs in (softmax_max_shift(logits), softmax_online(logits, block_size=2)):
        assert torch.equal(probs[0], torch.tensor([0, 0, 1, 0, 0], dtype=dtype))
        assert bool(torch.isnan(probs[1]).all())
        assert torch.equal(probs[2], torch.tensor([0.5, 0, 0.5, 0, 0], dtype=dtype))


def test_mask_in_a_whole_leading_block() -> None:
    # The running maximum stays -inf for two whole blocks before the first finite logit.
    logits = torch.full((2, 11), NEG_INF, dtype=torch.float64)
    logits[0, 9] = 1.0
    logits[0, 10] = 1.0
    logits[1, 5] = -3.0
    b = softmax_online(logits, block_size=3)
    expected = torch.zeros_like(logits)
    expected[0, 9] = expected[0, 10] = 0.5
    expected[1, 5] = 1.0
    assert torch.equal(b, expected)


def test_dtype_is_preserved_and_half_rounds_back() -> None:
    logits = torch.randn(3, 10, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        x = logits.to(dtype)
        assert softmax_max_shift(x).dtype == dtype
        assert softmax_online(x, block_size=4).dtype == dtype


def test_backend_dispatch_and_validation() -> None:
    logits = torch.randn(2, 9, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(softmax(logits, SoftmaxBackend.MAX_SHIFT), softmax_max_shift(logits))
    assert torch.equal(softmax(logits, "online"), softmax_online(logits))
    with pytest.raises(ValueError):
        softmax(logits, "exponential_race")
    with pytest.raises(ValueError):
        softmax_online(logits, block_size=0)
    with pytest.raises(TypeError):
        softmax_online(torch.ones(2, 3, dtype=torch.int64))


_finite = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, width=64)
_entry = st.one_of(_finite, _finite, _finite, st.just(NEG_INF))


@given(
    rows=st.integers(1, 3).flatmap(
        lambda n: st.integers(1, 70).flatmap(
            lambda v: st.lists(st.lists(_entry, min_size=v, max_size=v), min_size=n, max_size=n)
        )
    ),
    block=st.integers(1, 17),
    dtype=st.sampled_from(DTYPES),
)
def test_parity_on_generated_rows(rows: list[list[float]], block: int, dtype: torch.dtype) -> None:
    logits = torch.tensor(rows, dtype=torch.float64).to(dtype)
    a = softmax_max_shift(logits)
    b = softmax_online(logits, block_size=block)
    assert_parity(a, b, block)
    all_masked = torch.isneginf(logits).all(-1)
    assert bool(torch.isnan(a[all_masked]).all())
    assert not bool(torch.isnan(a[~all_masked]).any())
