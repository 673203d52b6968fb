"""The backend interface and the ``Target`` every other layer reads capabilities from.

A backend is three steps: ``render(module, target) -> source``, ``build(source, target) ->
Binary`` and ``load(binary) -> callable``.  Code outside ``backends/`` reads ``Target`` fields
(warp size, shared memory, vector width, ...) and never branches on a backend's name.
"""
from __future__ import annotations

import ctypes
import enum
import os
import platform
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from ..ir.dtypes import ScalarType
from ..ir.func import Function, Module
from ..ir.types import TensorType


class TargetKind(enum.Enum):
    CPU = "cpu"
    CUDA = "cuda"
    HIP = "hip"


@dataclass(frozen=True)
class Target:
    """What code is generated for.  Frozen and hashable: it is part of every cache key."""

    kind: TargetKind
    arch: str                         # "x86-64-native", "sm_90", "gfx90a"
    warp_size: int = 32               # GPU-style kernels: threads per warp (64 on CDNA)
    max_threads_per_block: int = 1024
    max_shared_memory: int = 48 * 1024  # bytes per block without opting in
    max_shared_memory_optin: int = 48 * 1024
    vector_bytes: int = 16            # widest vector load/store (CPU: SIMD register width)
    num_cores: int = 1                # CPU cores, or GPU multiprocessors
    features: tuple[str, ...] = field(default=())

    @property
    def name(self) -> str:
        return f"{self.kind.value}:{self.arch}"


def _cpu_flags() -> tuple[str, ...]:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return tuple(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return ()


def host_cpu_target() -> Target:
    """The machine this process runs on (``-march=native``): its SIMD width and core count."""
    flags = _cpu_flags()
    simd = 64 if "avx512f" in flags else 32 if "avx2" in flags else 16
    keep = tuple(f for f in flags if f.startswith(("avx", "fma", "sse", "f16c", "amx")))
    return Target(TargetKind.CPU, f"{platform.machine()}-native", warp_size=32,
                  max_threads_per_block=1024, max_shared_memory=1 << 20, max_shared_memory_optin=1 << 20,
                  vector_bytes=simd, num_cores=os.cpu_count() or 1, features=keep)


@dataclass(frozen=True)
class Binary:
    """A built artifact: the generated source and the binary (bytes or a file path)."""

    target: Target
    source: str
    binary: Any
    source_path: str | None = None
    entry: str = ""
    extra: Any = None  # the toolchain's own result (e.g. a CudaBinary with cubin, PTX and log)


_CTYPES = {
    "bool": ctypes.c_bool, "int8": ctypes.c_int8, "int16": ctypes.c_int16, "int32": ctypes.c_int32,
    "int64": ctypes.c_int64, "uint8": ctypes.c_uint8, "uint16": ctypes.c_uint16, "uint32": ctypes.c_uint32,
    "uint64": ctypes.c_uint64, "float16": ctypes.c_float, "bfloat16": ctypes.c_float,
    "float32": ctypes.c_float, "float64": ctypes.c_double,
}


def ctypes_type(t: ScalarType | TensorType) -> Any:
    """The ctypes type an argument of type ``t`` is passed as (tensors: a pointer; half floats as
    float, which the generated entry converts)."""
    return ctypes.c_void_p if isinstance(t, TensorType) else _CTYPES[t.name]


def param_ctypes(func: Function) -> list[Any]:
    """ctypes of a kernel's arguments: its parameters, then its symbolic sizes (int32)."""
    return [ctypes_type(p.type) for p in func.params] + [ctypes.c_int32 for _ in func.size_vars]


class Launcher(Protocol):
    """Runs a built kernel: ``values`` are the parameters then the sizes (pointers as ints), on
    device ordinal ``device`` of the launcher's kind, on ``stream`` (None: the default stream)."""

    def __call__(self, values: Sequence[Any], grid: tuple[int, int, int], block: tuple[int, int, int],
                 smem_bytes: int, stream: Any, device: int = 0) -> int: ...


class Backend(Protocol):
    def render(self, module: Module, target: Target) -> str: ...

    def build(self, source: str, target: Target, entry: str) -> Binary: ...

    def load(self, binary: Binary, func: Function) -> Launcher | None:
        """A launcher, or None when the device is not present in this process."""
