"""Expressions of the tensor IR.

Every node is a small immutable dataclass whose ``dtype`` is computed when it is built.  Python
operators build nodes (``a + b * 2``), with Python numbers adopting the other operand's type.
``==`` stays structural equality (nodes are compared and hashed structurally); comparisons are
built with ``<``, ``<=``, ``>``, ``>=`` or :func:`compare`.  ``Var`` is the exception: two
variables are the same only if they are the same object.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Union

from .dtypes import HOOKS, ScalarType, bool_, f32, f64, i32, i64, promote

Number = Union[int, float, bool]


class BinOp(enum.Enum):
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"          # true division (floats)
    FLOORDIV = "//"    # floor division (ints)
    MOD = "%"          # floor modulo (ints), fmod for floats
    MIN = "min"
    MAX = "max"
    AND = "and"        # logical
    OR = "or"
    BITAND = "&"
    BITOR = "|"
    BITXOR = "^"
    SHL = "<<"
    SHR = ">>"


class CmpOp(enum.Enum):
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


class UnOp(enum.Enum):
    NEG = "-"
    NOT = "not"
    BITNOT = "~"


class Intrinsic(enum.Enum):
    """Math functions with a fixed meaning on every backend."""

    EXP = ("exp", 1)
    EXP2 = ("exp2", 1)
    EXPM1 = ("expm1", 1)    # exp(x) - 1, accurate near 0
    SIGMOID = ("sigmoid", 1)    # 1 / (1 + exp(-x)): 0 at -inf, 1 at +inf
    SILU = ("silu", 1)          # x * sigmoid(x), as x / (1 + exp(-x))
    LOG = ("log", 1)
    LOG1P = ("log1p", 1)    # log(1 + x), accurate near 0
    LOG2 = ("log2", 1)
    SQRT = ("sqrt", 1)
    RSQRT = ("rsqrt", 1)
    TANH = ("tanh", 1)
    ERF = ("erf", 1)
    ABS = ("abs", 1)
    SIN = ("sin", 1)
    COS = ("cos", 1)
    TAN = ("tan", 1)
    ASIN = ("asin", 1)
    ACOS = ("acos", 1)
    ATAN = ("atan", 1)
    SINH = ("sinh", 1)
    COSH = ("cosh", 1)
    ASINH = ("asinh", 1)
    ACOSH = ("acosh", 1)
    ATANH = ("atanh", 1)
    FLOOR = ("floor", 1)
    CEIL = ("ceil", 1)
    ROUND = ("round", 1)
    TRUNC = ("trunc", 1)
    POW = ("pow", 2)
    FMOD = ("fmod", 2)      # C's fmod: the remainder with the dividend's sign
    ATAN2 = ("atan2", 2)
    LGAMMA = ("lgamma", 1)
    FMA = ("fma", 3)

    @property
    def fname(self) -> str:
        return self.value[0]

    @property
    def arity(self) -> int:
        return self.value[1]


class SpecialReg(enum.Enum):
    """GPU launch registers: ``threadIdx.x`` is ``Special(SpecialReg.THREAD_IDX, 0)``."""

    THREAD_IDX = "threadIdx"
    BLOCK_IDX = "blockIdx"
    BLOCK_DIM = "blockDim"
    GRID_DIM = "gridDim"
    # Resolved by the backend with the target's warp size, 32 or 64 (the IR does not know which):
    # the lane and warp of the thread's linear index in its block, and the warp size.  ``dim`` is 0.
    LANE_ID = "lane_id"
    WARP_ID = "warp_id"
    WARP_SIZE = "warp_size"

    @property
    def is_warp(self) -> bool:
        return self in (SpecialReg.LANE_ID, SpecialReg.WARP_ID, SpecialReg.WARP_SIZE)


class Expr:
    """Base of all expression nodes; subclasses set ``dtype``."""

    dtype: ScalarType

    # Arithmetic builds nodes.
    def __add__(self, o: Any) -> "Expr": return binary(BinOp.ADD, self, o)
    def __radd__(self, o: Any) -> "Expr": return binary(BinOp.ADD, o, self)
    def __sub__(self, o: Any) -> "Expr": return binary(BinOp.SUB, self, o)
    def __rsub__(self, o: Any) -> "Expr": return binary(BinOp.SUB, o, self)
    def __mul__(self, o: Any) -> "Expr": return binary(BinOp.MUL, self, o)
    def __rmul__(self, o: Any) -> "Expr": return binary(BinOp.MUL, o, self)
    def __truediv__(self, o: Any) -> "Expr": return binary(BinOp.DIV, self, o)
    def __rtruediv__(self, o: Any) -> "Expr": return binary(BinOp.DIV, o, self)
    def __floordiv__(self, o: Any) -> "Expr": return binary(BinOp.FLOORDIV, self, o)
    def __rfloordiv__(self, o: Any) -> "Expr": return binary(BinOp.FLOORDIV, o, self)
    def __mod__(self, o: Any) -> "Expr": return binary(BinOp.MOD, self, o)
    def __rmod__(self, o: Any) -> "Expr": return binary(BinOp.MOD, o, self)
    def __and__(self, o: Any) -> "Expr": return binary(BinOp.BITAND, self, o)
    def __or__(self, o: Any) -> "Expr": return binary(BinOp.BITOR, self, o)
    def __xor__(self, o: Any) -> "Expr": return binary(BinOp.BITXOR, self, o)
    def __lshift__(self, o: Any) -> "Expr": return binary(BinOp.SHL, self, o)
    def __rshift__(self, o: Any) -> "Expr": return binary(BinOp.SHR, self, o)
    def __neg__(self) -> "Expr": return Unary(UnOp.NEG, self)
    def __invert__(self) -> "Expr": return Unary(UnOp.BITNOT, self)
    def __lt__(self, o: Any) -> "Expr": return compare(CmpOp.LT, self, o)
    def __le__(self, o: Any) -> "Expr": return compare(CmpOp.LE, self, o)
    def __gt__(self, o: Any) -> "Expr": return compare(CmpOp.GT, self, o)
    def __ge__(self, o: Any) -> "Expr": return compare(CmpOp.GE, self, o)

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of the IR expression {self!r} is unknown until run time")

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}    # see cached_hash

    def __repr__(self) -> str:
        return HOOKS["expr_str"](self)  # set by ir.printer


def _dtype_field() -> Any:
    return field(init=False, compare=False, repr=False, hash=False)


def cached_hash(cls: type) -> type:
    """Cache a structural node's hash on the node (a frozen dataclass's own ``__hash__`` hashes
    the whole tree on every call, and trees are hashed over and over as memo keys: quadratic in
    their size).  The cache is not pickled: string hashes differ between processes."""
    structural = cls.__hash__

    def __hash__(self: Any) -> int:
        try:
            return self.__dict__["_hash"]
        except KeyError:
            h = structural(self)
            object.__setattr__(self, "_hash", h)
            return h
    cls.__hash__ = __hash__  # type: ignore[assignment]
    return cls


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Const(Expr):
    value: Number
    type: ScalarType = i32

    def __post_init__(self) -> None:
        t = self.type
        v = self.value
        if t.is_bool:
            v = bool(v)
        elif t.is_integer:
            if isinstance(v, float) and not v.is_integer():
                raise ValueError(f"{v} is not an integer constant of type {t!r}")
            v = int(v)
        else:
            v = float(v)
        object.__setattr__(self, "value", v)

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return self.type


@dataclass(frozen=True, eq=False, repr=False)
class Var(Expr):
    """A variable: scalar (``type`` a ScalarType) or tensor (``type`` a TensorType)."""

    name: str
    type: Any  # ScalarType | TensorType (types.py imports this module)

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return self.type if isinstance(self.type, ScalarType) else self.type.dtype

    @property
    def is_tensor(self) -> bool:
        return not isinstance(self.type, ScalarType)

    def __getitem__(self, idx: Any) -> "Load":
        return Load(self, tuple(as_expr(i) for i in (idx if isinstance(idx, tuple) else (idx,))))

    __hash__ = object.__hash__


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class SizeVar(Expr):
    """A symbolic tensor dimension, bound from the arguments' shapes at launch (by name)."""

    name: str

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return i32


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Special(Expr):
    reg: SpecialReg
    dim: int

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return i32


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Binary(Expr):
    op: BinOp
    a: Expr
    b: Expr
    dtype: ScalarType = _dtype_field()

    def __post_init__(self) -> None:
        if self.op in (BinOp.AND, BinOp.OR):
            t = bool_
        else:
            t = promote(self.a.dtype, self.b.dtype)
            if self.op is BinOp.DIV and not t.is_float:
                t = f32
        object.__setattr__(self, "dtype", t)


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Compare(Expr):
    op: CmpOp
    a: Expr
    b: Expr

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return bool_


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Unary(Expr):
    op: UnOp
    a: Expr

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return bool_ if self.op is UnOp.NOT else self.a.dtype


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Cast(Expr):
    a: Expr
    type: ScalarType

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return self.type


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class BitCast(Expr):
    """The bits of ``a`` read as ``type`` (same size, e.g. f32 <-> i32): ``x.view(type)`` in
    numpy.  Never a numeric conversion: build it with :func:`bitcast`, which checks the sizes."""

    a: Expr
    type: ScalarType

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return self.type


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: ScalarType = _dtype_field()

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", promote(self.a.dtype, self.b.dtype))


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Load(Expr):
    """``tensor[indices]``: one index per dimension (one flat index after flattening)."""

    tensor: Var
    indices: tuple[Expr, ...]

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        return self.tensor.dtype


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class Call(Expr):
    """A math intrinsic; the result has the (promoted) type of the arguments, or f32 for ints."""

    fn: Intrinsic
    args: tuple[Expr, ...]
    dtype: ScalarType = _dtype_field()

    def __post_init__(self) -> None:
        t = self.args[0].dtype
        for a in self.args[1:]:
            t = promote(t, a.dtype)
        if self.fn is not Intrinsic.ABS and not t.is_float:
            t = f32
        object.__setattr__(self, "dtype", t)


@cached_hash
@dataclass(frozen=True, eq=True, repr=False)
class CallFunc(Expr):
    """A call of another function of the module (a helper device function) by name."""

    name: str
    args: tuple[Expr, ...]
    ret: ScalarType | None  # None: the call is a statement

    @property
    def dtype(self) -> ScalarType:  # type: ignore[override]
        if self.ret is None:
            raise TypeError(f"function {self.name} returns nothing")
        return self.ret


# ----------------------------------------------------------------------------- construction


def const(value: Number, dtype: ScalarType | None = None) -> Const:
    if dtype is None:
        if isinstance(value, bool):
            dtype = bool_
        elif isinstance(value, int):
            dtype = i32 if -(2**31) <= value < 2**31 else i64
        else:
            dtype = f32
    return Const(value, dtype)


def as_expr(value: Any, like: Expr | None = None) -> Expr:
    """An IR expression for ``value``; a Python number takes the type of ``like`` if given."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, (bool, int, float)):
        if like is not None and not isinstance(value, bool):
            t = like.dtype
            if isinstance(value, float) and not t.is_float:
                return const(value, f32 if t is not f64 else f64)
            if t.is_bool:
                return const(value)
            return const(value, t)
        return const(value)
    raise TypeError(f"cannot use {value!r} (of type {type(value).__name__}) in a kernel expression")


def binary(op: BinOp, a: Any, b: Any) -> Expr:
    if not isinstance(a, Expr):
        a = as_expr(a, like=as_expr(b))
    if not isinstance(b, Expr):
        b = as_expr(b, like=a)
    if op in (BinOp.FLOORDIV, BinOp.MOD, BinOp.BITAND, BinOp.BITOR, BinOp.BITXOR, BinOp.SHL, BinOp.SHR):
        if op not in (BinOp.MOD, BinOp.FLOORDIV) and (a.dtype.is_float or b.dtype.is_float):
            raise TypeError(f"operator {op.value} needs integer operands, got {a.dtype!r} and {b.dtype!r}")
    return Binary(op, a, b)


def compare(op: CmpOp, a: Any, b: Any) -> Compare:
    if not isinstance(a, Expr):
        a = as_expr(a, like=as_expr(b))
    if not isinstance(b, Expr):
        b = as_expr(b, like=a)
    return Compare(op, a, b)


def cast(value: Any, dtype: ScalarType) -> Expr:
    e = as_expr(value)
    if isinstance(e, Const) and not (dtype.is_integer and isinstance(e.value, float) and not e.value.is_integer()):
        return Const(e.value if not dtype.is_integer else int(e.value), dtype)
    return e if e.dtype is dtype else Cast(e, dtype)


def bitcast_problem(src: ScalarType, dst: ScalarType) -> str | None:
    """Why the bits of a ``src`` value cannot be read as ``dst``, or None (same size, no bool)."""
    if src.is_bool or dst.is_bool:
        return f"cannot bit-cast {src!r} to {dst!r}: bool has no defined bit pattern"
    if src.nbytes != dst.nbytes:
        return (f"cannot bit-cast {src!r} ({8 * src.nbytes} bits) to {dst!r} ({8 * dst.nbytes} bits): "
                "the types must have the same size")
    return None


def bitcast(value: Any, dtype: ScalarType) -> Expr:
    """The bits of ``value`` reinterpreted as ``dtype`` (raises TypeError if the sizes differ).

    A Python int is an i32 (i64 if it needs to be), a Python float an f32."""
    e = as_expr(value)
    bad = bitcast_problem(e.dtype, dtype)
    if bad is not None:
        raise TypeError(bad)
    return e if e.dtype is dtype else BitCast(e, dtype)


def call(fn: Intrinsic, *args: Any) -> Call:
    if len(args) != fn.arity:
        raise TypeError(f"{fn.fname} takes {fn.arity} argument(s), got {len(args)}")
    exprs = [as_expr(a) for a in args]
    return Call(fn, tuple(exprs))


def select(cond: Any, a: Any, b: Any) -> Select:
    ea = as_expr(a) if isinstance(a, Expr) or not isinstance(b, Expr) else as_expr(a, like=b)
    eb = as_expr(b, like=ea)
    return Select(as_expr(cond), ea, eb)


def logical_and(*args: Any) -> Expr:
    out = as_expr(args[0])
    for a in args[1:]:
        out = Binary(BinOp.AND, out, as_expr(a))
    return out


def logical_or(*args: Any) -> Expr:
    out = as_expr(args[0])
    for a in args[1:]:
        out = Binary(BinOp.OR, out, as_expr(a))
    return out


def logical_not(a: Any) -> Expr:
    return Unary(UnOp.NOT, as_expr(a))


def minimum(a: Any, b: Any) -> Expr:
    return binary(BinOp.MIN, a, b)


def maximum(a: Any, b: Any) -> Expr:
    return binary(BinOp.MAX, a, b)


def var(name: str, type_: Any = i32) -> Var:
    return Var(name, type_)


HOOKS["cast"] = cast

# threadIdx.x etc. as plain objects with .x/.y/.z (used by the DSL and by templates).


@dataclass(frozen=True)
class _Dim3:
    reg: SpecialReg

    @property
    def x(self) -> Special:
        return Special(self.reg, 0)

    @property
    def y(self) -> Special:
        return Special(self.reg, 1)

    @property
    def z(self) -> Special:
        return Special(self.reg, 2)


threadIdx = _Dim3(SpecialReg.THREAD_IDX)
blockIdx = _Dim3(SpecialReg.BLOCK_IDX)
blockDim = _Dim3(SpecialReg.BLOCK_DIM)
gridDim = _Dim3(SpecialReg.GRID_DIM)
