"""The exact law of a model's first generated tokens, by enumeration (the reference for sampling-law tests).

For a small vocabulary and horizon, every continuation of the prompt is walked token by token: the
processed target conditional at each prefix (the processor chain advanced over exactly that prefix) gives
the probability of each next token, and products of those along a path give the probability of the path.
It runs the model's plain forward pass, not the serving path that the tests check against it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from specround.sampling.processors.processor_chain import ProcessorChain

__all__ = ["exact_sequence_law"]


def exact_sequence_law(
    logits_of: Callable[[torch.Tensor], torch.Tensor],
    chain: ProcessorChain,
    prompt: Sequence[int],
    horizon: int,
    stop: int,
) -> dict[tuple[int, ...], float]:
    """P(first ``horizon`` generated tokens) under the target alone; a sequence ends early at ``stop``.

    ``logits_of(ids)`` returns the model's logits ``[len(ids), V]`` for a 1-D tensor of token ids; the
    last row is the next-token distribution. ``chain`` is cloned and advanced over ``prompt`` first; it is
    not changed. The probabilities of the returned sequences sum to one (up to float64 rounding).
    """
    start = chain.clone()
    start.advance_many(prompt)
    prompt_ids = tuple(prompt)
    law: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], mass: float, state: ProcessorChain) -> None:
        if len(prefix) == horizon or (prefix and prefix[-1] == stop):
            law[prefix] = law.get(prefix, 0.0) + mass
            return
        logits = logits_of(torch.tensor(prompt_ids + prefix))[-1].double()  # [V]
        probs = state.distribution(logits)  # [V] float64
        for token in range(probs.shape[0]):
            p = float(probs[token])
            if p > 0.0:
                nxt = state.clone()
                nxt.advance(token)
                walk((*prefix, token), mass * p, nxt)

    walk((), 1.0, start)
    return law
