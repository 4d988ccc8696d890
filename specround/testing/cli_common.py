"""What the ``specround conform`` commands share: the default prompt, prompt ids, model loading, output."""

from __future__ import annotations

from typing import Any

import typer

__all__ = ["DEFAULT_PROMPT", "load_model_dir", "model_eos", "parse_prompt_ids", "print_report"]

DEFAULT_PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"
"""The prompt text used when neither ``--prompt`` nor ``--prompt-ids`` is given: its repeats give prompt
lookup something to match."""


def parse_prompt_ids(text: str) -> list[int]:
    """The ids of one ``--prompt-ids`` value (BadParameter when malformed or empty)."""
    try:
        ids = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(
            f"not a comma-separated list of token ids: {text!r}", param_hint="--prompt-ids"
        ) from None
    if not ids:
        raise typer.BadParameter("a prompt needs at least one token id", param_hint="--prompt-ids")
    return ids


def load_model_dir(path: str, gguf: str | None, device: str) -> Any:
    """A causal LM from a local directory (float32, eval mode); ModelLoadError on failure."""
    import torch

    from specround.errors import ModelLoadError

    try:
        from transformers import AutoModelForCausalLM
    except ImportError as exc:  # pragma: no cover - transformers is a dependency of the dev extra
        raise ModelLoadError("the transformers package is not installed") from exc
    from pathlib import Path

    if not Path(path).is_dir():
        raise ModelLoadError(f"cannot load a causal LM from {path!r}: no such directory")
    try:
        kwargs: dict[str, Any] = {"local_files_only": True, "dtype": torch.float32}
        if gguf is not None:
            kwargs["gguf_file"] = gguf
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"cannot load a causal LM from {path!r}: {first}") from exc
    return model.to(device).eval()  # type: ignore[arg-type]


def model_eos(model: Any, given: int | None) -> int | None:
    """``--eos-token-id`` (-1: none) or the model's first EOS token."""
    if given is not None:
        return None if given < 0 else given
    eos = getattr(model.generation_config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        return int(eos[0]) if eos else None
    return int(eos) if eos is not None else None


def print_report(report: Any, as_json: bool, json_out: str | None) -> None:
    """Print the table or the JSON, write the JSON file if asked, exit 1 on a failed check."""
    from pathlib import Path

    from rich.console import Console

    from specround.testing.conform_console import render_report, report_json

    if json_out is not None:
        Path(json_out).write_text(report_json(report) + "\n", encoding="utf-8")
    if as_json:
        typer.echo(report_json(report))
    else:
        console = Console()
        render_report(report, console if console.is_terminal else Console(width=200))
    if not report.passed:
        raise typer.Exit(1)
