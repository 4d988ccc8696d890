"""specround's transformers drop-in (:func:`specround.hf.generate`) as an engine under test.

:class:`SpecroundHfEngine` runs each group of requests that share a prompt, a setting and a horizon as one
batched :func:`specround.hf.generate` call (one seed per row) with an assistant model or prompt lookup at a
fixed draft length, every round published to an in-memory event log. :meth:`SpecroundHfEngine.self_audit`
runs specround's audit over every log written: the kit's ``audit`` row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specround.adapters.memory_log import MemoryEventLog
from specround.audit.run import audit_log
from specround.errors import InvalidRequestError
from specround.testing.engine_contract import EngineRequest
from specround.testing.hf_engine import draft_mode
from specround.testing.settings import SamplingSettings

__all__ = ["SpecroundHfEngine", "generation_fields"]


def generation_fields(settings: SamplingSettings, horizon: int) -> dict[str, Any]:
    """Complete ``GenerationConfig`` fields for ``settings`` (every knob set, so no model default applies)."""
    eos = settings.eos_token_id
    return {
        "do_sample": True,
        "max_new_tokens": horizon,
        "min_new_tokens": 0,
        "temperature": float(settings.temperature),
        "top_k": settings.top_k if settings.top_k is not None else 0,
        "top_p": settings.top_p if settings.top_p is not None else 1.0,
        "min_p": settings.min_p,
        "repetition_penalty": settings.repetition_penalty if settings.repetition_penalty is not None else 1.0,
        "eos_token_id": eos,
        "pad_token_id": eos if eos is not None else 0,
    }


def _until_eos(tokens: Sequence[int], eos: int | None, horizon: int) -> tuple[int, ...]:
    """The first ``horizon`` tokens, cut after the first EOS (kept)."""
    head = list(tokens[:horizon])
    if eos is not None and eos in head:
        head = head[: head.index(eos) + 1]
    return tuple(head)


class SpecroundHfEngine:
    """:func:`specround.hf.generate` on a transformers model with an assistant model or prompt lookup."""

    def __init__(
        self,
        model: Any,
        *,
        assistant: Any | None = None,
        prompt_lookup: int | None = None,
        max_matching_ngram_size: int | None = None,
        k: int = 3,
        name: str | None = None,
    ) -> None:
        """``k`` is the fixed draft length (prompt lookup: ``prompt_lookup`` tokens unless given)."""
        mode = draft_mode(assistant, prompt_lookup)
        self.model = model
        self.assistant = assistant
        self.prompt_lookup = prompt_lookup
        self.max_matching_ngram_size = max_matching_ngram_size
        self.k = k
        self.name = name or f"specround.hf:{mode}"
        self.logs: list[MemoryEventLog] = []

    def _group(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """One batched call for requests sharing prompt, settings and horizon."""
        from specround.hf import generate

        first = requests[0]
        fields = generation_fields(first.settings, first.horizon)
        if self.prompt_lookup is not None:
            fields["prompt_lookup_num_tokens"] = self.prompt_lookup
            if self.max_matching_ngram_size is not None:
                fields["max_matching_ngram_size"] = self.max_matching_ngram_size
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(first.prompt)] * len(requests), dtype=torch.int64, device=device)
        log = MemoryEventLog()
        self.logs.append(log)
        with torch.no_grad():
            out = generate(
                self.model,
                ids,
                attention_mask=torch.ones_like(ids),
                assistant_model=self.assistant,
                log=log,
                seed=[r.seed for r in requests],
                k=self.k,
                return_dict_in_generate=True,
                **fields,
            )
        sequences = out.sequences if not isinstance(out, torch.Tensor) else out
        width = ids.shape[1]
        return [
            _until_eos(sequences[b, width:].tolist(), first.settings.eos_token_id, first.horizon)
            for b in range(len(requests))
        ]

    def generate(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """The first ``horizon`` generated tokens of each request (EOS included, nothing after it)."""
        if any(not r.prompt for r in requests):
            raise InvalidRequestError("the prompt must hold at least one token")
        groups: dict[tuple[tuple[int, ...], SamplingSettings, int], list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((tuple(r.prompt), r.settings, r.horizon), []).append(i)
        outputs: list[tuple[int, ...]] = [() for _ in requests]
        for indices in groups.values():
            for i, tokens in zip(indices, self._group([requests[i] for i in indices]), strict=True):
                outputs[i] = tokens
        return outputs

    def self_audit(self) -> list[str]:
        """Audit every log written since the last call with specround's audit (one line per finding)."""
        found: list[str] = []
        for log in self.logs:
            report = audit_log(log)
            found.extend(f"{f.request_id} {f.invariant} {f.kind}: {f.message}" for f in report.findings)
        self.logs.clear()
        return found
