"""Exact speculative generation for transformers users: ``from specround.hf import generate``.

:func:`generate` takes a transformers causal LM, ``input_ids`` / ``attention_mask`` (left padding included),
an ``assistant_model`` or ``prompt_lookup_num_tokens``, a ``GenerationConfig`` and its keyword overrides,
runs real batches (one target forward per step for the whole batch) and publishes every round to an event
log that ``specround audit`` checks. :func:`custom_generate_dir` is the directory to pass as
``model.generate(..., custom_generate=..., trust_remote_code=True)``.
"""

from __future__ import annotations

from pathlib import Path

from specround.hf.generate import generate
from specround.hf.outputs import SpecroundGenerateOutput

__all__ = ["SpecroundGenerateOutput", "custom_generate_dir", "generate"]


def custom_generate_dir() -> str:
    """The local directory holding ``custom_generate/generate.py`` for transformers' ``custom_generate``."""
    return str(Path(__file__).resolve().parent)
