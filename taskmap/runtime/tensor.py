"""``taskmap.Tensor``: a small, C-contiguous array in device (or host) memory.

    t = taskmap.tensor(np.random.rand(4, 4).astype(np.float32), device="cuda")
    out = taskmap.empty((4, 4), "float32", device="cuda")
    kernel(t, out)                     # taskmap Tensors are kernel arguments like torch tensors
    out.numpy()                        # a host copy (waits for the device first)
    torch.from_dlpack(out)             # zero-copy views for other libraries (DLPack, and
    cupy.asarray(out)                  # __cuda_array_interface__ v3 on CUDA)
    t2 = taskmap.from_dlpack(torch_tensor)   # and back, zero-copy

Memory comes from the CUDA driver (``cuMemAlloc`` in the device's primary context, the one
PyTorch uses), the HIP runtime (``hipMalloc``), or numpy on the host (``device="cpu"``), and is
freed when the last reference to it goes.  ``bfloat16`` tensors are made from and read back as
float32 arrays (numpy has no bfloat16): values are rounded to nearest-even on the way in.

Streams: taskmap launches kernels on PyTorch's current stream when torch is loaded, else on the
legacy default stream, which is what exported tensors tell their consumers to wait for.
"""
from __future__ import annotations

import ctypes
import sys
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..backends.cuda import driver as cuda_driver
from ..backends.hip import runtime as hip_runtime
from ..errors import TaskmapError, UnsupportedError
from ..ir.dtypes import ScalarType, scalar_type
from . import dlpack

DEVICE_KINDS = ("cpu", "cuda", "hip")
_DL_DEVICE = {"cpu": dlpack.CPU, "cuda": dlpack.CUDA, "hip": dlpack.ROCM}
#: DLPack device types taskmap reads, and the device kind they are (pinned host memory is host memory).
DLPACK_DEVICES = {dlpack.CPU: "cpu", dlpack.CUDA_HOST: "cpu", dlpack.ROCM_HOST: "cpu", dlpack.CUDA: "cuda",
                  dlpack.CUDA_MANAGED: "cuda", dlpack.ROCM: "hip"}


# ---------------------------------------------------------------------------------------------
# Devices and dtypes


def parse_device(device: Any) -> tuple[str, int]:
    """``"cuda"`` / ``"cuda:1"`` / ``"hip:0"`` / ``"cpu"`` (or a torch.device) -> (kind, index)."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in DEVICE_KINDS or (index and not index.isdigit()) or (kind == "cpu" and index not in ("", "0")):
        raise UnsupportedError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N', 'hip' or 'hip:N'")
    return kind, int(index or 0)


def device_string(kind: str, index: int = 0) -> str:
    """The canonical name: ``"cpu"``, ``"cuda:N"`` or ``"hip:N"``."""
    return "cpu" if kind == "cpu" else f"{kind}:{index}"


def dtype_name(dtype: Any) -> str:
    """Normalise a dtype: ``"float32"``, ``"f32"``, ``np.float32``, ``taskmap.lang.f32``, torch dtypes."""
    if isinstance(dtype, (np.dtype, type)) and not isinstance(dtype, ScalarType):
        try:
            dtype = np.dtype(dtype).name
        except TypeError:
            pass
    try:
        return scalar_type(dtype).name
    except TypeError:
        raise UnsupportedError(f"unsupported dtype {dtype!r}: use bool, int8..int64, uint8..uint64, float16, "
                               "bfloat16, float32 or float64") from None


def storage_dtype(name: str) -> np.dtype:
    """The numpy dtype holding the bits of ``name`` (bfloat16: uint16)."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float values -> bfloat16 bit patterns (uint16), rounding to nearest-even; NaN stays NaN."""
    u = np.asarray(x, dtype=np.float32, order="C").view(np.uint32)
    rounded = ((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return np.asarray(np.where((u & 0x7FFFFFFF) > 0x7F800000, ((u >> 16) | 0x40).astype(np.uint16), rounded))


def from_bf16_bits(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Memory owners: whatever keeps a tensor's pointer valid


def _quietly(fn: Callable[[], Any]) -> Callable[[], None]:
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 -- freeing at collection time: nobody to report to
            pass
    return run


class _Owned:
    """Device memory freed when this object is collected."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        finalizer = weakref.finalize(self, _quietly(buffer.free))
        finalizer.atexit = False  # at exit the process's memory goes with it


class _Borrowed:
    """Memory owned by another library (a consumed DLPack capsule): released when collected."""

    def __init__(self, release: Callable[[], None]) -> None:
        weakref.finalize(self, _quietly(release)).atexit = False


def _check_device(kind: str, index: int) -> None:
    if kind == "cuda":
        if not cuda_driver.cuda_available():
            raise UnsupportedError(f"no NVIDIA GPU in this process: cannot place a tensor on cuda:{index} "
                                   "(use device='cpu', or numpy arrays, to run kernels on the CPU)")
        count = cuda_driver.device_count()
        if index >= count:
            raise UnsupportedError(f"cuda:{index} does not exist: this machine has {count} NVIDIA GPU(s)")
    elif kind == "hip" and not hip_runtime.hip_available():
        raise UnsupportedError(f"no AMD GPU in this process: cannot place a tensor on hip:{index}")


def _alloc(kind: str, index: int, nbytes: int) -> Any:
    _check_device(kind, index)
    return (cuda_driver.alloc if kind == "cuda" else hip_runtime.alloc)(nbytes, index)


def _view(kind: str, index: int, ptr: int, nbytes: int) -> Any:
    """A non-owning buffer object over device memory, for its copy methods."""
    if kind == "cuda":
        return cuda_driver.DeviceBuffer(ptr, nbytes, cuda_driver.primary_context(index))
    return hip_runtime.HipBuffer(ptr, nbytes, index)


def _synchronize(kind: str, index: int) -> None:
    (cuda_driver.synchronize if kind == "cuda" else hip_runtime.synchronize)(index)


# ---------------------------------------------------------------------------------------------
# Tensor


class Tensor:
    """A C-contiguous array on one device; make one with :func:`tensor`, :func:`empty` or
    :func:`from_dlpack`.  Accepted wherever a kernel takes a tensor argument."""

    __slots__ = ("__weakref__", "_index", "_kind", "_memory", "_ptr", "_writeable", "device", "dtype", "shape")

    def __init__(self, memory: Any, ptr: int, shape: Sequence[int], dtype: str, device: str,
                 writeable: bool = True) -> None:
        self._memory = memory                    # keeps the pointer valid (numpy array, _Owned, _Borrowed)
        self._ptr = int(ptr)
        self.shape: tuple[int, ...] = tuple(int(s) for s in shape)
        self.dtype: str = dtype
        self._kind, self._index = parse_device(device)
        self.device: str = device_string(self._kind, self._index)
        self._writeable = writeable

    # -- description ---------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return storage_dtype(self.dtype).itemsize

    @property
    def nbytes(self) -> int:
        return self.size * self.itemsize

    @property
    def writeable(self) -> bool:
        return self._writeable

    def data_ptr(self) -> int:
        """The address of the first element (device memory for cuda/hip tensors)."""
        return self._ptr

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __repr__(self) -> str:
        return f"taskmap.Tensor(shape={self.shape}, dtype={self.dtype}, device='{self.device}')"

    # -- copies ----------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """A host copy (bfloat16 comes back as float32).  For device tensors this first waits for
        all work queued on the device, so results of kernels launched on any stream are seen."""
        out = np.empty(self.shape, storage_dtype(self.dtype))
        if out.nbytes:
            if self._kind == "cpu":
                src = (ctypes.c_char * out.nbytes).from_address(self._ptr)
                out.reshape(-1).view(np.uint8)[:] = np.frombuffer(src, np.uint8)
            else:
                _synchronize(self._kind, self._index)
                self._device_buffer().copy_to(out)
        return from_bf16_bits(out) if self.dtype == "bfloat16" else out

    def copy_(self, data: Any) -> Tensor:
        """Copy a host array of the same shape into this tensor (converted to its dtype)."""
        if not self._writeable:
            raise TaskmapError(f"{self!r} is read-only")
        host = _host_array(data, self.dtype)
        if host.shape != self.shape:
            raise TaskmapError(f"copy_: shape {host.shape} does not match the tensor's {self.shape}")
        if host.nbytes:
            if self._kind == "cpu":
                ctypes.memmove(self._ptr, host.ctypes.data, host.nbytes)
            else:
                self._device_buffer().copy_from(host)
        return self

    def _device_buffer(self) -> Any:
        if isinstance(self._memory, _Owned):
            return self._memory.buffer
        return _view(self._kind, self._index, self._ptr, self.nbytes)

    # -- interchange -----------------------------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        """Version 3 of Numba's CUDA Array Interface (CUDA tensors other than bfloat16 only)."""
        if self._kind != "cuda":
            raise AttributeError(f"__cuda_array_interface__: {self.device} tensors are not CUDA memory")
        if self.dtype == "bfloat16":
            raise AttributeError("__cuda_array_interface__ has no typestr for bfloat16: use DLPack")
        typestr = np.dtype(self.dtype).str
        return {"shape": self.shape, "typestr": typestr, "descr": [("", typestr)],
                "data": (self._ptr, not self._writeable), "strides": None, "version": 3, "stream": 1}

    def __dlpack_device__(self) -> tuple[int, int]:
        return _DL_DEVICE[self._kind], self._index

    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: tuple[int, int] | None = None, copy: bool | None = None) -> Any:
        """A DLPack capsule sharing this tensor's memory (a copy when ``copy=True``); versioned
        (DLPack 1.0) when the consumer's ``max_version`` allows it."""
        if stream is not None and not isinstance(stream, int):
            raise TypeError(f"stream must be an int or None, got {type(stream).__name__}")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export a {self.device} tensor to DLPack device {tuple(dl_device)} "
                              "(taskmap exports without moving data)")
        source = self
        if copy:
            source = tensor(self.numpy(), device=self.device, dtype=self.dtype)
        versioned = max_version is not None and tuple(max_version) >= dlpack.VERSION
        return dlpack.export_capsule(source._ptr, source.shape, source.dtype, source.__dlpack_device__(),
                                     owner=source, versioned=versioned, read_only=not source._writeable)


# ---------------------------------------------------------------------------------------------
# Constructors


def _host_array(data: Any, dtype: str) -> np.ndarray:
    """``data`` as a C-contiguous host array holding the bits of ``dtype``."""
    arr = np.asarray(data)
    if dtype == "bfloat16":
        return arr.view(np.uint16) if arr.dtype.name == "bfloat16" else to_bf16_bits(arr.astype(np.float32))
    return np.asarray(arr, dtype=np.dtype(dtype), order="C")


#: Byte alignment of the CPU arrays taskmap allocates for kernels: a cache line (what PyTorch's CPU
#: allocator gives too).  numpy starts arrays 16 bytes off a line as often as not, and every
#: vector load of a row that starts off a line spans two lines.
CACHE_LINE = 64


def host_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialised C-contiguous numpy array that starts on a cache line."""
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    buf = np.empty(nbytes + CACHE_LINE, np.uint8)
    start = -buf.ctypes.data % CACHE_LINE
    return buf[start:start + nbytes].view(dt).reshape(tuple(shape))


def empty(shape: int | Sequence[int], dtype: Any = "float32", device: Any = "cuda") -> Tensor:
    """An uninitialised tensor of ``shape`` and ``dtype`` on ``device``."""
    shape = (int(shape),) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in shape {shape}")
    name = dtype_name(dtype)
    kind, index = parse_device(device)
    nbytes = int(np.prod(shape, dtype=np.int64)) * storage_dtype(name).itemsize
    if kind == "cpu":
        host = host_empty((max(nbytes, 1),), np.uint8)
        return Tensor(host, host.ctypes.data, shape, name, "cpu")
    owned = _Owned(_alloc(kind, index, nbytes))
    return Tensor(owned, owned.buffer.ptr, shape, name, device_string(kind, index))


def tensor(data: Any, device: Any = "cuda", dtype: Any = None) -> Tensor:
    """A copy of ``data`` (a numpy array or anything ``np.asarray`` takes) on ``device``;
    ``dtype`` converts it (default: the array's own dtype)."""
    arr = np.asarray(data)
    name = dtype_name(dtype if dtype is not None else arr.dtype)
    out = empty(arr.shape, name, device)
    return out.copy_(arr)


def consumer_stream(kind: str, index: int) -> int | None:
    """The stream a DLPack producer must order its work before (what taskmap launches on)."""
    if kind == "cpu":
        return None
    torch = sys.modules.get("torch")
    if kind == "cuda" and torch is not None and torch.cuda.is_available():
        handle = torch.cuda.current_stream(index).cuda_stream
        return handle if handle else 1     # DLPack: 1 names CUDA's legacy default stream
    return 1 if kind == "cuda" else 0      # ROCm's default stream is 0


def from_dlpack(obj: Any) -> Tensor:
    """A Tensor sharing the memory of ``obj`` (anything with ``__dlpack__``, or a DLPack capsule),
    without copying; ``obj``'s memory stays alive as long as the Tensor does."""
    if hasattr(obj, "__dlpack__"):
        dl_type, dl_id = obj.__dlpack_device__()
        kind = DLPACK_DEVICES.get(int(dl_type))
        if kind is None:
            raise UnsupportedError(f"from_dlpack: DLPack device type {int(dl_type)} is not supported "
                                   "(cpu, cuda and rocm are)")
        capsule = dlpack.request_capsule(obj, consumer_stream(kind, int(dl_id)))
    else:
        capsule = obj
    view = dlpack.peek(capsule)            # validate before taking ownership
    kind = DLPACK_DEVICES.get(view.device_type)
    if kind is None:
        raise UnsupportedError(f"from_dlpack: DLPack device type {view.device_type} is not supported")
    if not view.contiguous:
        raise UnsupportedError(f"from_dlpack: taskmap Tensors are C-contiguous, got shape {view.shape} with "
                               f"strides {view.strides} (elements); make it contiguous first")
    view, release = dlpack.consume(capsule)
    return Tensor(_Borrowed(release), view.ptr, view.shape, view.dtype,
                  device_string(kind, view.device_id if kind != "cpu" else 0), writeable=view.writeable)
