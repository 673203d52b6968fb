"""The HIP backend: IR -> HIP C++ (``gpu_codegen``), hipRTC -> AMD code object, HIP runtime -> launch.

The code object is loaded lazily, on the first launch on each GPU (a build never needs the device).
"""
from __future__ import annotations

from ...ir.func import Function, Module
from ..base import Binary, Target
from ..gpu_codegen import HIP, render_gpu
from ..gpu_launch import GpuLauncher
from . import runtime
from .hiprtc import compile_hip


def _loader(binary: Binary):
    def load(device: int) -> runtime.HipFunction:
        return runtime.load_module(binary.extra, device).get_function(binary.entry)
    return load


class HipBackend:
    def render(self, module: Module, target: Target) -> str:
        return render_gpu(module, target, HIP)

    def build(self, source: str, target: Target, entry: str) -> Binary:
        out = compile_hip(source, entry, arch=target.arch)
        return Binary(target=target, source=source, binary=out.code_object, source_path=out.source_path,
                      entry=entry, extra=out)

    def load(self, binary: Binary, func: Function) -> GpuLauncher | None:
        if not runtime.hip_available():
            return None
        return GpuLauncher(func, _loader(binary), runtime.launch, None)
