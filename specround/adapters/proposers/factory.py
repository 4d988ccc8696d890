"""Build proposers from short specifications (``ngram:3``, ``early_exit:8``, ``draft:bf16``)."""

from __future__ import annotations

import torch

from specround.adapters.llama.model import LlamaModel
from specround.adapters.llama.target import LlamaTarget
from specround.adapters.proposers.model_draft import ModelProposer
from specround.adapters.proposers.ngram import NGramProposer
from specround.errors import InvalidRequestError, UnknownProposerError
from specround.statemachine.model_ports import Proposer

__all__ = [
    "PROPOSER_KINDS",
    "early_exit_proposer",
    "proposer_from_spec",
    "reduced_precision_proposer",
]

PROPOSER_KINDS = ("ngram", "early_exit", "draft")
"""Names :func:`proposer_from_spec` understands."""

_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def early_exit_proposer(target: LlamaTarget, num_layers: int) -> ModelProposer:
    """Self-speculation: the target's first ``num_layers`` layers + final norm + head, with their own K/V."""
    engine = target.early_exit(num_layers)
    return ModelProposer(engine, proposer_id=f"early_exit:{num_layers}:{target.model_id}")


def reduced_precision_proposer(target: LlamaTarget, dtype: torch.dtype = torch.bfloat16) -> ModelProposer:
    """A separate draft model: the target's weights rounded through ``dtype`` (then computed in fp32)."""
    base = target.model
    twin = LlamaModel(base.config, base.weights.rounded_through(dtype))
    name = str(dtype).removeprefix("torch.")
    engine = LlamaTarget(twin, model_id=f"{target.model_id}~{name}")
    return ModelProposer(engine, proposer_id=f"draft:{name}:{target.model_id}")


def proposer_from_spec(spec: str, *, target: LlamaTarget) -> Proposer:
    """``ngram[:max_n]``, ``early_exit:<layers>`` or ``draft[:bf16|fp16]`` over ``target``'s weights."""
    kind, _, arg = spec.strip().partition(":")
    try:
        if kind == "ngram":
            return NGramProposer(target.vocab_size, max_ngram=int(arg) if arg else 3)
        if kind == "early_exit":
            return early_exit_proposer(target, int(arg))
        if kind == "draft":
            return reduced_precision_proposer(target, _DTYPES[arg or "bf16"])
    except (ValueError, KeyError, InvalidRequestError) as exc:
        raise UnknownProposerError(f"invalid proposer specification {spec!r}: {exc}") from exc
    raise UnknownProposerError(f"unknown proposer {kind!r} in {spec!r} (known: {', '.join(PROPOSER_KINDS)})")
