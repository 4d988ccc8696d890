"""``specround.hf.generate``: exact speculative generation for a transformers causal LM, batched and logged.

Typical use::

    from specround.hf import generate
    out = generate(model, input_ids, attention_mask=mask,
                   assistant_model=draft,            # or prompt_lookup_num_tokens=N
                   generation_config=cfg, log="run.sqlite", seed=0, max_new_tokens=64, do_sample=True)

One step of the loop runs one round of every unfinished row:

1. **K** per row from the draft-length policy (fixed, or ``auto``: the ledger policy of
   :mod:`specround.serving.policy`), capped by the row's budget;
2. **draft**: ONE assistant forward per draft step for the whole batch (or a prompt lookup), each draft drawn
   from the q row it reports (:mod:`specround.hf.drafting`);
3. **verify**: ONE target forward for the whole batch over each row's ``[F, d_1..d_K]``
   (:mod:`specround.hf.batch_cache`), then each row's p rows along its drafts;
4. **publish**: ONE controller step for all the rows (:mod:`specround.hf.controller_bridge`), i.e. one
   batched exact decision and one group commit, which runs on the controller's writer thread while the next
   step drafts and verifies (every round is durable before ``generate`` returns a token);
5. **K/V**: each row keeps what its round published and drops the rest; finished rows leave the batch.

The generated law is the target's processed law whatever the assistant proposes (the sampler is exact), and
every round is in the event log, so ``specround audit`` checks the run as any other.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specround.errors import InvalidRequestError, UnsupportedGenerationConfigError
from specround.hf.batch_cache import BatchedCausalLM
from specround.hf.batch_loop import BatchLoop, RowRequests
from specround.hf.controller_bridge import ControllerBridge
from specround.hf.drafting import AssistantDrafter, Drafter, LookupDrafter
from specround.hf.generation_settings import (
    GenerationSettings,
    resolve_settings,
    with_assistant_draft_length,
)
from specround.hf.outputs import SpecroundGenerateOutput, pad_sequences, stack_positions
from specround.hf.processors import build_chain, stop_strings_processor
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    AdaptiveDraftLength,
    DraftLengthPolicy,
    FixedDraftLength,
)
from specround.statemachine.ports import EventLog

__all__ = ["generate"]

_IGNORED_NONE = (
    "logits_processor",
    "stopping_criteria",
    "prefix_allowed_tokens_fn",
    "synced_gpus",
    "streamer",
    "negative_prompt_ids",
    "negative_prompt_attention_mask",
    "use_model_defaults",
    "custom_generate",
)
"""``model.generate`` arguments accepted only when None (a custom generate receives them all)."""


def _prompts(input_ids: Any, attention_mask: Any) -> tuple[torch.Tensor, list[list[int]]]:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dtype.is_floating_point:
        raise InvalidRequestError("input_ids must be an integer tensor [B, L]")
    ids = input_ids[None] if input_ids.dim() == 1 else input_ids
    if ids.dim() != 2 or ids.shape[0] < 1 or ids.shape[1] < 1:
        raise InvalidRequestError(f"input_ids must be [B, L] with B, L >= 1, got {tuple(input_ids.shape)}")
    if attention_mask is None:
        mask = torch.ones_like(ids, dtype=torch.bool)
    else:
        mask = (attention_mask[None] if attention_mask.dim() == 1 else attention_mask).to(torch.bool)
        if tuple(mask.shape) != tuple(ids.shape):
            raise InvalidRequestError(
                f"attention_mask {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}"
            )
    prompts = []
    for b in range(ids.shape[0]):
        row = mask[b].cpu()
        count = int(row.sum())
        if count == 0:
            raise InvalidRequestError(f"row {b} of attention_mask masks every token")
        if not bool(row[ids.shape[1] - count :].all()):
            raise InvalidRequestError(f"row {b} is not left-padded (only left padding is supported)")
        prompts.append([int(t) for t in ids[b, ids.shape[1] - count :].tolist()])
    return ids, prompts


def _open_log(log: str | Path | EventLog | None) -> tuple[EventLog, str, bool]:
    """(log, label, whether this call owns and closes it); default as ``specround generate``."""
    if log is not None and not isinstance(log, (str, Path)):
        return log, "memory" if type(log).__name__ == "MemoryEventLog" else type(log).__name__, False
    from specround.adapters.sql import SqlEventLog
    from specround.adapters.sql.engine import parse_location
    from specround.serving.session import default_log_path

    text = str(log) if log is not None else ""
    location = parse_location(text if "://" in text else Path(text or default_log_path()).expanduser())
    if location.sqlite_path is not None:
        if location.sqlite_path.exists() and not location.sqlite_path.is_file():
            raise InvalidRequestError(f"log {location.sqlite_path} exists and is not a file")
        location.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
    return SqlEventLog.open(location.connect_target()), location.label(), True


def _policy(k: int | str | None, settings: GenerationSettings, drafter: Drafter | None) -> DraftLengthPolicy:
    if drafter is None:
        return FixedDraftLength(0)
    if k is None:
        if settings.prompt_lookup_num_tokens and isinstance(drafter, LookupDrafter):
            k = settings.prompt_lookup_num_tokens
        elif (
            settings.num_assistant_tokens is not None and settings.num_assistant_tokens_schedule == "constant"
        ):
            k = settings.num_assistant_tokens
        else:
            k = "auto"
    if k == "auto":
        return AdaptiveDraftLength(draft_cost_hint=drafter.cost_hint)
    if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= MAX_DRAFT_LENGTH:
        raise InvalidRequestError(f"the draft length must be 0..{MAX_DRAFT_LENGTH} or 'auto', got {k!r}")
    return FixedDraftLength(k)


def _model_id(model: Any) -> str:
    return f"hf:{getattr(model.config, '_name_or_path', '') or type(model).__name__}"


def _drafter(assistant_model: Any, settings: GenerationSettings, batch: int, vocab: int) -> Drafter | None:
    """The assistant model's drafter, the prompt lookup's, or None (plain decoding)."""
    if assistant_model is not None:
        assistant_model.eval()
        return AssistantDrafter(
            assistant_model, range(batch), vocab_size=vocab, filler_id=settings.pad_token_id or 0
        )
    if settings.prompt_lookup_num_tokens:
        return LookupDrafter(
            vocab, max_ngram=settings.max_matching_ngram_size or 2, eos_token_ids=settings.eos_token_ids
        )
    return None


def _chains(
    settings: GenerationSettings,
    assistant: GenerationSettings,
    tokenizer: Any,
    prompts: Sequence[Sequence[int]],
    width: int,
    vocab: int,
) -> tuple[list[ProcessorChain], list[ProcessorChain]]:
    """Each row's target (p) chain, and its draft (q) chain advanced over its prompt."""
    stops = stop_strings_processor(settings, tokenizer, vocab)
    q_stops = stops if assistant is settings else stop_strings_processor(assistant, tokenizer, vocab)
    p_chains = [
        build_chain(settings, vocab, input_length=width, prompt_length=len(p), stop_strings=stops)
        for p in prompts
    ]
    q_chains: list[ProcessorChain] = []
    for prompt in prompts:
        chain = build_chain(
            assistant, vocab, input_length=width, prompt_length=len(prompt), stop_strings=q_stops
        )
        chain.advance_many(prompt)
        q_chains.append(chain)
    return p_chains, q_chains


def _coordinate(
    model: Any, target: BatchedCausalLM, drafter: Drafter | None, draft_processors_digest: str
) -> dict[str, Any]:
    """The static round coordinate every row's request is opened with (models, backend, draft chain)."""
    import transformers

    from specround import __version__

    return {
        "target_model_id": _model_id(model),
        "draft_model_id": drafter.proposer_id if drafter is not None else "none",
        "backend": {
            "dtype": str(target.dtype).removeprefix("torch."),
            "attention_path": f"hf-batched-{getattr(model.config, '_attn_implementation', 'eager')}",
            "software_revision": (
                f"specround {__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
            ),
        },
        "draft_processors_digest": draft_processors_digest,
    }


def generate(
    model: Any,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    *,
    assistant_model: Any = None,
    generation_config: Any = None,
    assistant_generation_config: Any = None,
    tokenizer: Any = None,
    log: str | Path | EventLog | None = None,
    seed: int | Sequence[int] = 0,
    k: int | str | None = None,
    inputs: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor | SpecroundGenerateOutput:
    """Generate like ``model.generate`` with exact speculative decoding; every round goes to ``log``.

    ``kwargs`` are ``GenerationConfig`` fields (``max_new_tokens``, ``do_sample``, ``temperature``,
    ``prompt_lookup_num_tokens``, ``num_assistant_tokens``, ...), resolved over ``generation_config`` and
    the model's own config as ``model.generate`` does; a set field specround cannot honour raises
    :class:`~specround.errors.UnsupportedGenerationConfigError`. ``seed`` is every row's request seed (one
    int, the same for every row, so a row's tokens do not depend on the batch), or one per row. ``k`` is
    the draft length (``0..8`` or ``"auto"``); by default ``prompt_lookup_num_tokens`` or a constant
    ``num_assistant_tokens`` (the call's, else the one on the assistant's own ``generation_config``, where
    transformers reads it), else ``"auto"``. ``log`` is a SQLite path, a database URL or an
    :class:`~specround.statemachine.ports.EventLog`; None writes
    ``specround-logs/generate-<time>-<id>.sqlite`` as ``specround generate`` does.
    """
    for name in _IGNORED_NONE:
        if kwargs.pop(name, None) is not None:
            raise UnsupportedGenerationConfigError([name], "specround.hf.generate takes no such argument")
    kwargs.pop("trust_remote_code", None)
    ids, prompts = _prompts(inputs if input_ids is None else input_ids, attention_mask)
    settings = resolve_settings(model, generation_config, kwargs)
    if assistant_model is not None and settings.prompt_lookup_num_tokens:
        raise InvalidRequestError("pass assistant_model or prompt_lookup_num_tokens, not both")
    assistant = settings
    if assistant_generation_config is not None:
        if assistant_model is None:
            raise InvalidRequestError("assistant_generation_config needs an assistant_model")
        assistant = resolve_settings(assistant_model, assistant_generation_config, {})
    batch, width = len(prompts), ids.shape[1]
    seeds = [int(seed)] * batch if isinstance(seed, int) else [int(s) for s in seed]
    if len(seeds) != batch:
        raise InvalidRequestError(f"{len(seeds)} seeds for {batch} rows")
    budget = settings.budget(width)
    model.eval()
    target = BatchedCausalLM(model, range(batch), filler_id=settings.pad_token_id or 0)
    vocab = target.vocab_size
    context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
    for b, prompt in enumerate(prompts):
        if len(prompt) + budget > context:
            raise InvalidRequestError(
                f"row {b}: prompt ({len(prompt)}) + {budget} new tokens exceed the context of {context}"
            )
    drafter = _drafter(assistant_model, settings, batch, vocab)
    policy = _policy(k, with_assistant_draft_length(settings, assistant_model), drafter)
    eos = tuple(t for t in settings.eos_token_ids if 0 <= t < vocab)
    p_chains, q_chains = _chains(settings, assistant, tokenizer, prompts, width, vocab)
    draft_digest = q_chains[0].config_digest() if drafter is not None else "none"
    coordinate = _coordinate(model, target, drafter, draft_digest)
    event_log, label, owned = _open_log(log)
    bridge: ControllerBridge | None = None
    try:
        bridge = ControllerBridge(event_log)
        loop = BatchLoop(
            target,
            drafter,
            policy,
            bridge,
            q_chains=q_chains,
            settings=settings,
            context=context,
        )
        rows = RowRequests(prompts, seeds, budget, p_chains, eos, coordinate)
        return _run(loop, rows, ids=ids, label=label)
    finally:
        try:
            if bridge is not None:
                bridge.close()
        finally:
            if owned:
                event_log.close()


def _run(
    loop: BatchLoop, rows: RowRequests, *, ids: torch.Tensor, label: str
) -> torch.Tensor | SpecroundGenerateOutput:
    """Open and run every row; the padded sequences, or the whole output with ``return_dict_in_generate``."""
    start = loop.clock()
    loop.open(rows)
    loop.run()
    settings, vocab = loop.settings, loop.target.vocab_size
    generated = [list(s.generated) for s in loop.states]
    sequences = pad_sequences(ids, generated, settings.pad_token_id)
    if not settings.return_dict_in_generate:
        return sequences
    return SpecroundGenerateOutput(
        sequences=sequences,
        scores=stack_positions(loop.scores, vocab) if settings.output_scores else None,
        logits=stack_positions(loop.raw, vocab) if settings.output_logits else None,
        request_ids=tuple(loop.rids),
        rounds=tuple(tuple(r) for r in loop.rounds),
        stats=tuple(loop.stats),
        totals=loop.totals,
        finish_reasons=tuple(s.finish_reason for s in loop.states),
        log=label,
        wall_s=loop.clock() - start,
    )
