"""The mutation lab (0x07): every failure class is a mutation of the real code path that a check must kill.

Each :class:`~specround.model_check.mutants.Mutation` patches wrong variants of real functions in for the
duration of a ``with`` block (:mod:`specround.model_check.mutants`). The lab runs every check first on the
unmutated code (the **baseline**, which must pass) and then under each mutation, and records for each
mutation:

* **killed by**: the checks that fail under it;
* **active**: whether it changed anything observable. Every check reports an *observation* (a digest of
  what it saw: joints, sampled counts, published states and stored events, generated tokens, cache rows and
  logits); a mutation whose observations all equal the baseline's is inactive, and its "kills" would be
  vacuous;
* **verdict**: ``killed`` when it is active and at least one check fails; ``survived`` otherwise (a failure
  of ``specround check``); ``error`` when it could not be applied (a seam is gone: its owner no longer
  binds the function by identity) or when none of its seams was called while the checks ran (unreached).

The checks (:data:`CHECKS`), each run as a plain function:

``enumeration``
    The exact oracle (:mod:`.enumeration`) on the named fixtures and :data:`LAB_RANDOM_FIXTURES` random
    ones, tables built under the mutation (rows, ``rows_along``, the target joint).
``monte carlo``
    Seeded Monte Carlo through the real ``decide`` (:mod:`.montecarlo`) on the Monte Carlo fixtures.
``z3 conformance``
    Every pair of :func:`~specround.model_check.conformance.run_conformance` (witnesses, refusals, batch
    independence, the walk) against the z3 round relation.
``state-machine invariants``
    INV-1..INV-9 after every rule of the seeded walk (:class:`~.conformance.MachineWalk`).
``audit``
    :func:`~specround.audit.audit_log` of every log the conformance run wrote under the mutation.
``pipelined faults``
    The pipelined write-fault cells of :mod:`specround.audit.pipelined_faults` (a write that fails or loses
    the fence while the next step is in flight, F-5 and F-6 beside it) on a memory log: every cell must
    hold and audit clean.
``model K/V``
    The serving loop on the tiny Llama (both layouts, a draft model proposer): after every step the target's
    committed token ids equal ``C`` (INV-1, INV-5) and the logits its cache gives for the frontier equal a
    fresh forward over ``O`` (within 1e-4: float32 logits of the same weights, computed in another order).
``model q rows``
    From the same runs: every logged q(d_i) equals the request's chain at ``O_0 + d_1..d_{i-1}`` applied to
    a fresh forward of the draft model (the row that actually sampled the draft, 0x03D, 0x06J).
``model law``
    Monte Carlo through the whole serving path on the tiny Llama: the first :data:`MODEL_HORIZON` tokens of
    :data:`MODEL_LAW_SAMPLES` requests against the exact target law.

Statistics. Every check is seeded, so on a given code path its outcome is deterministic; the baseline run
shows that the unmutated code passes. The model-law test is Pearson's chi-square at level
:data:`MODEL_LAW_LEVEL` over the law's cells pooled to >= 5 expected samples (one test, so a correct
serving path fails it with probability 1e-3 over the choice of seeds); its power against the stated
alternative "the same chain at temperature x1.25" is printed in its detail. The fixture Monte Carlo uses
:func:`~.montecarlo.run_monte_carlo` at its documented level with :data:`LAB_MC_SAMPLES` rounds per fixture.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch

from specround.errors import SpecroundError
from specround.model_check.mutants import MUTATIONS, Mutation, SeamGoneError
from specround.model_check.results import single_threaded

__all__ = [
    "CHECKS",
    "LAB_MC_SAMPLES",
    "LAB_RANDOM_FIXTURES",
    "MODEL_LAW_SAMPLES",
    "CheckOutcome",
    "LabReport",
    "MutationRow",
    "prepare",
    "run_checks_once",
    "run_lab",
]

LAB_RANDOM_FIXTURES = 12
"""Random fixtures (seed 0) the lab's exact oracle runs beside the named ones."""
LAB_MC_SAMPLES = 20_000
"""Monte Carlo rounds per Monte Carlo fixture in the lab."""
MODEL_LAW_SAMPLES = 400
"""Requests of the tiny-model law check."""
MODEL_LAW_LEVEL = 1e-3
"""Level of the tiny-model chi-square test."""
WALK_RULES = 40
"""Rules of the seeded state-machine walk."""

Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict, what it saw, and how long it took."""

    check: str
    passed: bool
    detail: str
    observation: str
    """Digest of everything the check observed (for the activity test)."""
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "check": self.check,
            "passed": self.passed,
            "detail": self.detail,
            "observation": self.observation[:16],
            "seconds": round(self.seconds, 3),
        }


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode())
    return h.hexdigest()


def _failed(check: str, error: BaseException, started: float) -> CheckOutcome:
    """A check whose run crashed: it fails, and what it observed is the crash."""
    return CheckOutcome(
        check,
        False,
        f"crashed: {type(error).__name__}: {error}",
        _digest("crash", type(error).__name__, str(error)),
        time.perf_counter() - started,
    )


# --- the exact oracle and Monte Carlo on fixtures -------------------------------------------------------


def _fixture_checks() -> list[CheckOutcome]:
    """``enumeration`` and ``monte carlo`` (one tables build serves both)."""
    from specround.model_check.enumeration import enumerate_fixtures
    from specround.model_check.fixtures import named_fixtures, random_fixtures
    from specround.model_check.montecarlo import run_monte_carlo
    from specround.model_check.tables import build_tables

    started = time.perf_counter()
    try:
        fixtures = named_fixtures() + random_fixtures(LAB_RANDOM_FIXTURES, 0)
        tables = [build_tables(f) for f in fixtures]
        results = enumerate_fixtures(tables)
    except Exception as error:
        crashed = _failed("enumeration", error, started)
        return [
            crashed,
            CheckOutcome("monte carlo", False, "no tables: " + crashed.detail, crashed.observation),
        ]
    failed = [f"{r.name}: {c.check}" for r in results for c in r.checks if not c.passed]
    joints = [sorted((k, round(v, 12)) for k, v in r.speculative_joint.items()) for r in results]
    enumeration = CheckOutcome(
        "enumeration",
        not failed,
        f"{len(results) - len({f.split(':')[0] for f in failed})}/{len(results)} fixtures pass"
        + (f"; failed: {', '.join(failed[:4])}" if failed else ""),
        _digest(joints),
        time.perf_counter() - started,
    )
    started = time.perf_counter()
    chosen = [i for i, f in enumerate(fixtures) if "monte_carlo" in f.tags][:3]
    try:
        runs = [
            run_monte_carlo(
                results[i].tables,
                results[i].tables.target_joint,
                results[i].emitted_pmf,
                samples=LAB_MC_SAMPLES,
                seed=1,
            )
            for i in chosen
        ]
    except Exception as error:
        return [enumeration, _failed("monte carlo", error, started)]
    mc_failed = [f"{r.fixture}: {c.check}" for r in runs for c in r.checks if not c.passed]
    monte_carlo = CheckOutcome(
        "monte carlo",
        not mc_failed,
        f"{len(runs)} fixtures x {LAB_MC_SAMPLES} rounds"
        + (f"; failed: {', '.join(mc_failed[:4])}" if mc_failed else ""),
        _digest([(r.fixture, r.test.statistic, r.unexpected) for r in runs]),
        time.perf_counter() - started,
    )
    return [enumeration, monte_carlo]


# --- the controller: conformance, the walk's invariants, the audit --------------------------------------


def _controller_checks() -> list[CheckOutcome]:
    """``z3 conformance``, ``state-machine invariants`` and ``audit`` (one conformance run serves all)."""
    from specround.audit import audit_log
    from specround.model_check.conformance import run_conformance

    started = time.perf_counter()
    try:
        run = run_conformance(walk_rules=WALK_RULES)
    except Exception as error:
        crashed = _failed("z3 conformance", error, started)
        return [
            crashed,
            CheckOutcome("state-machine invariants", False, crashed.detail, crashed.observation),
            CheckOutcome("audit", False, crashed.detail, crashed.observation),
        ]
    seconds = time.perf_counter() - started
    bad = run.nonconforming
    detail = f"{len(run.pairs) - len(bad)}/{len(run.pairs)} pairs conform"
    if bad:
        detail += f"; first: [{bad[0].scenario}] {bad[0].attempt}: {bad[0].detail}"
    if run.failures:
        detail += f"; {len(run.failures)} scenario failures, first: {run.failures[0]}"
    observation = run.observation()
    conformance = CheckOutcome("z3 conformance", run.conforming, detail, observation, seconds)
    invariants = CheckOutcome(
        "state-machine invariants",
        not run.violations,
        f"{len(run.walk_rules)} rules"
        + (f"; {len(run.violations)} violations, first: {run.violations[0]}" if run.violations else ""),
        _digest(run.walk_events, [str(v) for v in run.violations]),
    )
    started = time.perf_counter()
    findings: list[str] = []
    try:
        for log in run.logs:
            report = audit_log(log)
            findings += [f"{f.invariant} {f.kind} ({f.request_id}): {f.message}" for f in report.findings]
    except Exception as error:
        return [conformance, invariants, _failed("audit", error, started)]
    audit = CheckOutcome(
        "audit",
        not findings,
        f"{len(run.logs)} logs" + (f"; {len(findings)} findings, first: {findings[0]}" if findings else ""),
        _digest(run.events(), findings),
        time.perf_counter() - started,
    )
    return [conformance, invariants, audit]


# --- the tiny model -------------------------------------------------------------------------------------

MODEL_PROMPT = (1, 2, 3, 1, 2)
"""Prompt of every tiny-model request (repeated tokens, so the repetition penalty matters)."""
MODEL_STOP = 7
"""The tiny-model requests' stop token."""
MODEL_DRAFT = 2
"""Draft length K of the model-law check (the K/V check drafts 3)."""
MODEL_HORIZON = MODEL_DRAFT + 1
"""Tokens per request of the model-law check."""


@cache
def _tiny_models() -> tuple[Any, Any]:
    from specround.adapters.llama import tiny_llama

    return tiny_llama(seed=0), tiny_llama(seed=1)


MODEL_TEMPERATURE = 0.6
"""Temperature of the tiny-model checks' chain (sharp enough that raw and processed rows differ)."""


def _model_chain(temperature: float = MODEL_TEMPERATURE) -> Any:
    from specround.sampling.processors import sampling_chain

    return sampling_chain(8, temperature=temperature, top_k=4, repetition_penalty=1.3)


def _serving_loop(layout: Any, draft: int) -> tuple[Any, Any, Any]:
    from specround.adapters.llama import LlamaTarget
    from specround.adapters.memory_log import MemoryEventLog
    from specround.adapters.proposers import ModelProposer
    from specround.serving import FixedDraftLength, ServingLoop
    from specround.statemachine.controller import RoundController

    tiny, drafter = _tiny_models()
    target = LlamaTarget(tiny.model, model_id=tiny.model_id)
    proposer = ModelProposer(LlamaTarget(drafter.model, model_id=drafter.model_id))
    loop = ServingLoop(
        RoundController(MemoryEventLog(clock=lambda: 0.0)),
        target,
        proposer,
        policy=FixedDraftLength(draft),
        layout=layout,
        clock=lambda: 0.0,
    )
    return loop, target, tiny


def _frontier_logits(target: Any, rid: str, layout: Any, frontier: int) -> torch.Tensor:
    """What the target's cache gives for the row after the frontier (its retained or replayed row)."""
    from specround.sampling.types import Layout
    from specround.statemachine.model_ports import VerifyRequest

    if layout is Layout.RETAINED_FRONTIER:
        row: torch.Tensor = target.materialize_frontier({rid: frontier})[rid]
        return row
    [result] = target.verify([VerifyRequest(rid, layout, frontier, ())])
    target.discard(rid, result.branch)
    logits: torch.Tensor = result.logits[0]
    return logits


def _q_row_problems(loop: Any, drafter: Any, rid: str) -> tuple[list[str], list[float]]:
    """Re-derive every logged q(d_i) from a fresh forward of the draft model and the request's chain.

    The proposer must hand the controller the processed row that sampled each draft (0x03D, 0x06J): row i
    is the chain at ``O_0 + d_1..d_{i-1}`` applied to the draft model's logits after that prefix.
    """
    from specround.statemachine.staging import chain_from_config

    controller = loop.controller
    config = controller.config(rid)
    chain = chain_from_config(config)
    output = list(config.prompt_ids)
    chain.advance_many(output)
    problems: list[str] = []
    seen: list[float] = []
    for event in controller.log.events(rid):
        if event.kind == "round_ready":
            drafts = [int(d) for d in event.payload["draft_ids"]]
            logged = [float(q) for q in event.payload["q_draft"]]
            walker = chain.clone()
            for i, draft in enumerate(drafts):
                logits = drafter.model.logits(torch.tensor(output + drafts[:i]))[-1].double()  # [V]
                q = float(walker.distribution(logits)[draft])
                seen.append(round(logged[i], 6))
                if abs(q - logged[i]) > 1e-4:
                    problems.append(
                        f"{rid[:8]} q(d_{i + 1} = {draft}) logged {logged[i]:.6g}, the row gives {q:.6g}"
                    )
                walker.advance(draft)
        elif event.kind == "round_decided":
            emitted = [int(t) for t in event.payload["emitted_ids"]]
            output += emitted
            chain.advance_many(emitted)
    return problems, seen


def _model_checks() -> list[CheckOutcome]:
    """``model K/V`` and ``model q rows``: the serving loop on the tiny Llama, both layouts."""
    from specround.sampling.types import Layout
    from specround.serving import GenerationRequest

    started = time.perf_counter()
    problems: list[str] = []
    q_problems: list[str] = []
    seen: list[Any] = []
    q_seen: list[float] = []
    try:
        _, drafter = _tiny_models()
        for layout in Layout:
            loop, target, tiny = _serving_loop(layout, 3)
            rids = [
                loop.submit(
                    GenerationRequest(
                        MODEL_PROMPT, 12, seed=50 + i, processors=_model_chain(), stop_token_ids=(MODEL_STOP,)
                    )
                )
                for i in range(4)
            ]
            for _ in range(16):
                if not loop.active:
                    break
                loop.step()
                for rid in loop.active:
                    state = loop.state(rid)
                    ids = target.committed_token_ids(rid)
                    if ids != state.cache:
                        problems.append(f"{layout.value} {rid[:8]}: cache holds {ids}, C = {state.cache}")
                        continue
                    got = _frontier_logits(target, rid, layout, state.frontier)
                    want = tiny.model.logits(torch.tensor(state.output))[-1]  # [V] a fresh forward over O
                    error = float((got - want).abs().max())
                    seen.append((layout.value, state.generated, round(error, 4)))
                    if error > 1e-4:
                        problems.append(
                            f"{layout.value} {rid[:8]}: frontier logits off a fresh forward by {error:.3g}"
                        )
            problems += [f"{layout.value} {rid[:8]}: {err!r}" for rid, err in loop.errors.items()]
            seen += [
                (rid in loop.errors, loop.state(rid).generated) for rid in rids if rid not in loop.errors
            ]
            for rid in rids:
                found, values = _q_row_problems(loop, drafter, rid)
                q_problems += [f"{layout.value} {p}" for p in found]
                q_seen += values
    except Exception as error:
        crashed = _failed("model K/V", error, started)
        return [crashed, CheckOutcome("model q rows", False, crashed.detail, crashed.observation)]
    seconds = time.perf_counter() - started
    kv = CheckOutcome(
        "model K/V",
        not problems,
        f"{len(seen)} probes" + (f"; {len(problems)} problems, first: {problems[0]}" if problems else ""),
        _digest(seen, problems),
        seconds,
    )
    rows = CheckOutcome(
        "model q rows",
        bool(q_seen) and not q_problems,
        f"{len(q_seen)} q(d) re-derived"
        + (f"; {len(q_problems)} differ, first: {q_problems[0]}" if q_problems else ""),
        _digest(q_seen, q_problems),
    )
    return [kv, rows]


@cache
def _exact_model_law(temperature: float = MODEL_TEMPERATURE) -> dict[tuple[int, ...], float]:
    """P(first MODEL_HORIZON tokens) under the tiny target alone (a sequence ends early at the stop).

    Computed once, on first use (the lab computes it in its baseline, before any mutation is applied), by
    enumerating the target's processed conditionals token by token: a reference that does not run the
    serving path it checks.
    """
    from specround.model_check.sequence_law import exact_sequence_law

    tiny, _ = _tiny_models()
    return exact_sequence_law(
        tiny.model.logits, _model_chain(temperature), MODEL_PROMPT, MODEL_HORIZON, MODEL_STOP
    )


def _model_law_check() -> CheckOutcome:
    """The first tokens generated through the serving loop follow the exact target law (chi-square)."""
    from specround.model_check.stats import chi_square_test
    from specround.sampling.types import Layout
    from specround.serving import GenerationRequest

    started = time.perf_counter()
    try:
        law = _exact_model_law()
        loop, _, _ = _serving_loop(Layout.REPLAY_FRONTIER, MODEL_DRAFT)
        rids = [
            loop.submit(
                GenerationRequest(
                    MODEL_PROMPT,
                    MODEL_HORIZON,
                    seed=10_000 + i,
                    processors=_model_chain(),
                    stop_token_ids=(MODEL_STOP,),
                )
            )
            for i in range(MODEL_LAW_SAMPLES)
        ]
        finished = loop.run()
        counts = Counter(finished[rid].generated for rid in rids if rid in finished)
    except Exception as error:
        return _failed("model law", error, started)
    outside = sum(n for seq, n in counts.items() if seq not in law)
    cells = sorted(law)
    alternative = _exact_model_law(1.25 * MODEL_TEMPERATURE)
    test = chi_square_test(
        [law[c] for c in cells],
        [counts[c] for c in cells],
        MODEL_LAW_LEVEL,
        {"temperature x1.25": [alternative.get(c, 0.0) for c in cells]},
    )
    missing = MODEL_LAW_SAMPLES - sum(counts.values())
    ok = test.passed and outside == 0 and missing == 0
    return CheckOutcome(
        "model law",
        ok,
        f"N = {MODEL_LAW_SAMPLES}, chi2 = {test.statistic:.1f}, df = {test.df}, p = {test.p_value:.3g}, "
        f"power {test.power.get('temperature x1.25', 0.0):.2f} vs temperature x1.25"
        + (f", {outside} outside the support" if outside else "")
        + (f", {missing} requests failed" if missing else ""),
        _digest(sorted(counts.items())),
        time.perf_counter() - started,
    )


def _pipelined_check() -> CheckOutcome:
    """``pipelined faults``: the pipelined write-fault cells on one layout and two shapes (memory log)."""
    from specround.adapters.memory_log import MemoryEventLog
    from specround.audit.fault_matrix import FAULT_MATRIX_SHAPES
    from specround.audit.pipelined_faults import run_pipelined_faults
    from specround.sampling.types import Layout

    started = time.perf_counter()
    log = MemoryEventLog(clock=lambda: 0.0)
    try:
        cells = run_pipelined_faults(log, layouts=(Layout.REPLAY_FRONTIER,), shapes=FAULT_MATRIX_SHAPES[1:3])
    except Exception as error:
        return _failed("pipelined faults", error, started)
    bad = [c for c in cells if not c.ok]
    detail = f"{len(cells) - len(bad)}/{len(cells)} cells held"
    if bad:
        detail += f"; first: {bad[0].point} {bad[0].shape}: {bad[0].detail}"
    observation = _digest(
        [(c.point, c.shape, c.verdict, c.detail) for c in cells],
        [(e.request_id.split("/", 2)[-1], e.seq, e.kind) for e in log.events()],
    )
    return CheckOutcome("pipelined faults", not bad, detail, observation, time.perf_counter() - started)


# --- the lab --------------------------------------------------------------------------------------------

_GROUPS: dict[str, Callable[[], list[CheckOutcome]]] = {
    "fixtures": _fixture_checks,
    "controller": _controller_checks,
    "pipelined": lambda: [_pipelined_check()],
    "model": _model_checks,
    "model law": lambda: [_model_law_check()],
}
_GROUP_OF = {
    "enumeration": "fixtures",
    "monte carlo": "fixtures",
    "z3 conformance": "controller",
    "state-machine invariants": "controller",
    "audit": "controller",
    "pipelined faults": "pipelined",
    "model K/V": "model",
    "model q rows": "model",
    "model law": "model law",
}
CHECKS: tuple[str, ...] = tuple(_GROUP_OF)
"""Every check of the lab, in report order."""


def prepare() -> None:
    """Compute what the checks take as given, on the code as it is now.

    That is the tiny models, the exact law of the model-law check and the z3 witnesses. :func:`run_lab`
    calls it before applying any mutation, so that no reference is ever computed by mutated code.
    """
    from specround.model_check.conformance import BranchKind, witness
    from specround.sampling.types import Layout

    with single_threaded():
        _tiny_models()
        _exact_model_law()
        _exact_model_law(1.25 * MODEL_TEMPERATURE)
        for layout in Layout:
            for kind in BranchKind:
                witness(kind, layout)


def run_checks_once(checks: Iterable[str] = CHECKS) -> dict[str, CheckOutcome]:
    """Run the named checks once on the code as it is now (patched or not)."""
    wanted = list(checks)
    unknown = [c for c in wanted if c not in _GROUP_OF]
    if unknown:
        raise KeyError(f"unknown lab checks {unknown}; known: {list(CHECKS)}")
    groups = dict.fromkeys(_GROUP_OF[c] for c in wanted)
    outcomes: dict[str, CheckOutcome] = {}
    with single_threaded():
        for group in groups:
            for outcome in _GROUPS[group]():
                outcomes[outcome.check] = outcome
    return {c: outcomes[c] for c in wanted}


@dataclass(frozen=True)
class MutationRow:
    """What the lab found for one mutation."""

    name: str
    family: str
    failure_class: str
    violates: tuple[str, ...]
    seams: tuple[str, ...]
    killed_by: tuple[str, ...]
    """Checks that failed under the mutation."""
    changed: tuple[str, ...]
    """Checks whose observation differs from the baseline's (non-empty: the mutation is active)."""
    details: dict[str, str]
    """Each failing check's detail."""
    seconds: float
    error: str | None = None
    """Why the mutation could not be applied (a seam is gone)."""

    @property
    def active(self) -> bool:
        """Whether the mutation changed something observable."""
        return bool(self.changed)

    @property
    def killed(self) -> bool:
        """Active, applied, and caught by at least one check."""
        return self.error is None and self.active and bool(self.killed_by)

    @property
    def verdict(self) -> str:
        """``killed``, ``survived`` (inactive or uncaught) or ``error``."""
        if self.error is not None:
            return "error"
        return "killed" if self.killed else "survived"

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "name": self.name,
            "family": self.family,
            "failure_class": self.failure_class,
            "violates": list(self.violates),
            "seams": list(self.seams),
            "verdict": self.verdict,
            "active": self.active,
            "killed_by": list(self.killed_by),
            "changed": list(self.changed),
            "details": self.details,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


@dataclass
class LabReport:
    """The baseline and one row per mutation."""

    checks: tuple[str, ...]
    baseline: dict[str, CheckOutcome] = field(default_factory=dict)
    rows: list[MutationRow] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def baseline_passed(self) -> bool:
        """Every check passes on the unmutated code (else no kill means anything)."""
        return all(o.passed for o in self.baseline.values())

    @property
    def killed(self) -> int:
        """Mutations killed."""
        return sum(1 for row in self.rows if row.killed)

    @property
    def score(self) -> float:
        """Mutation score: killed / total (1.0 when there is nothing to kill)."""
        return self.killed / len(self.rows) if self.rows else 1.0

    @property
    def passed(self) -> bool:
        """The baseline passes and every mutation is killed."""
        return self.baseline_passed and self.killed == len(self.rows)

    def as_json(self) -> dict[str, Any]:
        """JSON-able form."""
        return {
            "passed": self.passed,
            "score": self.score,
            "killed": self.killed,
            "total": len(self.rows),
            "checks": list(self.checks),
            "baseline": {name: o.as_json() for name, o in self.baseline.items()},
            "mutations": [row.as_json() for row in self.rows],
            "seconds": round(self.seconds, 3),
        }


def _evaluate(mutation: Mutation, checks: Sequence[str], baseline: dict[str, CheckOutcome]) -> MutationRow:
    started = time.perf_counter()
    seams = tuple(seam.name for seam in mutation.seams)
    try:
        with mutation.applied() as reach:
            outcomes = run_checks_once(checks)
        if not reach.reached:
            raise SeamGoneError(f"unreached: no seam of {mutation.name!r} was called while the checks ran")
    except (AttributeError, ImportError, SpecroundError) as error:
        return MutationRow(
            mutation.name,
            mutation.family,
            mutation.failure_class,
            mutation.violates,
            seams,
            (),
            (),
            {},
            time.perf_counter() - started,
            error=f"{type(error).__name__}: {error}",
        )
    killed_by = tuple(c for c in checks if not outcomes[c].passed)
    changed = tuple(c for c in checks if outcomes[c].observation != baseline[c].observation)
    return MutationRow(
        name=mutation.name,
        family=mutation.family,
        failure_class=mutation.failure_class,
        violates=mutation.violates,
        seams=seams,
        killed_by=killed_by,
        changed=changed,
        details={c: outcomes[c].detail for c in killed_by},
        seconds=time.perf_counter() - started,
    )


def run_lab(
    mutations: Sequence[Mutation] = MUTATIONS,
    checks: Sequence[str] = CHECKS,
    progress: Progress | None = None,
) -> LabReport:
    """Run the baseline and every mutation through every check (see the module docstring)."""
    tick = progress or (lambda _stage, _done, _total: None)
    started = time.perf_counter()
    report = LabReport(checks=tuple(checks))
    tick("mutation lab", 0, len(mutations) + 1)
    prepare()
    report.baseline = run_checks_once(checks)
    for n, mutation in enumerate(mutations, start=1):
        tick("mutation lab", n, len(mutations) + 1)
        report.rows.append(_evaluate(mutation, checks, report.baseline))
    tick("mutation lab", len(mutations) + 1, len(mutations) + 1)
    report.seconds = time.perf_counter() - started
    return report
