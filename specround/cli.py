"""The ``specround`` command line: a typer app that wires the packages together.

Each command parses and validates its options, calls into the library, and renders the result with rich
(or prints JSON with ``--json``). Exit status 0 means every check the command ran passed.
"""

from __future__ import annotations

import typer

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
        status = upgrade_database(url, revision)
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
    as_json: bool = typer.Option(True, "--json", help="Print JSON (the only output format)."),
) -> None:
    """Time the exact sampler against the minimum it must read and a full pass, in one run."""
    from specround.bench.sampler import run_sampler_bench

    del as_json
    try:
        sizes = [int(part) for part in batch_sizes.split(",") if part.strip()]
    except ValueError as exc:
        raise typer.BadParameter(
            f"not a list of integers: {batch_sizes!r}", param_hint="--batch-sizes"
        ) from exc
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter("batch sizes must be >= 1", param_hint="--batch-sizes")
    report = run_sampler_bench(
        sizes, draft_len=draft_len, vocab=vocab, repeats=repeats, warmup=warmup, seed=seed, threads=threads
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

    from specround.adapters.llama.bench import run_model_bench

    if threads is not None:
        torch.set_num_threads(threads)
    typer.echo(run_model_bench(repeats=repeats, warmup=warmup, cold=cold).model_dump_json(indent=2))


@bench_app.command("controller")
def bench_controller(
    postgres_url: str | None = typer.Option(
        None,
        "--postgres-url",
        envvar="SPECROUND_BENCH_POSTGRES_URL",
        help="Also time PostgreSQL (in a scratch schema, dropped afterwards).",
    ),
    batch_sizes: str = typer.Option("1,64", help="Comma-separated batch sizes B."),
    rounds: int = typer.Option(128, min=1, help="Request-rounds per case and repetition."),
    repeats: int = typer.Option(5, min=1, help="Timed repetitions per case (the median is reported)."),
    warmup: int = typer.Option(1, min=0, help="Untimed repetitions before timing."),
    draft_len: int = typer.Option(4, min=1, help="Draft length K."),
    vocab: int = typer.Option(64, min=2, help="Vocabulary size V."),
    seed: int = typer.Option(0, help="Seed of the synthetic rows."),
    threads: int = typer.Option(1, min=0, help="torch threads (0 keeps torch's default)."),
) -> None:
    """Time the round controller + durable publish per request-round on each log backend, and replay."""
    from specround.bench.controller import run_controller_bench

    try:
        sizes = [int(part) for part in batch_sizes.split(",") if part.strip()]
    except ValueError as exc:
        raise typer.BadParameter(
            f"not a list of integers: {batch_sizes!r}", param_hint="--batch-sizes"
        ) from exc
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
    mutations: bool = typer.Option(True, "--mutations/--no-mutations", help="Run the mutation smoke tests."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Exact enumeration oracle, mutation smoke tests, seeded Monte Carlo and the speedup ledger."""
    import json

    from rich.console import Console

    from specround.model_check.render import progress_bar, render_report
    from specround.model_check.report import CheckOptions, run_checks

    options = CheckOptions(
        random_fixtures=random_fixtures,
        fixture_seed=seed,
        mc_samples=mc_samples,
        mc_random_fixtures=mc_random_fixtures,
        mc_seed=mc_seed,
        mutations=mutations,
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


def main() -> None:
    """Console-script entry point."""
    app()
