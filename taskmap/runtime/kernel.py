"""Kernels users call: an IR module, lowered once, built per target, launched on arrays.

``Kernel`` is what ``@taskmap.kernel`` returns.  Calling it with numpy arrays or torch CPU
tensors builds (once, cached on disk) and runs it on the CPU backend — GPU-style kernels
included, with GPU semantics; with GPU arrays (torch CUDA tensors, ``taskmap.Tensor``, CuPy /
Numba arrays, DLPack-capable arrays) it runs on their GPU, on PyTorch's current stream when
torch is loaded, else on the legacy default stream.  ``kernel.build("cpu" | "cuda" | "hip",
arch=...)`` returns the :class:`CompiledKernel` with its source and binary, with or without the
device.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..backends import Binary, Launcher, Target, TargetKind, get_backend, resolve_target
from ..backends.clike import smem_layout, written_tensors
from ..errors import LaunchError, TaskmapError, UnsupportedError
from ..ir import expr as E
from ..ir.func import FuncKind, Function, Module
from ..ir.functor import substitute
from ..ir.simplify import simplify_expr
from ..ir.types import TensorType
from ..passes import lower
from .args import ArrayInfo, BoundArgs, array_info, bind_args

_STATUS = {1: "out of memory while setting up thread blocks on the CPU",
           2: "grid and block dimensions must be positive",
           3: "misaligned address: copy16() and ldmatrix() need 16-byte aligned addresses, cp_async() addresses "
              "aligned to its size (a GPU faults on them; the CPU emulation checks)",
           4: "mma_sync_m16n8k16() / ldmatrix() executed by only some lanes of a warp: all 32 lanes must execute "
              "it together (the block size must be a multiple of 32)",
           5: "divergent warp primitive: a lane's mask must name itself, and the lanes it names must execute the "
              "same warp primitive with the same mask together (not syncthreads(), not another primitive)",
           6: "cp_async() into a shared tile that a pending wgmma_tf32() still reads: wgmma_wait() for that group "
              "before refilling the tile (the copy may land before the tensor cores read it; the CPU emulation "
              "checks)",
           7: "deadlock: every live thread of a block waits on an mbarrier phase that nothing left can complete "
              "(mbarrier_wait() for a parity whose phase lacks arrivals or tma_load bytes; a GPU would hang)",
           8: "mbarrier_arrive() on a barrier with no arrival pending in its phase (more arrivals than "
              "mbarrier_init()'s count, or a barrier never initialized), or an mbarrier_init() count outside 1..32767",
           9: "bar_sync() with a thread count that is not a positive multiple of the warp size within the block"}


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


class CompiledKernel:
    """A kernel built for one target: ``source``, ``binary`` (a shared library path, a cubin, an
    AMD code object), and — when the device is present — a launcher."""

    def __init__(self, module: Module, binary: Binary, launcher: Launcher | None) -> None:
        self.module = module
        self.artifact = binary
        self.target: Target = binary.target
        self.func = module.entry_function
        self.smem_bytes = smem_layout(self.func)[1] if self.func.kind is FuncKind.GPU_KERNEL else 0
        self._launcher = launcher
        written = written_tensors(module)
        self._written = {p.name for p in self.func.params if id(p) in written}

    @property
    def source(self) -> str:
        return self.artifact.source

    @property
    def binary(self) -> Any:
        return self.artifact.binary

    @property
    def source_path(self) -> str | None:
        return self.artifact.source_path

    @property
    def launcher(self) -> Launcher | None:
        """What launches the binary (None when the device is not present in this process)."""
        return self._launcher

    def launch_config(self, bound: BoundArgs) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Grid and block for these arguments, checked against the target's limits."""
        f = self.func
        if f.kind is not FuncKind.GPU_KERNEL:
            return (1, 1, 1), (1, 1, 1)
        grid, block = launch_dims(f, bound.sizes)
        if min(grid + block) <= 0:
            raise LaunchError(f"{f.name}(): grid {grid} and block {block} dimensions must be positive")
        threads = block[0] * block[1] * block[2]
        if threads > self.target.max_threads_per_block:
            raise LaunchError(f"{f.name}(): {threads} threads per block exceeds the limit of "
                              f"{self.target.max_threads_per_block} (max_threads_per_block) on {self.target.name}")
        if self.smem_bytes > self.target.max_shared_memory_optin:
            raise LaunchError(f"{f.name}(): {self.smem_bytes} bytes of shared memory per block exceeds the limit "
                              f"of {self.target.max_shared_memory_optin} bytes on {self.target.name}")
        return grid, block

    def __call__(self, *args: Any) -> None:
        self.prepare(*args)()

    def prepare(self, *args: Any) -> "PreparedLaunch":
        """Check ``args`` once and return a launch of this kernel on exactly these arrays.

        The result re-launches without re-checking (about a microsecond of Python on the CPU):
        for runtimes that own their buffers, e.g. a compiled graph's static memory plan.  The
        arrays must stay alive and keep their memory while it is used."""
        bound = bind_args(self.func, args, self._written)
        want = "cpu" if self.target.kind is TargetKind.CPU else self.target.kind.value
        kind, _, index = bound.device.partition(":")
        if kind != want:
            raise LaunchError(f"{self.func.name}() was built for {self.target.name} but got tensors on {bound.device}; "
                              + _MOVE_HINT.get(want, _MOVE_HINT["gpu"]))
        grid, block = self.launch_config(bound)
        if self._launcher is None:
            raise UnsupportedError(f"{self.func.name}: built for {self.target.name}, but no such device is "
                                   "present in this process: the source and binary are available (.source, "
                                   ".binary, .source_path), launching is not")
        return PreparedLaunch(self, bound.values, grid, block, kind, int(index or 0), tuple(args))

    def bind_host(self, *args: Any) -> HostLaunch:
        """Check ``args`` once, as a call does, and return this CPU build's launch by addresses:
        ``launch(ptr, ...)`` takes one data pointer per tensor parameter, in order; the scalars and
        symbolic sizes are the ones bound here.

        For operators that launch the same kernel on new arrays of the same shapes (about a
        microsecond of Python).  An address carries no shape, so the later calls cannot be checked:
        the caller keys the launch on what was checked here (shapes, dtypes, layout, device), as
        the plans of ``taskmap.ops`` do; :meth:`HostLaunch.checked` re-checks arrays when that is
        not known."""
        if self.target.kind is not TargetKind.CPU:
            raise UnsupportedError(f"{self.func.name}(): bind_host() launches CPU builds; this one is for "
                                   f"{self.target.name} (use prepare())")
        prepared = self.prepare(*args)
        infos = [array_info(a) for a, p in zip(args, self.func.params) if isinstance(p.type, TensorType)]
        return HostLaunch(self, prepared.values, infos)


class PreparedLaunch:
    """One launch of a compiled kernel with its arguments checked and packed (``CompiledKernel.prepare``)."""

    __slots__ = ("kernel", "values", "grid", "block", "kind", "device", "_keep")

    def __init__(self, kernel: CompiledKernel, values: tuple[Any, ...], grid: tuple[int, ...],
                 block: tuple[int, ...], kind: str, device: int, keep: tuple[Any, ...]) -> None:
        self.kernel, self.values, self.grid, self.block = kernel, values, grid, block
        self.kind, self.device, self._keep = kind, device, keep   # _keep: the arrays stay alive

    def __call__(self, stream: Any = None) -> None:
        """Launch on ``stream`` (a driver stream handle or a torch stream; None: PyTorch's
        current stream when torch is loaded, else the legacy default stream)."""
        k = self.kernel
        status = k._launcher(self.values, self.grid, self.block, k.smem_bytes,
                             _current_stream(self.kind, self.device) if stream is None else stream, self.device)
        if status:
            raise status_error(k.func.name, status)


def status_error(name: str, status: int) -> TaskmapError:
    """The error of a kernel whose launch returned the non-zero ``status``."""
    return TaskmapError(f"{name}(): {_STATUS.get(status, f'the kernel failed with status {status}')}")


class HostLaunch:
    """A CPU kernel launched by the addresses of its tensors (``CompiledKernel.bind_host``)."""

    __slots__ = ("_fn", "_infos", "_slots", "_tail", "_values", "_written", "_all", "_positions", "arity", "name",
                 "packed")

    def __init__(self, kernel: CompiledKernel, values: tuple[Any, ...], infos: list[ArrayInfo]) -> None:
        func = kernel.func
        self._fn = kernel.launcher.fn       # the ctypes entry: parameters, then the sizes
        self.packed: int | None = getattr(kernel.launcher, "packed", None)    # its packed entry's address
        self.name = func.name
        slots = [i for i, p in enumerate(func.params) if isinstance(p.type, TensorType)]
        self.arity = len(slots)
        self._all, self._positions = values, tuple(slots)
        prefix = slots == list(range(len(slots)))   # tensors first (the templates' kernels): no shuffling
        self._tail = values[len(slots):] if prefix else ()
        self._slots, self._values = (None, ()) if prefix else (slots, values)
        self._infos = tuple((func.params[i].name, info) for i, info in zip(slots, infos))
        self._written = frozenset(func.params[i].name for i in slots if func.params[i].name in kernel._written)

    def __call__(self, *ptrs: int) -> None:
        """Launch on the tensors at ``ptrs`` (one per tensor parameter, arrays like the bound ones)."""
        if len(ptrs) != self.arity:
            raise LaunchError(f"{self.name}(): the bound launch takes {self.arity} addresses, got {len(ptrs)}")
        if self._slots is None:
            status = self._fn(*ptrs, *self._tail)
        else:
            values = list(self._values)
            for i, ptr in zip(self._slots, ptrs):
                values[i] = ptr
            status = self._fn(*values)
        if status:
            raise status_error(self.name, status)

    def words(self) -> tuple[list[int], tuple[int, ...]]:
        """The packed entry's arguments (``tm_packed_<kernel>``): one 64-bit word per argument
        (the bound scalars' bytes; 0 for a tensor), and the words of the tensor parameters."""
        out = []
        for v, t in zip(self._all, self._fn.argtypes):
            out.append(0 if t is ctypes.c_void_p else int.from_bytes(bytes(t(v)).ljust(8, b"\0"), "little"))
        return out, self._positions

    def checked(self, *arrays: Any) -> None:
        """Launch on ``arrays`` after checking that each is like the one bound: the same shape,
        dtype and device, C-contiguous, writeable where the kernel writes."""
        if len(arrays) != self.arity:
            raise LaunchError(f"{self.name}(): the bound launch takes {self.arity} arrays, got {len(arrays)}")
        ptrs = []
        for (name, want), a in zip(self._infos, arrays):
            got = array_info(a)
            if got is None or (got.shape, got.dtype, got.device) != (want.shape, want.dtype, want.device):
                what = f"{got.dtype}{list(got.shape)} on {got.device}" if got is not None else type(a).__name__
                raise LaunchError(f"{self.name}(): argument '{name}' must be like the bound one, "
                                  f"{want.dtype}{list(want.shape)} on {want.device}; got {what}")
            if not got.contiguous:
                raise LaunchError(f"{self.name}(): argument '{name}' must be C-contiguous (row-major)")
            if name in self._written and not got.writeable:
                raise LaunchError(f"{self.name}(): argument '{name}' is written by the kernel but the array "
                                  "is read-only")
            ptrs.append(got.ptr)
        self(*ptrs)


_MOVE_HINT = {
    "cpu": "copy them to the host first (taskmap.Tensor.numpy(), torch's .cpu())",
    "cuda": "move them to the GPU with taskmap.tensor(array, device='cuda') or torch's .cuda()",
    "hip": "move them to the GPU with taskmap.tensor(array, device='hip') or torch's .cuda() (ROCm)",
    "gpu": "move them to the kernel's device",
}


def _current_stream(kind: str, device: int) -> Any:
    """PyTorch's current stream on the GPU when torch is loaded (None: the legacy default stream).

    PyTorch for ROCm calls its HIP streams ``torch.cuda`` streams too."""
    torch = sys.modules.get("torch")
    if kind == "cpu" or torch is None or not torch.cuda.is_available():
        return None
    if (kind == "hip") != bool(getattr(torch.version, "hip", None)):
        return None  # torch is built for the other vendor: its streams are not this GPU's
    return torch.cuda.current_stream(device)


class Kernel:
    """A kernel written with ``@taskmap.kernel``: its IR, lowered once, built once per target."""

    def __init__(self, module: Module, py_func: Any = None) -> None:
        self.module = module
        self.py_func = py_func
        self.__name__ = module.entry
        self.__doc__ = getattr(py_func, "__doc__", None)
        self._lowered: Module | None = None
        self._built: dict[tuple[str, str | None], CompiledKernel] = {}
        self._sources: dict[Target, str] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_lowered(cls, module: Module, sources: Mapping[Target, str] | None = None,
                     original: Module | None = None) -> "Kernel":
        """A kernel whose module is already lowered (e.g. loaded from a compile cache): it is
        built as it is, without running the lowering passes again.  ``sources``: its source
        already rendered for some targets (stored with the module), which the builds for those
        exact targets use instead of rendering it again.  ``original``: the module before the
        lowering passes (``module`` otherwise), which :attr:`module` then is — what a later
        rewrite of the kernel (:func:`taskmap.fusion.place`) starts from."""
        k = cls(original if original is not None else module)
        k._lowered = module
        k._sources.update(sources or {})
        return k

    @property
    def func(self) -> Function:
        return self.module.entry_function

    def lower(self) -> Module:
        if self._lowered is None:
            self._lowered = lower(self.module)
        return self._lowered

    def render(self, target: Target) -> str:
        """The source of the lowered module for ``target``: the one given to :meth:`from_lowered`
        or rendered by an earlier call (until a build from it fails), else rendered now."""
        source = self._sources.get(target)
        if source is None:
            source = self._sources[target] = get_backend(target.kind).render(self.lower(), target)
        return source

    def build(self, target: str = "cpu", arch: str | None = None) -> CompiledKernel:
        """Build for ``target`` ("cpu", "cuda", "hip"); ``arch`` ("sm_90", "gfx90a") defaults to the
        device present.  Works without the device: the result carries the source and binary."""
        key = (target, arch)
        with self._lock:
            built = self._built.get(key)
            if built is None:
                tgt = resolve_target(target, arch)
                backend = get_backend(tgt.kind)
                module = self.lower()
                try:
                    binary = backend.build(self.render(tgt), tgt, module.entry)
                except Exception:
                    self._sources.pop(tgt, None)     # a failed build renders the source again next time
                    raise
                built = self._built[key] = CompiledKernel(module, binary, backend.load(binary, module.entry_function))
            return built

    def __call__(self, *args: Any) -> None:
        if self.func.kind not in (FuncKind.GPU_KERNEL, FuncKind.CPU_KERNEL):
            raise TypeError(f"{self.__name__} is a {self.func.kind.value} function, not a kernel")
        bound_device = _device_of(args)
        kind = bound_device.partition(":")[0]
        if kind not in ("cpu", "cuda", "hip"):
            raise UnsupportedError(f"{self.__name__}(): cannot run on tensors on device {bound_device!r}; "
                                   "pass numpy arrays, taskmap Tensors, or CPU / CUDA / ROCm torch tensors")
        self.build(kind)(*args)

    def __repr__(self) -> str:
        return f"<taskmap.Kernel {self.__name__}>\n{self.module!r}"


def _device_of(args: tuple[Any, ...]) -> str:
    """The one device the array arguments are on ("cpu" when there are none)."""
    devices = set()
    for a in args:
        if type(a) is np.ndarray:
            devices.add("cpu")
            continue
        try:
            info = array_info(a)
        except LaunchError:  # reported by bind_args, naming the parameter
            continue
        if info is not None:
            devices.add(info.device)
    if len(devices) > 1:
        raise LaunchError(f"arguments are on different devices: {sorted(devices)}")
    return devices.pop() if devices else "cpu"
