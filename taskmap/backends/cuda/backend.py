"""The CUDA backend: IR -> CUDA C++ (``gpu_codegen``), NVRTC -> cubin/PTX, driver API -> launch."""
from __future__ import annotations

from ...ir.func import Function, Module
from ..base import Binary, Target
from ..gpu_codegen import CUDA, render_gpu
from ..gpu_launch import GpuLauncher
from . import driver
from .nvrtc import NvrtcOptions, compile_cuda


class CudaBackend:
    def render(self, module: Module, target: Target) -> str:
        return render_gpu(module, target, CUDA)

    def build(self, source: str, target: Target, entry: str) -> Binary:
        out = compile_cuda(source, entry, NvrtcOptions(arch=target.arch))
        return Binary(target=target, source=source, binary=out.cubin if out.cubin is not None else out.ptx,
                      source_path=out.source_path, entry=entry, extra=out)

    def load(self, binary: Binary, func: Function) -> GpuLauncher | None:
        if not driver.cuda_available():
            return None
        module = driver.load_module(binary.extra)
        return GpuLauncher(module.get_function(binary.entry), func, driver.launch, driver.set_max_dynamic_shared)
