"""Element-wise operators: unary math, binary arithmetic with numpy broadcasting, comparisons,
``where`` and ``cast`` — each a compute definition run by the rule-based scheduler.

The definitions are public too (``unary_compute``, ``binary_compute``, ...): graph-level fusion
reuses them.  Results follow torch's types: float math on integers gives float32, 16-bit
floats are computed in float32 and rounded once, a Python scalar does not widen an array's
floating type (``add(x_f16, 2.0)`` stays f16), comparisons give bool.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from ..compute.nodes import ReduceOp, TensorInput, TensorNode, compute
from ..errors import OpError
from ..ir import expr as E
from ..ir.dtypes import ScalarType, bf16, bool_, f16, f32, f64, i64, promote, scalar_type
from ..ir.expr import Expr, Intrinsic
from ._dispatch import SUPPORTED, dtype_name, prepare, run_compute

Operand = Any  # an array, or a Python bool / int / float


# ----------------------------------------------------------------------------- math on IR values


def _call(fn: Intrinsic) -> Callable[[Expr], Expr]:
    return lambda e: E.call(fn, e)


def _relu(e: Expr) -> Expr:
    return E.select(E.compare(E.CmpOp.LT, e, 0), E.as_expr(0, like=e), e)  # NaN stays NaN


def _relu6(e: Expr) -> Expr:
    return E.select(E.compare(E.CmpOp.GT, e, 6), E.as_expr(6, like=e), _relu(e))


def _sigmoid(e: Expr) -> Expr:
    return E.call(Intrinsic.SIGMOID, e)


def _gelu(e: Expr) -> Expr:
    return 0.5 * e * (1.0 + E.call(Intrinsic.ERF, e * (1.0 / math.sqrt(2.0))))


def _gelu_tanh(e: Expr) -> Expr:
    inner = math.sqrt(2.0 / math.pi) * (e + 0.044715 * e * e * e)
    return 0.5 * e * (1.0 + E.call(Intrinsic.TANH, inner))


def _softplus(e: Expr) -> Expr:
    """``log(1 + exp(x))``, and ``x`` itself above 20 (PyTorch's threshold)."""
    return E.select(E.compare(E.CmpOp.GT, e, 20.0), e, E.call(Intrinsic.LOG1P, E.call(Intrinsic.EXP, e)))


def _logsigmoid(e: Expr) -> Expr:
    """``min(x, 0) - log1p(exp(-|x|))`` (PyTorch's form: no overflow at either end)."""
    zero = E.as_expr(0.0, like=e)
    low = E.select(E.compare(E.CmpOp.LT, e, zero), e, zero)
    return low - E.call(Intrinsic.LOG1P, E.call(Intrinsic.EXP, -E.call(Intrinsic.ABS, e)))


def _selu(e: Expr) -> Expr:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    neg = alpha * E.call(Intrinsic.EXPM1, e)
    return scale * E.select(E.compare(E.CmpOp.GT, e, 0.0), e, neg)


def _sign(e: Expr) -> Expr:
    one, zero = E.as_expr(1, like=e), E.as_expr(0, like=e)
    return E.select(E.compare(E.CmpOp.GT, e, zero), one, E.select(E.compare(E.CmpOp.LT, e, zero), -one, zero))


def _integral(fn: Intrinsic) -> Callable[[Expr], Expr]:
    """floor / ceil / round / trunc: integers are their own value."""
    return lambda e: E.call(fn, e) if e.dtype.is_float else e


#: name -> (IR function, needs a float input (ints are converted to float32 first)).
UNARY: dict[str, tuple[Callable[[Expr], Expr], bool]] = {
    "exp": (_call(Intrinsic.EXP), True), "log": (_call(Intrinsic.LOG), True),
    "sqrt": (_call(Intrinsic.SQRT), True), "rsqrt": (_call(Intrinsic.RSQRT), True),
    "tanh": (_call(Intrinsic.TANH), True), "erf": (_call(Intrinsic.ERF), True),
    "sin": (_call(Intrinsic.SIN), True), "cos": (_call(Intrinsic.COS), True),
    **{n: (_call(getattr(Intrinsic, n.upper())), True) for n in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh",
                                                                "acosh", "atanh")},
    "sigmoid": (_sigmoid, True), "silu": (_call(Intrinsic.SILU), True),
    "gelu": (_gelu, True), "gelu_tanh": (_gelu_tanh, True),
    "hardswish": (lambda e: e * _relu6(e + 3.0) * (1.0 / 6.0), True),
    "abs": (_call(Intrinsic.ABS), False), "neg": (lambda e: -e, False),
    "relu": (_relu, False), "relu6": (_relu6, False),
    "floor": (_integral(Intrinsic.FLOOR), False), "ceil": (_integral(Intrinsic.CEIL), False),
    "round": (_integral(Intrinsic.ROUND), False), "trunc": (_integral(Intrinsic.TRUNC), False),
    "sign": (_sign, False), "reciprocal": (lambda e: 1.0 / e, True), "square": (lambda e: e * e, False),
    "expm1": (_call(Intrinsic.EXPM1), True), "log1p": (_call(Intrinsic.LOG1P), True),
    "softplus": (_softplus, True), "mish": (lambda e: e * E.call(Intrinsic.TANH, _softplus(e)), True),
    "hardsigmoid": (lambda e: _relu6(e + 3.0) * (1.0 / 6.0), True), "logsigmoid": (_logsigmoid, True),
    "selu": (_selu, True), "lgamma": (_call(Intrinsic.LGAMMA), True),
}


def compute_type(t: ScalarType) -> ScalarType:
    """16-bit floats are computed in f32."""
    return f32 if t in (f16, bf16) else t


def unary_compute(name: str, x: TensorNode) -> TensorNode:
    """``y = name(x)`` element-wise (``name`` a key of :data:`UNARY`)."""
    fn, needs_float = UNARY[name]
    out_t = x.dtype if x.dtype.is_float or not needs_float else f32
    ct = compute_type(out_t)
    return compute(name, x.shape, lambda *i: E.cast(fn(E.cast(x[i], ct)), out_t))


def _unary(name: str, x: Any) -> Any:
    allowed = [d for d in SUPPORTED if d != "bool"]
    args = prepare(name, x, allowed=allowed)
    t = scalar_type(args.dtypes[0])
    out_t = t if t.is_float or not UNARY[name][1] else f32
    return run_compute(name, (), args, args.shapes[0], out_t.name, lambda xs: unary_compute(name, xs[0]))


def exp(x: Any) -> Any: return _unary("exp", x)
def log(x: Any) -> Any: return _unary("log", x)
def sqrt(x: Any) -> Any: return _unary("sqrt", x)
def rsqrt(x: Any) -> Any: return _unary("rsqrt", x)
def tanh(x: Any) -> Any: return _unary("tanh", x)
def erf(x: Any) -> Any: return _unary("erf", x)
def sin(x: Any) -> Any: return _unary("sin", x)
def cos(x: Any) -> Any: return _unary("cos", x)
def abs(x: Any) -> Any: return _unary("abs", x)  # noqa: A001 - torch's name
def neg(x: Any) -> Any: return _unary("neg", x)
def relu(x: Any) -> Any: return _unary("relu", x)
def tan(x: Any) -> Any: return _unary("tan", x)
def asin(x: Any) -> Any: return _unary("asin", x)
def acos(x: Any) -> Any: return _unary("acos", x)
def atan(x: Any) -> Any: return _unary("atan", x)
def sinh(x: Any) -> Any: return _unary("sinh", x)
def cosh(x: Any) -> Any: return _unary("cosh", x)
def asinh(x: Any) -> Any: return _unary("asinh", x)
def acosh(x: Any) -> Any: return _unary("acosh", x)
def atanh(x: Any) -> Any: return _unary("atanh", x)
def floor(x: Any) -> Any: return _unary("floor", x)
def ceil(x: Any) -> Any: return _unary("ceil", x)
def round(x: Any) -> Any: return _unary("round", x)  # noqa: A001 - torch's name (half to even)
def trunc(x: Any) -> Any: return _unary("trunc", x)
def sign(x: Any) -> Any: return _unary("sign", x)
def reciprocal(x: Any) -> Any: return _unary("reciprocal", x)
def square(x: Any) -> Any: return _unary("square", x)
def expm1(x: Any) -> Any: return _unary("expm1", x)
def log1p(x: Any) -> Any: return _unary("log1p", x)
def mish(x: Any) -> Any: return _unary("mish", x)
def hardsigmoid(x: Any) -> Any: return _unary("hardsigmoid", x)
def logsigmoid(x: Any) -> Any: return _unary("logsigmoid", x)
def selu(x: Any) -> Any: return _unary("selu", x)
def lgamma(x: Any) -> Any: return _unary("lgamma", x)


def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Any:
    """``log(1 + exp(beta x)) / beta``, ``x`` where ``beta x > threshold`` (as ``F.softplus``)."""
    if beta == 1.0 and threshold == 20.0:
        return _unary("softplus", x)
    bx = mul(x, float(beta))
    return where(gt(bx, float(threshold)), x, div(log1p(exp(bx)), float(beta)))
def relu6(x: Any) -> Any: return _unary("relu6", x)
def sigmoid(x: Any) -> Any: return _unary("sigmoid", x)
def silu(x: Any) -> Any: return _unary("silu", x)
def hardswish(x: Any) -> Any: return _unary("hardswish", x)


def gelu(x: Any, approximate: str = "none") -> Any:
    """GELU: exact (``approximate="none"``, with erf) or the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise OpError(f"gelu(): approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh", x)


# ----------------------------------------------------------------------------- broadcasting


def broadcast_shapes(op: str, *shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy's broadcasting of ``shapes`` (OpError when they do not broadcast)."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(n):
        dims = {s[len(s) - n + d] for s in shapes if len(s) - n + d >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise OpError(f"{op}(): shapes {' and '.join(str(tuple(s)) for s in shapes)} do not broadcast "
                          f"(dimension {d} of the result: sizes {sorted(dims)})")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_index(shape: Sequence[int], index: Sequence[Expr]) -> tuple[Expr, ...]:
    """The index of an operand of ``shape`` for the result index ``index`` (right-aligned)."""
    shape = tuple(shape)
    lead = len(index) - len(shape)
    return tuple(E.const(0) if s == 1 else index[lead + d] for d, s in enumerate(shape))


# ----------------------------------------------------------------------------- binary


def result_type(types: Sequence[ScalarType | None], scalars: Sequence[Any]) -> ScalarType:
    """torch's promotion: arrays among themselves; a Python scalar only changes the category."""
    arrays = [t for t in types if t is not None]
    t = arrays[0]
    for u in arrays[1:]:
        t = promote(t, u)
    for s in scalars:
        if isinstance(s, float) and not t.is_float:
            t = f32
        elif isinstance(s, int) and not isinstance(s, bool) and t.is_bool:
            t = i64
    return t


def _scalar_expr(v: Any, t: ScalarType) -> Expr:
    return E.const(v, t) if not (isinstance(v, float) and not t.is_float) else E.const(v, f32)


def _maximum(a: Expr, b: Expr) -> Expr:
    return ReduceOp.MAX.combine(a, b)


def _minimum(a: Expr, b: Expr) -> Expr:
    return ReduceOp.MIN.combine(a, b)


def _pow(a: Expr, b: Expr) -> Expr:
    """``a ** b``; small constant exponents as products, a square root or a reciprocal (as PyTorch
    computes them: GPT-2's ``x ** 3`` in its GELU), which vectorize where ``powf`` calls do not."""
    if isinstance(b, E.Const) and a.dtype.is_float:
        v = float(b.value)
        if v in (1.0, 2.0, 3.0, 4.0):
            out = a
            for _ in range(int(v) - 1):
                out = out * a
            return out
        if v == 0.5:
            return E.call(Intrinsic.SQRT, a)
        if v == -1.0:
            return E.const(1.0, a.dtype) / a
    return E.call(Intrinsic.POW, a, b)


def _lt0(e: Expr) -> Expr:
    return E.compare(E.CmpOp.LT, e, E.as_expr(0, like=e))


def _differ(a: Expr, b: Expr) -> Expr:
    """``(a < 0) != (b < 0)``."""
    return E.compare(E.CmpOp.NE, _lt0(a), _lt0(b))


def _floor_divide(a: Expr, b: Expr) -> Expr:
    """``a // b`` rounded toward minus infinity.  Floats as PyTorch computes them — through
    ``fmod``, not ``floor(a / b)``: ``1.0 // 0.1`` is 9 (``1.0 / 0.1`` rounds to 10); a zero
    divisor gives ``a / b`` (inf or NaN).  Integers: Python's floor division (a zero divisor
    gives -1 instead of trapping; PyTorch raises)."""
    if not a.dtype.is_float:
        return a // b
    zero, one = E.as_expr(0, like=a), E.as_expr(1, like=a)
    mod = E.call(Intrinsic.FMOD, a, b)
    div = (a - mod) / b
    div = E.select(E.logical_and(E.compare(E.CmpOp.NE, mod, zero), _differ(b, mod)), div - one, div)
    fl = E.call(Intrinsic.FLOOR, div)
    fl = E.select(E.compare(E.CmpOp.GT, div - fl, E.as_expr(0.5, like=a)), fl + one, fl)
    out = E.select(E.compare(E.CmpOp.NE, div, zero), fl, (a / b) * zero)    # 0 with the quotient's sign
    return E.select(E.compare(E.CmpOp.EQ, b, zero), a / b, out)


def _trunc_divide(a: Expr, b: Expr) -> Expr:
    """``a / b`` rounded toward zero (integers: C's division; a zero divisor does not trap)."""
    if a.dtype.is_float:
        return E.call(Intrinsic.TRUNC, a / b)
    q, r = a // b, a % b
    return E.select(E.logical_and(E.compare(E.CmpOp.NE, r, E.as_expr(0, like=a)), _differ(a, b)),
                    q + E.as_expr(1, like=a), q)


def _fmod(a: Expr, b: Expr) -> Expr:
    """C's ``fmod``: the remainder of the division rounded toward zero (the dividend's sign)."""
    if a.dtype.is_float:
        return E.call(Intrinsic.FMOD, a, b)
    return a - _trunc_divide(a, b) * b


#: name -> (IR function of the (promoted) operands, result: "same" | "float" | "bool").
BINARY: dict[str, tuple[Callable[[Expr, Expr], Expr], str]] = {
    "add": (lambda a, b: a + b, "same"), "sub": (lambda a, b: a - b, "same"),
    "mul": (lambda a, b: a * b, "same"), "div": (lambda a, b: a / b, "float"),
    "pow": (_pow, "same"), "maximum": (_maximum, "same"), "minimum": (_minimum, "same"),
    "floor_divide": (_floor_divide, "same"), "trunc_divide": (_trunc_divide, "same"),
    "remainder": (lambda a, b: a % b, "same"), "fmod": (_fmod, "same"),
    "atan2": (lambda a, b: E.call(Intrinsic.ATAN2, a, b), "float"),
    "eq": (lambda a, b: E.compare(E.CmpOp.EQ, a, b), "bool"), "ne": (lambda a, b: E.compare(E.CmpOp.NE, a, b), "bool"),
    "lt": (lambda a, b: E.compare(E.CmpOp.LT, a, b), "bool"), "le": (lambda a, b: E.compare(E.CmpOp.LE, a, b), "bool"),
    "gt": (lambda a, b: E.compare(E.CmpOp.GT, a, b), "bool"), "ge": (lambda a, b: E.compare(E.CmpOp.GE, a, b), "bool"),
    "bitwise_and": (lambda a, b: a & b, "same"), "bitwise_or": (lambda a, b: a | b, "same"),
    "bitwise_xor": (lambda a, b: a ^ b, "same"), "left_shift": (lambda a, b: a << b, "same"),
    "right_shift": (lambda a, b: a >> b, "same"),
}
#: Binary functions of integer operands only.
INTEGER_BINARY = ("bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift")


def binary_types(name: str, t: ScalarType) -> tuple[ScalarType, ScalarType]:
    """(compute type, result type) of ``name`` on operands promoted to ``t``."""
    kind = BINARY[name][1]
    if kind == "bool":
        return compute_type(t), bool_
    out = f32 if kind == "float" and not t.is_float else t
    ct = compute_type(out)
    if name == "pow" and not ct.is_float:
        ct = f64  # integer powers through f64: exact while the result fits in 53 bits
    return ct, out


def binary_compute(name: str, a: TensorNode | Any, b: TensorNode | Any, shape: Sequence[int]) -> TensorNode:
    """``y = a name b`` with broadcasting to ``shape``; ``a`` or ``b`` may be a Python scalar."""
    types = [x.dtype if isinstance(x, TensorNode) else None for x in (a, b)]
    t = result_type(types, [x for x in (a, b) if not isinstance(x, TensorNode)])
    ct, out_t = binary_types(name, t)
    fn = BINARY[name][0]

    def operand(x: Any, idx: tuple[Expr, ...]) -> Expr:
        if isinstance(x, TensorNode):
            return E.cast(E.cast(x[broadcast_index(x.shape, idx)], t), ct)
        return E.cast(_scalar_expr(x, t), ct)

    return compute(name, shape, lambda *i: E.cast(fn(operand(a, i), operand(b, i)), out_t))


def _scalars(*xs: Any) -> list[Any]:
    """numpy scalars (``np.float32(2)``) become Python numbers, as in torch."""
    return [x.item() if isinstance(x, np.generic) else x for x in xs]


def _binary(name: str, a: Operand, b: Operand) -> Any:
    a, b = _scalars(a, b)
    arrays = [x for x in (a, b) if not isinstance(x, (bool, int, float))]
    if not arrays:
        raise OpError(f"{name}(): at least one operand must be an array")
    args = prepare(name, *arrays)
    shape = broadcast_shapes(name, *args.shapes)
    types = [scalar_type(d) for d in args.dtypes]
    scalars = [x for x in (a, b) if isinstance(x, (bool, int, float))]
    t = result_type(types, scalars)
    if name in INTEGER_BINARY and t.is_float:
        raise OpError(f"{name}(): integer (or bool) operands only, got {t.name}")
    out_t = binary_types(name, t)[1]
    kshape = shape or (1,)
    key = tuple(("s", type(x).__name__, x) if isinstance(x, (bool, int, float)) else "a" for x in (a, b))

    def define(xs: list[TensorInput]) -> TensorNode:
        it = iter(xs)
        ops = [x if isinstance(x, (bool, int, float)) else next(it) for x in (a, b)]
        return binary_compute(name, ops[0], ops[1], kshape)

    return run_compute(name, key, args, shape, out_t.name, define)


def add(a: Operand, b: Operand) -> Any: return _binary("add", a, b)
def sub(a: Operand, b: Operand) -> Any: return _binary("sub", a, b)
def mul(a: Operand, b: Operand) -> Any: return _binary("mul", a, b)
def floor_divide(a: Operand, b: Operand) -> Any: return _binary("floor_divide", a, b)
def remainder(a: Operand, b: Operand) -> Any: return _binary("remainder", a, b)
def atan2(a: Operand, b: Operand) -> Any: return _binary("atan2", a, b)
def fmod(a: Operand, b: Operand) -> Any: return _binary("fmod", a, b)
def bitwise_and(a: Operand, b: Operand) -> Any: return _binary("bitwise_and", a, b)
def bitwise_or(a: Operand, b: Operand) -> Any: return _binary("bitwise_or", a, b)
def bitwise_xor(a: Operand, b: Operand) -> Any: return _binary("bitwise_xor", a, b)
def bitwise_left_shift(a: Operand, b: Operand) -> Any: return _binary("left_shift", a, b)
def bitwise_right_shift(a: Operand, b: Operand) -> Any: return _binary("right_shift", a, b)


def div(a: Operand, b: Operand, rounding_mode: str | None = None) -> Any:
    """``a / b`` (a float result), or rounded: ``rounding_mode="floor"`` / ``"trunc"`` (the
    operands' type), as ``torch.div``."""
    if rounding_mode is None:
        return _binary("div", a, b)
    modes = {"floor": "floor_divide", "trunc": "trunc_divide"}
    if rounding_mode not in modes:
        raise OpError(f"div(): rounding_mode must be None, 'floor' or 'trunc', got {rounding_mode!r}")
    return _binary(modes[rounding_mode], a, b)
def pow(a: Operand, b: Operand) -> Any: return _binary("pow", a, b)  # noqa: A001 - torch's name
def maximum(a: Operand, b: Operand) -> Any: return _binary("maximum", a, b)
def minimum(a: Operand, b: Operand) -> Any: return _binary("minimum", a, b)
def eq(a: Operand, b: Operand) -> Any: return _binary("eq", a, b)
def ne(a: Operand, b: Operand) -> Any: return _binary("ne", a, b)
def lt(a: Operand, b: Operand) -> Any: return _binary("lt", a, b)
def le(a: Operand, b: Operand) -> Any: return _binary("le", a, b)
def gt(a: Operand, b: Operand) -> Any: return _binary("gt", a, b)
def ge(a: Operand, b: Operand) -> Any: return _binary("ge", a, b)


# ----------------------------------------------------------------------------- where, cast


def where_compute(cond: TensorNode, a: TensorNode | Any, b: TensorNode | Any, shape: Sequence[int]) -> TensorNode:
    """``y = a if cond else b`` with broadcasting (``a``/``b`` may be Python scalars)."""
    types = [x.dtype if isinstance(x, TensorNode) else None for x in (a, b)]
    if all(t is None for t in types):
        t = result_type([f32 if isinstance(a, float) or isinstance(b, float) else i64], [])
    else:
        t = result_type(types, [x for x in (a, b) if not isinstance(x, TensorNode)])

    def operand(x: Any, idx: tuple[Expr, ...]) -> Expr:
        if isinstance(x, TensorNode):
            return E.cast(x[broadcast_index(x.shape, idx)], t)
        return _scalar_expr(x, t)

    def fn(*i: Expr) -> Expr:
        c = E.cast(cond[broadcast_index(cond.shape, i)], bool_)
        return E.Select(c, operand(a, i), operand(b, i))
    return compute("where", shape, fn)


def where(cond: Any, a: Operand, b: Operand) -> Any:
    """``a`` where ``cond`` is true, else ``b`` (broadcast together; non-bool conditions test != 0)."""
    cond, a, b = _scalars(cond, a, b)
    arrays = [x for x in (cond, a, b) if not isinstance(x, (bool, int, float))]
    if isinstance(cond, (bool, int, float)):
        raise OpError("where(): the condition must be an array")
    args = prepare("where", *arrays)
    shape = broadcast_shapes("where", *args.shapes)
    types = [scalar_type(d) for d in args.dtypes[1:]]
    scalars = [x for x in (a, b) if isinstance(x, (bool, int, float))]
    out_t = result_type(types, scalars) if types else (f32 if any(isinstance(x, float) for x in scalars) else i64)
    kshape = shape or (1,)
    key = tuple(("s", type(x).__name__, x) if isinstance(x, (bool, int, float)) else "a" for x in (a, b))

    def define(xs: list[TensorInput]) -> TensorNode:
        it = iter(xs)
        c = next(it)
        ops = [x if isinstance(x, (bool, int, float)) else next(it) for x in (a, b)]
        return where_compute(c, ops[0], ops[1], kshape)

    return run_compute("where", key, args, shape, out_t.name, define)


def cast_compute(x: TensorNode, dtype: ScalarType) -> TensorNode:
    return compute("cast", x.shape, lambda *i: E.cast(x[i], dtype))


def cast(x: Any, dtype: Any) -> Any:
    """``x`` converted to ``dtype`` (a name, numpy / torch dtype or taskmap ScalarType)."""
    name = dtype_name(dtype)
    if name not in SUPPORTED:
        raise OpError(f"cast(): unsupported target dtype {name}; supported: {', '.join(SUPPORTED)}")
    args = prepare("cast", x)
    if args.kind.library == "numpy" and name == "bfloat16":
        raise OpError("cast(): numpy has no bfloat16; pass torch tensors")
    t = scalar_type(name)
    return run_compute("cast", (name,), args, args.shapes[0], name, lambda xs: cast_compute(xs[0], t))


__all__ = ["abs", "acos", "acosh", "add", "asin", "asinh", "atan", "atan2", "atanh", "binary_compute",
           "bitwise_and", "bitwise_left_shift", "bitwise_or", "bitwise_right_shift", "bitwise_xor",
           "broadcast_index", "broadcast_shapes", "cast", "cast_compute", "ceil", "compute_type", "cos", "cosh",
           "div", "eq", "erf", "exp", "expm1", "floor", "floor_divide", "fmod", "ge", "gelu", "gt", "hardsigmoid",
           "hardswish", "le", "lgamma", "log", "log1p", "logsigmoid", "lt", "maximum", "minimum", "mish", "mul",
           "ne", "neg", "pow", "reciprocal", "relu", "relu6", "remainder", "result_type", "round", "rsqrt", "selu",
           "sigmoid", "sign", "silu", "sin", "sinh", "softplus", "sqrt", "square", "sub", "tan", "tanh", "trunc",
           "unary_compute", "where", "where_compute", "BINARY", "UNARY"]
