"""The CPU backend: C code generation, gcc build, ctypes loading."""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from ...ir.func import Function, Module
from ..base import Binary, Target, param_ctypes
from .build import build_c, load_library
from .cnames import entry_name, packed_name
from .codegen import render_c


class CpuBackend:
    def render(self, module: Module, target: Target) -> str:
        return render_c(module, target)

    def build(self, source: str, target: Target, entry: str) -> Binary:
        return build_c(source, target, entry)

    def load(self, binary: Binary, func: Function) -> "CpuLauncher":
        lib = load_library(binary.binary)
        packed = getattr(lib, packed_name(binary.entry), None)      # None: a library built before packed entries
        return CpuLauncher(getattr(lib, entry_name(binary.entry)), func,
                           None if packed is None else ctypes.cast(packed, ctypes.c_void_p).value)


class CpuLauncher:
    """Calls the generated entry, which runs the whole grid (or CPU kernel) and returns a status.
    ``packed``: the address of its packed entry (``tm_packed_<kernel>``), for chain runners."""

    def __init__(self, fn: Any, func: Function, packed: int | None = None) -> None:
        fn.argtypes = param_ctypes(func)
        fn.restype = ctypes.c_int32
        self.fn = fn
        self.packed = packed

    def __call__(self, values: Sequence[Any], grid: Any = None, block: Any = None, smem_bytes: int = 0,
                 stream: Any = None, device: int = 0) -> int:
        return self.fn(*values)


__all__ = ["CpuBackend", "CpuLauncher", "render_c", "build_c", "load_library"]
