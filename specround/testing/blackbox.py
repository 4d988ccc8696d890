"""Black-box contract checks besides the law: nothing after a stop, and the RNG contract.

* ``stop`` (:func:`check_stop_samples`): no sample holds a token after EOS.
* ``seed-reproducible`` (:func:`check_seed_reproducible`): the same requests, asked again in one batch,
  give the same outputs.
* ``batch-invariance`` (:func:`check_batch_invariance`): each request asked alone (a batch of one) gives the
  output it had inside the large batch, so its randomness depends on its own seed only.
"""

from __future__ import annotations

from collections.abc import Sequence

from specround.testing.engine_contract import Engine, EngineRequest

__all__ = ["check_batch_invariance", "check_seed_reproducible", "check_stop_samples"]


def check_stop_samples(requests: Sequence[EngineRequest], outputs: Sequence[Sequence[int]]) -> list[str]:
    """Samples with a token after EOS (one message each, at most the first 5 in detail)."""
    found = []
    for request, out in zip(requests, outputs, strict=True):
        eos = request.settings.eos_token_id
        if eos is not None and eos in out[:-1]:
            found.append(f"seed {request.seed}: {list(out)} continues after EOS")
    return found


def check_seed_reproducible(
    engine: Engine, requests: Sequence[EngineRequest], outputs: Sequence[Sequence[int]]
) -> list[str]:
    """Requests whose output changed when asked again (as one batch, in the same order)."""
    again = engine.generate(list(requests))
    return [
        f"seed {r.seed}: {list(a)} then {list(b)}"
        for r, a, b in zip(requests, outputs, again, strict=True)
        if tuple(a) != tuple(b)
    ]


def check_batch_invariance(
    engine: Engine, requests: Sequence[EngineRequest], outputs: Sequence[Sequence[int]]
) -> list[str]:
    """Requests whose output alone differs from their output inside the batch."""
    found = []
    for request, out in zip(requests, outputs, strict=True):
        [alone] = engine.generate([request])
        if tuple(alone) != tuple(out):
            found.append(f"seed {request.seed}: {list(out)} in the batch, {list(alone)} alone")
    return found
