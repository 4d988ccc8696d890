"""Stateless processors: temperature, greedy, top-k, top-p, min-p and additive logit bias.

Each maps logit rows ``[N, V]`` to new rows ``[N, V]`` (never in place) and depends only on its declared
parameters, so a chain applies it to every row of a round at once. Truncation decisions (greedy, top-k,
top-p, min-p) break ties by the lower token id, so they are deterministic on every device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.base import LogitProcessor
from specround.sampling.processors.params import check_keys, integer, real, token_id

__all__ = [
    "Greedy",
    "LogitBias",
    "MinP",
    "Temperature",
    "TopK",
    "TopP",
]

_NEG_INF = float("-inf")


def _no_state(kind: str, state: dict[str, Any]) -> None:
    if state:
        raise InvalidProcessorError(f"{kind} is stateless but was given state {state!r}")


def _keep(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``logits`` where ``keep`` (bool, same shape), ``-inf`` elsewhere."""
    return logits.masked_fill(~keep, _NEG_INF)


class Temperature(LogitProcessor):
    """Divide logits by ``temperature > 0`` (``temperature = 0`` is :class:`Greedy`, a separate kind)."""

    kind: ClassVar[str] = "temperature"

    def __init__(self, temperature: float) -> None:
        self.temperature = real(self.kind, "temperature", temperature, low=0.0, low_open=True)

    def params(self) -> dict[str, Any]:
        """``{"temperature": t}``."""
        return {"temperature": self.temperature}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits / t`` (``[N, V]``)."""
        return logits / self.temperature

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        check_keys(cls.kind, params, {"temperature"})
        _no_state(cls.kind, state)
        return cls(params["temperature"])


class Greedy(LogitProcessor):
    """Keep only the arg-max logit (lowest token id on ties): the processed row is an exact one-hot."""

    kind: ClassVar[str] = "greedy"

    def params(self) -> dict[str, Any]:
        """No parameters."""
        return {}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``0`` at each row's first arg-max, ``-inf`` elsewhere (``[N, V]``); all ``-inf`` rows stay so."""
        winner = logits.argmax(dim=-1, keepdim=True)  # [N, 1]; torch returns the first maximal index
        best = logits.gather(-1, winner)  # [N, 1]
        mark = torch.where(torch.isfinite(best), torch.zeros_like(best), best)
        return torch.full_like(logits, _NEG_INF).scatter(-1, winner, mark)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild (no parameters)."""
        check_keys(cls.kind, params, set())
        _no_state(cls.kind, state)
        return cls()


class TopK(LogitProcessor):
    """Keep the ``k`` largest logits of each row (``k >= 1``); at the boundary, lower token ids win ties."""

    kind: ClassVar[str] = "top_k"

    def __init__(self, k: int) -> None:
        self.k = integer(self.kind, "k", k, low=1)

    def params(self) -> dict[str, Any]:
        """``{"k": k}``."""
        return {"k": self.k}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask everything but the top ``k`` of each row to ``-inf`` (``[N, V]``)."""
        vocab = logits.shape[-1]
        if self.k >= vocab:
            return logits.clone()
        kth = torch.topk(logits, self.k, dim=-1).values[..., -1:]  # [N, 1] the k-th largest value
        above = logits > kth  # [N, V]
        at = logits == kth
        room = self.k - above.sum(dim=-1, keepdim=True)  # [N, 1] slots left for values equal to kth
        keep = above | (at & (at.cumsum(dim=-1) <= room))
        return _keep(logits, keep)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        check_keys(cls.kind, params, {"k"})
        _no_state(cls.kind, state)
        return cls(params["k"])


def _probabilities64(logits: torch.Tensor) -> torch.Tensor:
    """Max-shift softmax in float64 (``[N, V]``): truncation thresholds are decided in one precision."""
    x = logits.to(torch.float64)
    m = x.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    return e / e.sum(dim=-1, keepdim=True)


class TopP(LogitProcessor):
    """Nucleus truncation: keep the smallest set of highest-probability tokens whose mass is ``>= p``.

    Tokens are ranked by probability, ties by ascending token id; a token is kept when the mass ranked
    strictly before it is still ``< p``. Probabilities are computed in float64 whatever the row dtype.
    ``p = 1`` keeps every token.
    """

    kind: ClassVar[str] = "top_p"

    def __init__(self, p: float) -> None:
        self.p = real(self.kind, "p", p, low=0.0, high=1.0, low_open=True)

    def params(self) -> dict[str, Any]:
        """``{"p": p}``."""
        return {"p": self.p}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the tokens outside each row's nucleus to ``-inf`` (``[N, V]``)."""
        if self.p >= 1.0:
            return logits.clone()
        probs = _probabilities64(logits)  # [N, V]
        # Stable descending sort keeps equal probabilities in ascending token-id order.
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # [N, V] mass ranked strictly before
        keep_sorted = mass_before < self.p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        return _keep(logits, keep)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        check_keys(cls.kind, params, {"p"})
        _no_state(cls.kind, state)
        return cls(params["p"])


class MinP(LogitProcessor):
    """Keep tokens whose probability is at least ``p`` times the row's largest probability (``0 <= p <= 1``).

    The ratio ``prob / max_prob = exp(logit - max_logit)`` is evaluated in float64; ``p = 0`` keeps every
    token and ``p = 1`` keeps exactly the tokens tied for the maximum.
    """

    kind: ClassVar[str] = "min_p"

    def __init__(self, p: float) -> None:
        self.p = real(self.kind, "p", p, low=0.0, high=1.0)

    def params(self) -> dict[str, Any]:
        """``{"p": p}``."""
        return {"p": self.p}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask tokens below ``p * max_prob`` to ``-inf`` (``[N, V]``)."""
        if self.p <= 0.0:
            return logits.clone()
        x = logits.to(torch.float64)
        m = x.amax(dim=-1, keepdim=True)  # [N, 1]
        ratio = torch.exp(x - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))
        return _keep(logits, ratio >= self.p)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        check_keys(cls.kind, params, {"p"})
        _no_state(cls.kind, state)
        return cls(params["p"])


class LogitBias(LogitProcessor):
    """Add a finite bias to the logits of chosen tokens (``{token: bias}``)."""

    kind: ClassVar[str] = "logit_bias"

    def __init__(self, bias: Mapping[Any, Any] | Sequence[Sequence[Any]]) -> None:
        pairs = bias.items() if isinstance(bias, Mapping) else bias
        table: dict[int, float] = {}
        for pair in pairs:
            if len(pair) != 2:
                raise InvalidProcessorError(f"{self.kind}: expected (token, bias) pairs, got {pair!r}")
            token = token_id(self.kind, pair[0])
            if token in table:
                raise InvalidProcessorError(f"{self.kind}: token {token} is biased twice")
            table[token] = real(self.kind, "bias", pair[1])
        self.bias = dict(sorted(table.items()))
        self._tokens = torch.tensor(list(self.bias), dtype=torch.int64)  # [M]
        self._values = torch.tensor(list(self.bias.values()), dtype=torch.float64)  # [M]

    def params(self) -> dict[str, Any]:
        """``{"bias": [[token, bias], ...]}`` sorted by token (JSON objects cannot have int keys)."""
        return {"bias": [[token, value] for token, value in self.bias.items()]}

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse biased tokens outside the vocabulary."""
        if self.bias and max(self.bias) >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {max(self.bias)} outside vocab {vocab_size}")

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` with the biases added to their tokens' columns (``[N, V]``)."""
        out = logits.clone()
        if self.bias:
            tokens = self._tokens.to(logits.device)
            out[..., tokens] += self._values.to(device=logits.device, dtype=logits.dtype)
        return out

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        check_keys(cls.kind, params, {"bias"})
        _no_state(cls.kind, state)
        if not isinstance(params["bias"], (list, tuple, Mapping)):
            raise InvalidProcessorError(f"{cls.kind}: bias must be a list of pairs or a mapping")
        return cls(params["bias"])
