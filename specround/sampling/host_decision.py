"""A :class:`~specround.sampling.types.SamplerDecision` from the host arrays the control computed.

The fast path and the scalar path compute a decision's seventeen fields as numpy arrays or Python lists.
Wrapping each one in a tensor of its own costs one dispatched operator and a few microseconds apiece;
here they are laid out in five arrays by kind (the output rows, the per-request counts, the flags, the
per-draft floats and the per-request floats), and each field is a row of one of them: five zero-copy
wraps and four ``unbind`` calls, whatever B. The fields are views that share those arrays' memory, as
the fields of a decision taken on an accelerator share its device memory.
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt
import torch

from specround.sampling.types import SamplerDecision

__all__ = ["COUNT_FIELDS", "FLAG_FIELDS", "PER_DRAFT_FIELDS", "PER_REQUEST_FIELDS", "host_decision"]

COUNT_FIELDS = ("emitted", "accepted", "terminal", "accept_draws", "terminal_draws", "terminal_row")
"""The [B] int64 fields, in the row order of ``counts``."""
FLAG_FIELDS = ("finished", "stopped_by_token", "degenerate_correction")
"""The [B] bool fields, in the row order of ``flags``."""
PER_DRAFT_FIELDS = ("p_draft", "q_draft", "accept_uniforms")
"""The [B, K] float64 fields, in the order of ``per_draft``."""
PER_REQUEST_FIELDS = ("residual_mass", "terminal_mass_before", "terminal_token_mass", "terminal_uniform")
"""The [B] float64 fields, in the row order of ``per_request``."""


def host_decision(
    output_ids: npt.NDArray[Any],
    counts: npt.NDArray[Any],
    flags: npt.NDArray[Any],
    per_draft: npt.NDArray[Any],
    per_request: npt.NDArray[Any],
) -> SamplerDecision:
    """The decision whose fields are ``output_ids`` [B, K+1] int64 and the rows of the other four arrays.

    ``counts`` [6, B] int64 (:data:`COUNT_FIELDS`), ``flags`` [3, B] bool (:data:`FLAG_FIELDS`),
    ``per_draft`` [3, B, K] float64 (:data:`PER_DRAFT_FIELDS`), ``per_request`` [4, B] float64
    (:data:`PER_REQUEST_FIELDS`). Each array must be C-contiguous and is not copied: do not reuse it.
    """
    fields: dict[str, torch.Tensor] = {"output_ids": torch.from_numpy(output_ids)}
    for names, array in (
        (COUNT_FIELDS, counts),
        (FLAG_FIELDS, flags),
        (PER_DRAFT_FIELDS, per_draft),
        (PER_REQUEST_FIELDS, per_request),
    ):
        fields.update(zip(names, torch.from_numpy(array).unbind(0), strict=True))
    return SamplerDecision(**fields)
