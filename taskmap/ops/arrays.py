"""Arrays in and out of ``taskmap.ops``: numpy arrays, torch tensors and taskmap Tensors.

An operator returns the same kind of array it was given, on the same device: ``describe`` reads
what came in, ``empty_like_kind`` allocates the output, ``target_kind`` says which backend runs
it ("cpu" for numpy and CPU tensors, "cuda"/"hip" for GPU tensors).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import LaunchError
from ..runtime.args import array_info, is_torch_tensor
from ..runtime.tensor import Tensor, empty, host_empty


@dataclass(frozen=True)
class ArrayKind:
    """Where inputs live and what kind of object they are: the output is made the same way."""

    library: str   # "numpy" | "torch" | "taskmap"
    device: str    # "cpu" | "cuda:N" | "hip:N"

    @property
    def target(self) -> str:
        return self.device.partition(":")[0]


def describe(*arrays: Any) -> ArrayKind:
    """The common kind of the array arguments (LaunchError if they disagree on the device)."""
    kinds = set()
    for a in arrays:
        info = array_info(a)
        if info is None:
            raise LaunchError(f"expected numpy arrays, torch tensors or taskmap Tensors, got {type(a).__name__}")
        lib = "numpy" if isinstance(a, np.ndarray) else "torch" if is_torch_tensor(a) else \
            "taskmap" if isinstance(a, Tensor) else "other"
        kinds.add((lib, info.device))
    devices = {d for _, d in kinds}
    if len(devices) > 1:
        raise LaunchError(f"arguments are on different devices: {sorted(devices)}")
    libs = {lib for lib, _ in kinds}
    library = "torch" if "torch" in libs else "taskmap" if "taskmap" in libs else "numpy"
    return ArrayKind(library, devices.pop())


def empty_like_kind(kind: ArrayKind, shape: Sequence[int], dtype: str) -> Any:
    """A new, uninitialised C-contiguous array of ``kind``."""
    shape = tuple(int(s) for s in shape)
    if kind.library == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=getattr(torch, dtype), device=kind.device)
    if kind.library == "taskmap" or kind.device != "cpu":
        return empty(shape, dtype, device=kind.device)
    if dtype == "bfloat16":
        raise LaunchError("numpy has no bfloat16: pass torch tensors for bf16")
    return host_empty(shape, dtype)      # on a cache line, as PyTorch's CPU tensors


def dtype_of(a: Any) -> str:
    info = array_info(a)
    assert info is not None
    return info.dtype


def shape_of(a: Any) -> tuple[int, ...]:
    info = array_info(a)
    assert info is not None
    return info.shape


def contiguous(a: Any) -> Any:
    """``a`` if C-contiguous, else a contiguous copy of the same kind (ops accept strided inputs)."""
    info = array_info(a)
    if info is None or info.contiguous:
        return a
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    if is_torch_tensor(a):
        return a.contiguous()
    raise LaunchError(f"{type(a).__name__} argument is not C-contiguous")
