"""transformers' ``custom_generate`` entry point: ``model.generate(..., custom_generate=DIR, ...)``.

``DIR`` is :func:`specround.hf.custom_generate_dir`. transformers copies this file into its module cache and
calls :func:`generate` with ``model`` and every argument of ``model.generate``; they are handed on to
:func:`specround.hf.generate` (``log=``, ``seed=``, ``k=`` and ``tokenizer=`` pass through as keywords).
"""

from __future__ import annotations

from typing import Any


def generate(model: Any, **kwargs: Any) -> Any:
    """Run :func:`specround.hf.generate` on ``model`` with ``model.generate``'s arguments."""
    from specround.hf import generate as specround_generate

    return specround_generate(model, **kwargs)
