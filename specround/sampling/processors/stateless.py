"""Stateless processors: temperature, greedy, top-k, top-p, min-p and additive logit bias.

Each maps logit rows ``[N, V]`` to new rows ``[N, V]`` (never in place) and depends only on its declared
parameters, so a chain applies it to every row of a round at once. Truncation decisions (greedy, top-k,
top-p, min-p) break ties by the lower token id, so they are deterministic on every device.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, integer, real, token_id
from specround.sampling.processors.processor import LogitProcessor

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


def _stateless_arguments(
    kind: str, params: dict[str, Any], param_keys: Sequence[str], state: dict[str, Any]
) -> list[Any]:
    """A stateless processor's constructor arguments: ``params`` in ``param_keys`` order, ``state`` empty."""
    check_keys(kind, params, param_keys)
    _no_state(kind, state)
    return [params[key] for key in param_keys]


def _keep(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``logits`` where ``keep`` (bool, same shape), ``-inf`` elsewhere."""
    return logits.masked_fill(~keep, _NEG_INF)


class Temperature(LogitProcessor):
    """Divide logits by ``temperature > 0`` (``temperature = 0`` is :class:`Greedy`, a separate kind)."""

    kind: ClassVar[str] = "temperature"
    keeps_non_finite: ClassVar[bool] = True  # t > 0: NaN / t is NaN, +inf / t is +inf

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
        return cls(*_stateless_arguments(cls.kind, params, ("temperature",), state))


class Greedy(LogitProcessor):
    """Keep only the arg-max logit (lowest token id on ties): the processed row is an exact one-hot."""

    kind: ClassVar[str] = "greedy"

    def params(self) -> dict[str, Any]:
        """No parameters."""
        return {}

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``0`` at each row's first arg-max, ``-inf`` elsewhere (``[N, V]``); all ``-inf`` rows stay so."""
        winner = _first_argmax(logits)  # [N, 1]
        best = logits.gather(-1, winner)  # [N, 1]
        mark = torch.where(torch.isfinite(best), torch.zeros_like(best), best)
        return torch.full_like(logits, _NEG_INF).scatter(-1, winner, mark)

    def one_hot(self, logits: torch.Tensor) -> torch.Tensor | None:
        """The normalised rows of :meth:`apply`: ``1`` at each row's first arg-max, ``0`` elsewhere.

        Softmax of :meth:`apply`'s row is exactly this one-hot (``exp(0) / 1`` and ``exp(-inf)``), so a
        chain whose rows end here skips the O(V) masking and softmax passes. ``None`` when some row's
        maximum is not finite: the chain then takes the general path, which refuses that row by name.
        """
        winner = _first_argmax(logits)  # [N, 1]
        if not bool(torch.isfinite(logits.gather(-1, winner)).all()):
            return None
        return torch.zeros_like(logits).scatter_(-1, winner, 1.0)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild (no parameters)."""
        return cls(*_stateless_arguments(cls.kind, params, (), state))


def _first_argmax(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first arg-max ``[N, 1]`` (int64); numpy's for CPU float32/float64 rows, torch's otherwise.

    Both return the first maximal index of a row (and a NaN's, which the chain has refused before); numpy's
    vectorised scan is several times faster than torch's row-by-row reduction on CPU.
    """
    if logits.device.type == "cpu" and logits.dtype in (torch.float32, torch.float64) and logits.numel():
        found = logits.detach().numpy().argmax(axis=-1)  # [N]
        return torch.from_numpy(found).to(torch.int64).unsqueeze(-1)
    return logits.argmax(dim=-1, keepdim=True)


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
        keep = logits >= kth  # [N, V]
        if bool((keep.sum(dim=-1) == self.k).all()):  # no surplus ties at the k-th value
            return _keep(logits, keep)
        above = logits > kth
        at = logits == kth
        room = self.k - above.sum(dim=-1, keepdim=True)  # [N, 1] slots left for values equal to kth
        return _keep(logits, above | (at & (at.cumsum(dim=-1) <= room)))

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        return cls(*_stateless_arguments(cls.kind, params, ("k",), state))


_NUCLEUS_TIERS = (1024, 8192)
"""Top-p ranks this many candidates per row first, then more, before falling back to a full sort."""


def _rank_stably(values: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Order candidates ``[N, k]`` by value descending, then id ascending; returns (values, ids)."""
    ids_sorted, perm = ids.sort(dim=-1)
    values_by_id = values.gather(-1, perm)
    ranked_values, perm2 = torch.sort(values_by_id, dim=-1, descending=True, stable=True)
    return ranked_values, ids_sorted.gather(-1, perm2)


class TopP(LogitProcessor):
    """Nucleus truncation: keep the smallest set of highest-probability tokens whose mass is ``>= p``.

    Tokens are ranked by probability, ties by ascending token id; a token is kept when the mass ranked
    strictly before it is still ``< p``. Probabilities are ``exp(x - max) / sum`` in float64 whatever the
    row dtype. ``p = 1`` keeps every token.

    Ranking all ``V`` tokens costs a sort per row; the nucleus is usually small, so the top 1024 (then
    8192) candidates are ranked first. A candidate answer is provably the full one when the last kept
    candidate's logit is strictly above the smallest candidate logit (every token outside the candidates
    ranks after it); other rows go to the next tier and finally to a ranking of every allowed (finite)
    token, which is all that can be kept (after top-k, that is only k tokens). Every path gives the
    same mask.
    """

    kind: ClassVar[str] = "top_p"

    def __init__(self, p: float) -> None:
        self.p = real(self.kind, "p", p, low=0.0, high=1.0, low_open=True)

    def params(self) -> dict[str, Any]:
        """``{"p": p}``."""
        return {"p": self.p}

    def _nucleus(
        self, ids: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor, total: torch.Tensor
    ) -> torch.Tensor:
        """Keep flags ``[r, k]`` of ranked candidate ``ids`` of ``rows`` (``weights = exp(x - max)``)."""
        probs = weights[rows.unsqueeze(-1), ids] / total[rows]  # [r, k]
        mass_before = probs.cumsum(dim=-1) - probs
        return mass_before < self.p

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask the tokens outside each row's nucleus to ``-inf`` (``[N, V]``)."""
        if self.p >= 1.0 or logits.shape[0] == 0:
            return logits.clone()
        vocab = logits.shape[-1]
        x = logits.to(torch.float64)  # [N, V]
        m = x.amax(dim=-1, keepdim=True)
        weights = torch.exp(x - torch.where(torch.isfinite(m), m, torch.zeros_like(m)))  # [N, V]
        total = weights.sum(dim=-1, keepdim=True)  # [N, 1]
        # Only finite logits can be kept, so ranking the `allowed` largest of each row is a full ranking.
        allowed = int(torch.isfinite(x).sum(dim=-1).max())
        if allowed == 0:
            return logits.clone()
        keep = torch.zeros(x.shape, dtype=torch.bool, device=x.device)  # [N, V]
        pending = torch.arange(x.shape[0], device=x.device)  # rows whose nucleus is not settled yet
        for k in (*(t for t in _NUCLEUS_TIERS if t < allowed), allowed):
            rows = logits[pending]  # [r, V] (ranking the input dtype: the same order as float64)
            if k < vocab:
                top_values, top_ids = torch.topk(rows, k, dim=-1)  # [r, k]
                values, ids = _rank_stably(top_values, top_ids)
            else:  # a stable sort of all ids (already ascending) ranks ties by ascending id
                values, ids = torch.sort(rows, dim=-1, descending=True, stable=True)
            keep_ranked = self._nucleus(ids, pending, weights, total)  # [r, k], a True prefix
            if k < allowed:
                kept = keep_ranked.sum(dim=-1, keepdim=True)  # [r, 1]
                last_kept_value = values.gather(-1, (kept - 1).clamp(min=0))
                settled = ((kept < k) & (last_kept_value > values[..., -1:])).flatten()
            else:
                settled = torch.ones(pending.shape, dtype=torch.bool, device=x.device)
            done = pending[settled]
            keep[done] = torch.zeros_like(keep[done]).scatter(-1, ids[settled], keep_ranked[settled])
            pending = pending[~settled]
            if pending.numel() == 0:
                break
        return _keep(logits, keep)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        return cls(*_stateless_arguments(cls.kind, params, ("p",), state))


class MinP(LogitProcessor):
    """Keep tokens whose probability is at least ``p`` times the row's largest (``0 <= p <= 1``).

    Evaluated in logit space: a token is kept when ``logit >= max_logit + ln(p)``, compared in float64 (the
    ratio ``prob / max_prob = exp(logit - max_logit)``, without ``V`` exponentials). ``p = 0`` keeps every
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
        threshold = x.amax(dim=-1, keepdim=True) + math.log(self.p)  # [N, 1]
        return _keep(logits, x >= threshold)

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params`."""
        return cls(*_stateless_arguments(cls.kind, params, ("p",), state))


class LogitBias(LogitProcessor):
    """Add a finite bias to the logits of chosen tokens (``{token: bias}``)."""

    kind: ClassVar[str] = "logit_bias"
    keeps_non_finite: ClassVar[bool] = True  # b is finite: NaN + b is NaN, +inf + b is +inf

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
