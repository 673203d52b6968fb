"""Check and convert launch arguments against a kernel's parameters.

Tensor parameters accept (checked in this order):

* numpy arrays (host memory);
* :class:`taskmap.Tensor` (host, CUDA or HIP memory);
* torch tensors, zero-copy through ``data_ptr()`` (recognised without importing torch);
* any object with ``__cuda_array_interface__`` (CuPy, Numba, ...): versions 0 to 3, no mask,
  C-contiguous (``strides`` None or row-major), a native-endian ``typestr``; its device comes
  from ``__dlpack_device__`` or a ``device`` attribute when it has one, else from the driver;
* any object with ``__dlpack__`` / ``__dlpack_device__`` (JAX, ...): a capsule is requested and
  read (never consumed), the producer keeping ownership.

Scalar parameters take Python numbers.  Devices are named ``"cpu"``, ``"cuda:N"``, ``"hip:N"``
(torch's own name for others, e.g. ``"meta"``).  Binds symbolic sizes from the shapes, and
raises :class:`~taskmap.errors.LaunchError` naming the parameter for a wrong dtype, rank, shape,
layout or device.  Nothing here reads the arrays' memory.
"""
from __future__ import annotations

import ctypes
import functools
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from ..backends.cuda import driver as cuda_driver
from ..errors import LaunchError, TaskmapError
from ..ir import expr as E
from ..ir.dtypes import ScalarType, bf16, f16
from ..ir.func import Function
from ..ir.functor import substitute
from ..ir.simplify import simplify_expr
from ..ir.types import TensorType
from . import dlpack
from .tensor import CACHE_LINE, DLPACK_DEVICES, Tensor, consumer_stream, device_string, host_empty, parse_device

INT32_MAX = 2**31 - 1
_CAI_VERSIONS = range(4)


class ArrayInfo(NamedTuple):
    """What the launcher needs to know about one array argument (a tuple: built on every launch)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: str
    contiguous: bool
    writeable: bool
    device: str  # "cpu", "cuda:N", "hip:N" (or torch's name of another device, e.g. "meta")


_NP_NAMES: dict[np.dtype, str] = {}


def _np_name(dtype: np.dtype) -> str:
    """``dtype.name``, memoized (numpy computes it in Python on every access)."""
    name = _NP_NAMES.get(dtype)
    if name is None:
        name = _NP_NAMES[dtype] = dtype.name
    return name


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")


def array_info(x: Any) -> ArrayInfo | None:
    """Describe ``x`` if it is an array we accept, else None.  Raises LaunchError for an array
    interface we recognise but cannot use (e.g. a masked ``__cuda_array_interface__``)."""
    if isinstance(x, np.ndarray):
        flags = x.flags
        return ArrayInfo(x.__array_interface__["data"][0], x.shape, _np_name(x.dtype), flags.c_contiguous,
                         flags.writeable, "cpu")
    if isinstance(x, Tensor):
        return ArrayInfo(x.data_ptr(), x.shape, x.dtype, True, x.writeable, x.device)
    if is_torch_tensor(x):
        return ArrayInfo(x.data_ptr(), tuple(x.shape), str(x.dtype).replace("torch.", ""),
                         bool(x.is_contiguous()), True, _torch_device(x.device))
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return _cai_info(x, cai)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _dlpack_info(x)
    return None


def _data_field_offset() -> int | None:
    """Where a numpy array object keeps its data pointer: numpy's ``PyArrayObject`` starts with
    it, right after the object header (a stable part of numpy's ABI).  Checked on probe arrays;
    None where it does not hold (then :func:`numpy_ptr` asks numpy)."""
    offset = object.__basicsize__
    probes = [np.empty(3, np.float32), np.arange(7.0)[2:], np.zeros((2, 3), np.int8)[1]]
    if np.ndarray.__basicsize__ < offset + ctypes.sizeof(ctypes.c_void_p):
        return None
    ok = all(ctypes.c_void_p.from_address(id(p) + offset).value == p.ctypes.data for p in probes)
    return offset if ok else None


_DATA_OFFSET = _data_field_offset()
_AT = ctypes.c_void_p.from_address


def numpy_ptr(a: np.ndarray) -> int:
    """The address of a numpy array's first element (a microsecond faster than ``a.ctypes.data``:
    ops launch small kernels by addresses)."""
    if _DATA_OFFSET is None:
        return a.ctypes.data
    return _AT(id(a) + _DATA_OFFSET).value or 0


def data_ptr(a: Any) -> int:
    """The address of a numpy array's, torch tensor's or taskmap Tensor's first element."""
    return numpy_ptr(a) if isinstance(a, np.ndarray) else a.data_ptr()


def view(a: Any, shape: Sequence[int]) -> Any:
    """``a`` (C-contiguous) seen with another shape of the same size, without copying."""
    shape = tuple(int(s) for s in shape)
    if isinstance(a, np.ndarray):
        return a.reshape(shape)
    if isinstance(a, Tensor):
        return Tensor(a, a.data_ptr(), shape, a.dtype, a.device, a.writeable)
    if is_torch_tensor(a):
        return a.view(shape)
    raise TypeError(f"cannot view a {type(a).__name__} as {shape}")


def in_place(a: np.ndarray, nbytes: int = CACHE_LINE) -> bool:
    """Whether :func:`aligned` returns the numpy array ``a`` itself (no copy)."""
    return a.ctypes.data % nbytes == 0 or not a.flags.c_contiguous


def aligned(a: Any, nbytes: int = CACHE_LINE) -> Any:
    """``a`` (a C-contiguous numpy array or torch tensor) if it starts at a multiple of ``nbytes``
    bytes (at most a cache line), else a copy that does: on a cache line for numpy, a clone for
    torch (PyTorch's allocators align CPU tensors to 64 bytes, GPU ones to 256).  Other arrays,
    strided views included, are returned as they are."""
    if isinstance(a, np.ndarray):
        if in_place(a, nbytes):
            return a
        out = host_empty(a.shape, a.dtype)
        out[...] = a
        return out
    if is_torch_tensor(a) and a.data_ptr() % nbytes and a.is_contiguous():
        return a.clone(memory_format=sys.modules["torch"].contiguous_format)
    return a


def reinterpret(buf: Any, dtype: str) -> Any:
    """A float32 buffer (numpy or torch, 1-D) seen as ``dtype`` (same memory; 2-byte types: twice the
    elements) — a graph's workspace slots are float32."""
    if isinstance(buf, np.ndarray):
        from ..ir.dtypes import scalar_type
        return buf.view(scalar_type(dtype).numpy_dtype)
    torch = sys.modules["torch"]
    return buf.view(getattr(torch, dtype))


def torch_view(a: np.ndarray) -> Any:
    """A torch CPU tensor over ``a``'s memory, no copy (do not write to it when ``a`` is read-only);
    bfloat16 arrays (``ml_dtypes``') too, which ``torch.from_numpy`` refuses."""
    import warnings

    import torch
    with warnings.catch_warnings():  # a read-only array: torch warns, the tensor is only read
        warnings.simplefilter("ignore", UserWarning)
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(a)


def _torch_device(dev: Any) -> str:
    if dev.type == "cpu" or (dev.index is None and dev.type != "cuda"):
        return dev.type  # "cpu", "meta": no index
    kind = dev.type
    torch = sys.modules.get("torch")
    if kind == "cuda" and getattr(getattr(torch, "version", None), "hip", None):
        kind = "hip"  # PyTorch for ROCm calls AMD GPUs "cuda"
    return f"{kind}:{dev.index or 0}"


def _cai_info(x: Any, cai: Any) -> ArrayInfo:
    what = "__cuda_array_interface__"
    if not isinstance(cai, dict):
        raise LaunchError(f"{what} must be a dict, got {type(cai).__name__}")
    version = cai.get("version")
    if not isinstance(version, int) or version not in _CAI_VERSIONS:
        raise LaunchError(f"{what} version {version!r} is not supported (versions 0 to 3 are)")
    if cai.get("mask") is not None:
        raise LaunchError(f"{what} has a mask: masked arrays are not supported")
    try:
        shape = tuple(int(s) for s in cai["shape"])
        ptr, readonly = cai["data"]
        typestr = cai["typestr"]
    except (KeyError, TypeError, ValueError):
        raise LaunchError(f"{what} needs 'shape', 'typestr' and 'data' (pointer, read-only flag)") from None
    try:
        dtype = np.dtype(typestr)
    except TypeError:
        raise LaunchError(f"{what} typestr {typestr!r} is not a dtype taskmap supports") from None
    if not dtype.isnative:
        raise LaunchError(f"{what} typestr {typestr!r} is not in this machine's byte order")
    strides = cai.get("strides")
    contiguous = True
    if strides is not None:
        strides = tuple(int(s) for s in strides)
        contiguous = dlpack.is_c_contiguous(shape, strides, dtype.itemsize)
    ptr = int(ptr or 0)
    return ArrayInfo(ptr, shape, dtype.name, contiguous, not readonly, _cai_device(x, ptr))


def _declared_device(x: Any) -> str | None:
    """The device an array object names itself: ``__dlpack_device__()`` or ``.device`` (an int,
    a CuPy ``Device`` with ``.id``, or a string like ``"cuda:1"``)."""
    get = getattr(x, "__dlpack_device__", None)
    if callable(get):
        try:
            dl_type, dl_id = get()
        except Exception:  # noqa: BLE001, S110 -- a broken optional protocol: fall back to the others
            pass
        else:
            kind = DLPACK_DEVICES.get(int(dl_type))
            if kind is not None:
                return device_string(kind, int(dl_id))
    dev = getattr(x, "device", None)
    ident = getattr(dev, "id", dev)
    if isinstance(ident, (int, np.integer)) and not isinstance(ident, bool):
        return device_string("cuda", int(ident))
    if isinstance(dev, str):
        try:
            return device_string(*parse_device(dev))
        except TaskmapError:
            return None
    return None


def _cai_device(x: Any, ptr: int) -> str:
    declared = _declared_device(x)
    if declared is not None:
        return declared
    if not cuda_driver.cuda_available():
        return "cuda:0"  # nothing to ask; a launch without a GPU stops before using the pointer
    ordinal = cuda_driver.pointer_device(ptr)
    if ordinal is None:
        raise LaunchError(f"__cuda_array_interface__ pointer {ptr:#x} is not memory of any CUDA device")
    return f"cuda:{ordinal}"


def _dlpack_info(x: Any) -> ArrayInfo:
    try:
        dl_type, dl_id = (int(v) for v in x.__dlpack_device__())
    except (TypeError, ValueError) as exc:
        raise LaunchError(f"__dlpack_device__() did not return (device type, id): {exc}") from None
    kind = DLPACK_DEVICES.get(dl_type)
    if kind is None:
        raise LaunchError(f"DLPack device type {dl_type} is not supported (cpu, cuda and rocm are)")
    try:
        capsule = dlpack.request_capsule(x, consumer_stream(kind, dl_id))
        view = dlpack.peek(capsule)  # the unconsumed capsule returns the memory to x when dropped
    except (BufferError, TypeError, ValueError) as exc:
        raise LaunchError(f"cannot read it through DLPack: {exc}") from None
    return ArrayInfo(view.ptr, view.shape, view.dtype, view.contiguous, view.writeable, device_string(kind, dl_id))


@dataclass(frozen=True)
class BoundArgs:
    values: tuple[Any, ...]          # params then size values, as ctypes-ready Python values
    sizes: dict[str, int]
    device: str


def _dim_value(dim: E.Expr, sizes: dict[str, int]) -> int | None:
    if isinstance(dim, E.Const):
        return int(dim.value)
    if isinstance(dim, E.SizeVar):
        return sizes.get(dim.name)
    return None


@functools.lru_cache(maxsize=4096)
def _derived(dim: E.Expr, sizes: tuple[tuple[str, int], ...]) -> E.Expr:
    """A derived dimension (``2 * n``) with the symbolic sizes bound (memoized: a launch's checks
    repeat per call, and simplifying the expression costs far more than the kernel of a small
    problem)."""
    return simplify_expr(substitute(dim, {E.SizeVar(k): E.const(v) for k, v in sizes}))


def bind_args(func: Function, args: Sequence[Any], written: set[str]) -> BoundArgs:
    """Check ``args`` against ``func``'s parameters; ``written`` names the tensors it stores to."""
    if len(args) != len(func.params):
        names = ", ".join(p.name for p in func.params)
        raise LaunchError(f"{func.name}() takes {len(func.params)} arguments ({names}), got {len(args)}")
    sizes: dict[str, int] = {}
    values: list[Any] = []
    devices: set[str] = set()
    derived: list[tuple[str, int, E.Expr, tuple[int, ...]]] = []  # dimensions like 2 * n, checked last
    for p, a in zip(func.params, args):
        if isinstance(p.type, TensorType):
            values.append(_bind_tensor(func.name, p, a, sizes, p.name in written, devices, derived))
        else:
            values.append(_bind_scalar(func.name, p, a))
    if len(devices) > 1:
        raise LaunchError(f"{func.name}(): arguments are on different devices: {sorted(devices)}")
    missing = [sv.name for sv in func.size_vars if sv.name not in sizes]
    if missing:
        raise LaunchError(f"{func.name}(): cannot infer symbolic sizes {missing} from the arguments "
                          "(each must be a whole dimension of some tensor argument)")
    bound = tuple(sorted(sizes.items()))
    for where, d, dim, shape in derived:
        want = _derived(dim, bound)
        if not isinstance(want, E.Const) or int(want.value) != shape[d]:
            raise LaunchError(f"{where}: dimension {d} must be {dim!r} = {want!r}, got shape {shape}")
    values += [sizes[sv.name] for sv in func.size_vars]
    return BoundArgs(tuple(values), sizes, devices.pop() if devices else "cpu")


def _bind_tensor(fname: str, p: E.Var, a: Any, sizes: dict[str, int], written: bool, devices: set[str],
                 derived: list[tuple[str, int, E.Expr, tuple[int, ...]]]) -> int:
    t: TensorType = p.type
    where = f"{fname}(): argument '{p.name}'"
    try:
        info = array_info(a)
    except LaunchError as exc:
        raise LaunchError(f"{where}: {exc}") from None
    if info is None:
        raise LaunchError(f"{where} must be a numpy array or torch tensor (or a taskmap.Tensor, or an array with "
                          f"__cuda_array_interface__ or __dlpack__) of {t!r}, got {type(a).__name__}")
    if t.dtype is bf16 and isinstance(a, np.ndarray) and info.dtype != "bfloat16":
        raise LaunchError(f"{where} is a bfloat16 parameter: pass a torch bfloat16 tensor or an ml_dtypes "
                          f"bfloat16 array, got a numpy array of {info.dtype}")
    if info.dtype != t.dtype.name:
        raise LaunchError(f"{where} must have dtype {t.dtype.name}, got {info.dtype}")
    if len(info.shape) != t.ndim:
        raise LaunchError(f"{where} must have {t.ndim} dimensions {t!r}, got shape {info.shape}")
    for d, (dim, got) in enumerate(zip(t.shape, info.shape)):
        if not isinstance(dim, (E.Const, E.SizeVar)):
            derived.append((where, d, dim, info.shape))
            continue
        want = _dim_value(dim, sizes)
        if want is None and isinstance(dim, E.SizeVar):
            if got < 1:
                raise LaunchError(f"{where}: size '{dim.name}' (dimension {d}) must be positive, got {got}")
            sizes[dim.name] = got
        elif want != got:
            label = f"size '{dim.name}' = {want} bound by an earlier argument" if isinstance(dim, E.SizeVar) else want
            raise LaunchError(f"{where}: dimension {d} must be {label}, got shape {info.shape}")
    if math.prod(info.shape) > INT32_MAX:
        raise LaunchError(f"{where} has more than 2**31-1 elements, which 32-bit indexing cannot address")
    if not info.contiguous:
        raise LaunchError(f"{where} must be C-contiguous (row-major); call .contiguous() / np.ascontiguousarray")
    if written and not info.writeable:
        raise LaunchError(f"{where} is written by the kernel but the array is read-only")
    devices.add(info.device)
    return info.ptr


def _bind_scalar(fname: str, p: E.Var, a: Any) -> Any:
    t: ScalarType = p.type
    where = f"{fname}(): argument '{p.name}'"
    if isinstance(a, np.generic):
        a = a.item()
    if t.is_bool:
        if not isinstance(a, (bool, int)):
            raise LaunchError(f"{where} must be a bool, got {type(a).__name__}")
        return bool(a)
    if t.is_integer:
        if isinstance(a, bool) or not isinstance(a, int):
            raise LaunchError(f"{where} must be an int ({t!r}), got {type(a).__name__}")
        lo, hi = (0, 2 ** (8 * t.nbytes) - 1) if not t.is_signed else (-(2 ** (8 * t.nbytes - 1)), 2 ** (8 * t.nbytes - 1) - 1)
        if not lo <= a <= hi:
            raise LaunchError(f"{where} = {a} does not fit in {t!r}")
        return a
    if isinstance(a, bool) or not isinstance(a, (int, float)):
        raise LaunchError(f"{where} must be a number ({t!r}), got {type(a).__name__}")
    if t is f16:
        return float(np.float16(a))
    return _round_bf16(float(a)) if t is bf16 else float(a)


def _round_bf16(x: float) -> float:
    """``x`` rounded to the nearest bfloat16 (ties to even), as the kernel's bf16 conversions do."""
    u = int(np.array(x, np.float32).view(np.uint32))
    if (u & 0x7FFFFFFF) > 0x7F800000:  # NaN stays NaN
        return x
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16 << 16) & 0xFFFFFFFF
    return float(np.array(u, np.uint32).view(np.float32))
