"""Draft specifications of ``specround generate --draft`` and building the proposer they name.

Grammar (parsed and checked before any model is loaded):

``ngram`` or ``ngram:N``
    Prompt lookup over the request's own text, longest suffix match of at most N tokens (default 3).
``early-exit:N``
    Self-speculation: the target's first N layers, final norm and head, with their own K/V (1 <= N < L).
``model:PATH``
    A separate draft model from a GGUF file. It must share the target's tokenizer (contract#shared-vocabulary:
    a ratio ``p(d) / q(d)`` is only defined when both models name the same token events), which is checked.
``model:bf16``, ``model:fp16`` (aliases ``model:smollm2-bf16``, ``model:smollm2-fp16``)
    The reduced-precision copy of the target: its weights rounded through bfloat16 / float16 (computed in
    float32), the same copy ``specround bench e2e`` hands transformers as ``assistant_model``.
``none``
    No proposer: plain decoding (every round is K = 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from specround.canonical import digest
from specround.errors import InvalidRequestError, ModelLoadError, UnknownProposerError
from specround.statemachine.model_ports import Proposer

if TYPE_CHECKING:
    from specround.adapters.llama import LlamaTokenizer

__all__ = [
    "DRAFT_KINDS",
    "REDUCED_PRECISION_ALIASES",
    "DraftSpec",
    "build_proposer",
    "draft_cost_hint",
    "parse_draft_spec",
    "vocabulary_digest",
]

DraftKind = Literal["ngram", "early-exit", "model", "copy", "none"]

DRAFT_KINDS = ("ngram", "early-exit", "model", "none")
"""The kinds ``--draft`` accepts."""

REDUCED_PRECISION_ALIASES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "smollm2-bf16": torch.bfloat16,
    "smollm2-fp16": torch.float16,
}
"""``model:<alias>`` names that mean the target's reduced-precision copy, not a file."""


@dataclass(frozen=True, slots=True)
class DraftSpec:
    """A parsed ``--draft`` value."""

    kind: DraftKind
    """``copy`` is ``model:<alias>``: the target's reduced-precision copy."""
    ngram: int = 3
    layers: int = 0
    path: Path | None = None
    dtype: torch.dtype | None = None
    text: str = ""
    """The specification as given."""


def parse_draft_spec(spec: str) -> DraftSpec:
    """Parse a ``--draft`` value; unknown kinds and malformed arguments raise UnknownProposerError."""
    text = spec.strip()
    kind, sep, arg = text.partition(":")
    kind = kind.strip().lower()
    if kind == "none" and not sep:
        return DraftSpec("none", text=text)
    if kind == "ngram":
        if not sep:
            return DraftSpec("ngram", text=text)
        n = _positive_int(arg, text)
        return DraftSpec("ngram", ngram=n, text=text)
    if kind in ("early-exit", "early_exit"):
        if not sep:
            raise UnknownProposerError(f"draft {text!r}: early-exit needs a layer count, e.g. early-exit:8")
        return DraftSpec("early-exit", layers=_positive_int(arg, text), text=text)
    if kind == "model":
        if not arg:
            raise UnknownProposerError(f"draft {text!r}: model needs a GGUF path or bf16/fp16")
        alias = REDUCED_PRECISION_ALIASES.get(arg.lower())
        if alias is not None:
            return DraftSpec("copy", dtype=alias, text=text)
        path = Path(arg).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"draft model file not found: {path}")
        return DraftSpec("model", path=path, text=text)
    raise UnknownProposerError(
        f"unknown draft {text!r}: use ngram[:N], early-exit:N, model:PATH, model:bf16 or none"
    )


def _positive_int(arg: str, text: str) -> int:
    try:
        value = int(arg)
    except ValueError:
        raise UnknownProposerError(f"draft {text!r}: {arg!r} is not an integer") from None
    if value < 1:
        raise UnknownProposerError(f"draft {text!r}: {value} must be >= 1")
    return value


def vocabulary_digest(tokenizer: LlamaTokenizer | None, vocab_size: int) -> str:
    """Digest of the token events ``0..V-1`` (their spellings); of the size alone without a tokenizer."""
    if tokenizer is None:
        return digest({"vocab_size": vocab_size})
    return digest({"vocab_size": vocab_size, "tokens": [tokenizer.token(i) for i in range(vocab_size)]})


def build_proposer(spec: DraftSpec, target: object, *, vocab_digest: str | None = None) -> Proposer | None:
    """The proposer ``spec`` names, over ``target`` (a :class:`~specround.adapters.llama.LlamaTarget`).

    A separate draft model is loaded here and refused unless it names the same token events as the target
    (``vocab_digest``: :func:`vocabulary_digest` of the target's tokenizer).
    """
    from specround.adapters.llama import LlamaTarget, load_llama
    from specround.adapters.proposers import (
        ModelProposer,
        NGramProposer,
        early_exit_proposer,
        reduced_precision_proposer,
    )

    if not isinstance(target, LlamaTarget):
        raise InvalidRequestError(f"draft {spec.text!r} needs the compact Llama target")
    if spec.kind == "none":
        return None
    if spec.kind == "ngram":
        return NGramProposer(target.vocab_size, max_ngram=spec.ngram)
    if spec.kind == "early-exit":
        total = target.model.config.num_layers
        if not 1 <= spec.layers < total:
            raise UnknownProposerError(
                f"draft {spec.text!r}: the target has {total} layers; early exit needs 1..{total - 1}"
            )
        return early_exit_proposer(target, spec.layers)
    if spec.kind == "copy":
        assert spec.dtype is not None
        return reduced_precision_proposer(target, spec.dtype)
    assert spec.path is not None
    draft = load_llama(spec.path)
    same_size = draft.config.vocab_size == target.vocab_size
    if not same_size or (
        vocab_digest is not None and vocabulary_digest(draft.tokenizer, target.vocab_size) != vocab_digest
    ):
        raise ModelLoadError(
            f"draft model {spec.path.name} does not share the target's tokenizer: speculative sampling needs "
            "one vocabulary of token events (contract#shared-vocabulary)"
        )
    return ModelProposer(
        LlamaTarget(draft.model, model_id=draft.model_id), proposer_id=f"model:{draft.model_id}"
    )


def _streamed_elements(weights: Any, layers: int) -> int:
    """Weight elements one decode step reads: ``layers`` blocks, the final norm and the head."""
    blocks = sum(t.numel() for layer in weights.layers[:layers] for t in layer.tensors().values())
    return int(blocks + weights.norm.numel() + weights.lm_head.numel())


def draft_cost_hint(spec: DraftSpec, target: object, proposer: Proposer | None) -> float | None:
    """Declared cost of one draft token relative to a one-row target step, for the adaptive policy.

    A CPU decode step streams its weights once, so its cost is about proportional to the weight elements it
    reads: 0 for a lookup, ``(N blocks + head) / (L blocks + head)`` for an early exit at N layers, 1 for
    the reduced-precision copy (computed in float32, the same shapes), and the element ratio for a
    separate draft model. None when there is no proposer.
    """
    from specround.adapters.llama import LlamaTarget
    from specround.adapters.proposers import ModelProposer

    if proposer is None or spec.kind == "none":
        return None
    if spec.kind == "ngram":
        return 0.0
    if not isinstance(target, LlamaTarget):
        return None
    full = _streamed_elements(target.model.weights, target.model.config.num_layers)
    if spec.kind == "early-exit":
        return _streamed_elements(target.model.weights, spec.layers) / full
    if spec.kind == "copy":
        return 1.0
    if isinstance(proposer, ModelProposer) and isinstance(proposer.engine, LlamaTarget):
        engine = proposer.engine
        return _streamed_elements(engine.model.weights, engine.num_layers) / full
    return None
