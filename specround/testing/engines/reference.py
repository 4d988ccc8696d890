"""A correct speculative decoding engine over any two logits models, written plainly for the kit.

Each round drafts ``k = min(K, remaining - 1)`` tokens from the draft model's processed rows, scores
them with the target's processed rows (each at its own prefix, the processor state advanced over the
published output only), accepts test ``i`` iff ``u_i < p_i(d_i) / q_i(d_i)``, stops at an accepted EOS,
and otherwise draws one correction from the normalised residual ``max(p - q, 0)`` or one bonus from
``p_{k+1}`` by inverse CDF. Randomness is specround's counter-based RNG: a uniform is a function of
(seed, stream, counter), so a request's output never depends on the batch it is in.

The engine is correct by construction and independent of specround's batched sampler; the kit's
``decisions`` check re-derives its rounds with that sampler. The methods marked *hook* are the places
:mod:`specround.testing.engines.planted` breaks on purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from specround.sampling.exact import degenerate_residual_tolerance, inverse_cdf
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.rng import uniforms
from specround.sampling.types import Stream
from specround.testing.engine_contract import EngineRequest, RoundTrace
from specround.testing.models import LogitsModel, logits_after

__all__ = ["ReferenceEngine", "RequestRun"]


_BLOCK = 32
"""Uniforms computed per RNG call (one vectorised Philox call instead of one per draw)."""


def _sample(row: torch.Tensor, u: float) -> int:
    """A proposal draw from a float64 row ``[V]``: the first token whose cumulative mass exceeds ``u``."""
    cdf = torch.cumsum(row, dim=0)  # [V]
    index = int(torch.searchsorted(cdf, torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype), right=True)[0])
    index = min(index, row.shape[0] - 1)
    while float(row[index]) <= 0.0 and index > 0:  # never a zero-mass token (rounding at the top end)
        index -= 1
    return index


def _draw(row: torch.Tensor, u: float) -> int:
    """Inverse-CDF draw of one token from an unnormalised float64 row ``[V]`` (specround's rule)."""
    return int(inverse_cdf(row[None, :], torch.tensor([u], dtype=torch.float64)).tokens[0])


@dataclass
class RequestRun:
    """The working state of one request inside the reference engine (what the hooks see)."""

    request: EngineRequest
    seed: int
    published: ProcessorChain
    """The processor state over the prompt and the published output."""
    target_state: ProcessorChain
    """The state the target's rows are built from (equal to ``published`` in a correct engine)."""
    out: list[int] = field(default_factory=list)
    counters: dict[Stream, int] = field(default_factory=lambda: dict.fromkeys(Stream, 0))
    drawn: dict[Stream, list[float]] = field(default_factory=dict)
    """Uniforms of each stream computed so far (counter-based, so computed in blocks)."""
    stopped: bool = False

    def uniform(self, stream: Stream) -> float:
        """The next uniform of ``stream``: ``uniforms(seed, stream, counter)``."""
        counter = self.counters[stream]
        if not self.drawn:  # the first block of every stream in one vectorised call
            streams = torch.tensor([int(s) for s in Stream])[:, None]  # [3, 1]
            first = uniforms(self.seed, streams, torch.arange(_BLOCK)[None, :]).tolist()  # [3, BLOCK]
            self.drawn = {s: first[i] for i, s in enumerate(Stream)}
        block = self.drawn[stream]
        if counter >= len(block):
            block.extend(uniforms(self.seed, stream, torch.arange(len(block), len(block) + _BLOCK)).tolist())
        self.counters[stream] += 1
        return block[counter]


class ReferenceEngine:
    """The correct engine: a draft model proposes ``k`` tokens per round, the target verifies them."""

    def __init__(
        self, target: LogitsModel, draft: LogitsModel, *, k: int = 3, name: str = "reference"
    ) -> None:
        self.target = target
        self.draft = draft
        self.k = k
        self.name = name

    # --- the Engine protocol ----------------------------------------------------------------------------

    def generate(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """The first ``horizon`` tokens of each request."""
        return [self._run(request, self.seed_of(request, requests))[0] for request in requests]

    def trace(self, request: EngineRequest) -> tuple[tuple[int, ...], list[RoundTrace]]:
        """One request alone, with its rounds."""
        return self._run(request, self.seed_of(request, [request]))

    # --- hooks ------------------------------------------------------------------------------------------

    def seed_of(self, request: EngineRequest, batch: Sequence[EngineRequest]) -> int:
        """*Hook*: the seed a request draws with."""
        del batch
        return request.seed

    def q_rows(
        self, run: RequestRun, logits: torch.Tensor, chain: ProcessorChain
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """*Hook*: (row the draft is sampled from, row reported and used as q), both ``[V]``."""
        row = chain.distribution(logits)
        return row, row

    def advance_target_state(self, run: RequestRun, drafts: Sequence[int], emitted: Sequence[int]) -> None:
        """*Hook*: move the target-side processor state after a round (over the emitted tokens)."""
        del drafts
        run.target_state.advance_many(emitted)

    def terminal_row(
        self, p: torch.Tensor, q: torch.Tensor | None, bonus_q: torch.Tensor | None
    ) -> torch.Tensor:
        """*Hook*: the unnormalised row the terminal token is drawn from.

        ``p`` is the target row at the terminal position, ``q`` the rejected position's q row (None for a
        bonus), ``bonus_q`` the draft's row after the last draft (only for a bonus).
        """
        del bonus_q
        if q is None:
            return p
        residual = (p - q).clamp_min(0.0)
        return residual if float(residual.sum()) > degenerate_residual_tolerance(p.dtype) else p

    def continue_after_rejection(self) -> bool:
        """*Hook*: whether the tests go on after a rejection (never, in a correct engine)."""
        return False

    def stop_at_eos(self) -> bool:
        """*Hook*: whether an accepted EOS ends the round there (always, in a correct engine)."""
        return True

    # --- the round loop ---------------------------------------------------------------------------------

    def _run(self, request: EngineRequest, seed: int) -> tuple[tuple[int, ...], list[RoundTrace]]:
        vocab = self.target.vocab_size
        published = request.settings.chain(vocab)
        published.advance_many(request.prompt)
        run = RequestRun(request, seed, published, published.clone())
        traces: list[RoundTrace] = []
        while len(run.out) < request.horizon and not run.stopped:
            traces.append(self._round(run))
        return tuple(run.out[: request.horizon]), traces

    def _round(self, run: RequestRun) -> RoundTrace:
        request = run.request
        eos = request.settings.eos_token_id
        remaining = request.horizon - len(run.out)
        k = min(self.k, remaining - 1)
        context = list(request.prompt) + run.out
        # Draft: k tokens, each from the draft's row processed at the published state + earlier drafts.
        drafts: list[int] = []
        q_used: list[torch.Tensor] = []
        sampled_from: list[torch.Tensor] = []
        draft_chain = run.published.clone()
        for _ in range(k + 1):
            logits = self.draft.next_logits([context + drafts])[0]  # [V]
            sample_row, q_row = self.q_rows(run, logits, draft_chain)
            if len(drafts) == k:
                bonus_q = sample_row  # the draft's row after the last draft (read by a planted bug only)
                break
            token = _sample(sample_row, run.uniform(Stream.PROPOSAL))
            drafts.append(token)
            q_used.append(q_row)
            sampled_from.append(sample_row)
            draft_chain.advance(token)
        # Verify: the target's rows at every prefix of the drafts, at the target-side state.
        raw = logits_after(self.target, [context + drafts[:i] for i in range(k + 1)])  # [k+1, V]
        p_rows = run.target_state.rows_along(raw, drafts)  # [k+1, V]
        q_rows = torch.stack(q_used) if q_used else torch.zeros(0, p_rows.shape[1], dtype=torch.float64)
        # Decide: the leading run of accepted tests; an accepted EOS ends the request there.
        emitted: list[int] = []
        accept_u: list[float] = []
        terminal_u: float | None = None
        rejected = stopped_in_prefix = False
        i = 0
        while i < k:
            u = run.uniform(Stream.ACCEPT)
            accept_u.append(u)
            d = drafts[i]
            if u < float(p_rows[i, d]) / float(q_rows[i, d]):
                emitted.append(d)
                if d == eos and self.stop_at_eos():
                    stopped_in_prefix = True
                    break
            else:  # a correction from the residual at the rejected position
                rejected = True
                terminal_u = run.uniform(Stream.TERMINAL)
                emitted.append(_draw(self.terminal_row(p_rows[i], q_rows[i], None), terminal_u))
                if not self.continue_after_rejection():
                    break
            i += 1
        if not stopped_in_prefix and (not rejected or self.continue_after_rejection()):
            terminal_u = run.uniform(Stream.TERMINAL)  # the bonus, from the target row after the drafts
            emitted.append(_draw(self.terminal_row(p_rows[k], None, bonus_q), terminal_u))
        trace = RoundTrace(
            prefix=tuple(run.out),
            draft_ids=tuple(drafts),
            q_rows=q_rows,
            p_rows=p_rows,
            emitted=tuple(emitted),
            sampling_rows=torch.stack(sampled_from) if sampled_from else None,
            accept_uniforms=tuple(accept_u),
            terminal_uniform=terminal_u,
        )
        run.out.extend(emitted)
        run.published.advance_many(emitted)
        self.advance_target_state(run, drafts, emitted)
        run.stopped = eos is not None and eos in emitted
        return trace
