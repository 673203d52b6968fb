"""The CUDA backend: IR -> CUDA C++ (``gpu_codegen``), NVRTC -> cubin/PTX, driver API -> launch.

The module is loaded lazily, on the first launch on each GPU (a build never needs the device).
Kernels that ``tma_load`` get their tensor maps as extra arguments, made at launch
(:mod:`.tensor_map`).  Before each launch the block is checked against what the loaded function can run: its register
count times the block's threads must fit the device's registers per block, which the generated
``__launch_bounds__`` guarantees only when the block size is a compile-time constant.
"""
from __future__ import annotations

import threading

from ...errors import LaunchError
from ...ir.func import Function, Module
from ..base import Binary, Target
from ..gpu_codegen import CUDA, render_gpu
from ..gpu_launch import GpuLauncher
from . import driver
from .nvrtc import NvrtcOptions, compile_cuda
from .tensor_map import TensorMaps

_limits: dict[tuple[int, int], tuple[int, int, int]] = {}
_limits_lock = threading.Lock()


def _function_limits(fn: driver.CudaFunction, device: int) -> tuple[int, int, int]:
    """(registers per thread, max threads per block of this function, registers per block of the GPU)."""
    key = (int(fn.handle), device)
    limits = _limits.get(key)
    if limits is None:
        limits = (fn.num_registers, fn.max_threads_per_block, driver.device_properties(device).registers_per_block)
        with _limits_lock:
            _limits[key] = limits
    return limits


def check_registers(fn: driver.CudaFunction, block: tuple[int, int, int], smem_bytes: int, device: int) -> None:
    """Raise LaunchError when a block of ``block`` threads needs more registers than the GPU has."""
    threads = block[0] * block[1] * block[2]
    regs, max_threads, per_block = _function_limits(fn, device)
    if threads > max_threads or regs * threads > per_block:
        name = driver.device_properties(device).name
        raise LaunchError(
            f"{fn.name}(): a block of {threads} threads needs {regs} registers per thread, {regs * threads} "
            f"in all, but {name} (cuda:{device}) has {per_block} registers per block, so this kernel runs at "
            f"most {max_threads} threads per block; launch smaller blocks or use fewer registers per thread "
            "(smaller register tensors, a compile-time block size for __launch_bounds__)")


def _loader(binary: Binary):
    def load(device: int) -> driver.CudaFunction:
        return driver.load_module(binary.extra, device).get_function(binary.entry)
    return load


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
        maps = TensorMaps(func)
        return GpuLauncher(func, _loader(binary), driver.launch, driver.set_max_dynamic_shared, check_registers,
                           maps if maps else None)
