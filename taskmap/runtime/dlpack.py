"""DLPack (https://dmlc.github.io/dlpack/latest/) in plain ctypes: the C structs, export of a
buffer as a capsule, and reading (borrowing or taking) a capsule made by another library.

Two capsule kinds exist: the legacy ``"dltensor"`` (``DLManagedTensor``, DLPack < 1.0) and
``"dltensor_versioned"`` (``DLManagedTensorVersioned``, DLPack 1.x, with a read-only flag).  The
producer hands out a capsule; a consumer that takes ownership renames it ``"used_dltensor"``
(``"used_dltensor_versioned"``) and later calls the struct's ``deleter``.  A capsule nobody
consumed calls the deleter itself when it is destroyed.  Both directions are implemented here;
nothing in this module reads the tensor's memory (only the host-side structs).
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# DLDeviceType
CPU, CUDA, CUDA_HOST, ROCM, ROCM_HOST, CUDA_MANAGED = 1, 2, 3, 10, 11, 13
# DLDataTypeCode
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY

LEGACY, VERSIONED = b"dltensor", b"dltensor_versioned"
_USED = {LEGACY: b"used_dltensor", VERSIONED: b"used_dltensor_versioned"}
#: The DLPack version this module writes into versioned capsules.
VERSION = (1, 0)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


_Deleter = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _Deleter)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    pass


_DeleterV = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensorVersioned))
DLManagedTensorVersioned._fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                                     ("deleter", _DeleterV), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]

# ---------------------------------------------------------------------------------------------
# dtypes

_DTYPES: dict[str, tuple[int, int]] = {
    "bool": (_BOOL, 8), "int8": (_INT, 8), "int16": (_INT, 16), "int32": (_INT, 32), "int64": (_INT, 64),
    "uint8": (_UINT, 8), "uint16": (_UINT, 16), "uint32": (_UINT, 32), "uint64": (_UINT, 64),
    "float16": (_FLOAT, 16), "bfloat16": (_BFLOAT, 16), "float32": (_FLOAT, 32), "float64": (_FLOAT, 64),
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_NAMES[(_UINT, 1)] = "bool"  # some producers of DLPack < 0.8 describe bool as a 1-bit uint


def dl_dtype(name: str) -> DLDataType:
    code, bits = _DTYPES[name]
    return DLDataType(code, bits, 1)


def dtype_name(dt: DLDataType) -> str:
    name = _NAMES.get((dt.code, dt.bits))
    if name is None or dt.lanes != 1:
        raise BufferError(f"DLPack dtype (code {dt.code}, {dt.bits} bits, {dt.lanes} lanes) has no taskmap dtype")
    return name


# ---------------------------------------------------------------------------------------------
# CPython capsule API through ctypes (pointers passed as void*, so no reference counting happens
# on a capsule that is being destroyed)

_api = ctypes.pythonapi
_api.PyCapsule_New.restype, _api.PyCapsule_New.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                                               ctypes.c_void_p]
_api.PyCapsule_IsValid.restype, _api.PyCapsule_IsValid.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype, _api.PyCapsule_GetPointer.argtypes = ctypes.c_void_p, [ctypes.c_void_p,
                                                                                          ctypes.c_char_p]
_api.PyCapsule_SetName.restype, _api.PyCapsule_SetName.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
_CapsuleDestructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def _capsule_name(capsule: Any) -> bytes | None:
    for name in (VERSIONED, LEGACY):
        if _api.PyCapsule_IsValid(id(capsule), name):
            return name
    return None


# ---------------------------------------------------------------------------------------------
# Export

_exports: dict[int, tuple[Any, ...]] = {}   # address of a managed struct -> what keeps it valid
_exports_lock = threading.Lock()


def _release(address: int) -> None:
    with _exports_lock:
        _exports.pop(address, None)


@_Deleter
def _delete_legacy(managed):  # called by the consumer when it is done with the memory
    _release(ctypes.addressof(managed.contents))


@_DeleterV
def _delete_versioned(managed):
    _release(ctypes.addressof(managed.contents))


def _destructor(name: bytes) -> Any:
    @_CapsuleDestructor
    def destroy(capsule):  # the capsule died unconsumed: release the export ourselves
        if _api.PyCapsule_IsValid(capsule, name):
            _release(_api.PyCapsule_GetPointer(capsule, name))
    return destroy


_DESTRUCTORS = {LEGACY: _destructor(LEGACY), VERSIONED: _destructor(VERSIONED)}


def export_capsule(ptr: int, shape: tuple[int, ...], dtype: str, device: tuple[int, int], owner: Any,
                   versioned: bool, read_only: bool = False) -> Any:
    """A new capsule describing ``ptr`` (C-contiguous, ``shape`` of ``dtype`` on ``device``);
    ``owner`` is kept alive until the consumer calls the deleter (or the capsule dies unused)."""
    ndim = len(shape)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*shape)
    tensor = DLTensor(ctypes.c_void_p(ptr or None), DLDevice(*device), ndim, dl_dtype(dtype),
                      ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64)), None, 0)
    if versioned:
        managed: Any = DLManagedTensorVersioned(DLPackVersion(*VERSION), None, _delete_versioned,
                                                READ_ONLY if read_only else 0, tensor)
        name = VERSIONED
    else:
        managed, name = DLManagedTensor(tensor, None, _delete_legacy), LEGACY
    address = ctypes.addressof(managed)
    with _exports_lock:
        _exports[address] = (managed, shape_arr, owner)
    return _api.PyCapsule_New(address, name, ctypes.cast(_DESTRUCTORS[name], ctypes.c_void_p))


def live_exports() -> int:
    """How many exported capsules are still held by a consumer (or not yet destroyed)."""
    return len(_exports)


# ---------------------------------------------------------------------------------------------
# Import


@dataclass(frozen=True)
class DLView:
    """What a capsule describes: the data pointer (``byte_offset`` applied), shape, dtype and
    device, whether it is C-contiguous and writeable."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # in elements; None: C-contiguous
    dtype: str
    device_type: int
    device_id: int
    writeable: bool

    @property
    def contiguous(self) -> bool:
        return self.strides is None or is_c_contiguous(self.shape, self.strides)


def is_c_contiguous(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int = 1) -> bool:
    """Row-major with no gaps; ``strides`` in units where one element is ``itemsize`` (elements by
    default, bytes with the element size).  Dimensions of size 1 may have any stride."""
    if len(strides) != len(shape):
        return False
    if 0 in shape:
        return True
    expected = itemsize
    for size, stride in zip(reversed(shape), reversed(strides)):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def _view(managed: Any, versioned: bool) -> DLView:
    t: DLTensor = managed.dl_tensor
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = tuple(int(t.strides[i]) for i in range(t.ndim)) if t.strides else None
    writeable = not (versioned and managed.flags & READ_ONLY)
    return DLView((t.data or 0) + int(t.byte_offset), shape, strides, dtype_name(t.dtype),
                  int(t.device.device_type), int(t.device.device_id), writeable)


def _managed(capsule: Any) -> tuple[Any, bytes]:
    name = _capsule_name(capsule)
    if name is None:
        raise BufferError("not a DLPack capsule, or one that was already consumed")
    kind = DLManagedTensorVersioned if name == VERSIONED else DLManagedTensor
    ptr = _api.PyCapsule_GetPointer(id(capsule), name)
    managed = ctypes.cast(ptr, ctypes.POINTER(kind)).contents
    if name == VERSIONED and managed.version.major > VERSION[0]:
        raise BufferError(f"DLPack {managed.version.major}.{managed.version.minor} capsule: taskmap reads 1.x")
    return managed, name


def peek(capsule: Any) -> DLView:
    """Describe an unconsumed capsule without taking it (its producer keeps ownership)."""
    managed, name = _managed(capsule)
    return _view(managed, name == VERSIONED)


def consume(capsule: Any) -> tuple[DLView, Callable[[], None]]:
    """Take ownership of the capsule's tensor: returns its view and a release function that calls
    the producer's deleter (call it exactly once, when the memory is no longer used)."""
    managed, name = _managed(capsule)
    view = _view(managed, name == VERSIONED)
    if _api.PyCapsule_SetName(capsule, _USED[name]) != 0:
        raise BufferError("could not mark the DLPack capsule as used")
    deleter, address = managed.deleter, ctypes.addressof(managed)
    kind = type(managed)

    def release() -> None:
        if deleter:
            deleter(ctypes.cast(address, ctypes.POINTER(kind)))
    return view, release


def request_capsule(obj: Any, stream: int | None) -> Any:
    """``obj.__dlpack__(...)`` asking for DLPack 1.x, falling back for producers that predate the
    ``max_version`` / ``stream`` keywords."""
    attempts = ({"stream": stream, "max_version": VERSION}, {"stream": stream}, {})
    for kwargs in attempts[:-1]:
        try:
            return obj.__dlpack__(**kwargs)
        except TypeError:
            continue
    return obj.__dlpack__()
