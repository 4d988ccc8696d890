"""A seeded fuzz of ``RoundController.step_batch``: malformed batches and rows beside valid neighbours.

Each fuzz step builds a valid batch for a few live requests, then applies one edit drawn from
:data:`BATCH_EDITS` (the whole batch is malformed: it must be refused by name before any state moves) or
from :data:`ROW_EDITS` (one row is malformed: that row must be refused alone and every other row must
publish). :class:`FuzzCounts` counts what must never happen; :func:`fuzz_batch_steps` returns the counts and
the test asserts they are all zero and that the log audits clean afterwards.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from specround.errors import InputError, SpecroundError
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundStatus

V = 12
K = 3


@dataclass
class Batch:
    """One step's arguments (edited in place by the fuzz)."""

    ids: Any
    draft_ids: Any
    draft_lens: Any
    q: Any
    p: Any
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class FuzzCounts:
    """What the fuzz saw; every field but ``steps``, ``refused_batches`` and ``refused_rows`` must be 0."""

    steps: int = 0
    refused_batches: int = 0
    refused_rows: int = 0
    foreign_exceptions: int = 0
    """Exceptions that are not a specround error (a traceback for the engine)."""
    state_changed_after_refusal: int = 0
    malformed_published: int = 0
    neighbours_not_published: int = 0
    left_in_flight: int = 0
    examples: list[str] = field(default_factory=list)

    def failures(self) -> dict[str, int]:
        """The counts that must be zero."""
        return {
            "foreign_exceptions": self.foreign_exceptions,
            "state_changed_after_refusal": self.state_changed_after_refusal,
            "malformed_published": self.malformed_published,
            "neighbours_not_published": self.neighbours_not_published,
            "left_in_flight": self.left_in_flight,
        }


def _set(b: Batch, name: str, value: Any) -> None:
    setattr(b, name, value)


BATCH_EDITS: dict[str, Callable[[Batch, random.Random], None]] = {
    "float draft ids": lambda b, r: _set(b, "draft_ids", b.draft_ids.double()),
    "bool draft ids": lambda b, r: _set(b, "draft_ids", b.draft_ids > 0),
    "draft ids as a list": lambda b, r: _set(b, "draft_ids", b.draft_ids.tolist()),
    "1-D draft ids": lambda b, r: _set(b, "draft_ids", b.draft_ids.reshape(-1)),
    "lengths as numpy": lambda b, r: _set(b, "draft_lens", b.draft_lens.numpy()),
    "2-D lengths": lambda b, r: _set(b, "draft_lens", b.draft_lens[:, None]),
    "one length short": lambda b, r: _set(b, "draft_lens", b.draft_lens[:-1]),
    "q as a list": lambda b, r: _set(b, "q", b.q.tolist()),
    "q as numpy": lambda b, r: _set(b, "q", b.q.numpy()),
    "q float32, p float64": lambda b, r: _set(b, "q", b.q.float()),
    "q missing": lambda b, r: _set(b, "q", None),
    "q one row short": lambda b, r: _set(b, "q", b.q[:, :-1]),
    "p without the bonus row": lambda b, r: _set(b, "p", b.p[:, :-1]),
    "p integer": lambda b, r: _set(b, "p", (b.p * 100).long()),
    "p 2-D": lambda b, r: _set(b, "p", b.p.reshape(b.p.shape[0], -1)),
    "p as None": lambda b, r: _set(b, "p", None),
    "ids a string": lambda b, r: _set(b, "ids", "r0"),
    "ids None": lambda b, r: _set(b, "ids", None),
    "one id too many": lambda b, r: _set(b, "ids", [*b.ids, "extra"]),
    "digests one short": lambda b, r: b.kwargs.update(coordinate_digests=["x"] * (len(b.ids) - 1)),
    "branches one long": lambda b, r: b.kwargs.update(branches=[None] * (len(b.ids) + 1)),
}
"""Edits that make the whole batch malformed."""


def _row_value(b: Batch, row: int, name: str, value: Any) -> None:
    values = list(b.kwargs.get(name) or [None] * len(b.ids))
    values[row] = value
    b.kwargs[name] = values


def _draws(b: Batch, row: int, value: Any) -> None:
    values = list(b.kwargs.get("proposal_draws") or [0] * len(b.ids))
    values[row] = value
    b.kwargs["proposal_draws"] = values


ROW_EDITS: dict[str, Callable[[Batch, int, random.Random], None]] = {
    "length past K": lambda b, i, r: b.draft_lens.__setitem__(i, K + 1),
    "negative length": lambda b, i, r: b.draft_lens.__setitem__(i, -1),
    "draft id past V": lambda b, i, r: (b.draft_lens.__setitem__(i, K), b.draft_ids.__setitem__((i, 0), V)),
    "negative draft id": lambda b, i, r: (
        b.draft_lens.__setitem__(i, K),
        b.draft_ids.__setitem__((i, 0), -3),
    ),
    "NaN in p": lambda b, i, r: b.p.__setitem__((i, 0, r.randrange(V)), float("nan")),
    "negative p": lambda b, i, r: b.p.__setitem__((i, 0, r.randrange(V)), -0.5),
    "p not normalised": lambda b, i, r: b.p.__setitem__((i, 0), b.p[i, 0] * 3.0),
    "q zero at the draft": lambda b, i, r: (
        b.draft_lens.__setitem__(i, K),
        b.q.__setitem__((i, 0, int(b.draft_ids[i, 0])), 0.0),
    ),
    "inf in q": lambda b, i, r: (b.draft_lens.__setitem__(i, K), b.q.__setitem__((i, 0, 0), float("inf"))),
    "unknown request": lambda b, i, r: b.ids.__setitem__(i, "no-such-request"),
    "integer request id": lambda b, i, r: b.ids.__setitem__(i, 123),
    "request twice": lambda b, i, r: b.ids.__setitem__(i, b.ids[i - 1]),
    "stale digest": lambda b, i, r: _row_value(b, i, "coordinate_digests", "0" * 64),
    "digest not a string": lambda b, i, r: _row_value(b, i, "coordinate_digests", 7),
    "round id not a string": lambda b, i, r: _row_value(b, i, "round_ids", 123),
    "empty round id": lambda b, i, r: _row_value(b, i, "round_ids", ""),
    "negative proposal draws": lambda b, i, r: _draws(b, i, -1),
    "bool proposal draws": lambda b, i, r: _draws(b, i, True),
    "huge proposal draws": lambda b, i, r: _draws(b, i, 2**64),
    "float proposal draws": lambda b, i, r: _draws(b, i, 1.5),
    "negative verify rows": lambda b, i, r: _row_value(b, i, "verify_rows", -2),
    "huge verify rows": lambda b, i, r: _row_value(b, i, "verify_rows", 2**70),
}
"""Edits that make one row malformed (the row index is >= 1, so ``request twice`` has a predecessor)."""


def _valid_batch(ids: list[str], rng: random.Random) -> Batch:
    n = len(ids)
    gen = torch.Generator().manual_seed(rng.randrange(2**31))
    q = torch.softmax(torch.randn(n, K, V, generator=gen, dtype=torch.float64), dim=-1)  # [B, K, V]
    p = torch.softmax(torch.randn(n, K + 1, V, generator=gen, dtype=torch.float64), dim=-1)  # [B, K+1, V]
    draft_ids = torch.multinomial(q.reshape(n * K, V), 1, generator=gen).reshape(n, K)  # [B, K]
    lens = torch.tensor([rng.randrange(K + 1) for _ in ids], dtype=torch.int64)  # [B]
    return Batch(list(ids), draft_ids, lens, q, p)


def _snapshot(ctl: RoundController, ids: list[str]) -> dict[str, tuple[int, str]]:
    return {rid: (ctl.state(rid).generation, ctl.coordinate_digest(rid)) for rid in ids}


def fuzz_batch_steps(log: EventLog, steps: int, seed: int) -> FuzzCounts:
    """Run ``steps`` fuzzed batch steps over ``log``; returns the counts (the log keeps the rounds)."""
    rng = random.Random(seed)
    ctl = RoundController(log, validate="full")  # every row a decision could read is checked
    counts = FuzzCounts()
    ids: list[str] = []

    def note(what: str) -> None:
        if len(counts.examples) < 10:
            counts.examples.append(what)

    for _ in range(steps):
        live = [rid for rid in ids if not ctl.state(rid).finished]
        while len(live) < 4:
            rid = ctl.open_request(
                [1, 2, 3], seed=rng.randrange(2**63), max_new_tokens=40, vocab_size=V
            ).request_id
            ids.append(rid)
            live.append(rid)
        chosen = rng.sample(live, rng.randrange(2, len(live) + 1))
        batch = _valid_batch(chosen, rng)
        before = _snapshot(ctl, live)
        counts.steps += 1
        if rng.random() < 0.35:
            name = rng.choice(sorted(BATCH_EDITS))
            BATCH_EDITS[name](batch, rng)
            try:
                ctl.step_batch(batch.ids, batch.draft_ids, batch.draft_lens, batch.q, batch.p, **batch.kwargs)
            except InputError:
                counts.refused_batches += 1
            except Exception as exc:
                counts.foreign_exceptions += 1
                note(f"{name}: {type(exc).__name__}: {exc}")
            else:
                counts.malformed_published += 1
                note(f"{name}: not refused")
            if _snapshot(ctl, live) != before:
                counts.state_changed_after_refusal += 1
                note(f"{name}: state changed")
        else:
            row = rng.randrange(1, len(chosen))
            name = rng.choice(sorted(ROW_EDITS))
            ROW_EDITS[name](batch, row, rng)
            try:
                out = ctl.step_batch(
                    batch.ids, batch.draft_ids, batch.draft_lens, batch.q, batch.p, **batch.kwargs
                )
            except SpecroundError as exc:
                counts.neighbours_not_published += 1
                note(f"{name}: the whole batch raised {type(exc).__name__}: {exc}")
                continue
            except Exception as exc:
                counts.foreign_exceptions += 1
                note(f"{name}: {type(exc).__name__}: {exc}")
                continue
            for b, result in enumerate(out):
                delivered = result.status in (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)
                if b == row:
                    counts.refused_rows += 0 if delivered else 1
                    if delivered:
                        counts.malformed_published += 1
                        note(f"{name}: row published")
                elif not delivered:
                    counts.neighbours_not_published += 1
                    note(f"{name}: neighbour {b} {result.status}: {result.error}")
            untouched = [rid for rid in live if rid not in batch.ids]
            if any(_snapshot(ctl, [rid]) != {rid: before[rid]} for rid in untouched):
                counts.state_changed_after_refusal += 1
                note(f"{name}: an untouched request changed")
    for rid in ids:
        if ctl._live[rid].in_flight:
            counts.left_in_flight += 1
    return counts
