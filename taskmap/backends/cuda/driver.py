"""A thin, checked wrapper over the CUDA driver API (``cuda.bindings.driver``).

Everything here needs an NVIDIA GPU and driver except :func:`cuda_available` (False, never an
exception, on a machine without ``libcuda``) and :func:`check` / :func:`error_name`.

Contexts: taskmap uses the device's *primary* context, the one the CUDA runtime and PyTorch use,
so device pointers from torch tensors are valid in taskmap's kernels and vice versa.  A loaded
module remembers its context and makes it current before each launch.

Every driver call goes through :func:`check`, which raises ``TaskmapError`` naming the CUDA error
(``CUDA_ERROR_INVALID_VALUE: invalid argument``) and the call that failed.
"""
from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from cuda.bindings import driver as cu

from ...errors import TaskmapError
from ..kernel_args import pack_args
from .nvrtc import CudaBinary

_SUCCESS = cu.CUresult.CUDA_SUCCESS
_lock = threading.Lock()


# ---------------------------------------------------------------------------------------------
# Errors


def error_name(result: Any) -> str:
    """``"CUDA_ERROR_X: description"`` for a CUresult (enum or int), with or without a driver."""
    try:
        code = cu.CUresult(int(result))
    except ValueError:
        return f"unknown CUresult {int(result)}"
    name, desc = code.name, ""
    try:
        err, text = cu.cuGetErrorName(code)
        if err == _SUCCESS and text:
            name = text.decode()
        err, text = cu.cuGetErrorString(code)
        if err == _SUCCESS and text:
            desc = text.decode()
    except Exception:  # noqa: BLE001, S110 -- no libcuda: the enum's name is the same string cuGetErrorName returns
        pass
    return f"{name}: {desc}" if desc else name


def check(ret: Any, what: str = "CUDA driver call") -> Any:
    """Check a cuda-python return value; return the payload.

    ``ret`` is a CUresult or a tuple ``(CUresult, value, ...)`` as cuda-python returns them:
    ``check(cu.cuDeviceGet(0), "cuDeviceGet")`` returns the device.
    """
    err, values = (ret[0], ret[1:]) if isinstance(ret, tuple) else (ret, ())
    if int(err) != int(_SUCCESS):
        raise TaskmapError(f"{what} failed: {error_name(err)}")
    if not values:
        return None
    return values[0] if len(values) == 1 else values


# ---------------------------------------------------------------------------------------------
# Devices and contexts


@functools.cache
def cuda_available() -> bool:
    """Whether an NVIDIA GPU and its driver are usable by this process (never raises)."""
    try:
        (err,) = cu.cuInit(0)
        if err != _SUCCESS:
            return False
        err, count = cu.cuDeviceGetCount()
        return err == _SUCCESS and count > 0
    except Exception:  # noqa: BLE001 -- libcuda.so missing (DynamicLibNotFoundError), or unloadable
        return False


def _init() -> None:
    if not cuda_available():
        raise TaskmapError("no NVIDIA GPU: the CUDA driver (libcuda) is not available or sees no device")


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. ``(12, 4)``.  PTX from an NVRTC newer
    than this cannot be JIT-compiled (CUDA_ERROR_UNSUPPORTED_PTX_VERSION); cubins still load."""
    _init()
    v = int(check(cu.cuDriverGetVersion(), "cuDriverGetVersion"))
    return v // 1000, (v % 1000) // 10


def device_count() -> int:
    return check(cu.cuDeviceGetCount(), "cuDeviceGetCount") if cuda_available() else 0


@dataclass(frozen=True)
class DeviceProperties:
    name: str
    compute_capability: tuple[int, int]
    multiprocessor_count: int
    max_threads_per_block: int
    shared_memory_per_block: int          # default limit (48 KB)
    shared_memory_per_block_optin: int    # after set_max_dynamic_shared
    shared_memory_per_multiprocessor: int
    registers_per_block: int
    warp_size: int
    total_memory: int
    l2_cache_size: int


@functools.cache
def _device(ordinal: int) -> cu.CUdevice:
    _init()
    return check(cu.cuDeviceGet(ordinal), f"cuDeviceGet({ordinal})")


@functools.cache
def device_properties(device: int = 0) -> DeviceProperties:
    dev = _device(device)
    A = cu.CUdevice_attribute

    def attr(a) -> int:
        return int(check(cu.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})"))

    raw_name = check(cu.cuDeviceGetName(256, dev), "cuDeviceGetName")
    return DeviceProperties(
        name=raw_name.split(b"\0", 1)[0].decode(errors="replace"),
        compute_capability=(attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                            attr(A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)),
        multiprocessor_count=attr(A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        max_threads_per_block=attr(A.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK),
        shared_memory_per_block=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
        shared_memory_per_block_optin=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        shared_memory_per_multiprocessor=attr(A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
        registers_per_block=attr(A.CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK),
        warp_size=attr(A.CU_DEVICE_ATTRIBUTE_WARP_SIZE),
        total_memory=int(check(cu.cuDeviceTotalMem(dev), "cuDeviceTotalMem")),
        l2_cache_size=attr(A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
    )


_primary: dict[int, cu.CUcontext] = {}


def primary_context(device: int = 0) -> cu.CUcontext:
    """Retain (once per process) the device's primary context — the one PyTorch uses."""
    with _lock:
        ctx = _primary.get(device)
        if ctx is None:
            ctx = _primary[device] = check(cu.cuDevicePrimaryCtxRetain(_device(device)),
                                           "cuDevicePrimaryCtxRetain")
    return ctx


def make_current(ctx: cu.CUcontext) -> None:
    """Make ``ctx`` current on this thread unless it already is."""
    current = check(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if current is None or int(current) != int(ctx):
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def use_device(device: int = 0) -> cu.CUcontext:
    """Make the device's primary context current on this thread; returns it."""
    ctx = primary_context(device)
    make_current(ctx)
    return ctx


def synchronize(device: int = 0) -> None:
    use_device(device)
    check(cu.cuCtxSynchronize(), "cuCtxSynchronize")


# ---------------------------------------------------------------------------------------------
# Modules, functions, launches


@dataclass(frozen=True)
class CudaFunction:
    handle: cu.CUfunction
    name: str
    context: cu.CUcontext

    def attribute(self, attr: cu.CUfunction_attribute) -> int:
        return int(check(cu.cuFuncGetAttribute(attr, self.handle), f"cuFuncGetAttribute({attr.name})"))

    @property
    def num_registers(self) -> int:
        return self.attribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NUM_REGS)

    @property
    def max_threads_per_block(self) -> int:
        return self.attribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)

    @property
    def static_shared_bytes(self) -> int:
        return self.attribute(cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)


@dataclass
class CudaModule:
    handle: cu.CUmodule
    context: cu.CUcontext
    loaded_from: str                       # "cubin" or "ptx" (the JIT fallback)
    _functions: dict[str, CudaFunction] = field(default_factory=dict, repr=False)

    def get_function(self, name: str) -> CudaFunction:
        fn = self._functions.get(name)
        if fn is None:
            make_current(self.context)
            handle = check(cu.cuModuleGetFunction(self.handle, name.encode()), f"cuModuleGetFunction({name!r})")
            fn = self._functions[name] = CudaFunction(handle, name, self.context)
        return fn

    def unload(self) -> None:
        if self.handle is not None:
            make_current(self.context)
            check(cu.cuModuleUnload(self.handle), "cuModuleUnload")
            self.handle = None
            self._functions.clear()


def _load_image(image: bytes, what: str) -> cu.CUmodule:
    return check(cu.cuModuleLoadData(image), f"cuModuleLoadData({what})")


def load_module(image: CudaBinary | bytes | str, device: int = 0) -> CudaModule:
    """Load a cubin / fatbin (bytes), PTX (str), or a :class:`CudaBinary` into the device's
    primary context.  For a CudaBinary the cubin is tried first and, if the driver rejects it
    (e.g. a GPU newer than the cubin's arch), its PTX is JIT-compiled instead."""
    ctx = use_device(device)
    if isinstance(image, CudaBinary):
        if image.cubin is not None:
            try:
                return CudaModule(_load_image(image.cubin, f"cubin {image.name} {image.arch}"), ctx, "cubin")
            except TaskmapError as cubin_error:
                try:
                    return CudaModule(_load_image(image.ptx.encode() + b"\0", f"PTX {image.name}"), ctx, "ptx")
                except TaskmapError as ptx_error:
                    raise TaskmapError(f"{cubin_error}; PTX fallback: {ptx_error}") from None
        return CudaModule(_load_image(image.ptx.encode() + b"\0", f"PTX {image.name}"), ctx, "ptx")
    if isinstance(image, str):
        return CudaModule(_load_image(image.encode() + b"\0", "PTX"), ctx, "ptx")
    data = bytes(image)
    return CudaModule(_load_image(data, "image"), ctx, "cubin" if data.startswith(b"\x7fELF") else "ptx")


def set_max_dynamic_shared(fn: CudaFunction, nbytes: int) -> None:
    """Allow ``nbytes`` of dynamic shared memory (needed above 48 KB; up to the opt-in limit)."""
    make_current(fn.context)
    check(cu.cuFuncSetAttribute(fn.handle, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                int(nbytes)), f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={nbytes}) for {fn.name}")


def _dim3(dims: int | Sequence[int], what: str) -> tuple[int, int, int]:
    t = (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(int(d) for d in dims)
    if not 1 <= len(t) <= 3 or any(d < 1 for d in t):
        raise TaskmapError(f"{what} must be 1 to 3 positive sizes, got {dims!r}")
    return t + (1,) * (3 - len(t))


def _stream_handle(stream: Any) -> int:
    if stream is None:
        return 0
    handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream
    return int(handle if handle is not None else stream)


def launch(fn: CudaFunction, grid: int | Sequence[int], block: int | Sequence[int],
           shared_bytes: int = 0, stream: Any = None, args: Sequence[Any] = ()) -> None:
    """``cuLaunchKernel``; ``args`` are ctypes / numpy scalars or device pointers (see
    :mod:`taskmap.backends.kernel_args`).  Asynchronous: synchronize the stream to see errors."""
    g, b = _dim3(grid, "grid"), _dim3(block, "block")
    packed = pack_args(args)
    make_current(fn.context)
    check(cu.cuLaunchKernel(fn.handle, *g, *b, int(shared_bytes), _stream_handle(stream), packed.address, 0),
          f"cuLaunchKernel({fn.name}, grid={g}, block={b}, shared={shared_bytes})")


def graph_seconds(launch: Callable[[Any], None], number: int, repeat: int, device: int = 0) -> list[float]:
    """Device seconds per call of ``launch(stream)``: ``number`` calls captured into one CUDA
    graph on a new stream, replayed once to warm up, then ``repeat`` times between two events.

    The kernels run back to back without the host's launch overhead, as a compiled graph's
    replay runs them (a host-timed loop of small kernels measures the launches instead)."""
    use_device(device)
    stream = check(cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value), "cuStreamCreate")
    events = [check(cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DEFAULT.value), "cuEventCreate") for _ in range(2)]
    graph = exe = None
    try:
        check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        try:
            for _ in range(number):
                launch(stream)
        finally:
            graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
        exe = check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        out = []
        for _ in range(repeat):
            check(cu.cuEventRecord(events[0], stream), "cuEventRecord")
            check(cu.cuGraphLaunch(exe, stream), "cuGraphLaunch")
            check(cu.cuEventRecord(events[1], stream), "cuEventRecord")
            check(cu.cuEventSynchronize(events[1]), "cuEventSynchronize")
            out.append(check(cu.cuEventElapsedTime(*events), "cuEventElapsedTime") / 1e3 / number)
        return out
    finally:
        cu.cuStreamSynchronize(stream)
        if exe is not None:
            cu.cuGraphExecDestroy(exe)
        if graph is not None:
            cu.cuGraphDestroy(graph)
        for e in events:
            cu.cuEventDestroy(e)
        cu.cuStreamDestroy(stream)


# ---------------------------------------------------------------------------------------------
# Memory


@dataclass
class DeviceBuffer:
    """``nbytes`` of device memory (``cuMemAlloc``); pass it as a kernel argument (its ``ptr``)."""

    ptr: int
    nbytes: int
    context: cu.CUcontext

    def free(self) -> None:
        if self.ptr:
            make_current(self.context)
            check(cu.cuMemFree(self.ptr), "cuMemFree")
            self.ptr = 0

    def copy_from(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        if host.nbytes > self.nbytes:
            raise TaskmapError(f"copy of {host.nbytes} bytes into a {self.nbytes}-byte device buffer")
        make_current(self.context)
        check(cu.cuMemcpyHtoD(self.ptr, host.ctypes.data, host.nbytes), "cuMemcpyHtoD")

    def copy_to(self, host: np.ndarray) -> np.ndarray:
        if not host.flags.c_contiguous or host.nbytes > self.nbytes:
            raise TaskmapError("copy_to needs a C-contiguous host array no larger than the buffer")
        make_current(self.context)
        check(cu.cuMemcpyDtoH(host.ctypes.data, self.ptr, host.nbytes), "cuMemcpyDtoH")
        return host


def pointer_device(ptr: int) -> int | None:
    """The ordinal of the GPU whose memory ``ptr`` points into, or None when the driver does not
    know the address (host memory, a freed or made-up pointer) or there is no GPU."""
    if not cuda_available():
        return None
    try:
        err, ordinal = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                                cu.CUdeviceptr(int(ptr)))
    except (TypeError, ValueError, OverflowError):  # not an address at all
        return None
    return int(ordinal) if err == _SUCCESS else None


def alloc(nbytes: int, device: int = 0) -> DeviceBuffer:
    ctx = use_device(device)
    ptr = check(cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes})")
    return DeviceBuffer(int(ptr), int(nbytes), ctx)


def to_device(host: np.ndarray, device: int = 0) -> DeviceBuffer:
    buf = alloc(np.asarray(host).nbytes, device)
    buf.copy_from(np.asarray(host))
    return buf
