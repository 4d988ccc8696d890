"""specround itself as an engine under test: the serving loop over the compact Llama.

:class:`SpecroundEngine` submits each batch of requests to a fresh :class:`~specround.serving.ServingLoop`
(a :class:`~specround.statemachine.controller.RoundController` over an in-memory event log, a fixed draft
length K) with the kit's processor chain for the settings and EOS as a stop token, and reads each request's
first ``horizon`` generated tokens. Every log it wrote is kept, and :meth:`SpecroundEngine.self_audit`
runs specround's own audit over them (hash chains, replay, every decision re-derived from the logged
probabilities and the counter-based RNG): the kit's ``audit`` row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from specround.adapters.llama import LlamaTarget
from specround.adapters.memory_log import MemoryEventLog
from specround.audit.run import audit_log
from specround.serving import FixedDraftLength, GenerationRequest, ServingLoop
from specround.statemachine.controller import RoundController
from specround.statemachine.model_ports import Proposer
from specround.testing.engine_contract import EngineRequest

__all__ = ["SpecroundEngine"]


class SpecroundEngine:
    """specround's serving loop with a target adapter and a proposer, at a fixed draft length."""

    def __init__(
        self,
        target: LlamaTarget,
        proposer: Callable[[], Proposer],
        *,
        k: int = 3,
        name: str = "specround",
    ) -> None:
        """``proposer()`` builds a fresh proposer per batch (a draft model's cache is per loop)."""
        self.target = target
        self.proposer = proposer
        self.k = k
        self.name = name
        self.logs: list[MemoryEventLog] = []

    def generate(self, requests: Sequence[EngineRequest]) -> list[tuple[int, ...]]:
        """The first ``horizon`` generated tokens of each request, one serving loop per batch."""
        log = MemoryEventLog()
        self.logs.append(log)
        loop = ServingLoop(
            RoundController(log), self.target, self.proposer(), policy=FixedDraftLength(self.k)
        )
        vocab = self.target.vocab_size
        ids = [
            loop.submit(
                GenerationRequest(
                    tuple(r.prompt),
                    r.horizon,
                    seed=r.seed,
                    processors=r.settings.chain(vocab),
                    stop_token_ids=(r.settings.eos_token_id,) if r.settings.eos_token_id is not None else (),
                )
            )
            for r in requests
        ]
        finished = loop.run()
        loop.close()
        return [tuple(finished[rid].generated[: r.horizon]) for rid, r in zip(ids, requests, strict=True)]

    def self_audit(self) -> list[str]:
        """Audit every log written since the last call with specround's audit (one line per finding)."""
        found: list[str] = []
        for log in self.logs:
            report = audit_log(log)
            found.extend(f"{f.request_id} {f.invariant} {f.kind}: {f.message}" for f in report.findings)
        self.logs.clear()
        return found
