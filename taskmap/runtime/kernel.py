"""Kernels users call: an IR module, lowered once, built per target, launched on arrays.

``Kernel`` is what ``@taskmap.kernel`` returns.  Calling it with numpy arrays or torch CPU
tensors builds (once, cached on disk) and runs it on the CPU backend — GPU-style kernels
included, with GPU semantics.  ``kernel.build("cpu")`` returns the :class:`CompiledKernel`
with its source and binary.
"""
from __future__ import annotations

import threading
from typing import Any

from ..backends import Binary, Target, TargetKind, get_backend, host_cpu_target
from ..errors import LaunchError, TaskmapError, UnsupportedError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.func import FuncKind, Function, Module
from ..ir.functor import collect, substitute
from ..ir.simplify import simplify_expr
from ..ir.types import MemScope
from ..passes import lower
from .args import BoundArgs, array_info, bind_args, ctypes_type

_STATUS = {1: "out of memory while setting up thread blocks on the CPU",
           2: "grid and block dimensions must be positive"}


def launch_dims(func: Function, sizes: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The grid and block dimensions of a GPU kernel for the given symbolic sizes."""
    assert func.launch is not None
    env = {E.SizeVar(k): E.const(v) for k, v in sizes.items()}
    out = []
    for d in (*func.launch.grid_dim, *func.launch.block_dim):
        v = simplify_expr(substitute(d, env))
        if not isinstance(v, E.Const):
            raise LaunchError(f"{func.name}(): cannot evaluate launch dimension {d!r}")
        out.append(int(v.value))
    return tuple(out[:3]), tuple(out[3:])


def shared_bytes(func: Function) -> int:
    total = 0
    for decl in collect(func.body, S.DeclTensor):
        t = decl.var.type
        if t.scope is MemScope.SHARED:
            n = 1
            for s in t.shape:
                n *= int(s.value)
            total = (total + 15) // 16 * 16 + n * t.dtype.nbytes
    return total


class CompiledKernel:
    """A kernel built for one target: ``source``, ``binary``, and a launcher."""

    def __init__(self, module: Module, binary: Binary, launcher: Any) -> None:
        self.module = module
        self.artifact = binary
        self.target: Target = binary.target
        self.func = module.entry_function
        self._launcher = launcher
        self._written = {s.tensor.name for f in module.functions for s in collect(f.body, S.Store)}
        if launcher is not None and hasattr(launcher, "argtypes"):
            types = [ctypes_type(p.type) for p in self.func.params]
            types += [ctypes_type(sv.dtype) for sv in self.func.size_vars]
            launcher.argtypes = types
            launcher.restype = ctypes_type(E.i32)

    @property
    def source(self) -> str:
        return self.artifact.source

    @property
    def binary(self) -> Any:
        return self.artifact.binary

    @property
    def source_path(self) -> str | None:
        return self.artifact.source_path

    def check_launch(self, bound: BoundArgs) -> None:
        f = self.func
        if f.kind is not FuncKind.GPU_KERNEL:
            return
        grid, block = launch_dims(f, bound.sizes)
        if min(grid + block) <= 0:
            raise LaunchError(f"{f.name}(): grid {grid} and block {block} dimensions must be positive")
        threads = block[0] * block[1] * block[2]
        if threads > self.target.max_threads_per_block:
            raise LaunchError(f"{f.name}(): {threads} threads per block exceeds the limit of "
                              f"{self.target.max_threads_per_block} (max_threads_per_block) on {self.target.name}")
        smem = shared_bytes(f)
        if smem > self.target.max_shared_memory_optin:
            raise LaunchError(f"{f.name}(): {smem} bytes of shared memory per block exceeds the limit of "
                              f"{self.target.max_shared_memory_optin} bytes on {self.target.name}")

    def __call__(self, *args: Any) -> None:
        bound = bind_args(self.func, args, self._written)
        if self.target.kind is TargetKind.CPU and bound.device != "cpu":
            raise LaunchError(f"{self.func.name}() was built for the CPU but got tensors on {bound.device}")
        self.check_launch(bound)
        if self._launcher is None:
            raise UnsupportedError(f"{self.func.name}: cannot launch on {self.target.name} from this process")
        status = self._launcher(*bound.values)
        if status:
            raise TaskmapError(f"{self.func.name}(): {_STATUS.get(status, f'error {status}')}")


def _target_for(kind: str, arch: str | None) -> Target:
    if kind == "cpu":
        return host_cpu_target()
    raise UnsupportedError(f"target {kind!r} (arch={arch!r}) is not available in this version of taskmap")


class Kernel:
    """A kernel written with ``@taskmap.kernel``: its IR, lowered once, built once per target."""

    def __init__(self, module: Module, py_func: Any = None) -> None:
        self.module = module
        self.py_func = py_func
        self.__name__ = module.entry
        self.__doc__ = getattr(py_func, "__doc__", None)
        self._lowered: Module | None = None
        self._built: dict[tuple[str, str | None], CompiledKernel] = {}
        self._lock = threading.Lock()

    @property
    def func(self) -> Function:
        return self.module.entry_function

    def lower(self) -> Module:
        if self._lowered is None:
            self._lowered = lower(self.module)
        return self._lowered

    def build(self, target: str = "cpu", arch: str | None = None) -> CompiledKernel:
        """Build for ``target`` ("cpu"; "cuda"/"hip" with an ``arch``) and return the result."""
        key = (target, arch)
        with self._lock:
            built = self._built.get(key)
            if built is None:
                tgt = _target_for(target, arch)
                backend = get_backend(tgt.kind)
                module = self.lower()
                binary = backend.build(backend.render(module, tgt), tgt, module.entry)
                built = self._built[key] = CompiledKernel(module, binary, backend.load(binary))
            return built

    def __call__(self, *args: Any) -> None:
        if self.func.kind not in (FuncKind.GPU_KERNEL, FuncKind.CPU_KERNEL):
            raise TypeError(f"{self.__name__} is a {self.func.kind.value} function, not a kernel")
        bound_device = _device_of(args)
        if bound_device.startswith("cuda"):
            raise UnsupportedError(f"{self.__name__}(): tensors on {bound_device} need the CUDA runtime, "
                                   "which this version of taskmap does not include yet")
        if bound_device != "cpu":
            raise UnsupportedError(f"{self.__name__}(): cannot run on tensors on device {bound_device!r}; "
                                   "pass numpy arrays or torch CPU tensors")
        self.build("cpu")(*args)

    def __repr__(self) -> str:
        return f"<taskmap.Kernel {self.__name__}>\n{self.module!r}"


def _device_of(args: tuple[Any, ...]) -> str:
    devices = {info.device for info in map(array_info, args) if info is not None}
    if len(devices) > 1:
        raise LaunchError(f"arguments are on different devices: {sorted(devices)}")
    return devices.pop() if devices else "cpu"
