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

import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from specround.errors import InvalidRequestError, UnsupportedGenerationConfigError
from specround.hf.batch_cache import BatchedCausalLM
from specround.hf.config import GenerationSettings, resolve_settings
from specround.hf.controller_bridge import ControllerBridge, RoundRequest
from specround.hf.drafting import AssistantDrafter, DraftAsk, Drafter, LookupDrafter
from specround.hf.outputs import SpecroundGenerateOutput, pad_sequences, stack_positions
from specround.hf.processors import build_chain, stop_strings_processor
from specround.sampling.processors.chain import ProcessorChain
from specround.serving.policy import (
    MAX_DRAFT_LENGTH,
    AdaptiveDraftLength,
    DraftLengthPolicy,
    DraftSlot,
    FixedDraftLength,
    StepCosts,
)
from specround.serving.stats import AcceptanceStats, RoundOutcome
from specround.statemachine.events import RoundTimings
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
    ``num_assistant_tokens``, else ``"auto"``. ``log`` is a SQLite path, a database URL or an
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
    drafter: Drafter | None = None
    if assistant_model is not None:
        assistant_model.eval()
        drafter = AssistantDrafter(
            assistant_model, range(batch), vocab_size=vocab, filler_id=settings.pad_token_id or 0
        )
    elif settings.prompt_lookup_num_tokens:
        drafter = LookupDrafter(vocab, max_ngram=settings.max_matching_ngram_size or 2)
    policy = _policy(k, settings, drafter)
    stops = stop_strings_processor(settings, tokenizer, vocab)
    q_stops = stops if assistant is settings else stop_strings_processor(assistant, tokenizer, vocab)
    eos = tuple(t for t in settings.eos_token_ids if 0 <= t < vocab)
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
    import transformers

    from specround import __version__

    coordinate = {
        "target_model_id": _model_id(model),
        "draft_model_id": drafter.proposer_id if drafter is not None else "none",
        "backend": {
            "dtype": str(target.dtype).removeprefix("torch."),
            "attention_path": f"hf-batched-{getattr(model.config, '_attn_implementation', 'eager')}",
            "software_revision": (
                f"specround {__version__}, torch {torch.__version__}, transformers {transformers.__version__}"
            ),
        },
        "draft_processors_digest": q_chains[0].config_digest() if drafter is not None else "none",
    }
    event_log, label, owned = _open_log(log)
    bridge: ControllerBridge | None = None
    try:
        bridge = ControllerBridge(event_log)
        return _run(
            target,
            drafter,
            policy,
            bridge,
            ids=ids,
            prompts=prompts,
            seeds=seeds,
            budget=budget,
            p_chains=p_chains,
            q_chains=q_chains,
            eos=eos,
            coordinate=coordinate,
            settings=settings,
            label=label,
            context=context,
        )
    finally:
        try:
            if bridge is not None:
                bridge.close()
        finally:
            if owned:
                event_log.close()


def _run(
    target: BatchedCausalLM,
    drafter: Drafter | None,
    policy: DraftLengthPolicy,
    bridge: ControllerBridge,
    *,
    ids: torch.Tensor,
    prompts: list[list[int]],
    seeds: list[int],
    budget: int,
    p_chains: list[ProcessorChain],
    q_chains: list[ProcessorChain],
    eos: tuple[int, ...],
    coordinate: dict[str, Any],
    settings: GenerationSettings,
    label: str,
    context: int,
) -> torch.Tensor | SpecroundGenerateOutput:
    clock = time.perf_counter
    start = clock()
    batch, vocab = len(prompts), target.vocab_size
    rids: list[str] = []
    states = []
    for b, prompt in enumerate(prompts):
        state = bridge.open_request(
            prompt,
            seed=seeds[b],
            max_new_tokens=budget,
            chain=p_chains[b],
            stop_token_ids=eos,
            coordinate=coordinate,
            request_id=uuid.uuid4().hex,
        )
        rids.append(state.request_id)
        states.append(state)
    # Prefill: the committed cache C = O[:-1] of every row in one forward.
    feeds = {b: list(states[b].cache) for b in range(batch)}
    if any(feeds.values()):
        target.forward(feeds, rows="none")
        target.commit({b: len(f) for b, f in feeds.items()})
    live = [b for b in range(batch) if not states[b].finished]
    rounds: list[list[RoundOutcome]] = [[] for _ in range(batch)]
    stats = [AcceptanceStats() for _ in range(batch)]
    totals = AcceptanceStats()
    want_scores, want_logits = settings.output_scores, settings.output_logits
    scores: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    raw: list[list[torch.Tensor]] = [[] for _ in range(batch)]
    last_end = clock()
    while live:
        step_start = clock()
        gap = step_start - last_end
        caps = {}
        for b in live:
            room = context - len(states[b].cache) - 1
            caps[b] = (
                0 if drafter is None else max(0, min(bridge.remaining(rids[b]) - 1, MAX_DRAFT_LENGTH, room))
            )
        ks = policy.choose([DraftSlot(rids[b], caps[b]) for b in live])
        asked = {b: max(0, min(int(kk), caps[b])) for b, kk in zip(live, ks, strict=True)}
        drafts: dict[int, tuple[int, ...]] = {b: () for b in live}
        q_rows: dict[int, torch.Tensor | None] = {b: None for b in live}
        draws = {b: 0 for b in live}
        draft_s = 0.0
        drafting = [b for b in live if asked[b] > 0]
        if drafter is not None and drafting:
            t0 = clock()
            offered = drafter.propose(
                [
                    DraftAsk(
                        b, states[b].output, asked[b], q_chains[b].clone(), seeds[b], states[b].rng.proposal
                    )
                    for b in drafting
                ]
            )
            draft_s = clock() - t0
            kept = policy.trim([DraftSlot(rids[b], len(offered[b].tokens)) for b in drafting])
            for b, count in zip(drafting, kept, strict=True):
                got = offered[b]
                n = max(0, min(int(count), len(got.tokens)))
                drafts[b] = got.tokens[:n]
                q_rows[b] = got.q_rows[:n]
                draws[b] = min(got.draws, n) if got.draws else 0
        # Verification: ONE target forward for the batch.
        t0 = clock()
        frontier = {b: states[b].frontier for b in live}
        logits = target.forward({b: [int(frontier[b] or 0), *drafts[b]] for b in live})
        verify_s = clock() - t0
        requests = []
        rows_s: dict[int, float] = {}
        p_rows: dict[int, torch.Tensor] = {}
        for b in live:
            t1 = clock()
            p_rows[b] = bridge.processors(rids[b]).rows_along(logits[b], drafts[b])  # [k + 1, V]
            rows_s[b] = clock() - t1
        asked_total = sum(asked[b] for b in drafting)
        rows_total = sum(len(drafts[b]) + 1 for b in live)
        for b in live:
            timing = RoundTimings(
                draft_s=draft_s * asked[b] / asked_total if asked_total else 0.0,
                verify_s=verify_s * (len(drafts[b]) + 1) / rows_total,
                state_s=rows_s[b],
                queue_s=gap / len(live),
            )
            requests.append(
                RoundRequest(
                    rids[b],
                    drafts[b],
                    q_rows[b],
                    p_rows[b],
                    proposal_draws=draws[b],
                    verify_rows=len(drafts[b]) + 1,
                    timings=timing,
                )
            )
        t0 = clock()
        results = bridge.submit(requests)  # decided now; durable before generate returns
        controller_s = clock() - t0
        keeps: dict[int, int] = {}
        outcomes = []
        for b, req, result in zip(live, requests, results, strict=True):
            keeps[b] = result.keep
            states[b] = result.state
            q_chains[b].advance_many(result.emitted_ids)
            emitted = len(result.emitted_ids)
            if want_scores:
                scores[b].extend(torch.log(p_rows[b][j]) for j in range(emitted))
            if want_logits:
                raw[b].extend(logits[b][j] for j in range(emitted))
            if drafter is not None and not result.finished:
                drafter.on_published(b, result.state.output)
            outcome = RoundOutcome(
                request_id=rids[b],
                generation=result.generation,
                requested_k=asked[b],
                drafted=len(req.draft_ids),
                accepted=result.accepted,
                reached=result.reached,
                emitted_ids=result.emitted_ids,
                terminal=result.terminal or "bonus",
                finished=result.finished,
                finish_reason=result.finish_reason,
                timings=req.timings or RoundTimings(),
            )
            rounds[b].append(outcome)
            stats[b].add(outcome)
            totals.add(outcome)
            outcomes.append(outcome)
        target.commit(keeps)
        finished = [b for b in live if states[b].finished]
        for b in finished:
            policy.forget(rids[b])
        live = [b for b in live if not states[b].finished]
        target.tidy(live)
        if drafter is not None:
            drafter.keep_rows(live)
        policy.observe(
            outcomes,
            StepCosts(
                draft=(max(asked[b] for b in drafting), draft_s)
                if drafting and drafter is not None
                else None,
                verify_calls=((rows_total, verify_s),),
                states=tuple(
                    (len(r.draft_ids), rows_s[b] + controller_s / len(requests))
                    for b, r in zip(asked, requests, strict=True)
                ),
                gap_s=gap,
            ),
        )
        last_end = clock()
    bridge.settle()  # every round is durable before any token is returned
    generated = [list(s.generated) for s in states]
    sequences = pad_sequences(ids, generated, settings.pad_token_id)
    if not settings.return_dict_in_generate:
        return sequences
    return SpecroundGenerateOutput(
        sequences=sequences,
        scores=stack_positions(scores, vocab) if want_scores else None,
        logits=stack_positions(raw, vocab) if want_logits else None,
        request_ids=tuple(rids),
        rounds=tuple(tuple(r) for r in rounds),
        stats=tuple(stats),
        totals=totals,
        finish_reasons=tuple(s.finish_reason for s in states),
        log=label,
        wall_s=clock() - start,
    )
