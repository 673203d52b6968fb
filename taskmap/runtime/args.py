"""Check and convert launch arguments against a kernel's parameters.

Accepts numpy arrays and torch tensors (recognised without importing torch) for tensor
parameters, Python numbers for scalar parameters.  Binds symbolic sizes from the shapes, and
raises :class:`~taskmap.errors.LaunchError` naming the parameter for a wrong dtype, rank, shape,
layout or device.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..errors import LaunchError
from ..ir import expr as E
from ..ir.dtypes import ScalarType, bf16, f16
from ..ir.func import Function
from ..ir.functor import substitute
from ..ir.simplify import simplify_expr
from ..ir.types import TensorType

INT32_MAX = 2**31 - 1



@dataclass(frozen=True)
class ArrayInfo:
    """What the launcher needs to know about one array argument."""

    ptr: int
    shape: tuple[int, ...]
    dtype: str
    contiguous: bool
    writeable: bool
    device: str  # "cpu" or "cuda:N"


def is_torch_tensor(x: Any) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "data_ptr") and hasattr(x, "is_contiguous")


def array_info(x: Any) -> ArrayInfo | None:
    """Describe ``x`` if it is an array we accept, else None."""
    if isinstance(x, np.ndarray):
        return ArrayInfo(x.ctypes.data, tuple(x.shape), x.dtype.name, bool(x.flags.c_contiguous),
                         bool(x.flags.writeable), "cpu")
    if is_torch_tensor(x):
        dev = x.device
        if dev.type == "cpu" or (dev.index is None and dev.type != "cuda"):
            device = dev.type  # "cpu", "meta": no index
        else:
            device = f"{dev.type}:{dev.index or 0}"
        return ArrayInfo(x.data_ptr(), tuple(x.shape), str(x.dtype).replace("torch.", ""),
                         bool(x.is_contiguous()), True, device)
    return None


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
    env = {E.SizeVar(k): E.const(v) for k, v in sizes.items()}
    for where, d, dim, shape in derived:
        want = simplify_expr(substitute(dim, env))
        if not isinstance(want, E.Const) or int(want.value) != shape[d]:
            raise LaunchError(f"{where}: dimension {d} must be {dim!r} = {want!r}, got shape {shape}")
    values += [sizes[sv.name] for sv in func.size_vars]
    return BoundArgs(tuple(values), sizes, devices.pop() if devices else "cpu")


def _bind_tensor(fname: str, p: E.Var, a: Any, sizes: dict[str, int], written: bool, devices: set[str],
                 derived: list[tuple[str, int, E.Expr, tuple[int, ...]]]) -> int:
    t: TensorType = p.type
    info = array_info(a)
    where = f"{fname}(): argument '{p.name}'"
    if info is None:
        raise LaunchError(f"{where} must be a numpy array or torch tensor of {t!r}, got {type(a).__name__}")
    if t.dtype is bf16 and isinstance(a, np.ndarray):
        raise LaunchError(f"{where} is a bfloat16 parameter: pass a torch bfloat16 tensor (numpy has no "
                          f"bfloat16), got a numpy array of {info.dtype}")
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
    if int(np.prod(info.shape, dtype=np.int64)) > INT32_MAX:
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
