"""Tensor types of the tensor IR: a scalar type, a shape, a memory scope and a layout.

Shapes are IR expressions: ints, or symbolic sizes (``SizeVar``) whose values are read from the
arguments at launch.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from .dtypes import HOOKS, ScalarType
from .expr import Expr, SizeVar, as_expr, const


class MemScope(enum.Enum):
    GLOBAL = "global"
    SHARED = "shared"
    REGISTER = "register"


@dataclass(frozen=True)
class Layout:
    """Strided layout: the element offset of index ``(i0, .., ik)`` is ``sum(i_d * strides[d])``."""

    strides: tuple[Expr, ...]

    def offset(self, indices: tuple[Expr, ...]) -> Expr:
        total: Expr = const(0)
        for idx, stride in zip(indices, self.strides):
            total = total + idx * stride
        return total


def row_major(shape: tuple[Expr, ...]) -> Layout:
    strides: list[Expr] = []
    acc: Expr = const(1)
    for s in reversed(shape):
        strides.append(acc)
        acc = acc * s
    return Layout(tuple(reversed(strides)))


def column_major(shape: tuple[Expr, ...]) -> Layout:
    strides: list[Expr] = []
    acc: Expr = const(1)
    for s in shape:
        strides.append(acc)
        acc = acc * s
    return Layout(tuple(strides))


@dataclass(frozen=True)
class TensorType:
    dtype: ScalarType
    shape: tuple[Expr, ...]
    scope: MemScope = MemScope.GLOBAL
    layout: Layout = field(default=None)  # type: ignore[assignment]  # row-major when omitted

    def __post_init__(self) -> None:
        if self.layout is None:
            object.__setattr__(self, "layout", row_major(self.shape))
        if len(self.layout.strides) != len(self.shape):
            raise ValueError(f"layout has {len(self.layout.strides)} strides for {len(self.shape)} dims")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def with_scope(self, scope: MemScope) -> "TensorType":
        return TensorType(self.dtype, self.shape, scope, self.layout)

    def __repr__(self) -> str:
        dims = ", ".join(repr(s) for s in self.shape)
        scope = "" if self.scope is MemScope.GLOBAL else f"{self.scope.value} "
        return f"{scope}{self.dtype!r}[{dims}]"


def tensor_type(dtype: ScalarType, shape: tuple[Any, ...], scope: MemScope = MemScope.GLOBAL,
                layout: Layout | None = None) -> TensorType:
    """Build a tensor type; string dimensions become symbolic sizes of that name."""
    if not isinstance(dtype, ScalarType):
        raise TypeError(f"tensor element type must be a scalar type, got {dtype!r}")
    dims = []
    for s in shape:
        if isinstance(s, str):
            s = SizeVar(s)
        if isinstance(s, bool) or not isinstance(s, (int, Expr)):
            raise TypeError(f"tensor dimensions must be ints or sizes, got {s!r}")
        if isinstance(s, int) and s <= 0:
            raise ValueError(f"tensor dimensions must be positive, got {s}")
        dims.append(as_expr(s))
    return TensorType(dtype, tuple(dims), scope, layout)


HOOKS["tensor_type"] = tensor_type
