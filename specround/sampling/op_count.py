"""Count the tensor operations a call dispatches (what the sampler's fixed cost is made of).

Each ATen operator that reaches the dispatcher is one count, whatever its size: on CPU each costs a few
microseconds of dispatch, on an accelerator each compute op is a kernel launch. Operators that only make
a new view of existing memory (``view``, ``slice``, ``detach``, ``lift_fresh`` of a numpy array...) are
counted too, and also reported apart: they launch no kernel. Work done with numpy or plain Python is not a
tensor op and is not counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCount", "count_tensor_ops"]


@dataclass(frozen=True, slots=True)
class OpCount:
    """Tensor operations dispatched by one call."""

    total: int
    """Every dispatched operator."""
    views: int
    """Of which view/alias operators (no kernel, no new memory)."""
    by_name: Mapping[str, int]
    """Counts per operator name (e.g. ``index_select``)."""

    @property
    def compute(self) -> int:
        """Operators that compute or copy values (``total - views``)."""
        return self.total - self.views


class _Counter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Dispatch mode that counts operators and passes them through unchanged."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.names: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        self.names[str(func.overloadpacket.__name__)] += 1
        if func.is_view:
            self.views += 1
        return func(*args, **(kwargs or {}))


def count_tensor_ops(call: Callable[[], object]) -> OpCount:
    """Run ``call()`` once and count the tensor operators it dispatched."""
    counter = _Counter()
    with counter:
        call()
    return OpCount(total=sum(counter.names.values()), views=counter.views, by_name=dict(counter.names))
