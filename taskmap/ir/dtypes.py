"""Scalar types of the tensor IR: interned singletons (``f32``, ``i32``, ...).

Indexing a scalar type, ``f32[64, n]``, builds a global row-major tensor type (kernel parameter
annotations); calling it, ``f32(x)``, builds a cast.  Both are provided by the modules that own
those nodes (``ir.types`` and ``ir.expr``) through the two hooks below, so this module depends on
nothing else in the IR.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

# Filled in by ir.types and ir.expr when they are imported (ir/__init__ imports both).
HOOKS: dict[str, Callable[..., Any]] = {}


class TypeKind(enum.Enum):
    BOOL = "bool"
    INT = "int"
    UINT = "uint"
    FLOAT = "float"


@dataclass(frozen=True, eq=False)
class ScalarType:
    """A scalar type; instances are unique, so identity is equality."""

    name: str
    kind: TypeKind
    nbytes: int
    short: str

    def __repr__(self) -> str:
        return self.short

    def __reduce__(self) -> tuple[Any, ...]:
        return scalar_type, (self.name,)     # unpickled as the unique instance

    @property
    def is_float(self) -> bool:
        return self.kind is TypeKind.FLOAT

    @property
    def is_integer(self) -> bool:
        return self.kind in (TypeKind.INT, TypeKind.UINT)

    @property
    def is_signed(self) -> bool:
        return self.kind in (TypeKind.INT, TypeKind.FLOAT)

    @property
    def is_bool(self) -> bool:
        return self.kind is TypeKind.BOOL

    @property
    def numpy_dtype(self) -> np.dtype:
        return numpy_bfloat16() if self.name == "bfloat16" else np.dtype(self.name)

    def __getitem__(self, shape: Any) -> Any:
        """``f32[64, n]``: a global, row-major tensor type (parameter annotations)."""
        return HOOKS["tensor_type"](self, shape if isinstance(shape, tuple) else (shape,))

    def __call__(self, value: Any) -> Any:
        """``f32(x)``: a cast of an IR expression (or a typed constant)."""
        return HOOKS["cast"](value, self)


def _scalar(name: str, kind: TypeKind, nbytes: int, short: str) -> ScalarType:
    return ScalarType(name, kind, nbytes, short)


bool_ = _scalar("bool", TypeKind.BOOL, 1, "bool")
i8 = _scalar("int8", TypeKind.INT, 1, "i8")
i16 = _scalar("int16", TypeKind.INT, 2, "i16")
i32 = _scalar("int32", TypeKind.INT, 4, "i32")
i64 = _scalar("int64", TypeKind.INT, 8, "i64")
u8 = _scalar("uint8", TypeKind.UINT, 1, "u8")
u16 = _scalar("uint16", TypeKind.UINT, 2, "u16")
u32 = _scalar("uint32", TypeKind.UINT, 4, "u32")
u64 = _scalar("uint64", TypeKind.UINT, 8, "u64")
f16 = _scalar("float16", TypeKind.FLOAT, 2, "f16")
bf16 = _scalar("bfloat16", TypeKind.FLOAT, 2, "bf16")
f32 = _scalar("float32", TypeKind.FLOAT, 4, "f32")
f64 = _scalar("float64", TypeKind.FLOAT, 8, "f64")

SCALAR_TYPES: tuple[ScalarType, ...] = (bool_, i8, i16, i32, i64, u8, u16, u32, u64, f16, bf16, f32, f64)
_BY_NAME = {t.name: t for t in SCALAR_TYPES} | {t.short: t for t in SCALAR_TYPES}


def numpy_bfloat16() -> np.dtype:
    """numpy's bfloat16: the ``ml_dtypes`` package's (a compiled graph keeps bf16 constants in it;
    importing it also makes ``np.dtype("bfloat16")`` known).  TypeError without the package."""
    try:
        import ml_dtypes
    except ImportError:
        raise TypeError("numpy has no bfloat16 without the ml_dtypes package (pip install ml_dtypes)") from None
    return np.dtype(ml_dtypes.bfloat16)


def scalar_type(name: str | np.dtype | ScalarType) -> ScalarType:
    """Look a scalar type up by name ('float32', 'f32'), numpy dtype, or torch dtype name."""
    if isinstance(name, ScalarType):
        return name
    key = str(name).replace("torch.", "")
    if key in _BY_NAME:
        return _BY_NAME[key]
    raise TypeError(f"unsupported scalar type {name!r}")


def promote(a: ScalarType, b: ScalarType) -> ScalarType:
    """The result type of a binary arithmetic operation on ``a`` and ``b``."""
    if a is b:
        return a
    if a.is_float or b.is_float:
        if not (a.is_float and b.is_float):
            return a if a.is_float else b
        if {a, b} == {f16, bf16}:
            return f32
        return a if a.nbytes >= b.nbytes else b
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.nbytes != b.nbytes:
        return a if a.nbytes > b.nbytes else b
    return a if a.kind is TypeKind.UINT else b
