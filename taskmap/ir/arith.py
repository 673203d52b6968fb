"""Integer arithmetic for the simplifier: inclusive ranges, linear forms and constant folding.

A ``Range`` is an inclusive ``(lo, hi)`` pair with ``None`` for an unbounded side; the ``r_*``
functions are interval arithmetic under the IR's floor semantics of ``//`` and ``%``.  A ``Lin``
is a sum ``sum(coeff * term) + const`` of integer terms.  ``fold_binary`` and ``fold_cast``
evaluate operations on constants, refusing results that do not fit the type.
"""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy as np

from .dtypes import ScalarType, TypeKind, bool_
from .expr import BinOp, CmpOp, Const, Expr

Range = tuple[Optional[int], Optional[int]]
"""An inclusive integer range; ``None`` is unbounded on that side."""
UNKNOWN: Range = (None, None)

def is_sint(t: ScalarType) -> bool:
    return t.kind is TypeKind.INT


def int_const(e: Expr) -> int | None:
    return e.value if isinstance(e, Const) and e.dtype.is_integer else None  # type: ignore[return-value]


def fits(v: int, t: ScalarType) -> bool:
    bits = 8 * t.nbytes
    if t.kind is TypeKind.UINT:
        return 0 <= v < 2**bits
    return -(2 ** (bits - 1)) <= v < 2 ** (bits - 1)


# Inclusive-range arithmetic.


def r_add(a: Range, b: Range) -> Range:
    return (None if a[0] is None or b[0] is None else a[0] + b[0],
            None if a[1] is None or b[1] is None else a[1] + b[1])


def r_scale(a: Range, k: int) -> Range:
    if k == 0:
        return (0, 0)
    lo = None if a[0] is None else a[0] * k
    hi = None if a[1] is None else a[1] * k
    return (lo, hi) if k > 0 else (hi, lo)


def r_mul(a: Range, b: Range) -> Range:
    if None not in a and None not in b:
        ps = [x * y for x in a for y in b]  # type: ignore[operator]
        return (min(ps), max(ps))
    if a[0] is not None and b[0] is not None and a[0] >= 0 and b[0] >= 0:
        return (a[0] * b[0], None if a[1] is None or b[1] is None else a[1] * b[1])
    return UNKNOWN


def r_floordiv(a: Range, b: Range) -> Range:
    """``a // b`` for a positive divisor ``b``."""
    if b[0] is None or b[0] <= 0:
        return UNKNOWN
    if b[0] == b[1]:
        return (None if a[0] is None else a[0] // b[0], None if a[1] is None else a[1] // b[0])
    if a[0] is not None and a[0] >= 0:
        return (0 if b[1] is None else a[0] // b[1], None if a[1] is None else a[1] // b[0])
    return UNKNOWN


def r_mod(a: Range, b: Range) -> Range:
    """``a % b`` for a positive divisor ``b`` (floor semantics: the result is in ``[0, b)``)."""
    if b[0] is None or b[0] <= 0:
        return UNKNOWN
    if b[0] == b[1] and a[0] is not None and a[1] is not None and a[0] // b[0] == a[1] // b[0]:
        return (a[0] % b[0], a[1] % b[0])
    hi = None if b[1] is None else b[1] - 1
    if a[0] is not None and a[0] >= 0 and a[1] is not None:
        hi = a[1] if hi is None else min(hi, a[1])
    return (0, hi)


def r_min(a: Range, b: Range) -> Range:
    lo = None if a[0] is None or b[0] is None else min(a[0], b[0])
    hi = b[1] if a[1] is None else a[1] if b[1] is None else min(a[1], b[1])
    return (lo, hi)


def r_max(a: Range, b: Range) -> Range:
    lo = b[0] if a[0] is None else a[0] if b[0] is None else max(a[0], b[0])
    hi = None if a[1] is None or b[1] is None else max(a[1], b[1])
    return (lo, hi)


def r_union(a: Range, b: Range) -> Range:
    return (None if a[0] is None or b[0] is None else min(a[0], b[0]),
            None if a[1] is None or b[1] is None else max(a[1], b[1]))


def r_meet(a: Range, b: Range) -> Range:
    lo = b[0] if a[0] is None else a[0] if b[0] is None else max(a[0], b[0])
    hi = b[1] if a[1] is None else a[1] if b[1] is None else min(a[1], b[1])
    return (lo, hi)


R_BINARY: dict[BinOp, Callable[[Range, Range], Range]] = {
    BinOp.ADD: r_add, BinOp.SUB: lambda a, b: r_add(a, r_scale(b, -1)), BinOp.MUL: r_mul,
    BinOp.FLOORDIV: r_floordiv, BinOp.MOD: r_mod, BinOp.MIN: r_min, BinOp.MAX: r_max,
}


class Key:
    """An expression as a dict key, with its (structural, recursive) hash computed once."""

    __slots__ = ("e", "h")

    def __init__(self, e: Expr) -> None:
        self.e = e
        self.h = hash(e)

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and (self.e is other.e or (self.h == other.h and self.e == other.e))


@dataclass
class Lin:
    """``sum(coeff * term) + const``: terms in order of first appearance, no zero coefficients.

    Values are never mutated once built (they are memoised)."""

    terms: dict[Key, int] = field(default_factory=dict)
    const: int = 0

    def add(self, other: "Lin", k: int = 1) -> "Lin":
        terms = dict(self.terms)
        for t, c in other.terms.items():
            v = terms.get(t, 0) + k * c
            if v:
                terms[t] = v
            else:
                del terms[t]
        return Lin(terms, self.const + k * other.const)

    def scale(self, k: int) -> "Lin":
        return Lin({t: c * k for t, c in self.terms.items()} if k else {}, self.const * k)


# Constant folding.
_INT_FOLD: dict[BinOp, Callable[[int, int], Any]] = {
    BinOp.ADD: operator.add, BinOp.SUB: operator.sub, BinOp.MUL: operator.mul,
    BinOp.FLOORDIV: lambda a, b: a // b if b else None, BinOp.MOD: lambda a, b: a % b if b else None,
    BinOp.MIN: min, BinOp.MAX: max, BinOp.BITAND: operator.and_, BinOp.BITOR: operator.or_,
    BinOp.BITXOR: operator.xor, BinOp.SHL: lambda a, b: a << b if 0 <= b < 64 else None,
    BinOp.SHR: lambda a, b: a >> b if b >= 0 else None,
}
_FLOAT_FOLD: dict[BinOp, Callable[[Any, Any], Any]] = {
    BinOp.ADD: operator.add, BinOp.SUB: operator.sub, BinOp.MUL: operator.mul,
    BinOp.DIV: lambda a, b: a / b if b else None, BinOp.MIN: min, BinOp.MAX: max,
}
NP_FLOAT = {"float16": np.float16, "float32": np.float32, "float64": np.float64}
CMP_FOLD: dict[CmpOp, Callable[[Any, Any], bool]] = {
    CmpOp.EQ: operator.eq, CmpOp.NE: operator.ne, CmpOp.LT: operator.lt,
    CmpOp.LE: operator.le, CmpOp.GT: operator.gt, CmpOp.GE: operator.ge,
}
NEGATE = {CmpOp.EQ: CmpOp.NE, CmpOp.NE: CmpOp.EQ, CmpOp.LT: CmpOp.GE,
           CmpOp.GE: CmpOp.LT, CmpOp.GT: CmpOp.LE, CmpOp.LE: CmpOp.GT}
SWAP = {CmpOp.EQ: CmpOp.EQ, CmpOp.NE: CmpOp.NE, CmpOp.LT: CmpOp.GT,
         CmpOp.GT: CmpOp.LT, CmpOp.LE: CmpOp.GE, CmpOp.GE: CmpOp.LE}


def fold_binary(op: BinOp, a: Expr, b: Expr, dt: ScalarType) -> Expr | None:
    if not (isinstance(a, Const) and isinstance(b, Const)):
        return None
    if op in (BinOp.AND, BinOp.OR):
        return Const(bool(a.value) and bool(b.value) if op is BinOp.AND else bool(a.value) or bool(b.value), bool_)
    if dt.is_integer and a.dtype.is_integer and b.dtype.is_integer and op in _INT_FOLD:
        v = _INT_FOLD[op](int(a.value), int(b.value))
        return Const(v, dt) if v is not None and fits(v, dt) else None
    np_t = NP_FLOAT.get(dt.name)
    if np_t is not None and op in _FLOAT_FOLD and not (a.dtype.is_bool or b.dtype.is_bool):
        with np.errstate(all="ignore"):
            v = _FLOAT_FOLD[op](np_t(a.value), np_t(b.value))
        return Const(float(v), dt) if v is not None and math.isfinite(float(v)) else None
    return None


def fold_cast(a: Const, t: ScalarType) -> Const | None:
    v = a.value
    if t.is_bool:
        return Const(bool(v), t)
    if t.is_float:
        return Const(float(v), t) if t.name in NP_FLOAT else None
    if isinstance(v, float) and not v.is_integer():
        return None
    return Const(int(v), t) if fits(int(v), t) else None


def fold_bitcast(a: Const, t: ScalarType) -> Const | None:
    """The constant with the bits of ``a`` read as ``t`` (numpy's ``view``), or None where a constant
    would not keep those bits: bf16 (numpy has none) and NaNs (backends print any NaN as ``NAN``)."""
    src, v = a.dtype, a.value
    if "bfloat16" in (src.name, t.name) or (src.is_float and v != v) or (src.is_integer and not fits(int(v), src)):
        return None
    out = np.array(v, dtype=src.numpy_dtype).view(t.numpy_dtype).item()
    return None if t.is_float and out != out else Const(out, t)
