"""Validation of declared processor parameters: bad values raise :class:`InvalidProcessorError`.

Values are normalised to canonical JSON types (``float`` for reals, ``int`` for integers) so that a chain's
digest does not change when its spec takes a round trip through JSON.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from typing import Any

from specround.errors import InvalidProcessorError

__all__ = ["check_keys", "integer", "real", "spec_arguments", "token_id"]


def check_keys(
    kind: str, given: dict[str, Any], required: Collection[str], optional: Collection[str] = ()
) -> None:
    """Refuse a params/state mapping with missing or unknown keys."""
    keys = set(given)
    missing = set(required) - keys
    unknown = keys - set(required) - set(optional)
    if missing or unknown:
        raise InvalidProcessorError(
            f"{kind}: missing keys {sorted(missing)}, unknown keys {sorted(unknown)}"
            if missing and unknown
            else f"{kind}: missing keys {sorted(missing)}"
            if missing
            else f"{kind}: unknown keys {sorted(unknown)}"
        )


def spec_arguments(
    kind: str, params: dict[str, Any], param_keys: Sequence[str], state: dict[str, Any], state_key: str
) -> list[Any]:
    """A processor's constructor arguments: ``params`` in ``param_keys`` order, then its one state value.

    The state value is appended only when ``state`` is non-empty (``{}`` is the fresh state); both mappings
    must hold exactly their keys.
    """
    check_keys(kind, params, param_keys)
    arguments = [params[key] for key in param_keys]
    if state:
        check_keys(kind, state, {state_key})
        arguments.append(state[state_key])
    return arguments


def real(
    kind: str,
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """A finite real number in ``[low, high]`` (``(low, high]`` when ``low_open``), as ``float``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidProcessorError(f"{kind}: {name} must be a number, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidProcessorError(f"{kind}: {name} must be finite, got {value!r}")
    if low is not None and (number <= low if low_open else number < low):
        bound = f"> {low}" if low_open else f">= {low}"
        raise InvalidProcessorError(f"{kind}: {name} must be {bound}, got {value!r}")
    if high is not None and number > high:
        raise InvalidProcessorError(f"{kind}: {name} must be <= {high}, got {value!r}")
    return number


def integer(kind: str, name: str, value: Any, *, low: int | None = None) -> int:
    """An integer ``>= low`` (bools refused), as ``int``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidProcessorError(f"{kind}: {name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise InvalidProcessorError(f"{kind}: {name} must be >= {low}, got {value!r}")
    return int(value)


def token_id(kind: str, value: Any) -> int:
    """A token id (a non-negative integer; the upper bound is checked against the chain's vocabulary)."""
    return integer(kind, "token id", value, low=0)
