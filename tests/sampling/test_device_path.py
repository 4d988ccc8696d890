"""The fast path for rows on an accelerator decides as the reference does, bit for bit, in a few tensor ops.

A batch whose rows live on an accelerator copies its integers to the host once, runs the fast path's
control there and reads its rows on the device (gathers, the terminal pass, one block per row for the
search). The same code runs on CPU tensors when the CPU batch is routed to it, which is how these tests
hold it to the reference without a GPU; ``tests/sampling/test_exact_properties.py`` compares a real CUDA
decision with the CPU one where a device is present.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specround.bench.sampler_bench import make_sampler_inputs
from specround.sampling import exact, fast_path
from specround.sampling.exact import decide, decide_from_uniforms
from specround.sampling.op_count import count_tensor_ops
from specround.sampling.types import PAD_ID, SamplerBatch
from tests.sampling import test_fast_path as fast_path_tests
from tests.sampling.test_fast_path import assert_same, realistic_batch, reference


@pytest.fixture
def device_route(monkeypatch: pytest.MonkeyPatch) -> list[fast_path.HostBatch]:
    """Route CPU batches through the accelerator's fast path; returns the host batches it built."""
    built: list[fast_path.HostBatch] = []

    def as_on_device(batch: SamplerBatch) -> fast_path.HostBatch:
        host = fast_path.device_host_batch(batch)
        built.append(host)
        return host

    monkeypatch.setattr(exact, "SCALAR_LIMIT", 0)
    monkeypatch.setattr(exact, "host_batch", as_on_device)
    return built


@pytest.mark.parametrize("seed", range(24))
def test_the_device_route_equals_the_reference(seed: int, device_route: list[fast_path.HostBatch]) -> None:
    n_batch = (1, 2, 7, 33)[seed % 4]
    vocab = (257, 1000, 4096, 50)[seed % 4]
    dtype = torch.float64 if seed % 5 == 0 else torch.float32
    batch = realistic_batch(seed, n_batch, (4, 0, 3)[seed % 3], vocab, dtype=dtype)
    assert_same(decide(batch), reference(batch))
    assert_same(decide(batch, validate="full"), reference(batch, "full"))
    assert device_route and all(host.p is None and host.seeds is not None for host in device_route)


def test_the_device_route_copies_the_integers_faithfully() -> None:
    batch = realistic_batch(3, 5, 4, 300)  # per-position stop sets [B, K+1, S]
    host = fast_path.device_host_batch(batch)
    assert (host.draft_ids == batch.draft_ids.numpy()).all() and host.draft_ids.shape == (5, 4)
    assert (host.stop_ids == batch.stop_ids.numpy()).all() and host.stop_ids.shape == batch.stop_ids.shape
    assert (host.draft_lens == batch.draft_lens.numpy()).all()
    assert (host.remaining == batch.remaining.numpy()).all()
    assert host.seeds == batch.seeds.tolist()
    assert host.accept_counters == batch.accept_counters.tolist()
    assert host.terminal_counters == batch.terminal_counters.tolist()
    assert host.vocab == 300 and host.p is None and host.q is None


def test_forced_corrections_and_signed_zeros_on_the_device_route(
    device_route: list[fast_path.HostBatch],
) -> None:
    batch = realistic_batch(4, 6, 3, 1000)
    p, q = batch.p.clone(), batch.q.clone()
    p[:, :, :40] = -0.0
    q[:, :, :20] = 0.0
    p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
    ids = torch.where(batch.draft_ids >= 0, 40 + batch.draft_ids % 900, PAD_ID)
    batch = replace(batch, p=p, q=q, draft_ids=ids)
    accept = torch.full((6, 3), 1.0 - 2.0**-53, dtype=torch.float64)  # reject every p(d) < q(d)
    terminal = torch.linspace(0.0, 0.999, 6, dtype=torch.float64)
    routed = decide_from_uniforms(batch, accept, terminal)
    with torch.no_grad():
        assert_same(routed, exact._decide_reference(batch, accept, terminal, "read"))
    assert int((routed.terminal == 0).sum()) >= 3  # corrections really were drawn
    assert device_route


def test_a_refused_value_on_the_device_route_reaches_the_reference(
    device_route: list[fast_path.HostBatch],
) -> None:
    fast_path_tests.test_the_reference_path_is_what_raises_refusals()  # q(d) = 0, through the device route
    assert device_route
    batch = realistic_batch(1, 2, 2, 64)
    bad = batch.p.clone()
    bad[:, :, 3] = float("nan")  # every terminal row holds a NaN: the reference names it
    with pytest.raises(Exception, match=r"NaN|finite"):
        decide(replace(batch, p=bad))


DEVICE_ROUTE_OPS = 54
"""Dispatched operators of one decision on the accelerator's route, CPU tensors routed through it: the
decision's host wrappers (nine), the gathers, the terminal pass and three copies each way. On a CUDA device
the host-to-device copies of two index arrays add about four (issue 9 asks for at most 60)."""
DEVICE_ROUTE_COMPUTE_OPS = 30
"""Of which operators that compute or copy: the kernels an accelerator launches (the reference: ~370)."""


def test_the_device_route_has_a_small_fixed_op_count(device_route: list[fast_path.HostBatch]) -> None:
    """Tensor ops per decision on the accelerator's route: a fixed handful, not growing with B."""
    counts = []
    for n_batch in (1, 64, 300):
        batch = make_sampler_inputs(n_batch, 4, 2048, seed=n_batch)
        count = count_tensor_ops(lambda batch=batch: decide(batch))
        counts.append(count.total)
        assert count.total <= DEVICE_ROUTE_OPS, count.by_name
        assert count.compute <= DEVICE_ROUTE_COMPUTE_OPS, count.by_name
    assert max(counts) - min(counts) <= 12, counts
    batch = make_sampler_inputs(64, 4, 2048, seed=64)
    reference_ops = count_tensor_ops(lambda: reference(batch))
    assert reference_ops.compute > 5 * DEVICE_ROUTE_COMPUTE_OPS, reference_ops  # what the route replaces
