"""The processor chain: an ordered, hashed list of processors plus the softmax that ends it.

A :class:`ProcessorChain` is the request's processor state G. It turns raw logits into processed
probability rows at its current state (:meth:`ProcessorChain.distribution`), or into the rows of a round
along a draft path, each at its own logical prefix (:meth:`ProcessorChain.rows_along`,
contract#processed-rows), and advances over published tokens only (contract#reached-events). Stateless
processors are applied to every row of a round at once; only stateful ones are evaluated per row.

Output rows keep the input's float dtype and are distributions over exactly ``vocab_size`` tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from specround.canonical import digest
from specround.errors import (
    DraftIdOutOfVocabError,
    InvalidProcessorError,
    NonFiniteProbabilityError,
    ShapeMismatchError,
)
from specround.sampling.processors.grammar import TokenGrammar
from specround.sampling.processors.penalties import FrequencyPenalty, PresencePenalty, RepetitionPenalty
from specround.sampling.processors.processor import LogitProcessor, StopAutomaton
from specround.sampling.processors.registry import processor_from_spec
from specround.sampling.processors.stateless import Greedy, LogitBias, MinP, Temperature, TopK, TopP
from specround.sampling.processors.stop import StopSequences
from specround.sampling.softmax import SoftmaxBackend, softmax

__all__ = ["ProcessorChain", "sampling_chain"]

_POS_INF = float("inf")
_NEG_INF = float("-inf")


def _backend(value: SoftmaxBackend | str) -> SoftmaxBackend:
    try:
        return SoftmaxBackend(value)
    except ValueError as exc:
        raise InvalidProcessorError(f"unknown softmax backend {value!r}") from exc


class ProcessorChain:
    """Ordered processors over a declared vocabulary, ending in a declared softmax backend."""

    processors: tuple[LogitProcessor, ...]
    """The processors, applied in this order."""
    vocab_size: int
    """Number of token ids every row covers."""
    softmax: SoftmaxBackend
    """Backend that normalises processed logits."""

    def __init__(
        self,
        processors: Sequence[LogitProcessor] = (),
        *,
        vocab_size: int,
        softmax: SoftmaxBackend | str = SoftmaxBackend.MAX_SHIFT,
    ) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise InvalidProcessorError(f"vocab_size must be a positive integer, got {vocab_size!r}")
        for p in processors:
            if not isinstance(p, LogitProcessor):
                raise InvalidProcessorError(f"not a LogitProcessor: {p!r}")
            p.validate_vocab(vocab_size)
        self.vocab_size = vocab_size
        self.softmax = _backend(softmax)
        # The chain owns private copies: advancing a caller's processor later cannot change it.
        self.processors = tuple(p.clone() for p in processors)

    # --- identity -------------------------------------------------------------------------------------

    def clone(self) -> ProcessorChain:
        """An independent copy (stateful processors are cloned; nothing O(V) is copied)."""
        twin = object.__new__(ProcessorChain)
        twin.vocab_size = self.vocab_size
        twin.softmax = self.softmax
        twin.processors = tuple(p.clone() for p in self.processors)
        return twin

    def to_spec(self) -> tuple[dict[str, Any], ...]:
        """``({"kind", "params", "state"}, ...)`` in order; JSON-able and accepted by :meth:`from_spec`."""
        return tuple({"kind": p.kind, "params": p.params(), "state": p.state()} for p in self.processors)

    @classmethod
    def from_spec(
        cls,
        spec: Iterable[Mapping[str, Any]],
        *,
        vocab_size: int,
        softmax: SoftmaxBackend | str = SoftmaxBackend.MAX_SHIFT,
    ) -> ProcessorChain:
        """Rebuild a chain (with state) from :meth:`to_spec` output."""
        if isinstance(spec, (Mapping, str, bytes)):
            raise InvalidProcessorError("a chain spec is a sequence of processor specs")
        return cls([processor_from_spec(item) for item in spec], vocab_size=vocab_size, softmax=softmax)

    def _identity(self, *, with_state: bool) -> dict[str, Any]:
        return {
            "vocab_size": self.vocab_size,
            "softmax": self.softmax.value,
            "processors": [
                {"kind": p.kind, "params": p.params(), **({"state": p.state()} if with_state else {})}
                for p in self.processors
            ],
        }

    def digest(self) -> str:
        """Canonical digest of order, kinds, params, state, vocabulary size and softmax backend."""
        return digest(self._identity(with_state=True))

    def config_digest(self) -> str:
        """Like :meth:`digest` without state: the declared policy, bound into the round coordinate."""
        return digest(self._identity(with_state=False))

    @property
    def stateful(self) -> bool:
        """Whether any processor changes when advanced."""
        return any(p.stateful for p in self.processors)

    def __repr__(self) -> str:
        kinds = ", ".join(p.kind for p in self.processors)
        return f"ProcessorChain([{kinds}], vocab_size={self.vocab_size}, softmax={self.softmax.value!r})"

    # --- state ----------------------------------------------------------------------------------------

    def _check_token(self, token: Any) -> int:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < self.vocab_size:
            raise DraftIdOutOfVocabError(f"token {token!r} outside [0, {self.vocab_size})")
        return int(token)

    def advance(self, token: int) -> None:
        """Consume one published token in every processor, in order; refused tokens change nothing."""
        token = self._check_token(token)
        for p in self.processors:
            p.validate_token(token)
        for p in self.processors:
            p.advance(token)

    def advance_many(self, tokens: Iterable[int]) -> None:
        """Consume published tokens in order; all or nothing (a refused token leaves the chain as it was)."""
        staged = [p.clone() for p in self.processors]
        for raw in tokens:
            token = self._check_token(raw)
            for p in staged:
                p.validate_token(token)
            for p in staged:
                p.advance(token)
        self.processors = tuple(staged)

    # --- rows -----------------------------------------------------------------------------------------

    def _check_logits(self, logits: torch.Tensor) -> torch.Tensor | None:
        """Refuse logits ``[N, V]`` of the wrong shape or dtype, or holding NaN or +inf.

        When the chain starts with its greedy arg-max, returns the one-hot rows it writes: that arg-max
        reads every row first, and a NaN or a +inf is its own row's arg-max, so a finite winner in every
        row is the finiteness check (one O(V) pass instead of two). Otherwise, or when some winner is not
        finite, the one reduction below checks the rows and ``None`` is returned.
        """
        if logits.dim() != 2 or logits.shape[-1] != self.vocab_size:
            raise ShapeMismatchError(
                f"logits must be [V] or [N, V] with V = {self.vocab_size}, got {tuple(logits.shape)}"
            )
        if not logits.dtype.is_floating_point:
            raise ShapeMismatchError(f"logits must be floating point, got {logits.dtype}")
        if self._greedy_end() == 0:
            greedy = self.processors[0]
            assert isinstance(greedy, Greedy)
            one_hot = greedy.one_hot(logits)
            if one_hot is not None:
                return one_hot
        if not self._finite_check_deferred():
            _refuse_non_finite(logits)
        return None

    def _finite_check_deferred(self) -> bool:
        """Whether the logits' NaN/+inf check waits for the processed rows' maxima (:meth:`_normalise`).

        True when the rows reach the softmax (no greedy arg-max) through processors that each keep a NaN
        or ``+inf`` logit non-finite: a non-finite input then shows in the processed rows' maxima, which
        the softmax's checks read anyway, and the input is read again only when one is.
        """
        return self._greedy_end() < 0 and all(
            p.keeps_non_finite for p in self.processors if p.transforms_logits
        )

    def _normalise(self, processed: torch.Tensor, unchecked: torch.Tensor | None = None) -> torch.Tensor:
        """Softmax of processed logits ``[n, V]``, refusing rows with no allowed token.

        ``unchecked``: the raw logits when their NaN/+inf check was deferred (:meth:`_finite_check_deferred`);
        they are refused here, before any other finding, exactly when they hold NaN or ``+inf``.
        """
        if processed.shape[0] == 0:
            return processed.clone()
        top = processed.amax(dim=-1).tolist()  # [n] row maxima (NaN when a row holds one)
        if unchecked is not None and not all(value < _POS_INF for value in top):
            _refuse_non_finite(unchecked)
        empty = [row for row, value in enumerate(top) if value == _NEG_INF]
        if empty:
            raise InvalidProcessorError(f"the processors leave no allowed token in rows {empty}")
        if not all(math.isfinite(value) for value in top):
            raise InvalidProcessorError(
                "processing produced NaN or +inf logits (e.g. an extreme temperature)"
            )
        return softmax(processed, self.softmax)

    def _greedy_end(self) -> int:
        """Index of a :class:`Greedy` processor followed only by stop automata (identity on rows), or -1."""
        for index in range(len(self.processors) - 1, -1, -1):
            processor = self.processors[index]
            if isinstance(processor, Greedy):
                return index
            if not isinstance(processor, StopAutomaton):
                return -1
        return -1

    def _finish(
        self, rows: torch.Tensor, apply: Callable[[LogitProcessor, torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """Every processor by ``apply(p, rows)``, then the softmax, on ``[N, V]`` rows.

        When the chain ends in a greedy arg-max (:meth:`_greedy_end`) the rows are one-hot, written
        directly by :meth:`Greedy.one_hot` (the same values the masking and softmax would give).
        """
        greedy = self._greedy_end()
        rest = self.processors
        unchecked = rows if self._finite_check_deferred() else None
        if greedy >= 0:
            for p in self.processors[:greedy]:
                if p.transforms_logits:
                    rows = apply(p, rows)
            last = self.processors[greedy]
            assert isinstance(last, Greedy)
            one_hot = last.one_hot(rows)
            if one_hot is not None:
                return one_hot
            rest = self.processors[greedy:]
        for p in rest:
            if p.transforms_logits:  # an identity (stop sequences) would only copy the rows
                rows = apply(p, rows)
        return self._normalise(rows, unchecked)

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """Processed probabilities at the current state: ``[V] -> [V]`` or ``[N, V] -> [N, V]``."""
        single = logits.dim() == 1
        rows = logits.unsqueeze(0) if single else logits  # [N, V]
        one_hot = self._check_logits(rows)
        probs = one_hot if one_hot is not None else self._finish(rows, lambda p, r: p.apply(r))  # [N, V]
        return probs.squeeze(0) if single else probs

    def rows_along(self, logits: torch.Tensor, path: Sequence[int]) -> torch.Tensor:
        """Row ``i`` of ``logits`` ``[n, V]`` processed at the state advanced over ``path[:i]``.

        Needs ``len(path) >= n - 1`` (later tokens are ignored); returns ``[n, V]`` probabilities and
        leaves ``self`` unchanged. Equal to advancing a clone token by token and calling
        :meth:`distribution` on each row for every path the chain can advance over. After a path token
        a grammar refuses, the following rows are unreachable (that token has probability 0 in its own
        row) and are computed with the grammar held at its last state.
        """
        if logits.dim() != 2:
            raise ShapeMismatchError(f"rows_along needs [n, V] logits, got {tuple(logits.shape)}")
        one_hot = self._check_logits(logits)
        n = logits.shape[0]
        if len(path) < n - 1:
            raise ShapeMismatchError(f"{n} rows need a path of at least {n - 1} tokens, got {len(path)}")
        steps = [self._check_token(t) for t in path[: max(0, n - 1)]]
        if one_hot is not None:
            return one_hot
        return self._finish(logits, lambda p, r: p.apply_along(r, steps))  # [n, V]

    def stop_tokens(self) -> frozenset[int]:
        """Tokens that would end the request if emitted now (union over the stop automata)."""
        found: frozenset[int] = frozenset()
        for p in self.processors:
            if isinstance(p, StopAutomaton):
                found = found.union(p.stop_tokens())
        return found

    def stop_sets_along(self, path: Sequence[int]) -> list[frozenset[int]]:
        """``len(path) + 1`` stop sets: set ``i`` after advancing over ``path[:i]`` (``self`` unchanged)."""
        steps = [self._check_token(t) for t in path]
        sets: list[frozenset[int]] = [frozenset()] * (len(steps) + 1)
        for p in self.processors:
            if isinstance(p, StopAutomaton):
                sets = [a | b for a, b in zip(sets, p.stop_sets_along(steps), strict=True)]
        return sets


def sampling_chain(
    vocab_size: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    frequency_penalty: float | None = None,
    presence_penalty: float | None = None,
    logit_bias: Mapping[int, float] | None = None,
    stop_sequences: Sequence[Sequence[int]] | None = None,
    grammar: TokenGrammar | None = None,
    softmax: SoftmaxBackend | str = SoftmaxBackend.MAX_SHIFT,
) -> ProcessorChain:
    """The usual decoding policy as a chain, in a fixed order.

    Order: logit bias, repetition, frequency and presence penalties, grammar, then temperature (``0``
    means :class:`Greedy`; ``1`` adds nothing), top-k, top-p, min-p, and the stop sequences. ``None``
    leaves a processor out. Under greedy decoding the truncations are left out: they cannot change a
    one-hot row.
    """
    processors: list[LogitProcessor] = []
    if logit_bias:
        processors.append(LogitBias(logit_bias))
    if repetition_penalty is not None:
        processors.append(RepetitionPenalty(repetition_penalty))
    if frequency_penalty is not None:
        processors.append(FrequencyPenalty(frequency_penalty))
    if presence_penalty is not None:
        processors.append(PresencePenalty(presence_penalty))
    if grammar is not None:
        processors.append(grammar)
    if isinstance(temperature, (int, float)) and not isinstance(temperature, bool) and temperature == 0:
        processors.append(Greedy())
    else:
        if temperature != 1.0:
            processors.append(Temperature(temperature))
        if top_k is not None:
            processors.append(TopK(top_k))
        if top_p is not None:
            processors.append(TopP(top_p))
        if min_p is not None:
            processors.append(MinP(min_p))
    if stop_sequences:
        processors.append(StopSequences(stop_sequences))
    return ProcessorChain(processors, vocab_size=vocab_size, softmax=softmax)


def _refuse_non_finite(logits: torch.Tensor) -> None:
    """Refuse logits holding NaN or ``+inf``: one reduction (torch's max propagates NaN)."""
    if logits.numel() and not bool(logits.max() < _POS_INF):
        raise NonFiniteProbabilityError("logits hold NaN or +inf")
