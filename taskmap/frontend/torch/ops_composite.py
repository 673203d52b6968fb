"""Registry: PyTorch operators that taskmap composes from its own ops — statistics (std,
logsumexp, vector norms, normalize, any / all), NaN and infinity tests, group / instance norm,
prelu and index transforms (flip, roll, tril / triu, pixel (un)shuffle, repeat_interleave).

Every composition is injective ops around at most the reductions it needs, so the fusion pass
folds it into as few kernels as the hand-written op would take (``flip`` is a slice of step -1,
``pixel_shuffle`` a reshape / permute)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, NormAttrs, OpKind, ReduceAttrs, ReduceFn, SliceAttrs, Tensor, UnaryFn, \
    WhereAttrs
from ...ir.dtypes import bool_, i32
from .ops_nn import _axes
from .registry import Converter, NotConvertible, norm_axis, register

nn = torch.nn


def _where_scalar(cv: Converter, cond: Tensor, value: Any, x: Tensor) -> Tensor:
    """``value if cond else x`` (a Python number for ``value``)."""
    return cv.op(OpKind.WHERE, [cond, x], WhereAttrs(a_scalar=value))


def _reduce(cv: Converter, fn: ReduceFn, x: Tensor, axes: tuple[int, ...], keepdim: bool, corr: int = 0) -> Tensor:
    return cv.op(OpKind.REDUCE, [x], ReduceAttrs(fn, axes, keepdim, corr))


# ----------------------------------------------------------------------------- statistics


@register(torch.std, "std")
def std(cv: Converter, x: Tensor, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *,
        correction: Any = None) -> Tensor:
    if isinstance(dim, bool):               # torch.std(x, unbiased)
        dim, unbiased = None, dim
    corr = int(correction) if correction is not None else (1 if unbiased else 0)
    return cv.unary(UnaryFn.SQRT, _reduce(cv, ReduceFn.VAR, x, _axes(x, dim), bool(keepdim), corr))


@register(torch.logsumexp, "logsumexp", torch.special.logsumexp)
def logsumexp(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    """``m + log(sum(exp(x - m)))`` with ``m`` the maximum — 0 where it is infinite (all -inf:
    -inf; a +inf: +inf, as torch)."""
    axes = _axes(x, dim)
    m = _reduce(cv, ReduceFn.MAX, x, axes, True)
    m = _where_scalar(cv, cv.binary(BinaryFn.EQ, cv.unary(UnaryFn.ABS, m), math.inf), 0.0, m)
    s = _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.EXP, cv.binary(BinaryFn.SUB, x, m)), axes, bool(keepdim))
    if not keepdim:
        m = cv.reshape(m, s.shape)
    return cv.binary(BinaryFn.ADD, cv.unary(UnaryFn.LOG, s), m)


def _anyall(fn: ReduceFn, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        nonzero = cv.cast(cv.binary(BinaryFn.NE, x, 0), i32)
        return cv.cast(_reduce(cv, fn, nonzero, _axes(x, dim), bool(keepdim)), bool_)


_anyall(ReduceFn.MAX, torch.any, "any")
_anyall(ReduceFn.MIN, torch.all, "all")


def _vector_norm(cv: Converter, x: Tensor, ord: Any, dim: Any, keepdim: bool) -> Tensor:
    axes = _axes(x, dim)
    if ord in (2, 2.0, "fro"):
        return cv.unary(UnaryFn.SQRT, _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.SQUARE, x), axes, keepdim))
    if ord in (1, 1.0):
        return _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.ABS, x), axes, keepdim)
    if ord in (math.inf, "inf"):
        return _reduce(cv, ReduceFn.MAX, cv.unary(UnaryFn.ABS, x), axes, keepdim)
    raise NotConvertible(f"vector norm of order {ord!r} (2, 1 and inf are supported)")


@register(torch.linalg.vector_norm)
def vector_norm(cv: Converter, x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None) -> Tensor:
    if dtype is not None:
        raise NotConvertible("vector_norm(dtype=...)")
    return _vector_norm(cv, x, ord, dim, bool(keepdim))


@register(torch.norm, "norm")
def norm(cv: Converter, x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: Any = None) -> Tensor:
    if dtype is not None or (p == "fro" and isinstance(dim, (tuple, list)) and len(dim) > 2):
        raise NotConvertible("norm with dtype or a Frobenius norm over more than two dims")
    return _vector_norm(cv, x, p, dim, bool(keepdim))


@register(F.normalize)
def normalize(cv: Converter, x: Tensor, p: Any = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    n = _vector_norm(cv, x, p, dim, True)
    return cv.binary(BinaryFn.DIV, x, cv.binary(BinaryFn.MAXIMUM, n, float(eps)))


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
    y = _where_scalar(cv, cv.binary(BinaryFn.NE, x, x), float(nan or 0.0), x)
    y = _where_scalar(cv, cv.binary(BinaryFn.EQ, x, math.inf), big if posinf is None else float(posinf), y)
    return _where_scalar(cv, cv.binary(BinaryFn.EQ, x, -math.inf), -big if neginf is None else float(neginf), y)


# ----------------------------------------------------------------------------- normalization layers


def _per_channel(cv: Converter, p: Tensor, ndim: int) -> Tensor:
    """A per-channel parameter ``(C,)`` seen along axis 1 of an ``ndim``-d tensor."""
    return cv.reshape(p, (p.shape[0],) + (1,) * (ndim - 2))


def _group_norm(cv: Converter, x: Tensor, groups: int, weight: Any, bias: Any, eps: float) -> Tensor:
    n, c = x.shape[0], x.shape[1]
    if c % groups:
        raise NotConvertible(f"group_norm: {c} channels in {groups} groups")
    rest = c // groups * int(np.prod(x.shape[2:], dtype=np.int64))
    y = cv.op(OpKind.LAYER_NORM, [cv.reshape(x, (n, groups, rest))], NormAttrs(float(eps), (rest,), False, False))
    y = cv.reshape(y, x.shape)
    if weight is not None:
        y = cv.binary(BinaryFn.MUL, y, _per_channel(cv, weight, x.ndim))
    if bias is not None:
        y = cv.binary(BinaryFn.ADD, y, _per_channel(cv, bias, x.ndim))
    return y


@register(F.group_norm, nn.GroupNorm)
def group_norm(cv: Converter, x: Any, num_groups: Any = None, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, num_groups
        num_groups, eps = m.num_groups, m.eps
        weight, bias = cv.param(m.weight, "weight"), cv.param(m.bias, "bias")
    return _group_norm(cv, x, int(num_groups), weight, bias, eps)


@register(F.instance_norm, nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
def instance_norm(cv: Converter, x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
                  bias: Any = None, use_input_stats: bool = True, momentum: Any = 0.1, eps: float = 1e-5) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, running_mean
        use_input_stats = m.training or not m.track_running_stats
        running_mean, running_var = cv.param(m.running_mean, "running_mean"), cv.param(m.running_var, "running_var")
        weight, bias, eps = cv.param(m.weight, "weight"), cv.param(m.bias, "bias"), m.eps
    if not use_input_stats:          # the running statistics: a batch norm
        ins = [x, running_mean, running_var] + [p for p in (weight, bias) if p is not None]
        return cv.op(OpKind.BATCH_NORM, ins, NormAttrs(float(eps), (), weight is not None, bias is not None))
    return _group_norm(cv, x, x.shape[1], weight, bias, eps)


@register(F.prelu, torch.prelu, nn.PReLU)
def prelu(cv: Converter, x: Any, weight: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, weight
        weight = cv.param(m.weight, "weight")
    w = weight if weight.numel == 1 or x.ndim < 2 else _per_channel(cv, weight, x.ndim)
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, x, 0.0), x, cv.binary(BinaryFn.MUL, x, w)], WhereAttrs())


# ----------------------------------------------------------------------------- index transforms


def _flip(cv: Converter, x: Tensor, axis: int) -> Tensor:
    n = x.shape[axis]
    return x if n <= 1 else cv.op(OpKind.SLICE, [x], SliceAttrs(axis, n - 1, -1, n))


@register(torch.flip, "flip")
def flip(cv: Converter, x: Tensor, *dims: Any) -> Tensor:
    dims = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    for d in dims:
        x = _flip(cv, x, norm_axis(d, x.ndim))
    return x


@register(torch.fliplr, "fliplr")
def fliplr(cv: Converter, x: Tensor) -> Tensor:
    return _flip(cv, x, 1)


@register(torch.flipud, "flipud")
def flipud(cv: Converter, x: Tensor) -> Tensor:
    return _flip(cv, x, 0)


@register(torch.roll, "roll")
def roll(cv: Converter, x: Tensor, shifts: Any, dims: Any = None) -> Tensor:
    if dims is None:
        return cv.reshape(roll(cv, cv.reshape(x, (x.numel,)), shifts, 0), x.shape)
    shifts = (shifts,) if isinstance(shifts, int) else tuple(shifts)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    if len(shifts) != len(dims):
        raise NotConvertible("roll: shifts and dims of different lengths")
    for s, d in zip(shifts, dims):
        d = norm_axis(d, x.ndim)
        n = x.shape[d]
        s = int(s) % n if n else 0
        if s:
            x = cv.op(OpKind.CONCAT, [cv.slice(x, d, n - s, n), cv.slice(x, d, 0, n - s)], AxisAttrs(d))
    return x


def _triangle(lower: bool, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Tensor, diagonal: int = 0) -> Tensor:
        if x.ndim < 2:
            raise NotConvertible("tril / triu of a tensor with fewer than 2 dims")
        r, c = x.shape[-2:]
        off = np.arange(c)[None, :] - np.arange(r)[:, None]
        drop = off > diagonal if lower else off < diagonal
        zero = 0.0 if x.dtype.is_float else False if x.dtype is bool_ else 0
        return _where_scalar(cv, cv.const(drop), zero, x)


_triangle(True, torch.tril, "tril")
_triangle(False, torch.triu, "triu")


@register(F.pixel_shuffle, torch.pixel_shuffle, nn.PixelShuffle)
def pixel_shuffle(cv: Converter, x: Any, r: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        r, x = x.upscale_factor, r
    *lead, c, h, w = x.shape
    k = len(lead)
    y = cv.reshape(x, (*lead, c // (r * r), r, r, h, w))
    y = cv.permute(y, (*range(k), k, k + 3, k + 1, k + 4, k + 2))
    return cv.reshape(y, (*lead, c // (r * r), h * r, w * r))


@register(F.pixel_unshuffle, torch.pixel_unshuffle, nn.PixelUnshuffle)
def pixel_unshuffle(cv: Converter, x: Any, r: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        r, x = x.downscale_factor, r
    *lead, c, h, w = x.shape
    k = len(lead)
    y = cv.reshape(x, (*lead, c, h // r, r, w // r, r))
    y = cv.permute(y, (*range(k), k, k + 2, k + 4, k + 1, k + 3))
    return cv.reshape(y, (*lead, c * r * r, h // r, w // r))


def _repeat_each(cv: Converter, x: Tensor, axis: int, times: int) -> Tensor:
    """Every element of ``axis`` repeated ``times`` times in place (a broadcast, then a reshape)."""
    shape = x.shape
    y = cv.reshape(x, (*shape[:axis + 1], 1, *shape[axis + 1:]))
    y = cv.expand(y, (*shape[:axis + 1], times, *shape[axis + 1:]))
    return cv.reshape(y, (*shape[:axis], shape[axis] * times, *shape[axis + 1:]))


@register(torch.repeat_interleave, "repeat_interleave")
def repeat_interleave(cv: Converter, x: Tensor, repeats: Any = None, dim: Any = None, *,
                      output_size: Any = None) -> Tensor:
    if isinstance(repeats, Tensor):
        if not (repeats.is_constant and repeats.numel == 1):
            raise NotConvertible("repeat_interleave with a tensor of repeats (data-dependent shape)")
        repeats = int(np.asarray(repeats.data).reshape(-1)[0])
    if repeats is None or not isinstance(repeats, int):
        raise NotConvertible("repeat_interleave(x) without an integer count")
    if dim is None:
        return _repeat_each(cv, cv.reshape(x, (x.numel,)), 0, repeats)
    return _repeat_each(cv, x, norm_axis(dim, x.ndim), repeats)


__all__: list[str] = []
