"""Stateful penalties over the tokens a processor was advanced over (published ones, contract#reached-events).

* ``repetition_penalty`` (Hugging Face style): for every seen token, a positive logit is divided by the
  penalty and a non-positive one multiplied by it.
* ``frequency_penalty`` and ``presence_penalty`` (OpenAI style): subtract ``f * count`` and
  ``p * [count > 0]``.

State is the token counts (a dict), so :meth:`advance` is O(1) and :meth:`clone` is O(distinct tokens
seen); applying touches only the seen tokens' columns. :meth:`apply_along` builds every row of a round in
one vectorised pass over the tokens seen by the start state or on the path.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar, Self

import torch

from specround.errors import InvalidProcessorError
from specround.sampling.processors.params import check_keys, integer, real, token_id
from specround.sampling.processors.processor import LogitProcessor

__all__ = ["FrequencyPenalty", "PresencePenalty", "RepetitionPenalty", "TokenCountPenalty"]


class TokenCountPenalty(LogitProcessor):
    """Common part of the penalties: one declared strength and the counts of tokens advanced over."""

    stateful: ClassVar[bool] = True
    param_name: ClassVar[str]
    """Name of the strength in :meth:`params`."""

    def __init__(self, strength: float, counts: Iterable[tuple[int, int]] = ()) -> None:
        self.strength = self._check_strength(strength)
        self.counts: dict[int, int] = {}
        for token, count in counts:
            t = token_id(self.kind, token)
            c = integer(self.kind, "count", count, low=1)
            if t in self.counts:
                raise InvalidProcessorError(f"{self.kind}: token {t} counted twice in state")
            self.counts[t] = c

    @classmethod
    @abstractmethod
    def _check_strength(cls, value: Any) -> float:
        """Validate the declared strength."""

    @abstractmethod
    def _penalise(self, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Penalised logits ``[..., M]`` of tokens with counts ``[..., M]`` (a count may be 0)."""

    def params(self) -> dict[str, Any]:
        """``{param_name: strength}``."""
        return {self.param_name: self.strength}

    def state(self) -> dict[str, Any]:
        """``{"counts": [[token, count], ...]}`` sorted by token."""
        return {"counts": [[token, self.counts[token]] for token in sorted(self.counts)]}

    def advance(self, token: int) -> None:
        """Count one more occurrence of ``token``."""
        self.counts[token] = self.counts.get(token, 0) + 1

    def clone(self) -> Self:
        """An independent copy (copies the counts dict, nothing O(V))."""
        twin = object.__new__(type(self))
        twin.strength = self.strength
        twin.counts = dict(self.counts)
        return twin

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalise the seen tokens' columns of every row (``[N, V]`` -> ``[N, V]``)."""
        return self.apply_along(logits, [0] * max(0, logits.shape[0] - 1), advance_rows=False)

    def apply_along(
        self, logits: torch.Tensor, path: Sequence[int], *, advance_rows: bool = True
    ) -> torch.Tensor:
        """Row ``i`` penalised with the counts after ``path[:i]`` (``[n, V]`` -> ``[n, V]``).

        ``advance_rows=False`` penalises every row with the current counts (what :meth:`apply` does).
        """
        n = logits.shape[0]
        steps = list(path[: max(0, n - 1)]) if advance_rows else []
        touched = sorted(set(self.counts) | set(steps))
        out = logits.clone()
        if not touched or n == 0:
            return out
        column = {token: j for j, token in enumerate(touched)}
        counts = torch.zeros((n, len(touched)), dtype=torch.int64)  # [n, M]
        base = torch.tensor([self.counts.get(token, 0) for token in touched], dtype=torch.int64)
        counts += base
        if steps:
            # Row i sees path[:i]: a one-hot per step, cumulated and shifted down by one row.
            step_hits = torch.zeros((n, len(touched)), dtype=torch.int64)
            step_hits[torch.arange(1, len(steps) + 1), [column[t] for t in steps]] = 1
            counts += step_hits.cumsum(dim=0)
        index = torch.tensor(touched, dtype=torch.int64, device=logits.device)
        values = logits[:, index]  # [n, M]
        out[:, index] = self._penalise(values, counts.to(logits.device))
        return out

    @classmethod
    def from_spec(cls, params: dict[str, Any], state: dict[str, Any]) -> Self:
        """Rebuild from :meth:`params` and :meth:`state` (``{}`` state: nothing seen yet)."""
        check_keys(cls.kind, params, {cls.param_name})
        if state:
            check_keys(cls.kind, state, {"counts"})
            pairs = state["counts"]
            if not isinstance(pairs, (list, tuple)) or any(
                not isinstance(p, (list, tuple)) or len(p) != 2 for p in pairs
            ):
                raise InvalidProcessorError(f"{cls.kind}: counts must be [[token, count], ...]")
            return cls(params[cls.param_name], [(p[0], p[1]) for p in pairs])
        return cls(params[cls.param_name])

    def validate_vocab(self, vocab_size: int) -> None:
        """Refuse counted tokens outside the vocabulary."""
        if self.counts and max(self.counts) >= vocab_size:
            raise InvalidProcessorError(f"{self.kind}: token {max(self.counts)} outside vocab {vocab_size}")


class RepetitionPenalty(TokenCountPenalty):
    """Hugging Face repetition penalty ``> 0``: seen positive logits ``/ penalty``, others ``* penalty``."""

    kind: ClassVar[str] = "repetition_penalty"
    param_name: ClassVar[str] = "penalty"

    @classmethod
    def _check_strength(cls, value: Any) -> float:
        return real(cls.kind, cls.param_name, value, low=0.0, low_open=True)

    def _penalise(self, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        penalised = torch.where(values > 0, values / self.strength, values * self.strength)
        return torch.where(counts > 0, penalised, values)


class _SubtractedPenalty(TokenCountPenalty):
    """The OpenAI penalties: a ``penalty`` of any real value, subtracted from seen tokens' logits."""

    param_name: ClassVar[str] = "penalty"

    @classmethod
    def _check_strength(cls, value: Any) -> float:
        return real(cls.kind, cls.param_name, value)


class FrequencyPenalty(_SubtractedPenalty):
    """OpenAI frequency penalty: subtract ``penalty * count`` from each seen token's logit."""

    kind: ClassVar[str] = "frequency_penalty"

    def _penalise(self, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return values - self.strength * counts.to(values.dtype)


class PresencePenalty(_SubtractedPenalty):
    """OpenAI presence penalty: subtract ``penalty`` once from each seen token's logit."""

    kind: ClassVar[str] = "presence_penalty"

    def _penalise(self, values: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return values - self.strength * (counts > 0).to(values.dtype)
