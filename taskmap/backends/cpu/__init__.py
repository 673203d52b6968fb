"""The CPU backend: C code generation, gcc build, ctypes loading."""
from __future__ import annotations

import ctypes

from ...ir.func import Module
from ..base import Binary, Target
from .build import build_c, load_library
from .cnames import entry_name
from .codegen import render_c


class CpuBackend:
    def render(self, module: Module, target: Target) -> str:
        return render_c(module, target)

    def build(self, source: str, target: Target, entry: str) -> Binary:
        return build_c(source, target, entry)

    def load(self, binary: Binary) -> ctypes._CFuncPtr:
        return getattr(load_library(binary.binary), entry_name(binary.entry))


__all__ = ["CpuBackend", "render_c", "build_c", "load_library"]
