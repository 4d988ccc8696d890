"""A seeded fuzz of ``RoundController.step``: malformed rounds, alone or beside a valid neighbour.

Each step picks a request ``b`` and hands in a valid round for it broken in one of :data:`MUTATIONS`; in
about 30 % of the steps a valid round of another request ``a`` rides along. :func:`run_step_fuzz` counts
what the isolation contract forbids:

* ``non_specround``: an exception that is not a :class:`~specround.errors.SpecroundError` (out of ``step``
  or in a round's result);
* ``states_changed``: a request whose state moved although none of its rounds published;
* ``malformed_published``: a broken round that published;
* ``left_in_flight``: a request that cannot start a new round after the step;
* ``neighbours_aborted``: a valid neighbour that did not publish.

Every mutation is invalid under the controller's contract (values the sampler's ``"read"`` validation
reads are the ones damaged, so none can pass as valid data).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from specround.errors import IllegalTransitionError, SpecroundError
from specround.statemachine.controller import RoundController
from specround.statemachine.ports import EventLog
from specround.statemachine.rounds import RoundInput, RoundProposal, RoundStatus
from tests.statemachine._synthetic import Branch

V = 16
REQUESTS = 6
_DONE = (RoundStatus.PUBLISHED, RoundStatus.ACKNOWLEDGED)

Mutation = Callable[[RoundInput, random.Random, RoundController], RoundInput]


def _q(item: RoundInput) -> torch.Tensor:
    assert item.q_rows is not None
    return item.q_rows.clone()


def _nan_p(item: RoundInput, _r: random.Random, _c: RoundController) -> RoundInput:
    p = item.p_rows.clone()
    p[0] = float("nan")  # row 0 is read: test 1, or the bonus row when k = 0
    return replace(item, p_rows=p)


def _negative_q(item: RoundInput, _r: random.Random, _c: RoundController) -> RoundInput:
    q = _q(item)
    d = int(item.draft_ids[0])  # type: ignore[index]
    q[0, d] = -0.5
    return replace(item, q_rows=q)


def _zero_q(item: RoundInput, _r: random.Random, _c: RoundController) -> RoundInput:
    q = _q(item)
    d = int(item.draft_ids[0])  # type: ignore[index]
    q[0, d] = 0.0
    return replace(item, q_rows=q)


def _inf_q(item: RoundInput, _r: random.Random, _c: RoundController) -> RoundInput:
    q = _q(item)
    d = int(item.draft_ids[0])  # type: ignore[index]
    q[0, d] = float("inf")
    return replace(item, q_rows=q)


def _long_draft(item: RoundInput, r: random.Random, _c: RoundController) -> RoundInput:
    k = 65 + r.randrange(3)
    q = torch.full((k, V), 1.0 / V, dtype=torch.float64)
    p = torch.full((k + 1, V), 1.0 / V, dtype=torch.float64)
    return replace(item, draft_ids=tuple(r.randrange(V) for _ in range(k)), q_rows=q, p_rows=p)


def _stale_digest(item: RoundInput, _r: random.Random, c: RoundController) -> RoundInput:
    return replace(item, coordinate_digest="0" * 64)


MUTATIONS: dict[str, Mutation] = {
    "q rows as a list": lambda it, r, c: replace(it, q_rows=_q(it).tolist()),  # type: ignore[arg-type]
    "q rows as numpy": lambda it, r, c: replace(it, q_rows=_q(it).numpy()),  # type: ignore[arg-type]
    "p rows as a list": lambda it, r, c: replace(it, p_rows=it.p_rows.tolist()),  # type: ignore[arg-type]
    "p rows as numpy": lambda it, r, c: replace(it, p_rows=it.p_rows.numpy()),  # type: ignore[arg-type]
    "digest not a str": lambda it, r, c: replace(it, coordinate_digest=r.choice([7, None, b"ab", 1.5])),  # type: ignore[arg-type]
    "stale digest": _stale_digest,
    "draft_ids None": lambda it, r, c: replace(it, draft_ids=None),  # type: ignore[arg-type]
    "draft_ids floats": lambda it, r, c: replace(it, draft_ids=tuple(float(d) for d in it.draft_ids)),  # type: ignore[arg-type]
    "draft_ids bools": lambda it, r, c: replace(it, draft_ids=tuple(True for _ in it.draft_ids)),
    "draft_ids numpy ints": lambda it, r, c: replace(it, draft_ids=np.array(it.draft_ids, dtype=np.int64)),  # type: ignore[arg-type]
    "draft_ids 2-D tensor": lambda it, r, c: replace(it, draft_ids=torch.tensor([list(it.draft_ids)])),
    "draft_ids float tensor": lambda it, r, c: replace(
        it, draft_ids=torch.tensor(it.draft_ids, dtype=torch.float32)
    ),
    "draft id out of vocab": lambda it, r, c: replace(
        it, draft_ids=(V + r.randrange(3), *tuple(it.draft_ids)[1:])
    ),
    "negative draft id": lambda it, r, c: replace(it, draft_ids=(-1, *tuple(it.draft_ids)[1:])),
    "q rows one row short": lambda it, r, c: replace(it, q_rows=_q(it)[1:]),
    "q rows integer": lambda it, r, c: replace(it, q_rows=_q(it).to(torch.int64)),
    "q rows complex": lambda it, r, c: replace(it, q_rows=_q(it).to(torch.complex128)),
    "q rows 3-D": lambda it, r, c: replace(it, q_rows=_q(it)[None]),
    "q rows sparse": lambda it, r, c: replace(it, q_rows=_q(it).to_sparse()),
    "q rows on meta": lambda it, r, c: replace(it, q_rows=_q(it).to("meta")),
    "p rows wrong shape": lambda it, r, c: replace(it, p_rows=it.p_rows[:, :-1]),
    "p rows float32": lambda it, r, c: replace(it, p_rows=it.p_rows.to(torch.float32)),
    "p rows integer": lambda it, r, c: replace(it, p_rows=it.p_rows.to(torch.int32)),
    "p rows on meta": lambda it, r, c: replace(it, p_rows=it.p_rows.to("meta")),
    "p rows sparse": lambda it, r, c: replace(it, p_rows=it.p_rows.to_sparse()),
    "p rows None": lambda it, r, c: replace(it, p_rows=None),  # type: ignore[arg-type]
    "NaN in read p": _nan_p,
    "negative q at a draft": _negative_q,
    "zero q at a draft": _zero_q,
    "infinite q at a draft": _inf_q,
    "K over 64": _long_draft,
    "proposal_draws 2**64": lambda it, r, c: replace(it, proposal_draws=2**64 + r.randrange(5)),
    "proposal_draws negative": lambda it, r, c: replace(it, proposal_draws=-1),
    "proposal_draws float": lambda it, r, c: replace(it, proposal_draws=1.5),  # type: ignore[arg-type]
    "proposal_draws bool": lambda it, r, c: replace(it, proposal_draws=True),
    "verify_rows 2**64": lambda it, r, c: replace(it, verify_rows=2**64),
    "verify_rows negative": lambda it, r, c: replace(it, verify_rows=-3),
    "verify_rows str": lambda it, r, c: replace(it, verify_rows="3"),  # type: ignore[arg-type]
    "round_id int": lambda it, r, c: replace(it, round_id=123),  # type: ignore[arg-type]
    "round_id empty": lambda it, r, c: replace(it, round_id=""),
    "round_id 201 chars": lambda it, r, c: replace(it, round_id="r" * 201),
    "round_id bytes": lambda it, r, c: replace(it, round_id=b"rid"),  # type: ignore[arg-type]
    "request_id unknown": lambda it, r, c: replace(it, request_id="nobody"),
    "request_id a list": lambda it, r, c: replace(it, request_id=["x"]),  # type: ignore[arg-type]
    "timings a str": lambda it, r, c: replace(it, timings="fast"),  # type: ignore[arg-type]
}
"""Mutations that need at least one draft are applied to rounds with k >= 1 (see :func:`_victim`)."""

_NEEDS_DRAFTS = frozenset(
    {
        "q rows as a list",
        "q rows as numpy",
        "q rows one row short",
        "q rows integer",
        "q rows complex",
        "q rows 3-D",
        "q rows sparse",
        "q rows on meta",
        "negative q at a draft",
        "zero q at a draft",
        "infinite q at a draft",
        "draft_ids floats",
        "draft_ids bools",
        "draft_ids float tensor",
        "draft id out of vocab",
        "negative draft id",
        "draft_ids numpy ints",
        "p rows float32",
    }
)


@dataclass
class FuzzCounts:
    """What one fuzz run counted (every count but ``steps`` and ``refused`` must be 0)."""

    steps: int = 0
    refused: int = 0
    non_specround: int = 0
    states_changed: int = 0
    malformed_published: int = 0
    left_in_flight: int = 0
    neighbours_aborted: int = 0
    examples: list[str] = field(default_factory=list)

    def failures(self) -> dict[str, int]:
        """The counts that must be zero."""
        return {
            "non_specround": self.non_specround,
            "states_changed": self.states_changed,
            "malformed_published": self.malformed_published,
            "left_in_flight": self.left_in_flight,
            "neighbours_aborted": self.neighbours_aborted,
        }

    def note(self, text: str) -> None:
        """Keep the first few failure descriptions."""
        if len(self.examples) < 8:
            self.examples.append(text)


def _rows(n: int, generator: torch.Generator) -> torch.Tensor:
    """``n`` strictly positive random distributions [n, V] (cheap: no softmax)."""
    rows = torch.rand(n, V, generator=generator, dtype=torch.float64) + 0.05  # [n, V]
    return rows / rows.sum(dim=1, keepdim=True)


def random_input(
    controller: RoundController, request_id: str, k: int, generator: torch.Generator
) -> RoundInput:
    """A valid round: drafts sampled from random q rows, with independent random p rows."""
    q_rows = _rows(k, generator)  # [k, V]
    drafts = torch.multinomial(q_rows, 1, generator=generator).squeeze(1).tolist() if k else []
    return RoundInput(
        request_id=request_id,
        coordinate_digest=controller.coordinate_digest(request_id),
        draft_ids=tuple(drafts),
        q_rows=q_rows if k else None,
        p_rows=_rows(k + 1, generator),
        branch=Branch(request_id, controller.state(request_id).generation),
        proposal_draws=k,
    )


def _in_flight(controller: RoundController, request_id: str) -> bool:
    digest = controller.coordinate_digest(request_id)
    step = controller.begin_step([RoundProposal(request_id, digest, (), None)])
    [result] = step.abort()
    return isinstance(result.error, IllegalTransitionError) and "in flight" in str(result.error)


def _victim(name: str, item: RoundInput, rng: random.Random, controller: RoundController) -> RoundInput:
    return MUTATIONS[name](item, rng, controller)


def run_step_fuzz(log: EventLog, steps: int, seed: int) -> FuzzCounts:
    """Drive ``steps`` fuzzed steps over ``REQUESTS`` requests of ``log``; return the counts."""
    rng = random.Random(seed)
    generator = torch.Generator().manual_seed(seed)
    controller = RoundController(log)
    ids = [f"req-{i}" for i in range(REQUESTS)]
    for index, request_id in enumerate(ids):
        controller.open_request(
            (1, 2, 3), seed=index, vocab_size=V, request_id=request_id, max_new_tokens=1_000_000
        )
    names = sorted(MUTATIONS)
    counts = FuzzCounts()
    for _ in range(steps):
        counts.steps += 1
        b, a = rng.sample(ids, 2)
        name = rng.choice(names)
        k = rng.randint(1, 4) if name in _NEEDS_DRAFTS else rng.randint(0, 4)
        broken = _victim(name, random_input(controller, b, k, generator), rng, controller)
        inputs: list[RoundInput] = [broken]
        with_neighbour = rng.random() < 0.3
        if with_neighbour:
            neighbour = random_input(controller, a, rng.randint(0, 4), generator)
            inputs.insert(rng.randrange(2), neighbour)
        before = {rid: controller.state(rid) for rid in ids}
        try:
            results = controller.step(inputs)
        except Exception as exc:
            if not isinstance(exc, SpecroundError):
                counts.non_specround += 1
                counts.note(f"{name}: step raised {type(exc).__name__}: {exc}")
            results = []
        by_request = {}
        for item, result in zip(inputs, results, strict=False):
            by_request[id(item)] = result
            if result.error is not None and not isinstance(result.error, SpecroundError):
                counts.non_specround += 1
                counts.note(f"{name}: result error {type(result.error).__name__}")
        broken_result = by_request.get(id(broken))
        if broken_result is not None and broken_result.status in (
            RoundStatus.PUBLISHED,
            RoundStatus.ACKNOWLEDGED,
        ):
            counts.malformed_published += 1
            counts.note(f"{name}: published")
        else:
            counts.refused += 1
        published = {r.request_id for r in results if r.status in _DONE}
        for rid in ids:
            if rid not in published and controller.state(rid) != before[rid]:
                counts.states_changed += 1
                counts.note(f"{name}: state of {rid} changed")
        if with_neighbour:
            result = by_request.get(id(inputs[0] if inputs[0] is not broken else inputs[1]))
            if result is None or result.status is not RoundStatus.PUBLISHED:
                counts.neighbours_aborted += 1
                counts.note(f"{name}: neighbour {a} -> {result.status if result else 'no result'}")
        for rid in {a, b}:
            if _in_flight(controller, rid):
                counts.left_in_flight += 1
                counts.note(f"{name}: {rid} left in flight")
                controller = RoundController(log)  # keep fuzzing with a fresh projection
    for rid in ids:  # the live projection agrees with the log
        live = controller.state(rid)
        if controller.refresh(rid) != live:
            counts.states_changed += 1
            counts.note(f"{rid}: live state differs from the log")
    return counts


def describe(counts: FuzzCounts) -> dict[str, Any]:
    """The counts as a dict (for messages)."""
    return {
        "steps": counts.steps,
        "refused": counts.refused,
        **counts.failures(),
        "examples": counts.examples,
    }
