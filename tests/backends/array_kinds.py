"""Array kinds the GPU-run kernel tests launch with, and conversions to and from numpy.

``numpy`` and ``taskmap-cpu`` run the kernels on the CPU backend (everywhere: they check the
tests' own expectations); ``torch-cuda`` and ``taskmap-cuda`` run them on an NVIDIA GPU (marked
``cuda``, skipped without one).  bfloat16 data is given and returned as float32 numpy arrays.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import taskmap

CPU = ("numpy", "taskmap-cpu")
GPU = ("torch-cuda", "taskmap-cuda")


def is_gpu(kind: str) -> bool:
    return kind.endswith("cuda")


def cases(values: list[Any] | None = None, kinds: tuple[str, ...] = CPU + GPU) -> list[Any]:
    """``pytest.param(value, kind)`` for each value and kind, GPU kinds marked ``cuda``; use with
    ``parametrize("name, kind", cases(values))``, or ``parametrize("kind", cases())``."""
    out = []
    for v in values if values is not None else [None]:
        head = () if values is None else (v,)
        for kind in kinds:
            out.append(pytest.param(*head, kind, marks=[pytest.mark.cuda] if is_gpu(kind) else [],
                                    id="-".join([*map(str, head), kind])))
    return out


KINDS = cases()
GPU_KINDS = cases(kinds=GPU)


def put(x: np.ndarray, kind: str, dtype: str | None = None) -> Any:
    """``x`` as an array of ``kind`` (``dtype`` converts, e.g. "bfloat16" from float32 values)."""
    dtype = dtype or x.dtype.name
    if kind == "numpy":
        if dtype == "bfloat16":
            torch = pytest.importorskip("torch", reason="bfloat16 arrays on the CPU come from torch")
            return torch.from_numpy(np.ascontiguousarray(x, np.float32)).to(torch.bfloat16)
        return np.ascontiguousarray(x, dtype)
    if kind.startswith("taskmap"):
        return taskmap.tensor(x, device=kind.split("-")[1], dtype=dtype)
    import torch

    t = torch.from_numpy(np.ascontiguousarray(x, np.float32 if dtype == "bfloat16" else dtype))
    return t.to(torch.bfloat16).cuda() if dtype == "bfloat16" else t.cuda()


def empty(shape: Any, kind: str, dtype: str = "float32", fill: float | None = np.nan) -> Any:
    """An output array of ``kind``, filled with ``fill`` (NaN: untouched elements stay visible)."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    host = np.full(shape, fill if fill is not None else 0, np.float32 if dtype == "bfloat16" else dtype)
    return put(host, kind, dtype)


def get(x: Any) -> np.ndarray:
    """A numpy copy of any kind (waits for the GPU); bfloat16 comes back as float32."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, taskmap.Tensor):
        return x.numpy()
    t = x.detach().cpu()
    return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
