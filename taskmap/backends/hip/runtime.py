"""Load and launch AMD code objects through the HIP runtime (``libamdhip64``, via ctypes).

Everything here needs an AMD GPU except :func:`hip_available` (False, never an exception, when
the library or a device is missing).  Calls are checked by :func:`check`, which raises
``TaskmapError`` with the HIP error name (``hipErrorInvalidValue``) and the failing call.

Device attribute numbers are those of ``hipDeviceAttribute_t`` in ROCm 5.x, which ROCm 6 keeps
(retired entries became ``hipDeviceAttributeUnused*``, so positions did not move).
"""
from __future__ import annotations

import ctypes
import functools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import TaskmapError
from ..kernel_args import pack_args
from .hiprtc import HipBinary, hip_library

_lock = threading.Lock()
_HIP_SUCCESS = 0
_MEMCPY_H2D, _MEMCPY_D2H = 1, 2

# hipDeviceAttribute_t (hip_runtime_api.h, ROCm 5.2)
_ATTR = {
    "compute_capability_major": 23,
    "max_threads_per_block": 56,
    "compute_capability_minor": 61,
    "multiprocessor_count": 63,
    "registers_per_block": 71,
    "shared_memory_per_block": 74,
    "warp_size": 87,
}


def _lib() -> ctypes.CDLL:
    lib = hip_library()
    if lib is None:
        raise TaskmapError("HIP runtime not found: libamdhip64.so is not installed (apt-get install libamdhip64-dev)")
    return lib


def error_name(code: int) -> str:
    lib = hip_library()
    if lib is not None:
        fn = lib.hipGetErrorName
        fn.argtypes, fn.restype = [ctypes.c_int], ctypes.c_char_p
        name = fn(int(code))
        if name:
            return name.decode()
    return f"hipError {int(code)}"


def check(code: int, what: str = "HIP call") -> None:
    if code != _HIP_SUCCESS:
        raise TaskmapError(f"{what} failed: {error_name(code)}")


@functools.cache
def hip_available() -> bool:
    """Whether an AMD GPU is usable through the HIP runtime (never raises)."""
    try:
        lib = hip_library()
        if lib is None:
            return False
        count = ctypes.c_int(0)
        return lib.hipGetDeviceCount(ctypes.byref(count)) == _HIP_SUCCESS and count.value > 0
    except Exception:  # noqa: BLE001 -- any failure to probe means "no usable GPU"
        return False


def _init(device: int) -> ctypes.CDLL:
    if not hip_available():
        raise TaskmapError("no AMD GPU: the HIP runtime sees no device")
    lib = _lib()
    check(lib.hipSetDevice(ctypes.c_int(device)), f"hipSetDevice({device})")
    return lib


# ---------------------------------------------------------------------------------------------
# Devices


@dataclass(frozen=True)
class HipDeviceProperties:
    name: str
    arch: str                         # "gfx90a", from hipDeviceProp_t.gcnArchName ("" if unknown)
    multiprocessor_count: int         # compute units
    max_threads_per_block: int
    shared_memory_per_block: int
    registers_per_block: int
    warp_size: int
    compute_capability: tuple[int, int]


def _gcn_arch_name(lib: ctypes.CDLL, device: int) -> str:
    # hipDeviceProp_t's layout differs between ROCm versions; its gcnArchName ("gfx90a:sramecc+:
    # xnack-") is found by pattern in an oversized buffer rather than by offset.
    buf = ctypes.create_string_buffer(16384)
    if lib.hipGetDeviceProperties(buf, ctypes.c_int(device)) != _HIP_SUCCESS:
        return ""
    m = re.search(rb"(gfx[0-9a-f]{3,4}(?::[a-z]+[+-])*)\0", buf.raw)
    return m.group(1).decode() if m else ""


@functools.cache
def device_properties(device: int = 0) -> HipDeviceProperties:
    lib = _init(device)

    def attr(key: str) -> int:
        value = ctypes.c_int()
        check(lib.hipDeviceGetAttribute(ctypes.byref(value), ctypes.c_int(_ATTR[key]), ctypes.c_int(device)),
              f"hipDeviceGetAttribute({key})")
        return value.value

    name = ctypes.create_string_buffer(256)
    check(lib.hipDeviceGetName(name, ctypes.c_int(256), ctypes.c_int(device)), "hipDeviceGetName")
    return HipDeviceProperties(
        name=name.value.decode(errors="replace"),
        arch=_gcn_arch_name(lib, device),
        multiprocessor_count=attr("multiprocessor_count"),
        max_threads_per_block=attr("max_threads_per_block"),
        shared_memory_per_block=attr("shared_memory_per_block"),
        registers_per_block=attr("registers_per_block"),
        warp_size=attr("warp_size"),
        compute_capability=(attr("compute_capability_major"), attr("compute_capability_minor")),
    )


def synchronize(device: int = 0) -> None:
    check(_init(device).hipDeviceSynchronize(), "hipDeviceSynchronize")


# ---------------------------------------------------------------------------------------------
# Modules and launches


@dataclass(frozen=True)
class HipFunction:
    handle: ctypes.c_void_p
    name: str
    device: int


@dataclass
class HipModule:
    handle: ctypes.c_void_p | None
    device: int
    _image: bytes = field(repr=False, default=b"")
    _functions: dict[str, HipFunction] = field(default_factory=dict, repr=False)

    def get_function(self, name: str) -> HipFunction:
        fn = self._functions.get(name)
        if fn is None:
            lib = _init(self.device)
            handle = ctypes.c_void_p()
            check(lib.hipModuleGetFunction(ctypes.byref(handle), self.handle, name.encode()),
                  f"hipModuleGetFunction({name!r})")
            fn = self._functions[name] = HipFunction(handle, name, self.device)
        return fn

    def unload(self) -> None:
        if self.handle is not None:
            check(_init(self.device).hipModuleUnload(self.handle), "hipModuleUnload")
            self.handle = None
            self._functions.clear()


def load_module(image: HipBinary | bytes, device: int = 0) -> HipModule:
    """Load an AMD code object (``hipModuleLoadData``) on ``device``."""
    data = image.code_object if isinstance(image, HipBinary) else bytes(image)
    lib = _init(device)
    handle = ctypes.c_void_p()
    with _lock:
        check(lib.hipModuleLoadData(ctypes.byref(handle), ctypes.c_char_p(data)), "hipModuleLoadData")
    return HipModule(handle, device, data)


def _dim3(dims: int | Sequence[int], what: str) -> tuple[int, int, int]:
    t = (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(int(d) for d in dims)
    if not 1 <= len(t) <= 3 or any(d < 1 for d in t):
        raise TaskmapError(f"{what} must be 1 to 3 positive sizes, got {dims!r}")
    return t + (1,) * (3 - len(t))


def launch(fn: HipFunction, grid: int | Sequence[int], block: int | Sequence[int],
           shared_bytes: int = 0, stream: Any = None, args: Sequence[Any] = ()) -> None:
    """``hipModuleLaunchKernel`` (asynchronous); ``args`` as for the CUDA driver's launch."""
    g, b = _dim3(grid, "grid"), _dim3(block, "block")
    packed = pack_args(args)
    lib = _init(fn.device)
    u = ctypes.c_uint
    stream_handle = getattr(stream, "cuda_stream", stream) or 0  # torch ROCm streams: .cuda_stream
    check(lib.hipModuleLaunchKernel(fn.handle, u(g[0]), u(g[1]), u(g[2]), u(b[0]), u(b[1]), u(b[2]),
                                    u(int(shared_bytes)), ctypes.c_void_p(int(stream_handle)),
                                    ctypes.c_void_p(packed.address), None),
          f"hipModuleLaunchKernel({fn.name}, grid={g}, block={b}, shared={shared_bytes})")


# ---------------------------------------------------------------------------------------------
# Memory


@dataclass
class HipBuffer:
    ptr: int
    nbytes: int
    device: int

    def free(self) -> None:
        if self.ptr:
            check(_init(self.device).hipFree(ctypes.c_void_p(self.ptr)), "hipFree")
            self.ptr = 0

    def copy_from(self, host: np.ndarray) -> None:
        host = np.ascontiguousarray(host)
        if host.nbytes > self.nbytes:
            raise TaskmapError(f"copy of {host.nbytes} bytes into a {self.nbytes}-byte device buffer")
        check(_init(self.device).hipMemcpy(ctypes.c_void_p(self.ptr), ctypes.c_void_p(host.ctypes.data),
                                           ctypes.c_size_t(host.nbytes), ctypes.c_int(_MEMCPY_H2D)), "hipMemcpy(H2D)")

    def copy_to(self, host: np.ndarray) -> np.ndarray:
        if not host.flags.c_contiguous or host.nbytes > self.nbytes:
            raise TaskmapError("copy_to needs a C-contiguous host array no larger than the buffer")
        check(_init(self.device).hipMemcpy(ctypes.c_void_p(host.ctypes.data), ctypes.c_void_p(self.ptr),
                                           ctypes.c_size_t(host.nbytes), ctypes.c_int(_MEMCPY_D2H)), "hipMemcpy(D2H)")
        return host


def alloc(nbytes: int, device: int = 0) -> HipBuffer:
    lib = _init(device)
    ptr = ctypes.c_void_p()
    check(lib.hipMalloc(ctypes.byref(ptr), ctypes.c_size_t(max(int(nbytes), 1))), f"hipMalloc({nbytes})")
    return HipBuffer(int(ptr.value or 0), int(nbytes), device)


def to_device(host: np.ndarray, device: int = 0) -> HipBuffer:
    host = np.ascontiguousarray(host)
    buf = alloc(host.nbytes, device)
    buf.copy_from(host)
    return buf
