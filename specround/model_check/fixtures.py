"""Finite fixtures for the exact-enumeration oracle and the Monte Carlo check.

Contract: contract#oracle, contract#worked-coupling, contract#worked-round.

An :class:`OracleFixture` freezes everything a round depends on: a vocabulary of ``V <= 4`` tokens, the
draft length ``K``, a comparison horizon, raw-logit tables for the target and the drafter *by prefix* (the
tokens emitted since the round began; context-dependent), an ordered processor list for each side, a prompt
that both processor chains have consumed before the round, and the remaining output budget.

Named fixtures reproduce the contract's worked examples; :func:`random_fixtures` draws any number of
further fixtures from a fixed seed (fixture ``i`` depends only on ``(seed, i)``).

contract#worked-coupling gives numbers, not whole rows: p(A) = 0.30, q(A) = 0.60, acceptance of a drafted
A = 0.50, residual mass Z = 0.25 + 0.05 = 0.30 with p'(B) = 0.833 and p'(C) = 0.167, and a coupling
diagonal of 0.70. We choose ``p = [0.30, 0.50, 0.20]`` and ``q = [0.60, 0.25, 0.15]``:
then p(B) - q(B) = 0.25, p(C) - q(C) = 0.05, and sum min(p, q) = 0.30 + 0.25 + 0.15 = 0.70, consistent with
every stated number (any q(B) + q(C) = 0.40 with p = q + (−0.30, 0.25, 0.05) would be).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from typing import Any

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.processor_chain import ProcessorChain
from specround.sampling.softmax import SoftmaxBackend

__all__ = [
    "MAX_FIXTURE_DRAFT",
    "MAX_FIXTURE_VOCAB",
    "SUMMARY_P",
    "SUMMARY_Q",
    "THREE_SYMBOL_P",
    "THREE_SYMBOL_Q",
    "LogitTable",
    "OracleFixture",
    "named_fixtures",
    "random_fixture",
    "random_fixtures",
]

MAX_FIXTURE_VOCAB = 4
"""Largest vocabulary of an oracle fixture (every sequence of the horizon is enumerated)."""
MAX_FIXTURE_DRAFT = 3
"""Largest draft length of an oracle fixture."""

THREE_SYMBOL_P = (0.30, 0.50, 0.20)
"""The target row of contract#worked-coupling over [A, B, C] (chosen; see the module docstring)."""
THREE_SYMBOL_Q = (0.60, 0.25, 0.15)
"""The draft row of contract#worked-coupling over [A, B, C] (chosen; see the module docstring)."""
SUMMARY_P = (0.6, 0.3, 0.1)
"""The target row of contract#worked-round over [A, B, C]."""
SUMMARY_Q = (0.2, 0.3, 0.5)
"""The draft row of contract#worked-round over [A, B, C]."""

LogitTable = Mapping[tuple[int, ...], tuple[float, ...]]
"""Raw logits ``[V]`` by prefix (tokens emitted since the round began)."""

ProcessorSpecs = tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class OracleFixture:
    """One finite round coordinate: tables, processors, prompt, budget and horizon.

    ``target_logits`` must hold every prefix shorter than ``horizon``; ``draft_logits`` every prefix
    shorter than ``draft_len``. ``remaining`` is the output budget at round start (``None``: no budget
    within the horizon). ``prompt`` is consumed by both processor chains before the round.
    """

    name: str
    vocab_size: int
    draft_len: int
    horizon: int
    target_logits: LogitTable
    draft_logits: LogitTable
    target_processors: ProcessorSpecs = ()
    draft_processors: ProcessorSpecs = ()
    prompt: tuple[int, ...] = ()
    remaining: int | None = None
    softmax: SoftmaxBackend = SoftmaxBackend.MAX_SHIFT
    notes: str = ""
    tags: frozenset[str] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not 2 <= self.vocab_size <= MAX_FIXTURE_VOCAB:
            raise InvalidProcessorError(f"{self.name}: vocab_size must lie in 2..{MAX_FIXTURE_VOCAB}")
        if not 1 <= self.draft_len <= MAX_FIXTURE_DRAFT or self.horizon < self.draft_len + 1:
            raise InvalidProcessorError(
                f"{self.name}: need 1 <= K <= {MAX_FIXTURE_DRAFT} and horizon >= K + 1"
            )
        if self.remaining is not None and self.remaining < 1:
            raise InvalidProcessorError(f"{self.name}: remaining budget must be >= 1")
        for table, depth, side in (
            (self.target_logits, self.horizon, "target"),
            (self.draft_logits, self.draft_len, "draft"),
        ):
            for length in range(depth):
                for prefix in product(range(self.vocab_size), repeat=length):
                    row = table.get(prefix)
                    if row is None or len(row) != self.vocab_size:
                        raise InvalidProcessorError(f"{self.name}: {side} logits missing at prefix {prefix}")

    @property
    def budget(self) -> int:
        """The remaining budget as the sampler sees it (beyond the horizon when undeclared)."""
        return self.remaining if self.remaining is not None else self.horizon + 1

    def chain(self, side: str, softmax: SoftmaxBackend | None = None) -> ProcessorChain:
        """The processor chain of ``side`` ("target" or "draft") after the prompt, at round start."""
        specs = self.target_processors if side == "target" else self.draft_processors
        made = ProcessorChain.from_spec(specs, vocab_size=self.vocab_size, softmax=softmax or self.softmax)
        made.advance_many(self.prompt)
        return made

    def logits(self, side: str, prefix: Sequence[int]) -> torch.Tensor:
        """Raw logits ``[V]`` float64 of ``side`` at ``prefix``."""
        table = self.target_logits if side == "target" else self.draft_logits
        return torch.tensor(table[tuple(prefix)], dtype=torch.float64)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (sizes and processor kinds) for reports."""
        return {
            "name": self.name,
            "V": self.vocab_size,
            "K": self.draft_len,
            "horizon": self.horizon,
            "target_processors": [p["kind"] for p in self.target_processors],
            "draft_processors": [p["kind"] for p in self.draft_processors],
            "prompt": list(self.prompt),
            "remaining": self.remaining,
        }


def _table(
    vocab: int, depth: int, row: Callable[[tuple[int, ...]], Sequence[float]]
) -> dict[tuple[int, ...], tuple[float, ...]]:
    """Logits for every prefix shorter than ``depth``."""
    return {
        prefix: tuple(float(x) for x in row(prefix))
        for length in range(depth)
        for prefix in product(range(vocab), repeat=length)
    }


def _constant(vocab: int, depth: int, probs: Sequence[float]) -> dict[tuple[int, ...], tuple[float, ...]]:
    """A context-independent table whose softmax is ``probs`` (logits are log-probabilities)."""
    logits = tuple(math.log(p) for p in probs)
    return _table(vocab, depth, lambda _prefix: logits)


def _spec(kind: str, **params: Any) -> dict[str, Any]:
    return {"kind": kind, "params": params}


def _two_token_target(prefix: tuple[int, ...]) -> tuple[float, float]:
    """Context-dependent target logits over {0, 1}: depends on the count of 1s and the last token."""
    ones = sum(prefix)
    last = prefix[-1] if prefix else -1
    return (
        0.3 - 0.45 * ones + (0.6 if last == 0 else 0.0),
        -0.2 + 0.25 * len(prefix) - (0.5 if last == 1 else 0.0),
    )


def _two_token_draft(prefix: tuple[int, ...]) -> tuple[float, float]:
    """A drafter that disagrees with :func:`_two_token_target` in a prefix-dependent way."""
    ones = sum(prefix)
    return (0.8 - 0.3 * ones, -0.1 + 0.35 * len(prefix))


def named_fixtures() -> list[OracleFixture]:
    """The contract's fixtures: two tokens with K = 2 and K = 3, both worked examples, and stops.

    Contract: contract#oracle, contract#bonus-token, contract#worked-coupling, contract#worked-round.
    """
    two_token_processors_target = (
        _spec("temperature", temperature=0.8),
        _spec("logit_bias", bias=[[1, 0.25]]),
    )
    two_token_processors_draft = (
        _spec("temperature", temperature=1.25),
        _spec("logit_bias", bias=[[0, -0.1]]),
    )
    fixtures = [
        OracleFixture(
            name="two-token K=2 (contract#oracle)",
            vocab_size=2,
            draft_len=2,
            horizon=3,
            target_logits=_table(2, 3, _two_token_target),
            draft_logits=_table(2, 2, _two_token_draft),
            target_processors=two_token_processors_target,
            draft_processors=two_token_processors_draft,
            notes="context-dependent raw-logit tables, ordered temperature and additive-bias processors",
            tags=frozenset({"spec", "monte_carlo"}),
        ),
        OracleFixture(
            name="two-token K=3 (contract#bonus-token)",
            vocab_size=2,
            draft_len=3,
            horizon=4,
            target_logits=_table(2, 4, _two_token_target),
            draft_logits=_table(2, 3, _two_token_draft),
            target_processors=two_token_processors_target,
            draft_processors=two_token_processors_draft,
            notes="every draft path, every first rejection, the bonus, completed to horizon K + 1",
            tags=frozenset({"spec", "monte_carlo"}),
        ),
        OracleFixture(
            name="three-symbol (contract#worked-coupling)",
            vocab_size=3,
            draft_len=1,
            horizon=2,
            target_logits=_constant(3, 2, THREE_SYMBOL_P),
            draft_logits=_constant(3, 1, THREE_SYMBOL_Q),
            notes="p = [0.30, 0.50, 0.20], q = [0.60, 0.25, 0.15] (chosen to match contract#worked-coupling)",
            tags=frozenset({"spec", "three_symbol"}),
        ),
        OracleFixture(
            name="three-symbol gamma=2 (contract#worked-round)",
            vocab_size=3,
            draft_len=2,
            horizon=3,
            target_logits=_constant(3, 3, SUMMARY_P),
            draft_logits=_constant(3, 2, SUMMARY_Q),
            notes="p = [0.6, 0.3, 0.1], q = [0.2, 0.3, 0.5] at every position",
            tags=frozenset({"spec", "summary", "monte_carlo"}),
        ),
        OracleFixture(
            name="stops and budget",
            vocab_size=3,
            draft_len=3,
            horizon=4,
            target_logits=_table(3, 4, lambda prefix: (0.2 * len(prefix), 0.5 - 0.3 * sum(prefix), -0.4)),
            draft_logits=_table(3, 3, lambda prefix: (0.1, 0.6 - 0.2 * len(prefix), 0.0)),
            target_processors=(
                _spec("repetition_penalty", penalty=1.3),
                _spec("stop_sequences", sequences=[[2], [0, 1]]),
            ),
            draft_processors=(_spec("top_k", k=2),),
            prompt=(1,),
            remaining=3,
            notes="EOS = 2, stop sequence [0, 1], budget 3: stops inside the prefix and as the terminal",
            tags=frozenset({"spec", "monte_carlo"}),
        ),
    ]
    return fixtures


# --- random fixtures --------------------------------------------------------------------------------------

_KINDS = (
    "temperature",
    "greedy",
    "top_k",
    "top_p",
    "min_p",
    "logit_bias",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "grammar",
)


def _random_processor(kind: str, vocab: int, rng: random.Random) -> dict[str, Any]:
    if kind == "temperature":
        return _spec(kind, temperature=round(rng.uniform(0.4, 2.5), 3))
    if kind == "greedy":
        return _spec(kind)
    if kind == "top_k":
        return _spec(kind, k=rng.randint(1, vocab))
    if kind in ("top_p", "min_p"):
        return _spec(kind, p=round(rng.uniform(0.05, 0.98), 3))
    if kind == "logit_bias":
        tokens = rng.sample(range(vocab), rng.randint(1, vocab))
        return _spec(kind, bias=[[t, round(rng.uniform(-2.0, 2.0), 3)] for t in sorted(tokens)])
    if kind == "repetition_penalty":
        return _spec(kind, penalty=round(rng.uniform(0.7, 2.0), 3))
    if kind in ("frequency_penalty", "presence_penalty"):
        return _spec(kind, penalty=round(rng.uniform(-0.5, 1.5), 3))
    if kind == "grammar":
        states = rng.randint(1, 3)
        transitions: list[list[int]] = []
        for src in range(states):
            allowed = rng.sample(range(vocab), rng.randint(1, vocab))
            transitions.extend([src, t, rng.randrange(states)] for t in sorted(allowed))
        return _spec(kind, num_states=states, start=0, transitions=transitions)
    raise ValueError(kind)


def _random_processors(vocab: int, rng: random.Random, *, stops: bool) -> ProcessorSpecs:
    count = rng.choice((0, 1, 2, 2, 3, 3, 4))
    kinds = rng.sample(_KINDS, count)
    if "greedy" in kinds and rng.random() < 0.7:
        kinds.remove("greedy")  # one-hot rows are covered, but keep most rows non-degenerate
    if "grammar" in kinds:
        # A grammar after a truncation could mask every surviving token (the chain refuses such rows):
        # constraints come first, as in ``sampling_chain``.
        kinds.remove("grammar")
        kinds.insert(0, "grammar")
    specs = [_random_processor(kind, vocab, rng) for kind in kinds]
    if stops and rng.random() < 0.35:
        sequences = [
            [rng.randrange(vocab) for _ in range(rng.randint(1, 2))] for _ in range(rng.randint(1, 2))
        ]
        specs.insert(rng.randint(0, len(specs)), _spec("stop_sequences", sequences=sequences))
    return tuple(specs)


def _prompt_both_accept(
    vocab: int, target: ProcessorSpecs, draft: ProcessorSpecs, length: int, rng: random.Random
) -> tuple[int, ...]:
    """A prompt of up to ``length`` tokens that both chains can consume (grammars may refuse tokens)."""
    chains = [ProcessorChain.from_spec(specs, vocab_size=vocab) for specs in (target, draft)]
    prompt: list[int] = []
    for _ in range(length):
        candidates = list(range(vocab))
        rng.shuffle(candidates)
        for token in candidates:
            trial = [c.clone() for c in chains]
            try:
                for c in trial:
                    c.advance(token)
            except InvalidProcessorError:
                continue
            chains = trial
            prompt.append(token)
            break
        else:
            break
    return tuple(prompt)


def random_fixture(seed: int, index: int) -> OracleFixture:
    """Random fixture ``index`` of the family ``seed`` (depends only on the pair).

    V <= 4, K <= 3, context-dependent tables, random processor lists on both sides (truncations,
    penalties, grammars; stop sequences and budgets on the target side), sometimes a drafter identical to
    the target (p == q).
    """
    rng = random.Random(f"specround-oracle:{seed}:{index}")
    vocab = rng.choice((2, 3, 4))
    k = rng.choice((1, 2, 3))
    horizon = k + 1
    if vocab ** (k + 2) <= 64 and rng.random() < 0.3:
        horizon = k + 2
    target_logits = _table(vocab, horizon, lambda _p: [round(rng.gauss(0.0, 1.5), 4) for _ in range(vocab)])
    target_processors = _random_processors(vocab, rng, stops=True)
    mode = rng.random()
    if mode < 0.12:  # self-draft: the drafter is the target itself, so p == q and nothing is ever corrected
        draft_logits = {prefix: row for prefix, row in target_logits.items() if len(prefix) < k}
        draft_processors = tuple(p for p in target_processors if p["kind"] != "stop_sequences")
        tag = "self_draft"
    elif mode < 0.45:  # a close drafter: target logits plus noise
        draft_logits = {
            prefix: tuple(round(x + rng.gauss(0.0, 0.4), 4) for x in row)
            for prefix, row in target_logits.items()
            if len(prefix) < k
        }
        draft_processors = _random_processors(vocab, rng, stops=False)
        tag = "close_draft"
    else:
        draft_logits = _table(vocab, k, lambda _p: [round(rng.gauss(0.0, 1.5), 4) for _ in range(vocab)])
        draft_processors = _random_processors(vocab, rng, stops=False)
        tag = "independent_draft"
    prompt = _prompt_both_accept(vocab, target_processors, draft_processors, rng.randint(0, 3), rng)
    remaining = rng.randint(1, horizon) if rng.random() < 0.2 else None
    softmax = SoftmaxBackend.ONLINE if rng.random() < 0.5 else SoftmaxBackend.MAX_SHIFT
    return OracleFixture(
        name=f"random #{index}",
        vocab_size=vocab,
        draft_len=k,
        horizon=horizon,
        target_logits=target_logits,
        draft_logits=draft_logits,
        target_processors=target_processors,
        draft_processors=draft_processors,
        prompt=prompt,
        remaining=remaining,
        softmax=softmax,
        tags=frozenset({"random", tag}),
    )


def random_fixtures(count: int, seed: int = 0) -> list[OracleFixture]:
    """``count`` random fixtures of the family ``seed`` (deterministic)."""
    return [random_fixture(seed, i) for i in range(count)]
