"""Registry: activations, arithmetic, comparisons, where / masked_fill, casts, dropout (eval),
identities."""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, Tensor, UnaryFn, WhereAttrs
from .registry import Converter, NotConvertible, from_torch_dtype, register, to_torch

nn = torch.nn


def _unary(fn: UnaryFn, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Any, *rest: Any, **kwargs: Any) -> Tensor:
        if isinstance(x, nn.Module):  # call_module: (module, input)
            x = rest[0]
        return cv.unary(fn, x)


_unary(UnaryFn.RELU, torch.relu, F.relu, "relu", "relu_", nn.ReLU, torch.relu_)
_unary(UnaryFn.SIGMOID, torch.sigmoid, F.sigmoid, "sigmoid", nn.Sigmoid)
_unary(UnaryFn.TANH, torch.tanh, F.tanh, "tanh", nn.Tanh)
_unary(UnaryFn.SILU, F.silu, "silu", nn.SiLU)
_unary(UnaryFn.HARDSWISH, F.hardswish, nn.Hardswish)
_unary(UnaryFn.RELU6, F.relu6, nn.ReLU6)
_unary(UnaryFn.EXP, torch.exp, "exp")
_unary(UnaryFn.LOG, torch.log, "log")
_unary(UnaryFn.SQRT, torch.sqrt, "sqrt")
_unary(UnaryFn.RSQRT, torch.rsqrt, "rsqrt")
_unary(UnaryFn.ERF, torch.erf, torch.special.erf, "erf")
_unary(UnaryFn.ABS, torch.abs, operator.abs, "abs")
_unary(UnaryFn.NEG, torch.neg, operator.neg, "neg")
_unary(UnaryFn.SIN, torch.sin, "sin")
_unary(UnaryFn.COS, torch.cos, "cos")
for _name in ("tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh"):
    _unary(getattr(UnaryFn, _name.upper()), getattr(torch, _name), _name,
           *[getattr(torch, a) for a in (f"arc{_name[1:]}",) if _name.startswith("a") and hasattr(torch, a)])
_unary(UnaryFn.FLOOR, torch.floor, "floor")
_unary(UnaryFn.CEIL, torch.ceil, "ceil")
_unary(UnaryFn.TRUNC, torch.trunc, torch.fix, "trunc", "fix")
_unary(UnaryFn.SIGN, torch.sign, "sign")
_unary(UnaryFn.RECIPROCAL, torch.reciprocal, "reciprocal")
_unary(UnaryFn.SQUARE, torch.square, "square")
_unary(UnaryFn.EXPM1, torch.expm1, torch.special.expm1, "expm1")
_unary(UnaryFn.LOG1P, torch.log1p, torch.special.log1p, "log1p")
_unary(UnaryFn.MISH, F.mish, nn.Mish)
_unary(UnaryFn.HARDSIGMOID, F.hardsigmoid, nn.Hardsigmoid)
_unary(UnaryFn.LOGSIGMOID, F.logsigmoid, nn.LogSigmoid)
_unary(UnaryFn.SELU, F.selu, torch.selu, nn.SELU)
_unary(UnaryFn.LGAMMA, torch.lgamma, torch.special.gammaln, "lgamma")


@register(torch.round, "round")
def round_(cv: Converter, x: Tensor, decimals: int = 0) -> Tensor:
    if decimals:
        raise NotConvertible("round(decimals=...)")
    return cv.unary(UnaryFn.ROUND, x)


@register(F.softplus, nn.Softplus)
def softplus(cv: Converter, x: Any, beta: Any = 1.0, threshold: Any = 20.0) -> Tensor:
    if isinstance(x, nn.Module):
        beta, threshold, x = x.beta, x.threshold, beta
    if beta == 1 and threshold == 20:
        return cv.unary(UnaryFn.SOFTPLUS, x)
    bx = cv.binary(BinaryFn.MUL, x, float(beta))
    soft = cv.binary(BinaryFn.DIV, cv.unary(UnaryFn.LOG1P, cv.unary(UnaryFn.EXP, bx)), float(beta))
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, bx, float(threshold)), x, soft], WhereAttrs())


@register(F.leaky_relu, nn.LeakyReLU, "leaky_relu", torch._C._nn.leaky_relu)
def leaky_relu(cv: Converter, x: Any, negative_slope: Any = 0.01, inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        negative_slope, x = x.negative_slope, negative_slope
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, x, 0.0), x, cv.binary(BinaryFn.MUL, x, float(negative_slope))],
                 WhereAttrs())


@register(F.elu, nn.ELU, "elu")
def elu(cv: Converter, x: Any, alpha: Any = 1.0, inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        alpha, x = x.alpha, alpha
    neg = cv.binary(BinaryFn.MUL, cv.unary(UnaryFn.EXPM1, x), float(alpha))
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, x, 0.0), x, neg], WhereAttrs())


@register(F.gelu, "gelu", nn.GELU, torch._C._nn.gelu)
def gelu(cv: Converter, x: Any, *rest: Any, approximate: str = "none") -> Tensor:
    if isinstance(x, nn.Module):
        approximate, x = x.approximate, rest[0]
    elif rest:
        approximate = rest[0]
    if approximate not in ("none", "tanh"):
        raise NotConvertible(f"gelu(approximate={approximate!r})")
    return cv.unary(UnaryFn.GELU if approximate == "none" else UnaryFn.GELU_TANH, x)


@register(F.hardtanh, nn.Hardtanh)
def hardtanh(cv: Converter, x: Any, min_val: Any = -1.0, max_val: Any = 1.0, inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        min_val, max_val, x = x.min_val, x.max_val, min_val
    return _clamp(cv, x, min_val, max_val)


@register("clamp", torch.clamp, torch.clip, "clip", "clamp_")
def clamp(cv: Converter, x: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return _clamp(cv, x, min, max)


@register("clamp_min", torch.clamp_min, "clamp_min_")
def clamp_min(cv: Converter, x: Tensor, lo: Any) -> Tensor:
    return _clamp(cv, x, lo, None)


@register("clamp_max", torch.clamp_max, "clamp_max_")
def clamp_max(cv: Converter, x: Tensor, hi: Any) -> Tensor:
    return _clamp(cv, x, None, hi)


def _clamp(cv: Converter, x: Tensor, lo: Any, hi: Any) -> Tensor:
    lo, hi = _scalar(cv, lo), _scalar(cv, hi)
    if lo is not None and hi is not None and not isinstance(lo, Tensor) and not isinstance(hi, Tensor) \
            and lo == 0 and hi == 6:
        return cv.unary(UnaryFn.RELU6, x)
    y = x
    if lo is not None:
        y = cv.binary(BinaryFn.MAXIMUM, y, lo)
    if hi is not None:
        y = cv.binary(BinaryFn.MINIMUM, y, hi)
    return y


def _softmax(kind: OpKind, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Any, *rest: Any, dim: Any = None, dtype: Any = None, _stacklevel: int = 3) -> Tensor:
        if isinstance(x, nn.Module):
            dim, x = x.dim, rest[0]
        elif rest:
            dim = rest[0]
            if len(rest) > 2:
                dtype = rest[2]
        if dim is None:
            raise NotConvertible("softmax without dim")
        if dtype is not None:
            x = cv.cast(x, from_torch_dtype(dtype))
        if not x.dtype.is_float:
            raise NotConvertible("softmax of a non-float tensor")
        return cv.op(kind, [x], AxisAttrs(int(dim) % max(x.ndim, 1)))


_softmax(OpKind.SOFTMAX, torch.softmax, F.softmax, "softmax", nn.Softmax)
_softmax(OpKind.LOG_SOFTMAX, torch.log_softmax, F.log_softmax, "log_softmax", nn.LogSoftmax)


_BINARY = {
    BinaryFn.ADD: (torch.add, operator.add, operator.iadd, "add", "add_", "__add__", "__radd__"),
    BinaryFn.SUB: (torch.sub, torch.subtract, operator.sub, operator.isub, "sub", "sub_", "__sub__"),
    BinaryFn.MUL: (torch.mul, torch.multiply, operator.mul, operator.imul, "mul", "mul_", "__mul__", "__rmul__"),
    BinaryFn.DIV: (torch.div, torch.divide, torch.true_divide, operator.truediv, operator.itruediv, "div", "div_",
                   "__truediv__"),
    BinaryFn.FLOOR_DIVIDE: (torch.floor_divide, operator.floordiv, operator.ifloordiv, "floor_divide", "__floordiv__"),
    BinaryFn.REMAINDER: (torch.remainder, operator.mod, operator.imod, "remainder", "__mod__"),
    BinaryFn.FMOD: (torch.fmod, "fmod"),
    BinaryFn.ATAN2: (torch.atan2, torch.arctan2, "atan2", "arctan2"),
    BinaryFn.POW: (torch.pow, operator.pow, operator.ipow, "pow", "pow_", "__pow__"),
    BinaryFn.MAXIMUM: (torch.maximum, "maximum"),
    BinaryFn.MINIMUM: (torch.minimum, "minimum"),
    BinaryFn.EQ: (torch.eq, operator.eq, "eq", "__eq__"),
    BinaryFn.NE: (torch.ne, operator.ne, "ne", "__ne__"),
    BinaryFn.LT: (torch.lt, torch.less, operator.lt, "lt", "__lt__"),
    BinaryFn.LE: (torch.le, operator.le, "le", "__le__"),
    BinaryFn.GT: (torch.gt, torch.greater, operator.gt, "gt", "__gt__"),
    BinaryFn.GE: (torch.ge, operator.ge, "ge", "__ge__"),
}


def _scalar(cv: Converter, v: Any) -> Any:
    """0-d constants become Python numbers (attributes)."""
    if isinstance(v, Tensor) and v.is_constant and v.ndim == 0:
        return to_torch(v).item()
    return v


def _binary(fn: BinaryFn, targets: tuple[Any, ...]) -> None:
    @register(*targets)
    def handler(cv: Converter, a: Any, b: Any, *rest: Any, alpha: Any = 1, rounding_mode: Any = None,
                out: Any = None) -> Tensor:
        if out is not None:
            raise NotConvertible(f"{fn.value} with out=")
        op = fn
        if rounding_mode is not None:        # div(..., rounding_mode="floor" | "trunc")
            op = {"floor": BinaryFn.FLOOR_DIVIDE, "trunc": BinaryFn.TRUNC_DIVIDE}.get(rounding_mode) \
                if fn is BinaryFn.DIV else None
            if op is None:
                raise NotConvertible(f"{fn.value} with rounding_mode={rounding_mode!r}")
        if rest:
            alpha = rest[0]
        if alpha != 1:
            b = cv.binary(BinaryFn.MUL, b, alpha) if isinstance(b, Tensor) else b * alpha
        a, b = _scalar(cv, a), _scalar(cv, b)
        return cv.binary(op, a, b)


for _fn, _targets in _BINARY.items():
    _binary(_fn, _targets)


@register("rsub", torch.rsub)
def rsub(cv: Converter, a: Any, b: Any, alpha: Any = 1) -> Tensor:
    return cv.binary(BinaryFn.SUB, b, a if alpha == 1 else cv.binary(BinaryFn.MUL, a, alpha))


@register("where")
def where_method(cv: Converter, x: Any, condition: Any, y: Any) -> Tensor:
    """``x.where(condition, y)``: ``x`` where the condition holds, else ``y`` (the tensor is the
    first value, not the condition)."""
    return where(cv, condition, x, y)


@register(torch.where)
def where(cv: Converter, cond: Any, a: Any = None, b: Any = None) -> Tensor:
    if a is None or b is None:
        raise NotConvertible("where(cond) with one argument (data-dependent shape)")
    a, b = _scalar(cv, a), _scalar(cv, b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):      # two numbers: PyTorch's dtype for them
        b = cv.const(torch.tensor(b, dtype=torch.result_type(torch.tensor(a), torch.tensor(b))))
    ins = [cond] + [v for v in (a, b) if isinstance(v, Tensor)]
    attrs = WhereAttrs(None if isinstance(a, Tensor) else a, None if isinstance(b, Tensor) else b)
    if not isinstance(cond, Tensor):
        raise NotConvertible("where with a scalar condition")
    return cv.op(OpKind.WHERE, ins, attrs)


@register("masked_fill", "masked_fill_", torch.masked_fill)
def masked_fill(cv: Converter, x: Tensor, mask: Tensor, value: Any) -> Tensor:
    value = _scalar(cv, value)
    if isinstance(value, Tensor):
        return cv.cast(cv.op(OpKind.WHERE, [mask, value, x], WhereAttrs()), x.dtype)
    if x.dtype.is_float:
        value = float(value)
    y = cv.op(OpKind.WHERE, [mask, x], WhereAttrs(a_scalar=value))
    return cv.cast(y, x.dtype)


# ----------------------------------------------------------------------------- logical (bool) and bitwise (integer)


def _bools(a: Any, b: Any) -> bool:
    """Whether the operands are bools (the logical op), else integers (bitwise); floats refused."""
    values = [v for v in (a, b) if v is not None]
    if all(isinstance(v, bool) or isinstance(v, Tensor) and v.dtype.is_bool for v in values):
        return True
    if any(isinstance(v, float) or isinstance(v, Tensor) and v.dtype.is_float for v in values):
        raise NotConvertible("bitwise op of floating-point values (PyTorch refuses them too)")
    return False


def _truth(cv: Converter, v: Any) -> Any:
    """``v`` as bools (``torch.logical_*`` take any dtype: nonzero is true)."""
    if isinstance(v, Tensor):
        return v if v.dtype.is_bool else cv.binary(BinaryFn.NE, v, 0)
    return bool(v)


@register(torch.logical_and, "logical_and")
def logical_and(cv: Converter, a: Any, b: Any) -> Tensor:
    a, b = _truth(cv, a), _truth(cv, b)
    if not isinstance(a, Tensor):
        a, b = b, a
    if not isinstance(b, Tensor):
        return a if b else cv.binary(BinaryFn.NE, a, a)
    return cv.op(OpKind.WHERE, [a, b], WhereAttrs(b_scalar=False))  # a ? b : false


@register(torch.logical_or, "logical_or")
def logical_or(cv: Converter, a: Any, b: Any) -> Tensor:
    a, b = _truth(cv, a), _truth(cv, b)
    if not isinstance(a, Tensor):
        a, b = b, a
    if not isinstance(b, Tensor):
        return cv.binary(BinaryFn.EQ, a, a) if b else a
    return cv.op(OpKind.WHERE, [a, b], WhereAttrs(a_scalar=True))  # a ? true : b


@register(torch.logical_xor, "logical_xor")
def logical_xor(cv: Converter, a: Any, b: Any) -> Tensor:
    return cv.binary(BinaryFn.NE, _truth(cv, a), _truth(cv, b))


@register(torch.logical_not, "logical_not")
def logical_not(cv: Converter, a: Tensor) -> Tensor:
    return cv.binary(BinaryFn.EQ, a, False if a.dtype.is_bool else 0)


@register(operator.and_, operator.iand, torch.bitwise_and, "__and__", "bitwise_and")
def bitwise_and(cv: Converter, a: Any, b: Any) -> Tensor:
    return logical_and(cv, a, b) if _bools(a, b) else cv.binary(BinaryFn.BITWISE_AND, a, b)


@register(operator.or_, operator.ior, torch.bitwise_or, "__or__", "bitwise_or")
def bitwise_or(cv: Converter, a: Any, b: Any) -> Tensor:
    return logical_or(cv, a, b) if _bools(a, b) else cv.binary(BinaryFn.BITWISE_OR, a, b)


@register(operator.xor, operator.ixor, torch.bitwise_xor, "__xor__", "bitwise_xor")
def bitwise_xor(cv: Converter, a: Any, b: Any) -> Tensor:
    return cv.binary(BinaryFn.NE if _bools(a, b) else BinaryFn.BITWISE_XOR, a, b)


@register(operator.invert, torch.bitwise_not, "__invert__", "bitwise_not")
def bitwise_not(cv: Converter, a: Tensor) -> Tensor:
    if _bools(a, None):
        return logical_not(cv, a)
    return cv.binary(BinaryFn.BITWISE_XOR, a, -1)         # every bit flipped


@register(operator.lshift, operator.ilshift, torch.bitwise_left_shift, "__lshift__", "bitwise_left_shift")
def left_shift(cv: Converter, a: Any, b: Any) -> Tensor:
    if _bools(a, b):
        raise NotConvertible("shift of bools")
    return cv.binary(BinaryFn.LEFT_SHIFT, a, b)


@register(operator.rshift, operator.irshift, torch.bitwise_right_shift, "__rshift__", "bitwise_right_shift")
def right_shift(cv: Converter, a: Any, b: Any) -> Tensor:
    if _bools(a, b):
        raise NotConvertible("shift of bools")
    return cv.binary(BinaryFn.RIGHT_SHIFT, a, b)


# ----------------------------------------------------------------------------- casts, identities

_DTYPE_METHODS = {"float": torch.float32, "half": torch.float16, "double": torch.float64, "long": torch.int64,
                  "int": torch.int32, "bool": torch.bool, "bfloat16": torch.bfloat16}


def _dtype_method(name: str, dtype: torch.dtype) -> None:
    @register(name)
    def handler(cv: Converter, x: Tensor, *rest: Any, **kwargs: Any) -> Tensor:
        return cv.cast(x, from_torch_dtype(dtype))


for _name, _dt in _DTYPE_METHODS.items():
    _dtype_method(_name, _dt)


@register("to", "type")
def to(cv: Converter, x: Tensor, *args: Any, dtype: Any = None, device: Any = None, **kwargs: Any) -> Tensor:
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, Tensor):
            dtype = a.dtype
        elif isinstance(a, (str, torch.device)):
            device = a
    if device is not None and torch.device(device).type != torch.device(x.device).type:
        raise NotConvertible(f"moving a tensor to {device} inside the model")
    if dtype is None:
        return x
    return cv.cast(x, dtype if not isinstance(dtype, torch.dtype) else from_torch_dtype(dtype))


@register("type_as")
def type_as(cv: Converter, x: Tensor, other: Tensor) -> Tensor:
    return cv.cast(x, other.dtype)


@register(F.dropout, nn.Dropout, "dropout", torch.dropout, F.dropout1d, F.dropout2d, nn.Dropout2d, F.alpha_dropout)
def dropout(cv: Converter, x: Any, *rest: Any, p: float = 0.5, training: bool = False, inplace: bool = False,
            train: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        training, x = x.training, rest[0]
    elif len(rest) >= 2:
        training = rest[1]
    if train is not None:
        training = train
    if training:
        raise NotConvertible("dropout in training mode")
    return x


@register(nn.Identity, "contiguous", "clone", "detach", torch.clone, "requires_grad_", torch.detach)
def identity(cv: Converter, x: Any, *rest: Any, **kwargs: Any) -> Tensor:
    return rest[0] if isinstance(x, nn.Module) else x


__all__: list[str] = []
