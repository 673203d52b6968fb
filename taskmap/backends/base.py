"""The backend interface and the ``Target`` every other layer reads capabilities from.

A backend is three steps: ``render(module, target) -> source``, ``build(source, target) ->
Binary`` and ``load(binary) -> callable``.  Code outside ``backends/`` reads ``Target`` fields
(warp size, shared memory, vector width, ...) and never branches on a backend's name.
"""
from __future__ import annotations

import enum
import os
import platform
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..ir.func import Module


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


class Backend(Protocol):
    def render(self, module: Module, target: Target) -> str: ...

    def build(self, source: str, target: Target, entry: str) -> Binary: ...

    def load(self, binary: Binary) -> Any: ...
