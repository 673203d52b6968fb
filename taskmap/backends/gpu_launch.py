"""The launcher shared by the CUDA and HIP backends: typed argument packing, loading the module on
each device it is launched on (on first use), the opt-in for more than 48 KB of dynamic shared
memory, a check of the launch's resources against the loaded function, and the launch on the
caller's stream."""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..ir.dtypes import f16
from ..ir.func import Function
from ..ir.types import TensorType
from .base import ctypes_type

#: Dynamic shared memory a kernel may use without opting in.
DEFAULT_SMEM_LIMIT = 48 * 1024

#: ``check(function, block, smem_bytes, device)``: raise LaunchError when the launch cannot run.
ResourceCheck = Callable[[Any, tuple[int, int, int], int, int], None]


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


@dataclass
class _Loaded:
    function: Any
    smem_opted_in: int = DEFAULT_SMEM_LIMIT


class GpuLauncher:
    """Launches one kernel through a driver's ``launch`` (CUDA or HIP) on any device of that kind.

    ``load(device)`` returns the kernel's function handle on ``device`` (loading the module
    there); it is called once per device, at the first launch on it.
    """

    def __init__(self, func: Function, load: Callable[[int], Any], launch: Callable[..., None],
                 set_max_dynamic_shared: Callable[[Any, int], None] | None = None,
                 check_resources: ResourceCheck | None = None,
                 extra_args: Callable[[Sequence[Any], int], list[Any]] | None = None) -> None:
        self.func = func
        self._extra = extra_args      # arguments after the sizes (CUDA's tensor maps), from (values, device)
        self._load = load
        self._launch = launch
        self._set_smem = set_max_dynamic_shared
        self._check = check_resources
        self._loaded: dict[int, _Loaded] = {}
        self._lock = threading.Lock()

    def function(self, device: int = 0) -> Any:
        """The function handle on ``device``, loading the module there on first use."""
        return self._entry(device).function

    def _entry(self, device: int) -> _Loaded:
        entry = self._loaded.get(device)
        if entry is None:
            with self._lock:
                entry = self._loaded.get(device)
                if entry is None:
                    entry = self._loaded[device] = _Loaded(self._load(device))
        return entry

    def __call__(self, values: Sequence[Any], grid: tuple[int, int, int], block: tuple[int, int, int],
                 smem_bytes: int, stream: Any, device: int = 0) -> int:
        entry = self._entry(device)
        if self._check is not None:
            self._check(entry.function, tuple(block), smem_bytes, device)
        if smem_bytes > entry.smem_opted_in and self._set_smem is not None:
            self._set_smem(entry.function, smem_bytes)
            entry.smem_opted_in = smem_bytes
        args = pack_values(self.func, values)
        if self._extra is not None:
            args += self._extra(values, device)
        self._launch(entry.function, grid, block, smem_bytes, stream, args)
        return 0
