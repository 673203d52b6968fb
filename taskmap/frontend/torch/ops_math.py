"""Registry: element-wise PyTorch operators composed from taskmap's — activations and arithmetic
(exp2, log2 / log10, softsign, tanhshrink, celu, threshold, rrelu, softmin, glu, addcmul / addcdiv,
lerp, outer, heaviside) and NaN / infinity tests (isnan, isinf, isfinite, nan_to_num).  Each is a
few injective ops, fused with its neighbours like a native one."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, ReduceFn, Tensor, UnaryFn, WhereAttrs
from ...ir.dtypes import f32
from .ops_nn import _reduce
from .registry import Converter, NotConvertible, norm_axis, register

nn = torch.nn


# ----------------------------------------------------------------------------- arithmetic and activations


def _scaled_unary(fn: UnaryFn, scale: float, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Tensor) -> Tensor:
        y = cv.unary(fn, x if x.dtype.is_float else cv.cast(x, f32))
        return cv.binary(BinaryFn.MUL, y, scale)


_scaled_unary(UnaryFn.LOG, 1 / math.log(2.0), torch.log2, "log2")
_scaled_unary(UnaryFn.LOG, 1 / math.log(10.0), torch.log10, "log10")


@register(torch.exp2, torch.special.exp2, "exp2")
def exp2(cv: Converter, x: Tensor) -> Tensor:
    return cv.binary(BinaryFn.POW, 2.0, x if x.dtype.is_float else cv.cast(x, f32))


@register(F.softsign, nn.Softsign)
def softsign(cv: Converter, x: Any, *rest: Any) -> Tensor:
    x = rest[0] if isinstance(x, nn.Module) else x
    return cv.binary(BinaryFn.DIV, x, cv.binary(BinaryFn.ADD, cv.unary(UnaryFn.ABS, x), 1.0))


@register(F.tanhshrink, nn.Tanhshrink)
def tanhshrink(cv: Converter, x: Any, *rest: Any) -> Tensor:
    x = rest[0] if isinstance(x, nn.Module) else x
    return cv.binary(BinaryFn.SUB, x, cv.unary(UnaryFn.TANH, x))


@register(F.hardshrink, torch.hardshrink, "hardshrink")
def hardshrink(cv: Converter, x: Tensor, lambd: Any = 0.5) -> Tensor:
    """``x`` where ``|x| > lambd``, else 0."""
    return cv.where_scalar(cv.binary(BinaryFn.LE, cv.unary(UnaryFn.ABS, x), float(lambd)), 0.0, x)


@register(F.softshrink)
def softshrink(cv: Converter, x: Tensor, lambd: Any = 0.5) -> Tensor:
    """``x - lambd * sign(x)`` where ``|x| > lambd``, else 0."""
    shrunk = cv.binary(BinaryFn.SUB, x, cv.binary(BinaryFn.MUL, cv.unary(UnaryFn.SIGN, x), float(lambd)))
    return cv.where_scalar(cv.binary(BinaryFn.LE, cv.unary(UnaryFn.ABS, x), float(lambd)), 0.0, shrunk)


@register(torch.hypot, "hypot")
def hypot(cv: Converter, a: Any, b: Any) -> Tensor:
    return cv.unary(UnaryFn.SQRT, cv.binary(BinaryFn.ADD, cv.unary(UnaryFn.SQUARE, a), cv.unary(UnaryFn.SQUARE, b)))


@register(torch.dot, "dot", torch.inner, "inner")
def dot(cv: Converter, a: Tensor, b: Tensor) -> Tensor:
    """The sum over the last axis of ``a * b`` (1-d operands: ``dot``; ``inner`` of n-d ones:
    every pair of their leading indices)."""
    if a.ndim == 0 or b.ndim == 0:
        return cv.binary(BinaryFn.MUL, a, b)
    lead_a, lead_b = a.shape[:-1], b.shape[:-1]
    a = cv.reshape(a, (*lead_a, *(1,) * len(lead_b), a.shape[-1]))
    prod = cv.binary(BinaryFn.MUL, a, b)
    return _reduce(cv, ReduceFn.SUM, prod, (prod.ndim - 1,), False)


@register(F.celu, nn.CELU, torch.celu)
def celu(cv: Converter, x: Any, alpha: Any = 1.0, inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        alpha, x = x.alpha, alpha
    neg = cv.binary(BinaryFn.MUL, cv.unary(UnaryFn.EXPM1, cv.binary(BinaryFn.DIV, x, float(alpha))), float(alpha))
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, x, 0.0), x, neg], WhereAttrs())


@register(F.threshold, F._threshold, nn.Threshold, torch.threshold)
def threshold(cv: Converter, x: Any, threshold: Any = None, value: Any = None, inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        threshold, value, x = x.threshold, x.value, threshold
    return cv.where_scalar(cv.binary(BinaryFn.LE, x, float(threshold)), float(value), x)


@register(F.rrelu, nn.RReLU)
def rrelu(cv: Converter, x: Any, lower: Any = 1.0 / 8, upper: Any = 1.0 / 3, training: bool = False,
          inplace: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        if x.training:
            raise NotConvertible("RReLU in training mode (random slopes)")
        lower, upper, x = x.lower, x.upper, lower
    elif training:
        raise NotConvertible("rrelu(training=True) (random slopes)")
    slope = (float(lower) + float(upper)) / 2
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GE, x, 0.0), x, cv.binary(BinaryFn.MUL, x, slope)], WhereAttrs())


@register(F.softmin, nn.Softmin)
def softmin(cv: Converter, x: Any, dim: Any = None, _stacklevel: int = 3, dtype: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        x, dim = dim, x.dim
    if dim is None or dtype is not None:
        raise NotConvertible("softmin without dim, or with dtype")
    return cv.op(OpKind.SOFTMAX, [cv.unary(UnaryFn.NEG, x)], AxisAttrs(norm_axis(dim, x.ndim)))


@register(F.glu, nn.GLU)
def glu(cv: Converter, x: Any, dim: Any = -1) -> Tensor:
    if isinstance(x, nn.Module):
        x, dim = dim, x.dim
    d = norm_axis(dim, x.ndim)
    if x.shape[d] % 2:
        raise NotConvertible(f"glu halves dimension {d}, of odd size {x.shape[d]}")
    h = x.shape[d] // 2
    return cv.binary(BinaryFn.MUL, cv.slice(x, d, 0, h), cv.unary(UnaryFn.SIGMOID, cv.slice(x, d, h, 2 * h)))


def _addc(fn: BinaryFn, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Tensor, a: Tensor, b: Tensor, *, value: Any = 1) -> Tensor:
        t = cv.binary(fn, a, b)
        return cv.binary(BinaryFn.ADD, x, t if value == 1 else cv.binary(BinaryFn.MUL, t, value))


_addc(BinaryFn.MUL, torch.addcmul, "addcmul")
_addc(BinaryFn.DIV, torch.addcdiv, "addcdiv")


@register(torch.lerp, "lerp")
def lerp(cv: Converter, a: Tensor, b: Tensor, weight: Any) -> Tensor:
    return cv.binary(BinaryFn.ADD, a, cv.binary(BinaryFn.MUL, cv.binary(BinaryFn.SUB, b, a), weight))


@register(torch.outer, torch.ger, "outer")
def outer(cv: Converter, a: Tensor, b: Tensor) -> Tensor:
    return cv.binary(BinaryFn.MUL, cv.reshape(a, (a.numel, 1)), cv.reshape(b, (1, b.numel)))


# ----------------------------------------------------------------------------- NaN and infinity


@register(torch.isnan, "isnan")
def isnan(cv: Converter, x: Tensor) -> Tensor:
    return cv.binary(BinaryFn.NE, x, x)


@register(torch.isinf, "isinf")
def isinf(cv: Converter, x: Tensor) -> Tensor:
    return cv.binary(BinaryFn.EQ, cv.unary(UnaryFn.ABS, x), math.inf)


@register(torch.isfinite, "isfinite")
def isfinite(cv: Converter, x: Tensor) -> Tensor:
    return cv.binary(BinaryFn.LT, cv.unary(UnaryFn.ABS, x), math.inf)     # NaN < inf is false


@register(torch.nan_to_num, "nan_to_num")
def nan_to_num(cv: Converter, x: Tensor, nan: Any = 0.0, posinf: Any = None, neginf: Any = None) -> Tensor:
    if not x.dtype.is_float:
        return x
    big = float(torch.finfo(getattr(torch, x.dtype.name)).max)
    y = cv.where_scalar(cv.binary(BinaryFn.NE, x, x), float(nan or 0.0), x)
    y = cv.where_scalar(cv.binary(BinaryFn.EQ, x, math.inf), big if posinf is None else float(posinf), y)
    return cv.where_scalar(cv.binary(BinaryFn.EQ, x, -math.inf), -big if neginf is None else float(neginf), y)


@register(torch.heaviside, "heaviside")
def heaviside(cv: Converter, x: Tensor, values: Any) -> Tensor:
    step = cv.cast(cv.binary(BinaryFn.GT, x, 0), x.dtype)
    if isinstance(values, Tensor):
        return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.EQ, x, 0), cv.cast(values, x.dtype), step], WhereAttrs())
    return cv.where_scalar(cv.binary(BinaryFn.EQ, x, 0), values, step)



__all__: list[str] = []
