"""Seeded sampler cases whose every value is machine-independent, and a digest of the decisions on them.

The decision fixture (``fixtures/decisions.json``) pins the sampler's output bit for bit: any change to the
uniforms used per position, the Philox streams or counters, the accept/correct/bonus rule, the stop and
budget rules, the refusals or the terminal draw shows up as a changed case.

To be identical on every machine the inputs are built from Python integers only (``random.Random``, no
libm, no torch RNG): every probability is ``w / 2**24`` for an integer weight ``w`` and each row's weights
sum to exactly ``2**24``. Such rows are exact in float32 and float64 and every partial sum of them is exact,
so no reduction order can change a decision. Row shapes imitate processed distributions: sharp and flat
"temperatures", top-k truncation, greedy one-hot rows, drafts that agree with the target exactly, and drafts
one unit of ``2**-24`` away from it (a degenerate correction when the uniform rejects).

Run ``python -m tests.sampling.decision_cases`` to rewrite the fixture (only when a change of the decision
rule is intended and reviewed).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from specround.errors import InputError
from specround.sampling.exact import decide, decide_from_uniforms
from specround.sampling.layouts import extract_verification
from specround.sampling.types import PAD_ID, Layout, SamplerBatch, SamplerDecision

FIXTURE = Path(__file__).parent / "fixtures" / "decisions.json"
GRID_BITS = 24
UNIT = 1 << GRID_BITS
N_VALID = 320
N_INVALID = 48


@dataclass(frozen=True)
class Case:
    """One seeded call of the sampler: a batch and, optionally, explicit uniforms."""

    name: str
    batch: SamplerBatch
    accept_uniforms: torch.Tensor | None
    terminal_uniforms: torch.Tensor | None
    validate: str


def _normalise(weights: list[int], rng: random.Random) -> list[int]:
    """Integer weights scaled to sum to exactly ``UNIT`` (zeros stay zero)."""
    total = sum(weights)
    scaled = [w * UNIT // total for w in weights]
    positive = [i for i, w in enumerate(weights) if w > 0]
    scaled[rng.choice(positive)] += UNIT - sum(scaled)
    return scaled


def _target_weights(vocab: int, shape: str, rng: random.Random) -> list[int]:
    """Unnormalised integer weights of one target row in the named shape."""
    if shape == "greedy":
        row = [0] * vocab
        row[rng.randrange(vocab)] = 1
        return row
    spread = {"sharp": 12, "flat": 2, "topk": 8}[shape]
    weights = [1 << rng.randrange(spread + 1) for _ in range(vocab)]
    if shape == "topk":
        keep = sorted(range(vocab), key=lambda i: (-weights[i], i))[: max(1, min(vocab, rng.randrange(1, 9)))]
        kept = set(keep)
        weights = [w if i in kept else 0 for i, w in enumerate(weights)]
    return weights


def _draft_weights(target: list[int], relation: str, rng: random.Random) -> list[int]:
    """Integer weights (already normalised) of a draft row related to the normalised ``target`` row."""
    if relation == "equal":
        return list(target)
    if relation == "greedy":
        row = [0] * len(target)
        row[rng.randrange(len(target))] = 1
        return _normalise(row, rng)
    noisy = [w * rng.randrange(1, 5) + rng.randrange(0, 3) * (UNIT >> 12) for w in target]
    return _normalise([max(w, 0) for w in noisy], rng)


def _nudged(target: list[int], token: int, rng: random.Random) -> list[int]:
    """``target`` with one unit moved from another entry onto ``token`` (unchanged when none can give)."""
    row = list(target)
    donors = [i for i, w in enumerate(row) if w > 0 and i != token]
    if donors:
        row[rng.choice(donors)] -= 1
        row[token] += 1
    return row


def _sample(weights: list[int], rng: random.Random) -> int:
    """A token drawn from integer weights with Python's seeded generator."""
    return rng.choices(range(len(weights)), weights=weights, k=1)[0]


def _valid_case(index: int) -> Case:
    rng = random.Random(1_000 + index)
    n_batch = rng.choice([1, 1, 2, 3, 5, 8])
    k_max = rng.choice([0, 1, 2, 3, 4, 4, 6])
    vocab = rng.choice([2, 5, 17, 64, 256, 300, 600])
    dtype = torch.float64 if index % 5 == 4 else torch.float32
    layout = Layout.RETAINED_FRONTIER if index % 2 else Layout.REPLAY_FRONTIER
    p_rows: list[torch.Tensor] = []
    q_rows: list[list[list[int]]] = []
    ids: list[list[int]] = []
    lens: list[int] = []
    for _ in range(n_batch):
        k = rng.randint(0, k_max) if rng.random() < 0.5 else k_max
        shape = rng.choice(["sharp", "flat", "topk", "greedy"])
        target = [_normalise(_target_weights(vocab, shape, rng), rng) for _ in range(k_max + 1)]
        relation = "greedy" if shape == "greedy" else rng.choice(["equal", "nudged", "noisy", "noisy"])
        if relation == "nudged":  # q = p with one unit of 2**-24 moved onto the draft: equal up to rounding
            drafts = [_sample(target[i], rng) for i in range(k)]
            draft = [_nudged(target[i], drafts[i] if i < k else 0, rng) for i in range(k_max)]
        else:
            draft = [_draft_weights(target[i], relation, rng) for i in range(k_max)]
            drafts = [_sample(draft[i], rng) for i in range(k)]
        ids.append(drafts + [PAD_ID] * (k_max - k))
        lens.append(k)
        q_rows.append(draft)
        rows = torch.tensor(target, dtype=torch.float64).div_(UNIT).to(dtype)  # [K+1, V]
        # The layout only changes how the rows reach the sampler (contract#logical-tuple): same logical tuple
        # either way.
        if layout is Layout.REPLAY_FRONTIER:
            verification = extract_verification(layout, rows, list(range(k_max + 1)), k_max)
        else:
            verification = extract_verification(layout, rows[1:], list(range(k_max)), k_max, rows[0])
        p_rows.append(verification.p_rows)
    p = torch.stack(p_rows)  # [B, K+1, V]
    q = torch.tensor(q_rows, dtype=torch.float64).reshape(n_batch, k_max, vocab).div_(UNIT).to(dtype)
    stop_ids = _stop_ids(rng, n_batch, k_max, vocab, ids)
    batch = SamplerBatch(
        p=p,
        q=q,
        draft_ids=torch.tensor(ids, dtype=torch.int64).reshape(n_batch, k_max),
        draft_lens=torch.tensor(lens, dtype=torch.int64),
        stop_ids=stop_ids,
        remaining=torch.tensor(
            [rng.choice([1, 2, 3, k_max + 1, k_max + 2, 1 << 30]) for _ in range(n_batch)], dtype=torch.int64
        ),
        seeds=torch.tensor([rng.randrange(-(1 << 63), 1 << 63) for _ in range(n_batch)], dtype=torch.int64),
        accept_counters=torch.tensor([rng.choice([0, 7, rng.randrange(1 << 40)]) for _ in range(n_batch)]),
        terminal_counters=torch.tensor([rng.choice([0, 3, rng.randrange(1 << 40)]) for _ in range(n_batch)]),
    )
    accept_u: torch.Tensor | None = None
    terminal_u: torch.Tensor | None = None
    if index % 3 == 2:  # explicit uniforms: near 0 and near 1 (forcing rejections of nudged drafts), NaN
        choices = [0.0, 0.5, 1.0 - 2.0**-53, 1.0 - 2.0**-30, rng.randrange(1 << 53) / 2.0**53]
        accept_rows = [[rng.choice(choices) for _ in range(k_max)] for _ in range(n_batch)]
        accept_u = torch.tensor(accept_rows, dtype=torch.float64).reshape(n_batch, k_max)
        terminal_u = torch.tensor([rng.choice(choices) for _ in range(n_batch)], dtype=torch.float64)
    validate = "full" if index % 4 == 3 else "read"
    return Case(f"valid-{index}", batch, accept_u, terminal_u, validate)


def _stop_ids(rng: random.Random, n_batch: int, k_max: int, vocab: int, ids: list[list[int]]) -> torch.Tensor:
    """Stop sets: none, [B, S] or per position [B, K+1, S], often holding drafted tokens."""
    kind = rng.choice(["none", "empty", "flat", "flat", "positional"])
    if kind == "empty":
        return torch.zeros(n_batch, 0, dtype=torch.int64)
    if kind == "none":
        return torch.full((n_batch, 1), PAD_ID, dtype=torch.int64)

    def one_set(request: int) -> list[int]:
        drafted = [t for t in ids[request] if t != PAD_ID]
        pool = drafted + [rng.randrange(vocab) for _ in range(2)]
        chosen = [rng.choice(pool) for _ in range(rng.randint(0, 3))]
        return (chosen + [PAD_ID] * 3)[:3]

    if kind == "flat":
        return torch.tensor([one_set(b) for b in range(n_batch)], dtype=torch.int64)
    return torch.tensor([[one_set(b) for _ in range(k_max + 1)] for b in range(n_batch)], dtype=torch.int64)


def _corrupt(batch: SamplerBatch, rng: random.Random) -> tuple[str, SamplerBatch]:
    """One malformed variant of ``batch`` (the kind, the batch)."""
    n_batch, k_max = batch.draft_ids.shape
    vocab = batch.p.shape[2]
    b = rng.randrange(n_batch)
    k = int(batch.draft_lens[b])

    def edit(name: str, change: Callable[[torch.Tensor], None]) -> SamplerBatch:
        tensor = getattr(batch, name).clone()
        change(tensor)
        return replace(batch, **{name: tensor})

    kinds: list[tuple[str, Callable[[], SamplerBatch]]] = [
        ("nan-terminal-p", lambda: edit("p", lambda t: t[b].fill_(float("nan")))),
        ("negative-p", lambda: edit("p", lambda t: t[b, :, 0].fill_(-0.25))),
        ("unnormalised-p", lambda: edit("p", lambda t: t[b].mul_(0.5))),
        ("budget-0", lambda: edit("remaining", lambda t: t.__setitem__(b, 0))),
        ("counter-negative", lambda: edit("accept_counters", lambda t: t.__setitem__(b, -1))),
        ("terminal-counter-end", lambda: edit("terminal_counters", lambda t: t.__setitem__(b, 2**63 - 1))),
        ("bad-stop", lambda: edit("stop_ids", lambda t: t.view(-1)[:1].fill_(vocab) if t.numel() else None)),
        ("bad-len", lambda: edit("draft_lens", lambda t: t.__setitem__(b, k_max + 1))),
        ("wrong-dtype", lambda: replace(batch, q=batch.q.to(torch.float16))),
        ("wrong-shape", lambda: replace(batch, seeds=batch.seeds[:0])),
    ]
    if k > 0:
        d = int(batch.draft_ids[b, 0])
        kinds += [
            ("id-out-of-vocab", lambda: edit("draft_ids", lambda t: t.__setitem__((b, 0), vocab))),
            ("zero-q", lambda: edit("q", lambda t: t.__setitem__((b, 0, d), 0.0))),
            ("inf-q", lambda: edit("q", lambda t: t.__setitem__((b, 0, d), float("inf")))),
            ("nan-q-row", lambda: edit("q", lambda t: t[b, 0].fill_(float("nan")))),
        ]
    if k < k_max:
        kinds.append(("missing-pad", lambda: edit("draft_ids", lambda t: t.__setitem__((b, k_max - 1), 0))))
    name, make = rng.choice(kinds)
    return name, make()


def _invalid_case(index: int) -> Case:
    base = _valid_case(10_000 + index)
    rng = random.Random(50_000 + index)
    kind, batch = _corrupt(base.batch, rng)
    accept_u, terminal_u = base.accept_uniforms, base.terminal_uniforms
    if index % 8 == 7:  # out-of-range uniforms instead
        n_batch, k_max = batch.draft_ids.shape
        kind, batch = "uniform-out-of-range", base.batch
        accept_u = torch.full((n_batch, k_max), 1.0, dtype=torch.float64)
        terminal_u = torch.full((n_batch,), -0.5, dtype=torch.float64)
    return Case(f"invalid-{index}-{kind}", batch, accept_u, terminal_u, base.validate)


def cases() -> list[Case]:
    """Every case of the fixture, in order."""
    return [_valid_case(i) for i in range(N_VALID)] + [_invalid_case(i) for i in range(N_INVALID)]


def _floats(tensor: torch.Tensor) -> list[str]:
    return [float(v).hex() for v in tensor.reshape(-1).tolist()]


def _digest(payload: Any) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:24]


def input_digest(case: Case) -> str:
    """Digest of a case's inputs (tells a changed generator from a changed sampler)."""
    parts: dict[str, Any] = {"validate": case.validate}
    for f in fields(SamplerBatch):
        tensor = getattr(case.batch, f.name)
        parts[f.name] = [str(tensor.dtype), list(tensor.shape), _floats(tensor.to(torch.float64))]
    for name in ("accept_uniforms", "terminal_uniforms"):
        value = getattr(case, name)
        parts[name] = None if value is None else _floats(value)
    return _digest(parts)


def run_case(case: Case) -> dict[str, Any]:
    """The sampler's answer to ``case``: readable integer fields, a digest of every field, or the refusal."""
    try:
        if case.accept_uniforms is None or case.terminal_uniforms is None:
            decision = decide(case.batch, validate=case.validate)  # type: ignore[arg-type]
        else:
            decision = decide_from_uniforms(
                case.batch,
                case.accept_uniforms,
                case.terminal_uniforms,
                validate=case.validate,  # type: ignore[arg-type]
            )
    except InputError as exc:
        return {"error": type(exc).__name__, "message": str(exc)}
    return describe(decision)


def describe(decision: SamplerDecision) -> dict[str, Any]:
    """Readable integer fields and a digest of every field (floats by their exact hex form, NaN included)."""
    summary: dict[str, Any] = {}
    every: dict[str, Any] = {}
    for f in fields(SamplerDecision):
        tensor = getattr(decision, f.name)
        every[f.name] = [str(tensor.dtype), list(tensor.shape), _floats(tensor.to(torch.float64))]
        if not tensor.is_floating_point():
            summary[f.name] = tensor.to(torch.int64).tolist()
    summary["digest"] = _digest(every)
    return summary


def build_fixture() -> dict[str, Any]:
    """The fixture's content: per case its input digest and the sampler's answer."""
    return {
        "about": "exact sampler decisions on machine-independent cases (tests/sampling/decision_cases.py)",
        "cases": {case.name: {"inputs": input_digest(case), **run_case(case)} for case in cases()},
    }


if __name__ == "__main__":
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(json.dumps(build_fixture(), indent=None, separators=(",", ":"), sort_keys=True) + "\n")
    print(f"wrote {FIXTURE}")
