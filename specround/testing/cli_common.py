"""What the ``specround conform`` commands share: the default prompt, prompt ids, model loading, output."""

from __future__ import annotations

from typing import Annotated, Any

import typer

__all__ = [
    "ALPHA_OPTION",
    "DEFAULT_PROMPT",
    "EOS_OPTION",
    "HORIZON_OPTION",
    "JSON_OPTION",
    "JSON_OUT_OPTION",
    "MIN_P_OPTION",
    "REPETITION_PENALTY_OPTION",
    "SAMPLES_OPTION",
    "SEED_OPTION",
    "TEMPERATURE_OPTION",
    "TOP_K_OPTION",
    "TOP_P_OPTION",
    "PromptIds",
    "PromptTexts",
    "load_model_dir",
    "model_eos",
    "parse_prompt_ids",
    "print_report",
]

DEFAULT_PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"
"""The prompt text used when neither ``--prompt`` nor ``--prompt-ids`` is given: its repeats give prompt
lookup something to match."""

# Options both ``conform`` commands take, declared once (Typer reads each as a parameter's default).
TEMPERATURE_OPTION: Any = typer.Option(1.0, help="Sampling temperature (> 0).")
TOP_K_OPTION: Any = typer.Option(None, "--top-k", help="Top-k (off when not given).")
TOP_P_OPTION: Any = typer.Option(None, "--top-p", help="Top-p (off when not given).")
MIN_P_OPTION: Any = typer.Option(None, "--min-p", help="Min-p (off when not given).")
REPETITION_PENALTY_OPTION: Any = typer.Option(None, "--repetition-penalty", help="Repetition penalty.")
EOS_OPTION: Any = typer.Option(
    None, "--eos-token-id", help="End-of-sequence token (default: the model's; -1: none)."
)
SAMPLES_OPTION: Any = typer.Option(1000, "--samples", min=1, help="Samples N per prompt and setting.")
HORIZON_OPTION: Any = typer.Option(2, "--horizon", min=1, help="Generated tokens H read per sample.")
ALPHA_OPTION: Any = typer.Option(0.01, "--alpha", help="Level of the law test.")
SEED_OPTION: Any = typer.Option(0, "--seed", help="Seed of the first sample (sample i uses seed + i).")
JSON_OPTION: Any = typer.Option(False, "--json", help="Print the report as JSON.")
JSON_OUT_OPTION: Any = typer.Option(
    None, "--json-out", help="Also write the report as JSON to this file (the table is still printed)."
)
PromptTexts = Annotated[
    list[str] | None, typer.Option("--prompt", help="A prompt text (needs a tokenizer); repeatable.")
]
"""``--prompt`` (repeatable)."""
PromptIds = Annotated[
    list[str] | None, typer.Option("--prompt-ids", help="A prompt as comma-separated ids; repeatable.")
]
"""``--prompt-ids`` (repeatable)."""


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
