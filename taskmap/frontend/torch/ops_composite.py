"""Registry: PyTorch operators that taskmap composes from its own ops — statistics (std,
logsumexp, vector norms, normalize, any / all), NaN and infinity tests, group / instance norm,
prelu, index transforms (flip, roll, tril / triu, pixel (un)shuffle, repeat_interleave) and
interpolation (nearest, bilinear).

Every composition is injective ops around at most the reductions it needs, so the fusion pass
folds it into as few kernels as the hand-written op would take (``flip`` is a slice of step -1,
``pixel_shuffle`` a reshape / permute, nearest upsampling by an integer factor a broadcast)."""
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
    big = float(np.finfo(x.dtype.numpy_dtype).max) if x.dtype.name != "bfloat16" else float(torch.finfo(torch.bfloat16).max)
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


# ----------------------------------------------------------------------------- interpolation


def _out_sizes(x: Tensor, size: Any, scale_factor: Any, recompute: Any) -> tuple[list[int], list[float]]:
    """Output sizes of the spatial dims and the scales source = dst * scale uses (torch's rule:
    ``1 / scale_factor`` when a factor is given and not recomputed, else in / out)."""
    spatial = x.shape[2:]
    k = len(spatial)
    if size is not None:
        outs = [int(size)] * k if isinstance(size, int) else [int(s) for s in size]
        return outs, [i / o for i, o in zip(spatial, outs)]
    if scale_factor is None:
        raise NotConvertible("interpolate without size or scale_factor")
    sfs = [float(scale_factor)] * k if isinstance(scale_factor, (int, float)) else [float(s) for s in scale_factor]
    outs = [int(math.floor(i * s)) for i, s in zip(spatial, sfs)]
    scales = [i / o for i, o in zip(spatial, outs)] if recompute else [1.0 / s for s in sfs]
    return outs, scales


def _gather_axis(cv: Converter, x: Tensor, axis: int, index: np.ndarray) -> Tensor:
    """``x`` picked along ``axis`` at the constant ``index`` (one entry per output position)."""
    shape = [1] * x.ndim
    shape[axis] = len(index)
    idx = cv.const(index.astype(np.int64).reshape(shape))
    out = list(x.shape)
    out[axis] = len(index)
    return cv.op(OpKind.GATHER, [x, cv.expand(idx, out)], AxisAttrs(axis))


def _nearest(cv: Converter, x: Tensor, outs: list[int], scales: list[float]) -> Tensor:
    for k, (o, s) in enumerate(zip(outs, scales)):
        axis, n = 2 + k, x.shape[2 + k]
        if o == n:
            continue
        if o % n == 0 and np.isclose(s * (o // n), 1.0):       # an integer factor: a broadcast
            x = _repeat_each(cv, x, axis, o // n)
            continue
        src = np.minimum(np.floor(np.arange(o, dtype=np.float32) * np.float32(s)), n - 1)
        x = _gather_axis(cv, x, axis, src)
    return x


def _linear(cv: Converter, x: Tensor, outs: list[int], scales: list[float], align_corners: bool) -> Tensor:
    """Separable linear interpolation, one spatial axis at a time (torch's source indices)."""
    for k, (o, s) in enumerate(zip(outs, scales)):
        axis, n = 2 + k, x.shape[2 + k]
        dst = np.arange(o, dtype=np.float32)
        if align_corners:
            src = dst * np.float32((n - 1) / (o - 1) if o > 1 else 0.0)
        else:
            src = np.maximum(np.float32(s) * (dst + np.float32(0.5)) - np.float32(0.5), np.float32(0.0))
        i0 = np.minimum(np.floor(src), n - 1).astype(np.int64)
        i1 = np.minimum(i0 + 1, n - 1)
        l1 = (src - i0).astype(np.float32)
        shape = [1] * x.ndim
        shape[axis] = o
        w1 = cv.const(l1.reshape(shape))
        w0 = cv.const((np.float32(1.0) - l1).reshape(shape))
        x = cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, _gather_axis(cv, x, axis, i0), w0),
                      cv.binary(BinaryFn.MUL, _gather_axis(cv, x, axis, i1), w1))
    return x


def _interpolate(cv: Converter, x: Tensor, size: Any, scale_factor: Any, mode: str, align_corners: Any,
                 recompute: Any) -> Tensor:
    linear = {"linear": 1, "bilinear": 2, "trilinear": 3}
    if mode == "nearest":
        outs, scales = _out_sizes(x, size, scale_factor, recompute)
        return _nearest(cv, x, outs, scales)
    if linear.get(mode) == x.ndim - 2:
        outs, scales = _out_sizes(x, size, scale_factor, recompute)
        if not x.dtype.is_float:
            raise NotConvertible(f"{mode} interpolation of a {x.dtype.name} tensor")
        return _linear(cv, x, outs, scales, bool(align_corners))
    raise NotConvertible(f"interpolate(mode={mode!r}) of a {x.ndim}-d tensor (nearest, and (bi/tri)linear "
                         "on 3/4/5-d tensors are supported)")


@register(F.interpolate, F.upsample)
def interpolate(cv: Converter, x: Tensor, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                align_corners: Any = None, recompute_scale_factor: Any = None, antialias: bool = False) -> Tensor:
    if antialias:
        raise NotConvertible("interpolate(antialias=True)")
    return _interpolate(cv, x, size, scale_factor, mode, align_corners, recompute_scale_factor)


@register(nn.Upsample, nn.UpsamplingNearest2d, nn.UpsamplingBilinear2d)
def upsample(cv: Converter, m: nn.Module, x: Tensor) -> Tensor:
    return _interpolate(cv, x, m.size, m.scale_factor, m.mode, m.align_corners,
                        getattr(m, "recompute_scale_factor", None))


__all__: list[str] = []
