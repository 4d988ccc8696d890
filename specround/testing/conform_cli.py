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

from typing import Any

import typer

from specround.testing import cli_common as options
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
    temperature: float = options.TEMPERATURE_OPTION,
    top_k: int | None = options.TOP_K_OPTION,
    top_p: float | None = options.TOP_P_OPTION,
    min_p: float | None = options.MIN_P_OPTION,
    repetition_penalty: float | None = options.REPETITION_PENALTY_OPTION,
    eos_token_id: int | None = options.EOS_OPTION,
    samples: int = options.SAMPLES_OPTION,
    horizon: int = options.HORIZON_OPTION,
    alpha: float = options.ALPHA_OPTION,
    prompt: options.PromptTexts = None,
    prompt_ids: options.PromptIds = None,
    seed: int = options.SEED_OPTION,
    trace: int = typer.Option(32, "--trace", min=0, help="Requests traced for the white-box checks."),
    num_assistant_tokens: int | None = typer.Option(
        None,
        "--num-assistant-tokens",
        help="Fixed assistant draft length, set on the assistant's own generation_config.",
    ),
    device: str = typer.Option("cpu", "--device", help="Torch device of both models."),
    as_json: bool = options.JSON_OPTION,
    json_out: str | None = options.JSON_OUT_OPTION,
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
