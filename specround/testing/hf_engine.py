"""transformers' assisted generation as an engine under test: ``assistant_model`` or prompt lookup.

:class:`TransformersEngine` runs ``model.generate(do_sample=True, ...)`` with a complete
``GenerationConfig`` built from the settings (so no default such as ``top_k = 50`` sneaks in unasked),
seeding torch's global generator with the request's seed before each call. transformers' assisted decoding
takes one sequence at a time, so a batch is a loop.

**Tracing** (:meth:`TransformersEngine.trace`, used by the white-box checks; it patches nothing global):
for the duration of one ``generate`` call the model's ``_get_candidate_generator`` is wrapped on the
instance. The wrapper (1) wraps the candidate generator it returns, recording every ``get_candidates``
call (the input length, the candidate ids, and the candidate logits whose softmax is transformers' q), and
(2) appends a pass-through recorder to the target's logits-processor list, which records the processed
target rows transformers computes for each candidate position just before its speculative sampling step
(calls made inside ``get_candidates``, e.g. prompt lookup's own processor probe, are ignored). The rounds
are then cut from the recorded calls and the final sequence. While the call runs, ``torch.multinomial``
is wrapped too, to read the rows the assistant actually samples its candidates from (``q-sampled``
compares transformers' q with them). transformers does not expose its uniforms,
so ``decisions`` checks that every outcome is possible rather than re-deriving it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch

from specround.errors import InvalidRequestError
from specround.testing.engine_contract import EngineRequest, RoundTrace

__all__ = ["TransformersEngine", "draft_mode"]


def draft_mode(assistant: Any | None, prompt_lookup: int | None) -> str:
    """``assistant`` or ``prompt-lookup:N``: exactly one of an assistant model and a lookup length >= 1."""
    if (assistant is None) == (prompt_lookup is None):
        raise InvalidRequestError("give exactly one of an assistant model and a prompt-lookup length")
    if prompt_lookup is not None and prompt_lookup < 1:
        raise InvalidRequestError(f"prompt lookup needs a length >= 1, got {prompt_lookup}")
    return "assistant" if assistant is not None else f"prompt-lookup:{prompt_lookup}"


@dataclass
class _Tape:
    """What one traced ``generate`` call recorded."""

    inside_candidates: bool = False
    candidates: list[tuple[int, list[int], torch.Tensor | None]] = field(default_factory=list)
    """Per round: input length, candidate ids, candidate logits ``[k, V]`` (None for prompt lookup)."""
    rows: list[tuple[int, int, torch.Tensor]] = field(default_factory=list)
    """Per processed target row: round index, input length, processed scores ``[V]``."""
    sampled: list[list[torch.Tensor]] = field(default_factory=list)
    """Per round: the probability rows ``[V]`` the assistant's sampling calls drew the candidates from."""


class _CandidateRecorder:
    """A candidate generator that records what the wrapped one returns."""

    def __init__(self, inner: Any, tape: _Tape) -> None:
        self._inner = inner
        self._tape = tape

    def get_candidates(self, input_ids: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, Any]:
        """The wrapped generator's candidates, recorded."""
        self._tape.inside_candidates = True
        self._tape.sampled.append([])
        try:
            ids, logits = self._inner.get_candidates(input_ids, **kwargs)
        finally:
            self._tape.inside_candidates = False
        start = int(input_ids.shape[1])
        drafts = [int(t) for t in ids[0, start:].tolist()]
        q = None if logits is None else logits[0, : len(drafts)].detach().to(torch.float64).cpu()
        self._tape.candidates.append((start, drafts, q))
        return ids, logits

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextmanager
def _recording_multinomial(tape: _Tape) -> Iterator[None]:
    """Record the rows ``torch.multinomial`` samples from inside ``get_candidates`` (the assistant's draws).

    ``torch.multinomial`` is replaced for the duration of one traced ``generate`` call and restored after.
    """
    original = torch.multinomial

    def recording(probs: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if tape.inside_candidates and tape.sampled:
            rows = probs.reshape(-1, probs.shape[-1])  # [n, V]
            tape.sampled[-1].extend(rows.detach().to(torch.float64).cpu())
        return original(probs, *args, **kwargs)

    torch.multinomial = recording  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.multinomial = original


def _row_recorder(tape: _Tape) -> Any:
    """A transformers logits processor that records the scores it is given and returns them unchanged."""
    from transformers import LogitsProcessor

    class RowRecorder(LogitsProcessor):
        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            if not tape.inside_candidates and tape.candidates:
                row = scores[0].detach().to(torch.float64).cpu()
                tape.rows.append((len(tape.candidates) - 1, int(input_ids.shape[1]), row))
            return scores

    return RowRecorder()


class TransformersEngine:
    """transformers' speculative (assisted) sampling with an assistant model or prompt lookup."""

    def __init__(
        self,
        model: Any,
        *,
        assistant: Any | None = None,
        prompt_lookup: int | None = None,
        max_matching_ngram_size: int | None = None,
        num_assistant_tokens: int | None = None,
        name: str | None = None,
    ) -> None:
        mode = draft_mode(assistant, prompt_lookup)
        self.model = model
        self.assistant = assistant
        self.prompt_lookup = prompt_lookup
        self.max_matching_ngram_size = max_matching_ngram_size
        self.num_assistant_tokens = num_assistant_tokens
        """The assistant's draft length, set on its own ``generation_config`` (read by transformers)."""
        if num_assistant_tokens is not None:
            if assistant is None:
                raise InvalidRequestError("num_assistant_tokens needs an assistant model")
            from specround.hf.generation_settings import set_assistant_draft_length

            set_assistant_draft_length(assistant, num_assistant_tokens)
        self.name = name or f"transformers:{mode}"

    def _config(self, request: EngineRequest) -> Any:
        from transformers import GenerationConfig

        s = request.settings
        values: dict[str, Any] = {
            "do_sample": True,
            "max_new_tokens": request.horizon,
            "min_new_tokens": 0,
            "temperature": float(s.temperature),
            "top_k": s.top_k if s.top_k is not None else 0,
            "top_p": s.top_p if s.top_p is not None else 1.0,
            "min_p": s.min_p,
            "repetition_penalty": s.repetition_penalty if s.repetition_penalty is not None else 1.0,
            "eos_token_id": s.eos_token_id,
            "pad_token_id": s.eos_token_id if s.eos_token_id is not None else 0,
        }
        if self.prompt_lookup is not None:
            values["prompt_lookup_num_tokens"] = self.prompt_lookup
            if self.max_matching_ngram_size is not None:
                values["max_matching_ngram_size"] = self.max_matching_ngram_size
        return GenerationConfig(**values)  # type: ignore[no-untyped-call]

    def _generate(self, request: EngineRequest) -> list[int]:
        if not request.prompt:
            raise InvalidRequestError("the prompt must hold at least one token")
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(request.prompt)], dtype=torch.int64, device=device)
        kwargs: dict[str, Any] = {"generation_config": self._config(request)}
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        torch.manual_seed(request.seed)
        with torch.no_grad():
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
        return [int(t) for t in out[0].tolist()]

    def generate(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """The first ``horizon`` generated tokens of each request, one ``generate`` call each."""
        return [tuple(self._generate(r)[len(r.prompt) :][: r.horizon]) for r in requests]

    def trace(self, request: EngineRequest) -> tuple[tuple[int, ...], list[RoundTrace]]:
        """One request with its rounds, recorded around transformers' speculative sampling step."""
        tape = _Tape()
        original = self.model._get_candidate_generator

        def recording(*args: Any, **kwargs: Any) -> Any:
            generator = original(*args, **kwargs)
            processors = kwargs.get("logits_processor")
            if processors is None:
                raise InvalidRequestError("transformers passed no logits processor list to trace")
            processors.append(_row_recorder(tape))
            return _CandidateRecorder(generator, tape)

        self.model._get_candidate_generator = recording
        try:
            with _recording_multinomial(tape):
                full = self._generate(request)
        finally:
            del self.model._get_candidate_generator
        return tuple(full[len(request.prompt) :][: request.horizon]), _rounds(tape, full, len(request.prompt))


def _rounds(tape: _Tape, full: list[int], prompt_len: int) -> list[RoundTrace]:
    """Cut the recorded calls into rounds."""
    traces = []
    ends = [start for start, _, _ in tape.candidates[1:]] + [len(full)]
    for r, ((start, drafts, logits), end) in enumerate(zip(tape.candidates, ends, strict=True)):
        rows = {length: row for index, length, row in tape.rows if index == r}
        if end <= start:
            continue  # a call that generated nothing (the length cap was reached)
        k = len(drafts)
        missing = [start + i for i in range(k + 1) if start + i not in rows]
        if missing:
            raise InvalidRequestError(f"no processed target row recorded at lengths {missing} of round {r}")
        p = torch.softmax(torch.stack([rows[start + i] for i in range(k + 1)]), dim=-1)  # [k+1, V]
        q = None if logits is None else torch.softmax(logits, dim=-1)  # [k, V]
        drawn = tape.sampled[r] if r < len(tape.sampled) else []
        sampling = torch.stack(drawn[:k]) if q is not None and len(drawn) >= k > 0 else None  # [k, V]
        traces.append(
            RoundTrace(
                prefix=tuple(full[prompt_len:start]),
                draft_ids=tuple(drafts),
                q_rows=q,
                p_rows=p,
                emitted=tuple(full[start:end]),
                sampling_rows=sampling,
            )
        )
    return traces
