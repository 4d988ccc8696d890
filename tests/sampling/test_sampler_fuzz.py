"""A seeded fuzz of the exact sampler's entry point: every malformed batch is refused by name, never crashes.

Each case builds a valid :class:`SamplerBatch` (B <= 4, K <= 4, V = 8) and applies one edit from
:data:`EDITS` (or none). ``decide`` must then either return a decision that satisfies the round's
contract (1 <= emitted <= min(k + 1, remaining), accepted <= min(emitted, k), tokens in the vocabulary) or
raise a named :class:`~specround.errors.InputError`; any other exception is a failure. Bounded for
``make test`` (``SPECROUND_FUZZ_CASES`` runs more).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from specround.errors import InputError
from specround.sampling.exact import decide
from specround.sampling.types import PAD_ID, SamplerBatch

V = 8
CASES = int(os.environ.get("SPECROUND_FUZZ_CASES", "0")) or 800


def _valid(rng: random.Random) -> SamplerBatch:
    n, k = rng.randint(1, 4), rng.randint(0, 4)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    dtype = rng.choice([torch.float32, torch.float64])
    p = torch.softmax(torch.randn(n, k + 1, V, generator=gen, dtype=torch.float64), dim=-1).to(dtype)
    q = torch.softmax(torch.randn(n, k, V, generator=gen, dtype=torch.float64), dim=-1).to(dtype)
    lens = torch.tensor([rng.randint(0, k) for _ in range(n)], dtype=torch.int64)
    drafts = torch.full((n, k), PAD_ID, dtype=torch.int64)
    for b in range(n):
        for i in range(int(lens[b])):
            drafts[b, i] = int(torch.multinomial(q[b, i].double(), 1, generator=gen))
    stop = torch.tensor([[rng.randrange(V)] for _ in range(n)]) if rng.random() < 0.5 else torch.empty((n, 0))
    return SamplerBatch(
        p=p,
        q=q,
        draft_ids=drafts,
        draft_lens=lens,
        stop_ids=stop.to(torch.int64),
        remaining=torch.tensor([rng.randint(1, 6) for _ in range(n)], dtype=torch.int64),
        seeds=torch.tensor([rng.randrange(-(2**63), 2**63) for _ in range(n)], dtype=torch.int64),
        accept_counters=torch.tensor([rng.randrange(2**40) for _ in range(n)], dtype=torch.int64),
        terminal_counters=torch.tensor([rng.randrange(2**40) for _ in range(n)], dtype=torch.int64),
    )


def _poke(name: str, value: float) -> Callable[[SamplerBatch, random.Random], SamplerBatch]:
    def edit(batch: SamplerBatch, rng: random.Random) -> SamplerBatch:
        rows = getattr(batch, name).clone()
        if rows.numel():
            rows.view(-1)[rng.randrange(rows.numel())] = value
        return replace(batch, **{name: rows})

    return edit


def _field(name: str, make: Callable[[Any], Any]) -> Callable[[SamplerBatch, random.Random], SamplerBatch]:
    return lambda batch, rng: replace(batch, **{name: make(getattr(batch, name))})


EDITS: dict[str, Callable[[SamplerBatch, random.Random], SamplerBatch]] = {
    "none": lambda batch, rng: batch,
    "NaN in p": _poke("p", float("nan")),
    "inf in p": _poke("p", float("inf")),
    "negative p": _poke("p", -0.25),
    "NaN in q": _poke("q", float("nan")),
    "negative q": _poke("q", -1.0),
    "p of 2": _poke("p", 2.0),
    "draft id past V": _poke("draft_ids", V + 3),
    "negative draft id": _poke("draft_ids", -7),
    "length past K": _poke("draft_lens", 9),
    "negative length": _poke("draft_lens", -1),
    "no budget": _poke("remaining", 0),
    "negative budget": _poke("remaining", -5),
    "negative counter": _poke("accept_counters", -1),
    "counter at the int64 end": _poke("terminal_counters", 2**63 - 1),
    "stop id past V": _poke("stop_ids", V),
    "p unnormalised": _field("p", lambda p: p * 1.5),
    "q zeros": _field("q", torch.zeros_like),
    "p integer": _field("p", lambda p: (p * 10).long()),
    "q other dtype": _field("q", lambda q: q.double() if q.dtype == torch.float32 else q.float()),
    "p without the bonus row": _field("p", lambda p: p[:, :-1]),
    "q one row short": _field("q", lambda q: q[:, 1:]),
    "lengths float": _field("draft_lens", lambda t: t.double()),
    "lengths one short": _field("draft_lens", lambda t: t[1:]),
    "draft ids 1-D": _field("draft_ids", lambda t: t.reshape(-1)),
    "seeds int32": _field("seeds", lambda t: t.to(torch.int32)),
    "stop ids 4-D": _field("stop_ids", lambda t: t[:, None, None]),
    "budget 2-D": _field("remaining", lambda t: t[:, None]),
    "p a list": _field("p", lambda p: p.tolist()),
    "q None": _field("q", lambda q: None),
}
"""Edits of a valid batch (``none`` keeps it valid)."""


def _contract_problems(batch: SamplerBatch, out: Any) -> list[str]:
    problems = []
    lens, remaining = batch.draft_lens.tolist(), batch.remaining.tolist()
    for b, (emitted, accepted) in enumerate(zip(out.emitted.tolist(), out.accepted.tolist(), strict=True)):
        if not 1 <= emitted <= min(lens[b] + 1, remaining[b]) or not 0 <= accepted <= min(emitted, lens[b]):
            problems.append(f"row {b}: emitted {emitted}, accepted {accepted}")
        tokens = out.output_ids[b, :emitted].tolist()
        if any(not 0 <= t < V for t in tokens):
            problems.append(f"row {b}: tokens {tokens}")
    return problems


@pytest.mark.parametrize("validate", ["read", "full"])
def test_the_sampler_refuses_by_name_or_decides_within_the_contract(validate: str) -> None:
    rng = random.Random(2024 if validate == "read" else 2025)
    foreign: list[str] = []
    broken: list[str] = []
    refused = decided = 0
    seen: set[str] = set()
    for _ in range(CASES):
        name = rng.choice(sorted(EDITS))
        seen.add(name)
        batch = EDITS[name](_valid(rng), rng)
        try:
            out = decide(batch, validate=validate)  # type: ignore[arg-type]
        except InputError:
            refused += 1
            continue
        except Exception as exc:
            if len(foreign) < 5:
                foreign.append(f"{name}: {type(exc).__name__}: {exc}")
            continue
        decided += 1
        broken += [f"{name}: {p}" for p in _contract_problems(batch, out)][:5]
    assert foreign == [], foreign
    assert broken == [], broken
    assert seen == set(EDITS)
    assert refused > CASES // 3 and decided > CASES // 10  # both outcomes were exercised
