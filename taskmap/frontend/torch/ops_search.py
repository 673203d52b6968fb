"""Registry: more PyTorch operators composed from taskmap's — order statistics (``median``,
``kthvalue``: a sort, then a slice), bucketing (``bucketize``,
``searchsorted``: counts of the boundaries below each value), distances and norms (``cdist``,
``linalg.norm``, p-norms of any order), power-average pooling (``lp_pool1d`` / ``lp_pool2d``) and
``frac``.

Bucketing compares every value with every boundary and counts (one reduction): right for the
small tables of bucketize's uses (quantization edges, position buckets), quadratic for long
sorted sequences.  ``cdist`` takes the differences of every pair of points (exact, as torch's
small-size path; its large-size path goes through a matrix product whose rounding differs)."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...graph import BinaryFn, ReduceFn, Tensor, UnaryFn
from ...ir.dtypes import i32, i64
from .ops_composite import _vector_norm
from .ops_layers import avg_pool1d
from .ops_nn import _axes, _reduce, avg_pool2d, sort
from .registry import Converter, NotConvertible, norm_axis, register

nn = torch.nn


# ----------------------------------------------------------------------------- order statistics


def _kth(cv: Converter, x: Tensor, k: int, dim: int, keepdim: bool) -> tuple[Tensor, Tensor]:
    """The ``k``-th smallest (from 0) along ``dim`` and its index."""
    axis = norm_axis(dim, max(x.ndim, 1))
    values, indices = sort(cv, x, axis)
    pick = [cv.slice(t, axis, k, k + 1) for t in (values, indices)]
    if keepdim:
        return pick[0], pick[1]
    shape = tuple(n for a, n in enumerate(x.shape) if a != axis)
    return cv.reshape(pick[0], shape), cv.reshape(pick[1], shape)


@register(torch.median, "median")
def median(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False) -> Any:
    """The lower median (as torch); with ``dim`` also its index.  NaNs are not treated apart."""
    if dim is None:
        flat = cv.reshape(x, (x.numel,))
        return _kth(cv, flat, (x.numel - 1) // 2, 0, False)[0]
    n = x.shape[norm_axis(dim, max(x.ndim, 1))] if x.ndim else 1
    return _kth(cv, x, (n - 1) // 2, dim, bool(keepdim))


@register(torch.kthvalue, "kthvalue")
def kthvalue(cv: Converter, x: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    n = x.shape[norm_axis(dim, max(x.ndim, 1))] if x.ndim else 1
    if not 1 <= int(k) <= n:
        raise NotConvertible(f"kthvalue: k = {k} out of range for a dimension of {n}")
    return _kth(cv, x, int(k) - 1, dim, bool(keepdim))


# ----------------------------------------------------------------------------- bucketing


def _count_below(cv: Converter, table: Tensor, values: Tensor, right: bool, out_int32: bool) -> Tensor:
    """Per value, the number of table entries below it (``<=`` with ``right``): ``table`` (..., K)
    against ``values`` (..., M) — or a 1-d table against values of any shape."""
    fn = BinaryFn.LE if right else BinaryFn.LT
    if table.ndim == 1:
        below = cv.binary(fn, cv.reshape(table, (1,) * values.ndim + table.shape),
                          cv.reshape(values, (*values.shape, 1)))
    else:
        if table.shape[:-1] != values.shape[:-1]:
            raise NotConvertible(f"searchsorted of values {list(values.shape)} in rows {list(table.shape)}")
        below = cv.binary(fn, cv.reshape(table, (*table.shape[:-1], 1, table.shape[-1])),
                          cv.reshape(values, (*values.shape, 1)))
    count = _reduce(cv, ReduceFn.SUM, cv.cast(below, i32), (below.ndim - 1,), False)
    return cv.cast(count, i32 if out_int32 else i64)


@register(torch.bucketize, "bucketize")
def bucketize(cv: Converter, x: Any, boundaries: Tensor, *, out_int32: bool = False, right: bool = False) -> Tensor:
    if not isinstance(x, Tensor):
        x = cv.tensor(x)
    if boundaries.ndim != 1:
        raise NotConvertible("bucketize with boundaries that are not 1-d")
    return _count_below(cv, cv.cast(boundaries, x.dtype), x, bool(right), bool(out_int32))


@register(torch.searchsorted)
def searchsorted(cv: Converter, seq: Tensor, values: Any, *, out_int32: bool = False, right: bool = False,
                 side: Any = None, sorter: Any = None) -> Tensor:
    if sorter is not None:
        raise NotConvertible("searchsorted with a sorter")
    if not isinstance(values, Tensor):
        values = cv.tensor(values)
    right = side == "right" if side is not None else bool(right)
    return _count_below(cv, cv.cast(seq, values.dtype), values, right, bool(out_int32))


# ----------------------------------------------------------------------------- norms and distances


@register(torch.linalg.norm)
def linalg_norm(cv: Converter, x: Tensor, ord: Any = None, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None) -> Tensor:
    """Vector norms (a 1-d input, an int ``dim``, or no ``ord`` and no ``dim``), and the matrix
    norms that are sums and maxima: Frobenius, 1, -1, inf, -inf (2, -2 and nuclear need singular
    values: not converted)."""
    if dtype is not None:
        raise NotConvertible("linalg.norm(dtype=...)")
    if isinstance(dim, int) or (dim is None and (ord is None or x.ndim == 1)):
        return _vector_norm(cv, x, 2 if ord is None else ord, _axes(x, dim), bool(keepdim))
    rows, cols = (norm_axis(d, x.ndim) for d in (dim if dim is not None else (-2, -1)))
    if ord in (None, "fro"):
        return _vector_norm(cv, x, 2, (rows, cols), bool(keepdim))
    if ord in (1, -1, math.inf, -math.inf):
        summed, over = (rows, cols) if ord in (1, -1) else (cols, rows)
        sums = _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.ABS, x), (summed,), True)
        out = _reduce(cv, ReduceFn.MAX if ord > 0 else ReduceFn.MIN, sums, (over,), True)
        return out if keepdim else cv.reshape(out, tuple(n for a, n in enumerate(x.shape) if a not in (rows, cols)))
    raise NotConvertible(f"linalg.norm of a matrix with ord={ord!r} (singular values)")


@register(torch.cdist)
def cdist(cv: Converter, a: Tensor, b: Tensor, p: float = 2.0, compute_mode: Any = None) -> Tensor:
    """The ``p``-norm of every difference ``a[..., i, :] - b[..., j, :]``."""
    if a.ndim < 2 or b.ndim != a.ndim or a.shape[-1] != b.shape[-1]:
        raise NotConvertible(f"cdist of {list(a.shape)} and {list(b.shape)}")
    d = cv.binary(BinaryFn.SUB, cv.reshape(a, (*a.shape[:-1], 1, a.shape[-1])),
                  cv.reshape(b, (*b.shape[:-2], 1, *b.shape[-2:])))
    return _vector_norm(cv, d, float(p), (d.ndim - 1,), False)


# ----------------------------------------------------------------------------- power-average pooling


def _lp_pool(pool: Any, cv: Converter, x: Any, norm_type: Any, kernel_size: Any, stride: Any,
             ceil_mode: bool) -> Tensor:
    """torch's formula: ``(sign(s) * relu(|s|) * area) ** (1 / p)`` of ``s = avg_pool(x ** p)``."""
    if isinstance(x, nn.Module):
        m, x = x, norm_type
        norm_type, kernel_size, stride, ceil_mode = m.norm_type, m.kernel_size, m.stride, m.ceil_mode
    p = float(norm_type)
    ks = (kernel_size,) * (x.ndim - 2) if isinstance(kernel_size, int) else tuple(kernel_size)
    s = pool(cv, cv.binary(BinaryFn.POW, x, p), kernel_size, stride, 0, bool(ceil_mode))
    s = cv.binary(BinaryFn.MUL, cv.unary(UnaryFn.SIGN, s), cv.unary(UnaryFn.RELU, cv.unary(UnaryFn.ABS, s)))
    return cv.binary(BinaryFn.POW, cv.binary(BinaryFn.MUL, s, float(math.prod(ks))), 1.0 / p)


@register(F.lp_pool2d, nn.LPPool2d)
def lp_pool2d(cv: Converter, x: Any, norm_type: Any = None, kernel_size: Any = None, stride: Any = None,
              ceil_mode: bool = False) -> Tensor:
    return _lp_pool(avg_pool2d, cv, x, norm_type, kernel_size, stride, ceil_mode)


@register(F.lp_pool1d, nn.LPPool1d)
def lp_pool1d(cv: Converter, x: Any, norm_type: Any = None, kernel_size: Any = None, stride: Any = None,
              ceil_mode: bool = False) -> Tensor:
    return _lp_pool(avg_pool1d, cv, x, norm_type, kernel_size, stride, ceil_mode)


@register(torch.frac, "frac")
def frac(cv: Converter, x: Tensor) -> Tensor:
    return cv.binary(BinaryFn.SUB, x, cv.unary(UnaryFn.TRUNC, x))
