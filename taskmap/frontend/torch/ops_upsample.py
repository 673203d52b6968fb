"""Registry: upsampling — ``interpolate`` / ``nn.Upsample`` (nearest, and linear / bilinear /
trilinear with or without ``align_corners``) and ``conv_transpose2d`` — composed from taskmap ops.

Interpolation is separable: along each spatial axis a gather at constant source indices (two,
blended by constant weights, for the linear modes; nearest upsampling by an integer factor is a
broadcast instead), all injective, so it fuses into the kernel that consumes it.  A transposed
convolution is a convolution of stride 1 over the input with ``stride - 1`` zeros inserted
between its elements (a reshape, a pad and a reshape), padded by ``dilation * (k - 1) - padding``,
with the weights' in / out channels swapped and their taps reversed."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, Conv2dAttrs, OpKind, PadAttrs, SliceAttrs, Tensor
from .ops_composite import _repeat_each
from .ops_nn import _pair, conv_module
from .registry import Converter, NotConvertible, register

nn = torch.nn


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


# ----------------------------------------------------------------------------- transposed convolution


def _insert_zeros(cv: Converter, x: Tensor, axis: int, s: int) -> Tensor:
    """``s - 1`` zeros between neighbours along ``axis``."""
    if s == 1 or x.shape[axis] <= 1:
        return x
    shape = x.shape
    y = cv.reshape(x, (*shape[:axis + 1], 1, *shape[axis + 1:]))
    widths = [(0, 0)] * y.ndim
    widths[axis + 1] = (0, s - 1)
    y = cv.op(OpKind.PAD, [y], PadAttrs(tuple(widths)))
    y = cv.reshape(y, (*shape[:axis], shape[axis] * s, *shape[axis + 1:]))
    return cv.slice(y, axis, 0, (shape[axis] - 1) * s + 1)


def _edges(cv: Converter, x: Tensor, axis: int, before: int, after: int) -> Tensor:
    """Pad (positive) or crop (negative) ``axis`` at both ends."""
    n = x.shape[axis]
    lo, hi = max(0, -before), n - max(0, -after)
    if lo or hi < n:
        x = cv.slice(x, axis, lo, hi)
    if before > 0 or after > 0:
        widths = [(0, 0)] * x.ndim
        widths[axis] = (max(0, before), max(0, after))
        x = cv.op(OpKind.PAD, [x], PadAttrs(tuple(widths)))
    return x


@register(F.conv_transpose2d, torch.conv_transpose2d, nn.ConvTranspose2d)
def conv_transpose2d(cv: Converter, x: Any, weight: Any = None, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, weight
        x, weight, bias, stride, padding, dilation, groups = conv_module(cv, m, x)   # (only zero padding)
        output_padding = m.output_padding
    if x.ndim != 4 or isinstance(padding, str):
        raise NotConvertible("conv_transpose2d of a non-4-d input or with string padding")
    stride, padding, output_padding, dilation = map(_pair, (stride, padding, output_padding, dilation))
    cin, cout_g, kh, kw = weight.shape
    g = int(groups)
    # weights (Cin, Cout/g, kh, kw) -> (Cout, Cin/g, kh, kw), taps reversed
    w = cv.reshape(weight, (g, cin // g, cout_g, kh, kw))
    w = cv.reshape(cv.permute(w, (0, 2, 1, 3, 4)), (g * cout_g, cin // g, kh, kw))
    for axis, k in ((2, kh), (3, kw)):
        if k > 1:
            w = cv.op(OpKind.SLICE, [w], SliceAttrs(axis, k - 1, -1, k))
    y = x
    for axis, s, p, op_, d, k in ((2, stride[0], padding[0], output_padding[0], dilation[0], kh),
                                  (3, stride[1], padding[1], output_padding[1], dilation[1], kw)):
        y = _insert_zeros(cv, y, axis, s)
        edge = d * (k - 1) - p
        y = _edges(cv, y, axis, edge, edge + op_)
    ins = [y, w] + ([bias] if bias is not None else [])
    return cv.op(OpKind.CONV2D, ins, Conv2dAttrs((1, 1), (0, 0), dilation, g))


__all__: list[str] = []
