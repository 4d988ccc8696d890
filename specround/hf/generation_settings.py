"""A transformers ``GenerationConfig`` resolved as transformers resolves it, then read field by field.

:func:`resolve_settings` merges the caller's config and keyword arguments over the model's own config and
transformers' global defaults (the model's ``_prepare_generation_config``, so precedence is exactly that of
``model.generate``). Every field is then either mapped (:class:`GenerationSettings`), known to have no
effect on the generated distribution (:data:`INERT_FIELDS`), or, when set to anything but its default,
refused with :class:`~specround.errors.UnsupportedGenerationConfigError` naming every such field.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from specround.errors import InvalidRequestError, UnsupportedGenerationConfigError

__all__ = [
    "INERT_FIELDS",
    "MAPPED_FIELDS",
    "GenerationSettings",
    "resolve_config",
    "resolve_settings",
    "set_assistant_draft_length",
    "settings_from_config",
    "with_assistant_draft_length",
]

MAPPED_FIELDS = frozenset(
    {
        "do_sample",
        "temperature",
        "top_k",
        "top_p",
        "min_p",
        "repetition_penalty",
        "no_repeat_ngram_size",
        "min_new_tokens",
        "min_length",
        "suppress_tokens",
        "bad_words_ids",
        "eos_token_id",
        "stop_strings",
        "max_new_tokens",
        "max_length",
        "pad_token_id",
        "num_assistant_tokens",
        "num_assistant_tokens_schedule",
        "prompt_lookup_num_tokens",
        "max_matching_ngram_size",
        "output_scores",
        "output_logits",
        "return_dict_in_generate",
    }
)
"""Fields this module reads and honours."""

INERT_FIELDS = frozenset(
    {
        "bos_token_id",
        "decoder_start_token_id",
        "use_cache",
        "transformers_version",
        "_from_model_config",
        "is_assistant",
        "disable_compile",
        "compile_config",
    }
)
"""Fields that cannot change which tokens are generated (accepted whatever their value)."""

_DEFAULTS: dict[str, Any] = {
    "num_beams": 1,
    "num_return_sequences": 1,
    "early_stopping": False,
    "typical_p": 1.0,
    "length_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0,
    "remove_invalid_values": False,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "assistant_confidence_threshold": 0.4,
    "assistant_lookbehind": 10,
    "target_lookbehind": 10,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "output_attentions": False,
    "output_hidden_states": False,
}
"""Unsupported fields whose default value is harmless (anything else set there is refused)."""


@dataclass(frozen=True, slots=True)
class GenerationSettings:
    """The mapped fields of one resolved ``GenerationConfig``."""

    do_sample: bool
    temperature: float
    top_k: int | None
    top_p: float | None
    min_p: float | None
    repetition_penalty: float | None
    no_repeat_ngram_size: int | None
    min_length: int
    """Minimum total length in transformers' count (padded input length included); 0 for none."""
    min_new_tokens: int
    suppress_tokens: tuple[int, ...]
    bad_words_ids: tuple[tuple[int, ...], ...]
    eos_token_ids: tuple[int, ...]
    stop_strings: tuple[str, ...]
    max_new_tokens: int | None
    max_length: int | None
    pad_token_id: int | None
    num_assistant_tokens: int | None
    """Set only when the caller set it (not transformers' default of 20)."""
    num_assistant_tokens_schedule: str
    prompt_lookup_num_tokens: int | None
    max_matching_ngram_size: int | None
    output_scores: bool
    output_logits: bool
    return_dict_in_generate: bool

    def budget(self, input_length: int) -> int:
        """New tokens per row: ``max_new_tokens``, else ``max_length - input_length`` (transformers' rule)."""
        if self.max_new_tokens is not None:
            budget = self.max_new_tokens
        elif self.max_length is not None:
            budget = self.max_length - input_length
        else:
            budget = 20 - input_length
        if budget < 1:
            raise InvalidRequestError(
                f"no room to generate: max_new_tokens / max_length leave {budget} tokens "
                f"after an input of {input_length}"
            )
        return budget

    def min_new(self, input_length: int) -> int:
        """New tokens before an end token may be emitted (the larger of min_length and min_new_tokens)."""
        return max(self.min_new_tokens, self.min_length - input_length, 0)


def _token_ids(value: Any, name: str) -> tuple[int, ...]:
    if value is None:
        return ()
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        out = []
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InvalidRequestError(f"{name} must hold token ids, got {v!r}")
            out.append(v)
        return tuple(out)
    raise InvalidRequestError(f"{name} must be a token id or a list of them, got {value!r}")


def _draft_length(config: Any) -> tuple[int | None, str]:
    """A config's ``num_assistant_tokens`` (None when unset or transformers' default of 20) and schedule."""
    schedule = getattr(config, "num_assistant_tokens_schedule", None) or "constant"
    if schedule not in ("constant", "heuristic"):
        raise UnsupportedGenerationConfigError(
            ["num_assistant_tokens_schedule"], f"{schedule!r}; use 'constant' or 'heuristic'"
        )
    tokens = getattr(config, "num_assistant_tokens", None)
    if tokens is None:
        return None, schedule
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise InvalidRequestError(f"num_assistant_tokens must be a non-negative integer, got {tokens!r}")
    return (None if tokens == 20 else tokens), schedule  # 20 is transformers' default, not a choice


def resolve_config(model: Any, generation_config: Any, kwargs: Mapping[str, Any]) -> Any:
    """The config ``model.generate`` would use; keyword arguments it does not know are refused."""
    config, unknown = model._prepare_generation_config(generation_config, **dict(kwargs))
    leftover = sorted(k for k in unknown if k not in ("output_attentions", "output_hidden_states"))
    if leftover:
        raise UnsupportedGenerationConfigError(leftover, "not generation settings specround can honour")
    return config


def settings_from_config(config: Any) -> GenerationSettings:
    """Read a resolved config field by field; refuse every unsupported field that is set."""
    fields: dict[str, Any] = dict(config.to_dict())
    refused = []
    for name, value in fields.items():
        if name in MAPPED_FIELDS or name in INERT_FIELDS:
            continue
        default = _DEFAULTS.get(name)
        if value is not None and value != default:
            refused.append(name)
    for name, value in vars(config).items():  # custom entries carried over from the model's config
        if not name.startswith("_") and name not in fields and value is not None:
            refused.append(name)
    if refused:
        raise UnsupportedGenerationConfigError(refused)

    def real(name: str, value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise InvalidRequestError(f"{name} must be a finite number, got {value!r}")
        return float(value)

    def count(name: str, value: Any) -> int | None:
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidRequestError(f"{name} must be a non-negative integer, got {value!r}")
        return int(value)

    do_sample = bool(config.do_sample)
    temperature = real("temperature", config.temperature)
    top_k = count("top_k", config.top_k)
    top_p = real("top_p", config.top_p)
    min_p = real("min_p", config.min_p)
    penalty = real("repetition_penalty", config.repetition_penalty)
    ngram = count("no_repeat_ngram_size", config.no_repeat_ngram_size)
    assistant_tokens, schedule = _draft_length(config)
    strings = config.stop_strings
    stop_strings = (strings,) if isinstance(strings, str) else tuple(strings or ())
    bad = config.bad_words_ids
    if bad is not None and (
        isinstance(bad, (str, bytes)) or not all(isinstance(seq, Sequence) and seq for seq in bad)
    ):
        raise InvalidRequestError(f"bad_words_ids must be a list of non-empty token-id lists, got {bad!r}")
    eos = _token_ids(config.eos_token_id, "eos_token_id")
    pad = config.pad_token_id
    return GenerationSettings(
        do_sample=do_sample,
        temperature=1.0 if temperature is None else temperature,
        top_k=top_k if top_k else None,
        top_p=top_p if top_p is not None and top_p < 1.0 else None,
        min_p=min_p,
        repetition_penalty=penalty if penalty is not None and penalty != 1.0 else None,
        no_repeat_ngram_size=ngram if ngram else None,
        min_length=count("min_length", config.min_length) or 0,
        min_new_tokens=count("min_new_tokens", config.min_new_tokens) or 0,
        suppress_tokens=_token_ids(config.suppress_tokens, "suppress_tokens"),
        bad_words_ids=tuple(_token_ids(seq, "bad_words_ids") for seq in (bad or ())),
        eos_token_ids=eos,
        stop_strings=stop_strings,
        max_new_tokens=count("max_new_tokens", config.max_new_tokens),
        max_length=count("max_length", config.max_length),
        pad_token_id=int(pad) if pad is not None else (eos[0] if eos else None),
        num_assistant_tokens=assistant_tokens,
        num_assistant_tokens_schedule=schedule,
        prompt_lookup_num_tokens=count("prompt_lookup_num_tokens", config.prompt_lookup_num_tokens),
        max_matching_ngram_size=count("max_matching_ngram_size", config.max_matching_ngram_size),
        output_scores=bool(config.output_scores),
        output_logits=bool(config.output_logits),
        return_dict_in_generate=bool(config.return_dict_in_generate),
    )


def resolve_settings(model: Any, generation_config: Any, kwargs: Mapping[str, Any]) -> GenerationSettings:
    """:func:`resolve_config` then :func:`settings_from_config`."""
    return settings_from_config(resolve_config(model, generation_config, kwargs))


def with_assistant_draft_length(settings: GenerationSettings, assistant_model: Any) -> GenerationSettings:
    """``settings`` with the assistant's own ``num_assistant_tokens`` where the call did not set one.

    transformers' assisted generation reads the draft length and its schedule from the assistant model's
    ``generation_config``, not from the arguments of ``generate``; specround honours the call's value first
    and the assistant's next, so a script written for transformers drafts as many tokens here as there.
    """
    if settings.num_assistant_tokens is not None or assistant_model is None:
        return settings
    tokens, schedule = _draft_length(getattr(assistant_model, "generation_config", None))
    if tokens is None:
        return settings
    return replace(settings, num_assistant_tokens=tokens, num_assistant_tokens_schedule=schedule)


def set_assistant_draft_length(assistant_model: Any, k: int) -> None:
    """Make transformers' assisted generation with ``assistant_model`` draft exactly ``k`` tokens a round.

    transformers reads ``num_assistant_tokens``, its schedule and ``assistant_confidence_threshold`` only
    from the assistant's own ``generation_config`` (the same fields passed to ``generate`` are not read), so
    they are set there: ``k``, the constant schedule, and no confidence cut-off.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InvalidRequestError(f"the assistant's draft length must be a positive integer, got {k!r}")
    config = assistant_model.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
