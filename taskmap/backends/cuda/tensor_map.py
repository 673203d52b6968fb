"""Tensor maps (``CUtensorMap``) for the ``tma_load`` calls of a kernel, made at launch.

Each :class:`~taskmap.backends.tma.TensorMapSpec` of the kernel becomes one more kernel argument
(after the symbolic sizes): a rank-3 tiled map (batch, rows, columns; a rank-2 tensor has one
batch) of the argument's address and sizes, with the spec's box and swizzle, elements outside the
tensor read as zeros.  Maps are cached by (device, address, sizes, spec): a compiled graph launches
on the same buffers every time.  The copy engine needs a 16-byte aligned base and rows whose byte
size is a multiple of 16; other arguments are refused with a ``LaunchError`` naming the tensor.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

from ...errors import LaunchError
from ...ir import expr as E
from ...ir.func import Function
from ...ir.functor import substitute
from ...ir.simplify import simplify_expr
from ..tma import TensorMapSpec, tensor_maps

MAP_BYTES = 128
_CACHE_LIMIT = 4096


def box_geometry(func: Function, spec: TensorMapSpec, values: Sequence[Any]) -> tuple[int, tuple[int, int, int],
                                                                                        tuple[int, int], int]:
    """(address, (columns, rows, batches), (row stride, batch stride) in bytes, element bytes) of the
    tensor ``spec`` maps, from the launch's values (parameters, then sizes); checked for TMA."""
    param = func.params[spec.param]
    t = param.type
    sizes = values[len(func.params):]
    dims = []
    for d in t.shape:
        if isinstance(d, E.Const):
            dims.append(int(d.value))
        elif isinstance(d, E.SizeVar) and d in func.size_vars:      # the common cases, without the simplifier
            dims.append(int(sizes[func.size_vars.index(d)]))
        else:
            v = simplify_expr(substitute(d, {sv: E.const(int(x)) for sv, x in zip(func.size_vars, sizes)}))
            if not isinstance(v, E.Const):
                raise LaunchError(f"{func.name}(): cannot evaluate the size {d!r} of '{param.name}' for its tensor map")
            dims.append(int(v.value))
    dims = [1] * (3 - len(dims)) + dims
    size = t.dtype.nbytes
    address = int(values[spec.param])
    row = dims[2] * size
    if address % 16 or row % 16:
        raise LaunchError(f"{func.name}(): tma_load() reads '{param.name}' ({'x'.join(map(str, dims[3 - t.ndim:]))} "
                          f"{t.dtype!r} at {address:#x}) through a tensor map, which needs a 16-byte aligned address "
                          f"and rows of a multiple of 16 bytes (its rows have {row})")
    return address, (dims[2], dims[1], dims[0]), (row, row * dims[1]), size


class TensorMaps:
    """The tensor-map arguments of one kernel: ``maps(values, device)`` -> ctypes byte arrays."""

    def __init__(self, func: Function) -> None:
        self.func = func
        self.specs = tensor_maps(func)
        self._cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return bool(self.specs)

    def __call__(self, values: Sequence[Any], device: int) -> list[Any]:
        return [self._map(spec, values, device) for spec in self.specs]

    def _map(self, spec: TensorMapSpec, values: Sequence[Any], device: int) -> Any:
        address, dims, strides, size = box_geometry(self.func, spec, values)
        key = (device, address, dims, strides, spec.key())
        found = self._cache.get(key)
        if found is None:
            found = encode_tiled(self.func.params[spec.param].type.dtype.name, address, dims, strides,
                                 (spec.cols, spec.rows, 1), spec.swizzle)
            with self._lock:
                if len(self._cache) >= _CACHE_LIMIT:
                    self._cache.clear()
                self._cache[key] = found
        return found


def encode_tiled(dtype: str, address: int, dims: tuple[int, int, int], strides: tuple[int, int],
                 box: tuple[int, int, int], swizzle: int) -> Any:
    """``cuTensorMapEncodeTiled`` of a rank-3 tensor (innermost dimension first), as the 128 bytes a
    kernel parameter takes."""
    from cuda.bindings import driver as cu

    from .driver import check

    # a copy: 16-bit integers as UINT16 (zero fill is zero bits whatever the type)
    kinds = {"float32": "FLOAT32", "float16": "FLOAT16", "bfloat16": "BFLOAT16", "int32": "INT32", "uint32": "UINT32",
             "int16": "UINT16", "uint16": "UINT16"}
    dtype_enum = getattr(cu.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{kinds[dtype]}")
    sw = cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B if swizzle else cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE
    tmap = check(cu.cuTensorMapEncodeTiled(
        dtype_enum, 3, address, [cu.cuuint64_t(d) for d in dims], [cu.cuuint64_t(s) for s in strides],
        [cu.cuuint32_t(b) for b in box], [cu.cuuint32_t(1)] * 3, cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        sw, cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
        f"cuTensorMapEncodeTiled(dims={dims}, strides={strides}, box={box}, swizzle={swizzle})")
    return (ctypes.c_ubyte * MAP_BYTES).from_buffer_copy(ctypes.string_at(tmap.getPtr(), MAP_BYTES))


__all__ = ["MAP_BYTES", "TensorMaps", "box_geometry", "encode_tiled"]
