"""The device a bench runs on: checked by name, named in its report, and waited for at each timed end.

The benches time CPU tensors by default. On an accelerator a torch call returns once its kernels are
queued, so a timed operation must wait for the device's queue before its clock stops
(:func:`synchronizer`), and the report names the device it ran on (:func:`device_name`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

__all__ = ["bench_device", "device_name", "synchronizer"]


def bench_device(name: str) -> torch.device:
    """The torch device a bench runs on, refused (:class:`ValueError`) when torch cannot use it here."""
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: {exc}") from None
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ValueError(f"device {name!r}: the benches run on 'cpu' or 'cuda[:N]'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r}: torch sees no CUDA device on this machine")
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not 0 <= index < torch.cuda.device_count():
        raise ValueError(f"device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device("cuda", index)


def device_name(device: torch.device) -> str:
    """``cpu``, or the accelerator's index and name (``cuda:0 NVIDIA H200``) for the report."""
    if device.type == "cpu":
        return "cpu"
    return f"{device} {torch.cuda.get_device_name(device)}"


def synchronizer(device: torch.device) -> Callable[[], None]:
    """What ends a timed operation: nothing on the CPU, waiting for the device's queue on an accelerator."""
    if device.type == "cpu":
        return _nothing
    return partial(torch.cuda.synchronize, device)


def _nothing() -> None:
    """No work (the CPU's synchronisation)."""
