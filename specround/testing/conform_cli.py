"""``specround conform ...``: run the conformance kit from the command line.

``specround conform transformers --model PATH (--assistant PATH | --prompt-lookup N) [sampling options]
--samples N [--json]`` loads a local transformers causal LM (offline: ``local_files_only``; a directory
saved with ``save_pretrained``, or a GGUF file inside it with ``--gguf``), runs its assisted generation
under the kit, and prints the verdict table (check, statistic, p-value, TV with CI, verdict). Exit status:
0 when every check passed, 1 when one failed, 2 on bad input (one line on stderr). Progress goes to
stderr; ``--json-out FILE`` also writes the JSON report next to the printed table. Without ``--prompt`` or
``--prompt-ids`` the prompt is :data:`~specround.testing.cli_common.DEFAULT_PROMPT`.

``specround conform specround ...`` runs the same checks on specround's own engines
(:mod:`specround.testing.cli_specround`).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from specround.testing.cli_common import (
    DEFAULT_PROMPT,
    load_model_dir,
    model_eos,
    parse_prompt_ids,
    print_report,
)
from specround.testing.cli_specround import conform_specround

__all__ = ["conform_app"]

conform_app = typer.Typer(
    help="Conformance kit: is an engine's speculative decoding exact? One named check per contract.",
    no_args_is_help=True,
)


@conform_app.command("transformers")
def conform_transformers(
    model: str = typer.Option(..., "--model", help="Target: a local transformers model directory."),
    assistant: str | None = typer.Option(None, "--assistant", help="Assistant (draft) model directory."),
    prompt_lookup: int | None = typer.Option(
        None, "--prompt-lookup", help="Prompt lookup with this many candidate tokens (no assistant)."
    ),
    gguf: str | None = typer.Option(None, "--gguf", help="A GGUF file name inside the model directories."),
    temperature: float = typer.Option(1.0, help="Sampling temperature (> 0)."),
    top_k: int | None = typer.Option(None, "--top-k", help="Top-k (off when not given)."),
    top_p: float | None = typer.Option(None, "--top-p", help="Top-p (off when not given)."),
    min_p: float | None = typer.Option(None, "--min-p", help="Min-p (off when not given)."),
    repetition_penalty: float | None = typer.Option(None, "--repetition-penalty", help="Repetition penalty."),
    eos_token_id: int | None = typer.Option(
        None, "--eos-token-id", help="End-of-sequence token (default: the model's; -1: none)."
    ),
    samples: int = typer.Option(1000, "--samples", min=1, help="Samples N per prompt and setting."),
    horizon: int = typer.Option(2, "--horizon", min=1, help="Generated tokens H read per sample."),
    alpha: float = typer.Option(0.01, "--alpha", help="Level of the law test."),
    prompt: Annotated[
        list[str] | None, typer.Option("--prompt", help="A prompt text (needs a tokenizer); repeatable.")
    ] = None,
    prompt_ids: Annotated[
        list[str] | None, typer.Option("--prompt-ids", help="A prompt as comma-separated ids; repeatable.")
    ] = None,
    seed: int = typer.Option(0, "--seed", help="Seed of the first sample (sample i uses seed + i)."),
    trace: int = typer.Option(32, "--trace", min=0, help="Requests traced for the white-box checks."),
    num_assistant_tokens: int | None = typer.Option(
        None, "--num-assistant-tokens", help="Assistant draft length."
    ),
    device: str = typer.Option("cpu", "--device", help="Torch device of both models."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
    json_out: str | None = typer.Option(
        None, "--json-out", help="Also write the report as JSON to this file (the table is still printed)."
    ),
) -> None:
    """Run the kit on transformers' assisted generation (assistant model or prompt lookup)."""
    from specround.errors import SpecroundError

    try:
        if (assistant is None) == (prompt_lookup is None):
            raise typer.BadParameter("give exactly one of --assistant and --prompt-lookup")
        if not 0.0 < alpha < 1.0:
            raise typer.BadParameter(f"--alpha must lie in (0, 1), got {alpha}", param_hint="--alpha")
        prompts = [parse_prompt_ids(text) for text in prompt_ids or ()]
        report = _run(
            model,
            assistant,
            prompt_lookup,
            gguf,
            prompts,
            list(prompt or ()),
            temperature,
            top_k,
            top_p,
            min_p,
            repetition_penalty,
            eos_token_id,
            samples,
            horizon,
            alpha,
            seed,
            trace,
            num_assistant_tokens,
            device,
        )
    except SpecroundError as exc:
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from exc
    print_report(report, as_json, json_out)


def _run(
    model_path: str,
    assistant_path: str | None,
    prompt_lookup: int | None,
    gguf: str | None,
    prompts: list[list[int]],
    texts: list[str],
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    min_p: float | None,
    repetition_penalty: float | None,
    eos_token_id: int | None,
    samples: int,
    horizon: int,
    alpha: float,
    seed: int,
    trace: int,
    num_assistant_tokens: int | None,
    device: str,
) -> Any:
    """Validate, load, run; returns the report (SpecroundError on bad input)."""
    from specround.errors import InvalidRequestError, ModelLoadError
    from specround.testing.hf_engine import TransformersEngine
    from specround.testing.models import TransformersLogits
    from specround.testing.runner import conform
    from specround.testing.settings import SamplingSettings

    if prompt_lookup is not None and prompt_lookup < 1:
        raise InvalidRequestError(f"--prompt-lookup must be >= 1, got {prompt_lookup}")
    target = load_model_dir(model_path, gguf, device)
    eos = model_eos(target, eos_token_id)
    settings = SamplingSettings(
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        min_p=min_p,
        repetition_penalty=repetition_penalty,
        eos_token_id=eos,
    )
    if not texts and not prompts:
        texts = [DEFAULT_PROMPT]
    if texts:
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True, gguf_file=gguf)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"--prompt needs a tokenizer in {model_path!r}; give --prompt-ids instead"
            ) from exc
        prompts = prompts + [list(tokenizer(text)["input_ids"]) for text in texts]
    vocab = int(target.config.vocab_size)
    for ids in prompts:
        if not ids or any(not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt ids must lie in [0, {vocab}): {ids}")
    assistant = None
    draft = None
    if assistant_path is not None:
        assistant = load_model_dir(assistant_path, gguf, device)
        if int(assistant.config.vocab_size) != vocab:
            raise InvalidRequestError(
                f"the assistant's vocabulary ({assistant.config.vocab_size}) differs from the target's "
                f"({vocab})"
            )
        draft = TransformersLogits(assistant)
    engine = TransformersEngine(
        target, assistant=assistant, prompt_lookup=prompt_lookup, num_assistant_tokens=num_assistant_tokens
    )
    return conform(
        engine,
        TransformersLogits(target),
        settings=[settings],
        prompts=prompts,
        samples=samples,
        horizon=horizon,
        alpha=alpha,
        draft=draft,
        base_seed=seed,
        batch_size=32,  # transformers' assisted decoding is sequential: small batches only pace the progress
        trace_requests=trace,
        progress=lambda line: typer.echo(line, err=True),
    )


conform_app.command("specround")(conform_specround)
