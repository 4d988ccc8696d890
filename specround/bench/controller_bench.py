"""``specround bench controller``: what the round controller and a durable publish cost per request-round.

Each case drives B requests through one step per iteration -- by default
:meth:`~specround.statemachine.controller.RoundController.step_batch` on the engine's batch tensors (``api``
``"batch"``), or the per-request :meth:`~specround.statemachine.controller.RoundController.step` with one
:class:`~specround.statemachine.rounds.RoundInput` per request (``"rounds"``): bind the round to its
coordinate, lifecycle, one batched exact decision, staging and validation, one group-committed publish --
with synthetic rows: K drafts over a small vocabulary, seeded softmax rows, drafts sampled from q, no model.
Backends: the in-memory log (the controller alone), SQLite in a temporary file and, when a URL is given,
PostgreSQL (in a temporary schema dropped afterwards). Cases are timed interleaved, repetition by
repetition after warm-up repetitions, and summarised by medians:

``us_per_round``
    Wall time per request-round of the whole step (for ``"rounds"``, the caller's coordinate digests too).
``cpu_us_per_round``
    The same in process CPU time (less sensitive to other load on the machine; misses I/O waits).
``publish_us_per_round`` (also ``durable_us_per_round``)
    Wall time inside :meth:`~specround.statemachine.ports.EventLog.publish` (canonical bytes, hash chain,
    the fenced transaction): the durable write; ``controller_us_per_round`` is the rest.
``critical_us_per_round``
    What the engine waits for before its next forward can start. For a synchronous step (``"batch"``,
    ``"rounds"``: its tokens and K/V instruction come back once the group commit is durable) this is the
    whole step. For ``"pipelined"`` (:meth:`~specround.statemachine.controller.RoundController.submit_batch`)
    it is the time inside ``submit_batch`` plus any wait for the previous step's durable outcome, with a
    simulated forward of ``forward_ms`` (a sleep, which releases the GIL as a torch forward does) between
    steps for the writer thread to hide behind; the durable write is the writer's time in ``publish``.
    Every API sleeps the same simulated forward between its steps, outside the clock: a step that starts
    after an idle forward finds colder caches than one run back to back, and the comparison must not
    depend on that.

Device: with ``device="cuda"`` the pool of synthetic rows lives on the accelerator, so each step reads the
engine's batch tensors where a GPU engine keeps them (the gathers before the clock run there too) and its
decision, tokens and K/V instruction come back to the host inside the timed step, as an engine's would.

Garbage collection: Python's periodic full collections scan every object of the process (here about
200k, almost all from importing torch, SQLAlchemy and pydantic), and the rounds' allocations decide how often
they run; young collections traverse each step's own short-lived objects. With ``freeze_gc`` (the default)
the bench sets the collector up once the cases are open as ``specround generate`` does once its model is
loaded (:func:`~specround.serving.collector.serving_collector`: the start-up heap frozen, young collections
spaced out); the report says which way it ran (``gc_frozen``). Each case reports the collector's pauses
while it ran (``gc_us_per_round``, ``gc_longest_ms``), either way.

Replay is measured on each SQL log the cases wrote: ``stream_events_per_s`` iterates
:meth:`~specround.statemachine.ports.EventLog.events` only; ``replay_events_per_s`` rebuilds every request
with :func:`~specround.statemachine.replay.replay_log` (hash links recomputed from the canonical payloads);
``audit_events_per_s`` runs :func:`~specround.audit.audit_log` (chains, replay, every decision re-derived).
``bytes_per_round`` is the log's size on disk (the SQLite file after a WAL checkpoint; PostgreSQL's
tables with their indexes) over the rounds it holds. Each SQL case writes a log of its own (a SQLite file,
a PostgreSQL scratch schema). The logs replayed are the largest B's (many short requests: each request's
opening event weighs on the size) and B = 1's (one long request, the shape of a ``generate`` log).
``round_bytes_per_round`` and ``request_bytes_per_request`` split that size into what each round and each
request add (SQLite's ``dbstat`` table, PostgreSQL's relation sizes), so
that the size of a log of longer or shorter requests follows: about ``round + request / rounds per
request`` bytes per round.

``format_floor`` is what the log's format alone asks of every durable write, whatever the backend: each
round's five events serialised to canonical JSON and the five links of the request's hash chain over them
(``specs/events.md``), timed over the memory log's last step at the largest B (:class:`FormatFloor`). A
durable write per request-round cannot cost less than this in this process; the rest of ``durable`` is the
backend's (encoding, planning, SQL).
"""

from __future__ import annotations

import gc
import os
import platform
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict

from specround.bench.devices import bench_device, device_name
from specround.canonical import GENESIS_HASH, chain_hash, dumps_trusted
from specround.serving.collector import CollectorClock, serving_collector
from specround.statemachine.controller import PendingStep, RoundController
from specround.statemachine.forwarding_log import ForwardingLog
from specround.statemachine.ports import EventLog, PublishOutcome, RoundPublication
from specround.statemachine.replay import replay_log
from specround.statemachine.rounds import RoundInput, RoundResult

__all__ = [
    "API_NAMES",
    "CONTROLLER_TARGET_US",
    "CRITICAL_TARGET_US",
    "DURABLE_TARGET_US",
    "LOG_BYTES_TARGET",
    "POSTGRES_REPLAY_TARGET_EVENTS_PER_S",
    "REPLAY_TARGET_EVENTS_PER_S",
    "SINGLE_STEP_TARGET_US",
    "ControllerBenchCase",
    "ControllerBenchReport",
    "FormatFloor",
    "ReplayBenchCase",
    "TargetVerdict",
    "run_controller_bench",
]

CONTROLLER_TARGET_US = 50.0
"""Target: at most this many microseconds per request-round at B = 64 on SQLite (controller + publish)."""
REPLAY_TARGET_EVENTS_PER_S = 300_000.0
"""Target: replay and audit at least this many events per second on SQLite."""
POSTGRES_REPLAY_TARGET_EVENTS_PER_S = 150_000.0
"""Target: replay and audit at least this many events per second on PostgreSQL."""
CRITICAL_TARGET_US = 5.0
"""Target: critical-path microseconds per request-round at B = 256 (V = 64)."""
SINGLE_STEP_TARGET_US = 300.0
"""Target: microseconds per step at B = 1, sampler included (critical path)."""
LOG_BYTES_TARGET = 400.0
"""Target: bytes on disk per request-round."""
DURABLE_TARGET_US: dict[str, float] = {"sqlite": 10.0, "postgresql": 25.0}
"""Targets: durable-write microseconds per request-round at B = 256, per SQL backend."""
API_NAMES = ("batch", "pipelined", "rounds")
"""The step APIs a case can drive: ``step_batch`` on batch tensors, ``submit_batch`` (the durable write
pipelined behind a simulated forward), or ``step`` on per-request inputs."""

_FROZEN = ConfigDict(frozen=True, extra="forbid")
_POOL = 256
"""Distinct synthetic row sets, reused cyclically."""


class ControllerBenchCase(BaseModel):
    """Medians per request-round for one backend and batch size."""

    model_config = _FROZEN

    backend: str
    batch_size: int
    api: str = "batch"
    """``"batch"`` (``step_batch``) or ``"rounds"`` (``step`` on per-request inputs)."""
    rounds_per_repetition: int
    us_per_round: float
    cpu_us_per_round: float
    publish_us_per_round: float
    controller_us_per_round: float
    critical_us_per_round: float = 0.0
    """What the engine waits for before its next forward (the whole synchronous step)."""
    durable_us_per_round: float = 0.0
    """The durable write (the group commit) per request-round."""
    over_memory: float
    """``us_per_round`` over the memory log's at the same batch size (the price of durability)."""
    mean_emitted: float
    """Mean tokens emitted per round (how realistic the synthetic acceptance is)."""
    forward_ms: float = 0.0
    """The simulated forward between steps (pipelined cases only)."""
    gc_us_per_round: float = 0.0
    """The garbage collector's pauses per request-round while the case ran (median of the repetitions; part
    of ``us_per_round`` where they fell inside a step)."""
    gc_longest_ms: float = 0.0
    """The longest collector pause of the case's timed repetitions."""


class ReplayBenchCase(BaseModel):
    """Read and replay speed of one SQL log written by the cases."""

    model_config = _FROZEN

    backend: str
    requests: int
    events: int
    batch_size: int = 0
    """B of the case that wrote the log: the largest B holds many short requests, B = 1 one long one."""
    stream_events_per_s: float
    replay_events_per_s: float
    audit_events_per_s: float = 0.0
    rounds: int = 0
    """Published rounds in the log."""
    bytes_per_round: float = 0.0
    """Size of the log on disk over its rounds (see the module docstring)."""
    round_bytes_per_round: float | None = None
    """The part of that size that grows with rounds: the ``rounds`` table and its indexes, over the rounds
    (None where the database cannot tell a table's pages apart)."""
    request_bytes_per_request: float | None = None
    """The part that grows with requests: the ``requests`` and ``events`` tables and their indexes, over
    the requests (the rest of the size is the empty schema's pages)."""


class FormatFloor(BaseModel):
    """What the event log's format alone costs per round, under every backend's durable write.

    Timed over the publications of the memory log's last step at the largest B: each round's five events
    serialised to their canonical bytes (:func:`~specround.canonical.dumps_trusted` of the record, the float
    checks left out) and the five links of the request's hash chain over those bytes
    (:func:`~specround.canonical.chain_hash`). The specification asks every durable write for both
    (``specs/events.md``), whatever the backend stores; medians of ``max(3, repeats)`` timings of the run.
    """

    model_config = _FROZEN

    rounds: int
    """Rounds the floor was timed over."""
    canonical_us_per_round: float
    """Serialising the five events to canonical JSON."""
    chain_us_per_round: float
    """The five SHA-256 links over those bytes."""
    us_per_round: float
    """Both together."""
    canonical_bytes_per_round: float
    """Canonical JSON bytes of the five events (what the chain hashes, before any compact encoding)."""


class ControllerBenchReport(BaseModel):
    """The JSON printed by ``specround bench controller``."""

    model_config = _FROZEN

    benchmark: str = "controller"
    vocab: int
    draft_len: int
    repeats: int
    warmup: int
    seed: int
    torch_threads: int
    gc_frozen: bool = False
    """Whether the start-up heap was frozen out of the collector's way while the cases ran (module doc)."""
    device: str = "cpu"
    """Where the batch tensors lived: ``cpu``, or the accelerator's index and name (see the module doc)."""
    machine: str
    load_average: tuple[float, float, float]
    """The machine's 1/5/15-minute load when the run ended (other processes inflate wall times)."""
    target_us_per_round: float
    meets_target: bool
    """``us_per_round`` of SQLite at the largest batch size is within ``target_us_per_round``."""
    replay_target_events_per_s: float
    meets_replay_target: bool
    """Every SQL backend replays and audits at least its target (``replay_target_events_per_s`` on SQLite,
    :data:`POSTGRES_REPLAY_TARGET_EVENTS_PER_S` on PostgreSQL)."""
    cases: list[ControllerBenchCase]
    replay: list[ReplayBenchCase]
    format_floor: FormatFloor | None = None
    """The log format's own cost per round (None when the memory log published nothing at the largest B)."""
    verdicts: list[TargetVerdict] = []
    """The serving-speed targets this run can judge (batch API), each with its measured value."""


class TargetVerdict(BaseModel):
    """One serving-speed target, what this run measured for it, and whether it holds."""

    model_config = _FROZEN

    target: str
    measured: float
    limit: float
    met: bool


class _TimedLog(ForwardingLog):
    """An EventLog that forwards every call, timing ``publish`` and keeping its last call's publications."""

    def __init__(self, inner: EventLog) -> None:
        super().__init__(inner)
        self.publish_s = 0.0
        self.last: Sequence[RoundPublication] = ()

    def publish(self, publications: Sequence[RoundPublication]) -> list[PublishOutcome]:
        start = time.perf_counter()
        try:
            return self.inner.publish(publications)
        finally:
            self.publish_s += time.perf_counter() - start
            self.last = publications


def _format_floor(publications: Sequence[RoundPublication], repeats: int) -> FormatFloor:
    """Time the canonical bytes and the hash links of ``publications``' events (see :class:`FormatFloor`)."""
    records = [[event.__dict__ for event in pub.events()] for pub in publications]
    canonical: list[float] = []
    chain: list[float] = []
    payloads: list[list[bytes]] = []
    for _ in range(max(3, repeats)):
        start = time.perf_counter()
        payloads = [[dumps_trusted(record) for record in five] for five in records]
        middle = time.perf_counter()
        for five in payloads:
            link = GENESIS_HASH
            for payload in five:
                link = chain_hash(link, payload)
        end = time.perf_counter()
        canonical.append((middle - start) / len(records) * 1e6)
        chain.append((end - middle) / len(records) * 1e6)
    canonical_us, chain_us = statistics.median(canonical), statistics.median(chain)
    return FormatFloor(
        rounds=len(records),
        canonical_us_per_round=canonical_us,
        chain_us_per_round=chain_us,
        us_per_round=canonical_us + chain_us,
        canonical_bytes_per_round=sum(map(len, (b for five in payloads for b in five))) / len(records),
    )


@dataclass
class _Rows:
    """A pool of seeded synthetic rounds: p [N, K+1, V], q [N, K, V], drafts [N, K]."""

    p: torch.Tensor
    q: torch.Tensor
    drafts: torch.Tensor

    @classmethod
    def make(cls, draft_len: int, vocab: int, seed: int, device: torch.device) -> _Rows:
        gen = torch.Generator().manual_seed(seed)
        logits = 2.0 * torch.randn(_POOL, draft_len + 1, vocab, generator=gen, dtype=torch.float64)
        noise = 0.7 * torch.randn(_POOL, draft_len, vocab, generator=gen, dtype=torch.float64)
        p = torch.softmax(logits, dim=-1)  # [N, K+1, V]
        q = torch.softmax(logits[:, :draft_len] + noise, dim=-1)  # [N, K, V]
        flat = q.reshape(_POOL * draft_len, vocab)
        drafts = torch.multinomial(flat, 1, generator=gen).reshape(_POOL, draft_len)  # [N, K]
        return cls(p=p.to(device), q=q.to(device), drafts=drafts.to(device))


@dataclass
class _Case:
    backend: str
    batch_size: int
    api: str
    log: _TimedLog
    controller: RoundController
    request_ids: list[str]
    rows: _Rows
    forward_s: float = 0.0
    """Simulated forward between pipelined steps (the time a durable write can hide behind)."""
    previous: PendingStep | None = None
    cursor: int = 0
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    publish: list[float] = field(default_factory=list)
    collector: list[float] = field(default_factory=list)
    collector_longest_s: float = 0.0
    emitted: int = 0
    rounds: int = 0

    def run(self, steps: int, record: bool) -> None:
        """Run ``steps`` steps; record per-round wall, CPU, publish and collector times when ``record``."""
        with CollectorClock() as clock:
            self._run(steps, record)
        if record:
            self.collector.append(clock.seconds / (steps * self.batch_size) * 1e6)
            self.collector_longest_s = max(self.collector_longest_s, clock.longest_s)

    def _run(self, steps: int, record: bool) -> None:
        publish_before = self.log.publish_s
        wall = cpu = 0.0
        ctl = self.controller
        device = self.rows.p.device
        lens = torch.full((self.batch_size,), self.rows.drafts.shape[1], dtype=torch.int64, device=device)
        for _ in range(steps):
            picks = [(self.cursor + b) % _POOL for b in range(self.batch_size)]
            self.cursor = (self.cursor + self.batch_size) % _POOL
            results: Sequence[RoundResult]
            if self.api != "pipelined" and self.forward_s:
                time.sleep(self.forward_s)  # the same simulated forward, outside the clock, for every API
            if self.api == "pipelined":
                at = torch.tensor(picks, device=device)
                drafts_t, q_t, p_t = self.rows.drafts[at], self.rows.q[at], self.rows.p[at]
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                pending = ctl.submit_batch(self.request_ids, drafts_t, lens, q_t, p_t)
                wall += time.perf_counter() - start_wall
                cpu += time.process_time() - start_cpu
                time.sleep(self.forward_s)  # the engine's next forward (releases the GIL, as torch does)
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                results = self.previous.wait().results() if self.previous is not None else []
                self.previous = pending
            elif self.api == "batch":  # the engine's batch tensors, gathered before the clock starts
                at = torch.tensor(picks, device=device)
                drafts_t, q_t, p_t = self.rows.drafts[at], self.rows.q[at], self.rows.p[at]
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                results = ctl.step_batch(self.request_ids, drafts_t, lens, q_t, p_t).results()
            else:
                rows = [(self.rows.drafts[i], self.rows.q[i], self.rows.p[i]) for i in picks]
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                inputs = [
                    RoundInput(rid, ctl.coordinate_digest(rid), drafts, q, p)
                    for rid, (drafts, q, p) in zip(self.request_ids, rows, strict=True)
                ]
                results = ctl.step(inputs)
            wall += time.perf_counter() - start_wall
            cpu += time.process_time() - start_cpu
            for result in results:
                result.raise_for_error()
                self.emitted += len(result.emitted_ids)
                self.rounds += 1
        if self.previous is not None:  # the last step's tokens (outside the clock: not a forward's wait)
            for result in self.previous.wait():
                result.raise_for_error()
            self.previous = None
        if record:
            rounds = steps * self.batch_size
            self.wall.append(wall / rounds * 1e6)
            self.cpu.append(cpu / rounds * 1e6)
            self.publish.append((self.log.publish_s - publish_before) / rounds * 1e6)


def _open_case(
    backend: str, location: str | None, batch_size: int, api: str, rows: _Rows, run_id: str, forward_s: float
) -> _Case:
    inner: EventLog
    if location is None:
        from specround.adapters.memory_log import MemoryEventLog

        inner = MemoryEventLog()
    else:
        from specround.adapters.sql import SqlEventLog

        inner = SqlEventLog.open(location)
    log = _TimedLog(inner)
    controller = RoundController(log)
    vocab = rows.p.shape[-1]
    request_ids = [f"bench-{run_id}-{backend}-{api}-b{batch_size}-{i:04d}" for i in range(batch_size)]
    for index, request_id in enumerate(request_ids):
        controller.open_request(
            [1, 2, 3], seed=index, max_new_tokens=1 << 30, vocab_size=vocab, request_id=request_id
        )
    return _Case(backend, batch_size, api, log, controller, request_ids, rows, forward_s)


def _replay(backend: str, batch_size: int, log: EventLog, repeats: int) -> ReplayBenchCase:
    from specround.audit import audit_log

    stream_rates, replay_rates, audit_rates = [], [], []
    events = requests = 0
    for _ in range(repeats):
        start = time.perf_counter()
        events = sum(1 for _ in log.events())
        stream_rates.append(events / (time.perf_counter() - start))
        start = time.perf_counter()
        replayed = list(replay_log(log))
        replay_rates.append(sum(r.events for r in replayed) / (time.perf_counter() - start))
        requests = len(replayed)
        start = time.perf_counter()
        audited = audit_log(log)
        audit_rates.append(sum(r.events for r in audited.requests) / (time.perf_counter() - start))
    rounds, size, by_table = _log_size(log)
    round_part = by_table.get("rounds")
    request_part = by_table.get("requests")
    return ReplayBenchCase(
        backend=backend,
        requests=requests,
        events=events,
        batch_size=batch_size,
        stream_events_per_s=statistics.median(stream_rates),
        replay_events_per_s=statistics.median(replay_rates),
        audit_events_per_s=statistics.median(audit_rates),
        rounds=rounds,
        bytes_per_round=size / max(1, rounds),
        round_bytes_per_round=None if round_part is None else round_part / max(1, rounds),
        request_bytes_per_request=None if request_part is None else request_part / max(1, requests),
    )


def _replayed(cases: Sequence[_Case], api: str) -> list[_Case]:
    """The cases whose logs are replayed: the largest B and B = 1 on each SQL backend.

    Each SQL case writes a log of its own (a SQLite file, a PostgreSQL schema), so B = 1's holds one long
    request (the shape of a ``generate`` log) and the largest B's many short ones.
    """
    largest = max(c.batch_size for c in cases)
    return [c for c in cases if c.api == api and c.backend != "memory" and c.batch_size in (1, largest)]


def _replay_target(backend: str) -> float:
    """The replay and audit target (events per second) of a SQL backend."""
    return REPLAY_TARGET_EVENTS_PER_S if backend == "sqlite" else POSTGRES_REPLAY_TARGET_EVENTS_PER_S


_GROWS_WITH = {"rounds": "rounds", "requests": "requests", "events": "requests"}
"""The tables whose pages grow with rounds or with requests (their indexes count with them)."""


def _log_size(log: EventLog) -> tuple[int, int, dict[str, int]]:
    """(published rounds, bytes on disk, bytes growing with ``rounds`` / ``requests``) of a SQL log.

    The split is empty where the database cannot tell a table's pages apart (a SQLite without ``dbstat``).
    """
    from specround.adapters.sql import SqlEventLog

    assert isinstance(log, SqlEventLog)
    by_table: dict[str, int] = {}
    with log.engine.connect() as connection:
        rounds = int(connection.exec_driver_sql("SELECT count(*) FROM rounds").scalar_one())
        connection.rollback()
        if log.location.sqlite_path is not None:
            raw = connection.connection.dbapi_connection
            assert raw is not None
            raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # outside a transaction (autocommit)
            try:
                pages = raw.execute(
                    "SELECT s.tbl_name, sum(d.pgsize) FROM dbstat d JOIN sqlite_schema s ON s.name = d.name "
                    "GROUP BY s.tbl_name"
                ).fetchall()
            except sqlite3.OperationalError:  # built without the dbstat table
                pages = []
            for table, size in pages:
                if table in _GROWS_WITH:
                    part = _GROWS_WITH[table]
                    by_table[part] = by_table.get(part, 0) + int(size)
            return rounds, log.location.sqlite_path.stat().st_size, by_table
        for table, part in _GROWS_WITH.items():
            size = connection.exec_driver_sql(f"SELECT pg_total_relation_size('{table}')").scalar_one()
            by_table[part] = by_table.get(part, 0) + int(size)
    return rounds, sum(by_table.values()), by_table


def _postgres_schema(base_url: str) -> tuple[str, str]:
    """Create a scratch schema; return (schema, URL selecting it)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from specround.adapters.sql import parse_location

    location = parse_location(base_url)
    schema = f"specround_bench_{uuid.uuid4().hex[:12]}"
    engine = create_engine(location.url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    finally:
        engine.dispose()
    url = make_url(location.url).update_query_dict({"options": f"-csearch_path={schema}"})
    return schema, url.render_as_string(hide_password=False)


def _drop_postgres_schema(base_url: str, schema: str) -> None:
    from sqlalchemy import create_engine, text

    from specround.adapters.sql import parse_location

    engine = create_engine(parse_location(base_url).url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        engine.dispose()


def run_controller_bench(
    batch_sizes: Sequence[int] = (1, 64),
    *,
    postgres_url: str | None = None,
    draft_len: int = 4,
    vocab: int = 64,
    rounds_per_repetition: int = 128,
    repeats: int = 5,
    warmup: int = 1,
    seed: int = 0,
    threads: int | None = 1,
    freeze_gc: bool = True,
    apis: Sequence[str] = ("batch",),
    progress: Callable[[str], None] | None = None,
    forward_ms: float = 5.0,
    device: str = "cpu",
) -> ControllerBenchReport:
    """Time the controller on every backend and batch size, interleaved, in this process.

    ``threads`` sets torch's intra-op threads for the run (tiny rows: one thread avoids contention);
    None leaves torch's setting alone. ``freeze_gc`` sets up the collector as a serving run does once the
    cases are open, and restores it at the end (a heap the caller froze already is left as it is). ``apis``
    picks the step APIs (:data:`API_NAMES`); ``progress`` receives a line per finished repetition;
    ``forward_ms`` is the simulated forward between pipelined steps. ``device`` is where the engine's
    batch tensors live (``cpu`` or ``cuda[:N]``, refused with :class:`ValueError` when torch cannot use
    it): every step reads its rows from there, and its tokens come back to the host as an engine's would.
    """
    if not batch_sizes or min(batch_sizes) < 1 or repeats < 1 or warmup < 0 or draft_len < 1 or vocab < 2:
        raise ValueError("need batch sizes >= 1, repeats >= 1, warmup >= 0, draft_len >= 1, vocab >= 2")
    if not apis or any(api not in API_NAMES for api in apis):
        raise ValueError(f"apis must be taken from {API_NAMES}, got {tuple(apis)}")
    if rounds_per_repetition < max(batch_sizes):
        raise ValueError("rounds_per_repetition must be at least the largest batch size")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    on_device = bench_device(device)
    rows = _Rows.make(draft_len, vocab, seed, on_device)
    run_id = uuid.uuid4().hex[:8]
    scratch = tempfile.TemporaryDirectory(prefix="specround-bench-")
    stack = ExitStack()
    schemas: list[str] = []
    cases: list[_Case] = []
    try:
        backends = ["memory", "sqlite"] + ([] if postgres_url is None else ["postgresql"])
        for backend in backends:
            for api in apis:
                for size in batch_sizes:
                    where = None
                    if backend == "sqlite":
                        where = str(Path(scratch.name) / f"{api}-b{size}.sqlite")
                    elif postgres_url is not None and backend == "postgresql":
                        schema, where = _postgres_schema(postgres_url)
                        schemas.append(schema)
                    cases.append(_open_case(backend, where, size, api, rows, run_id, forward_ms / 1e3))
        stack.enter_context(serving_collector(freeze_gc))  # a heap the caller froze stays as it is
        heap_frozen = gc.get_freeze_count() > 0
        for repetition in range(warmup + repeats):
            for case in cases:
                case.run(max(1, rounds_per_repetition // case.batch_size), record=repetition >= warmup)
            if progress is not None:
                kind = "warm-up" if repetition < warmup else "timed"
                progress(f"repetition {repetition + 1}/{warmup + repeats} ({kind}) done")
        memory = {(c.api, c.batch_size): statistics.median(c.wall) for c in cases if c.backend == "memory"}
        results = []
        for case in cases:
            wall = statistics.median(case.wall)
            publish = statistics.median(case.publish)
            results.append(
                ControllerBenchCase(
                    backend=case.backend,
                    batch_size=case.batch_size,
                    api=case.api,
                    rounds_per_repetition=max(1, rounds_per_repetition // case.batch_size) * case.batch_size,
                    us_per_round=wall,
                    cpu_us_per_round=statistics.median(case.cpu),
                    publish_us_per_round=publish,
                    controller_us_per_round=wall - publish,
                    critical_us_per_round=wall,
                    durable_us_per_round=publish,
                    over_memory=wall / memory[(case.api, case.batch_size)],
                    mean_emitted=case.emitted / max(1, case.rounds),
                    forward_ms=case.forward_s * 1e3,
                    gc_us_per_round=statistics.median(case.collector),
                    gc_longest_ms=case.collector_longest_s * 1e3,
                )
            )
        largest = max(batch_sizes)
        replays = [_replay(c.backend, c.batch_size, c.log.inner, repeats) for c in _replayed(cases, apis[0])]
        floor_case = next(
            (c for c in cases if c.backend == "memory" and c.batch_size == largest and c.log.last), None
        )
        floor = None if floor_case is None else _format_floor(floor_case.log.last, repeats)
        sqlite_largest = next(
            r for r in results if r.backend == "sqlite" and r.batch_size == largest and r.api == apis[0]
        )
        return ControllerBenchReport(
            vocab=vocab,
            draft_len=draft_len,
            repeats=repeats,
            warmup=warmup,
            seed=seed,
            torch_threads=torch.get_num_threads(),
            gc_frozen=heap_frozen,
            device=device_name(on_device),
            machine=platform.machine() or "unknown",
            load_average=os.getloadavg(),
            target_us_per_round=CONTROLLER_TARGET_US,
            meets_target=sqlite_largest.us_per_round <= CONTROLLER_TARGET_US,
            replay_target_events_per_s=REPLAY_TARGET_EVENTS_PER_S,
            meets_replay_target=all(
                min(r.replay_events_per_s, r.audit_events_per_s) >= _replay_target(r.backend) for r in replays
            ),
            cases=results,
            replay=replays,
            format_floor=floor,
            verdicts=_verdicts(results, replays),
        )
    finally:
        for case in cases:
            case.log.close()
        if postgres_url is not None:
            for schema in schemas:
                _drop_postgres_schema(postgres_url, schema)
        scratch.cleanup()
        torch.set_num_threads(previous_threads)
        stack.close()


def _verdicts(
    cases: Sequence[ControllerBenchCase], replays: Sequence[ReplayBenchCase]
) -> list[TargetVerdict]:
    """Judge the serving-speed targets that the batch API's cases of this run measured."""
    by = {(c.backend, c.batch_size): c for c in cases if c.api == "batch"}
    piped = {(c.backend, c.batch_size): c for c in cases if c.api == "pipelined"}
    out: list[TargetVerdict] = []

    def judge(target: str, measured: float, limit: float, at_most: bool = True) -> None:
        met = measured <= limit if at_most else measured >= limit
        out.append(TargetVerdict(target=target, measured=measured, limit=limit, met=met))

    for backend in ("memory", "sqlite", "postgresql"):
        if (case := piped.get((backend, 256))) is not None:
            judge(
                f"{backend} B=256 pipelined critical us/round", case.critical_us_per_round, CRITICAL_TARGET_US
            )
        if (case := by.get((backend, 256))) is not None:
            judge(f"{backend} B=256 critical us/round", case.critical_us_per_round, CRITICAL_TARGET_US)
            if backend in DURABLE_TARGET_US:
                judge(
                    f"{backend} B=256 durable us/round", case.durable_us_per_round, DURABLE_TARGET_US[backend]
                )
            if (large := by.get((backend, 1024))) is not None:
                judge(
                    f"{backend} B=1024 us/round no higher than B=256",
                    large.us_per_round,
                    case.us_per_round,
                )
        if (single := by.get((backend, 1))) is not None and backend == "memory":
            judge(
                "memory B=1 us/step (sampler included)", single.critical_us_per_round, SINGLE_STEP_TARGET_US
            )
    for replay in replays:
        limit = _replay_target(replay.backend)
        log = f"{replay.backend} B={replay.batch_size} log"
        judge(f"{log}: replay events/s", replay.replay_events_per_s, limit, at_most=False)
        judge(f"{log}: audit events/s", replay.audit_events_per_s, limit, at_most=False)
        judge(f"{log}: bytes per round on disk", replay.bytes_per_round, LOG_BYTES_TARGET)
    return out
