"""Pack kernel arguments for ``cuLaunchKernel`` / ``hipModuleLaunchKernel``.

Both take ``void** kernelParams``: an array of N pointers, the i-th pointing at the bytes of the
i-th argument (the driver copies ``sizeof(param i)`` bytes from there, sizes coming from the
kernel image).  So every argument must have an explicit C type; plain Python ``int``/``float``
are refused because their width is ambiguous (is 3 an ``int`` or a ``long long``?).

Accepted arguments:

* ctypes scalars (``ctypes.c_int(3)``, ``ctypes.c_float(1.0)``, ``ctypes.c_void_p(ptr)``) and
  ctypes structures (passed by value);
* numpy scalars (``np.float32(1.0)``, ``np.int64(7)``) and 0-d arrays;
* device pointers: anything with an integer ``.ptr`` (``DeviceBuffer``), cuda-python's
  ``CUdeviceptr`` (``int(ptr)``), or an object with ``data_ptr()`` (torch tensors) — passed as a
  64-bit address.
"""
from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import LaunchError


@dataclass
class PackedArgs:
    """The ``void**`` array and the storage it points into; keep it alive until the launch returns."""

    pointers: Any          # ctypes array of c_void_p
    storage: list[Any]     # the ctypes / numpy objects the pointers point at

    @property
    def address(self) -> int:
        """The ``void**`` as an integer (0 for a kernel without parameters)."""
        return ctypes.addressof(self.pointers) if len(self.storage) else 0

    def __len__(self) -> int:
        return len(self.storage)


def _device_address(arg: Any) -> int | None:
    ptr = getattr(arg, "ptr", None)
    if isinstance(ptr, (int, np.integer)):
        return int(ptr)
    data_ptr = getattr(arg, "data_ptr", None)
    if callable(data_ptr):
        return int(data_ptr())
    if type(arg).__name__ in ("CUdeviceptr", "hipDeviceptr_t"):
        return int(arg)
    return None


def _as_ctypes(i: int, arg: Any) -> Any:
    """A ctypes object (or 0-d numpy array) holding the argument's bytes."""
    if isinstance(arg, (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)):
        return arg
    if isinstance(arg, np.generic):
        return np.array(arg)  # 0-d, owns its bytes, right dtype
    if isinstance(arg, np.ndarray) and arg.ndim == 0:
        return np.ascontiguousarray(arg)
    address = _device_address(arg)
    if address is not None:
        return ctypes.c_uint64(address)
    if isinstance(arg, (bool, int, float)):
        raise LaunchError(
            f"kernel argument {i} is a Python {type(arg).__name__} ({arg!r}), whose C type is "
            "ambiguous: pass a ctypes or numpy scalar (e.g. ctypes.c_int32, np.float32)"
        )
    if isinstance(arg, np.ndarray):
        raise LaunchError(
            f"kernel argument {i} is a host numpy array of shape {arg.shape}: copy it to the "
            "device first and pass the device buffer"
        )
    raise LaunchError(f"kernel argument {i} has unsupported type {type(arg).__qualname__}")


def pack_args(args: Sequence[Any]) -> PackedArgs:
    """Build the ``void**`` parameter array for ``args`` (see the module docstring)."""
    storage = [_as_ctypes(i, a) for i, a in enumerate(args)]
    pointers = (ctypes.c_void_p * max(len(storage), 1))()
    for i, obj in enumerate(storage):
        pointers[i] = obj.ctypes.data if isinstance(obj, np.ndarray) else ctypes.addressof(obj)
    return PackedArgs(pointers, storage)
