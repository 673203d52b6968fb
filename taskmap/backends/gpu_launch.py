"""The launcher shared by the CUDA and HIP backends: typed argument packing, the opt-in for more
than 48 KB of dynamic shared memory, and the launch on the caller's stream."""
from __future__ import annotations

import ctypes
from typing import Any, Callable, Sequence

import numpy as np

from ..ir.dtypes import f16
from ..ir.func import Function
from ..ir.types import TensorType
from .base import ctypes_type

#: Dynamic shared memory a kernel may use without opting in.
DEFAULT_SMEM_LIMIT = 48 * 1024


def pack_values(func: Function, values: Sequence[Any]) -> list[Any]:
    """Typed kernel arguments (ctypes / numpy scalars) for the parameters and sizes."""
    out: list[Any] = []
    for p, v in zip(func.params, values):
        if isinstance(p.type, TensorType):
            out.append(ctypes.c_void_p(int(v)))
        elif p.type is f16:
            out.append(np.float16(v))           # __half is passed as its 2 bytes
        else:
            out.append(ctypes_type(p.type)(v))
    out += [ctypes.c_int32(int(v)) for v in values[len(func.params):]]
    return out


class GpuLauncher:
    """Launches one kernel function through a driver's ``launch`` (CUDA or HIP)."""

    def __init__(self, function: Any, func: Function, launch: Callable[..., None],
                 set_max_dynamic_shared: Callable[[Any, int], None] | None) -> None:
        self.function = function
        self.func = func
        self._launch = launch
        self._set_smem = set_max_dynamic_shared
        self._smem_opted_in = DEFAULT_SMEM_LIMIT

    def __call__(self, values: Sequence[Any], grid: tuple[int, int, int], block: tuple[int, int, int],
                 smem_bytes: int, stream: Any) -> int:
        if smem_bytes > self._smem_opted_in and self._set_smem is not None:
            self._set_smem(self.function, smem_bytes)
            self._smem_opted_in = smem_bytes
        self._launch(self.function, grid, block, smem_bytes, stream, pack_values(self.func, values))
        return 0
