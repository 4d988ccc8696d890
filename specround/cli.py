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


def main() -> None:
    """Console-script entry point."""
    app()
