"""Registry: upsampling — ``interpolate`` / ``nn.Upsample`` (nearest, nearest-exact, area, and
linear / bilinear / trilinear / bicubic with or without ``align_corners``) and ``conv_transpose2d``
(``conv_transpose1d`` is one of these: :mod:`.ops_layers`) — composed from taskmap ops.

Interpolation is separable: along each spatial axis a gather at constant source indices (two
for the linear modes, four for bicubic, blended by constant weights; nearest upsampling by an
integer factor is a broadcast instead), all injective, so it fuses into the kernel that consumes
it.  ``area`` is adaptive average pooling.  A transposed convolution is a convolution of stride 1
over the input with ``stride - 1`` zeros inserted between its elements (a reshape, a pad and a
reshape), padded by ``dilation * (k - 1) - padding``, with the weights' in / out channels swapped
and their taps reversed."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, Conv2dAttrs, OpKind, PadAttrs, SliceAttrs, Tensor
from .ops_nn import _pair, _repeat_each, adaptive_avg_pool2d, conv_module
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


def _nearest(cv: Converter, x: Tensor, outs: list[int], scales: list[float], exact: bool = False) -> Tensor:
    """``nearest`` picks source ``floor(dst * scale)``, ``nearest-exact`` ``floor((dst + 0.5) * scale)``."""
    for k, (o, s) in enumerate(zip(outs, scales)):
        axis, n = 2 + k, x.shape[2 + k]
        if o == n:
            continue
        if o % n == 0 and np.isclose(s * (o // n), 1.0):       # an integer factor: a broadcast
            x = _repeat_each(cv, x, axis, o // n)
            continue
        dst = np.arange(o, dtype=np.float32) + np.float32(0.5 if exact else 0.0)
        src = np.minimum(np.floor(dst * np.float32(s)), n - 1)
        x = _gather_axis(cv, x, axis, src)
    return x


def _source(dst: np.ndarray, n: int, o: int, s: float, align_corners: bool, cubic: bool) -> np.ndarray:
    """torch's source coordinate of each output position (``area_pixel_compute_source_index``, in
    f32): ``dst * (n - 1) / (o - 1)`` with ``align_corners``, else ``s * (dst + 0.5) - 0.5``,
    clamped at 0 for the linear modes (not for the cubic one)."""
    if align_corners:
        return dst * np.float32((n - 1) / (o - 1) if o > 1 else 0.0)
    src = np.float32(s) * (dst + np.float32(0.5)) - np.float32(0.5)
    return src if cubic else np.maximum(src, np.float32(0.0))


#: The cubic convolution kernel's ``A`` (Keys' kernel as PyTorch and OpenCV use it).
CUBIC_A = -0.75


def _cubic_weights(t: np.ndarray) -> list[np.ndarray]:
    """Weights of the taps ``i - 1 .. i + 2`` at fraction ``t`` (torch's
    ``get_cubic_upsample_coefficients``, in f32)."""
    a = np.float32(CUBIC_A)

    def near(x: np.ndarray) -> np.ndarray:        # |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x: np.ndarray) -> np.ndarray:         # 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a
    one = np.float32(1.0)
    return [far(t + one), near(t), near(one - t), far(one - t + one)]


def _separable(cv: Converter, x: Tensor, outs: list[int], scales: list[float], align_corners: bool,
               cubic: bool) -> Tensor:
    """Separable linear or cubic interpolation, one spatial axis at a time: per output position a
    weighted sum of 2 (linear) or 4 (cubic) source positions, clamped to the edges (torch's
    source indices and weights)."""
    for k, (o, s) in enumerate(zip(outs, scales)):
        axis, n = 2 + k, x.shape[2 + k]
        src = _source(np.arange(o, dtype=np.float32), n, o, s, align_corners, cubic)
        i0 = np.floor(src)
        t = (src - i0).astype(np.float32)
        i0 = i0.astype(np.int64)
        if cubic:
            taps = [(np.clip(i0 + d, 0, n - 1), w) for d, w in zip((-1, 0, 1, 2), _cubic_weights(t))]
        else:
            i0 = np.minimum(i0, n - 1)
            taps = [(i0, np.float32(1.0) - t), (np.minimum(i0 + 1, n - 1), t)]
        shape = [1] * x.ndim
        shape[axis] = o
        terms = [cv.binary(BinaryFn.MUL, _gather_axis(cv, x, axis, i), cv.const(w.astype(np.float32).reshape(shape)))
                 for i, w in taps]
        x = terms[0]
        for term in terms[1:]:
            x = cv.binary(BinaryFn.ADD, x, term)
    return x


def _interpolate(cv: Converter, x: Tensor, size: Any, scale_factor: Any, mode: str, align_corners: Any,
                 recompute: Any) -> Tensor:
    spatial = {"linear": 1, "bilinear": 2, "trilinear": 3, "bicubic": 2}
    if mode in ("nearest", "nearest-exact"):
        outs, scales = _out_sizes(x, size, scale_factor, recompute)
        return _nearest(cv, x, outs, scales, mode == "nearest-exact")
    if mode == "area":             # torch: adaptive average pooling to the output size
        outs, _ = _out_sizes(x, size, scale_factor, recompute)
        if x.ndim == 3:            # (N, C, L) as (N, C, 1, L)
            y = adaptive_avg_pool2d(cv, cv.reshape(x, (*x.shape[:2], 1, x.shape[2])), (1, outs[0]))
            return cv.reshape(y, (*x.shape[:2], outs[0]))
        if x.ndim != 4:
            raise NotConvertible(f"interpolate(mode='area') of a {x.ndim}-d tensor (3-d and 4-d are supported)")
        return adaptive_avg_pool2d(cv, x, tuple(outs))
    if spatial.get(mode) == x.ndim - 2:
        outs, scales = _out_sizes(x, size, scale_factor, recompute)
        if not x.dtype.is_float:
            raise NotConvertible(f"{mode} interpolation of a {x.dtype.name} tensor")
        return _separable(cv, x, outs, scales, bool(align_corners), mode == "bicubic")
    raise NotConvertible(f"interpolate(mode={mode!r}) of a {x.ndim}-d tensor (nearest / nearest-exact, area on 3/4-d, "
                         "(bi/tri)linear on 3/4/5-d and bicubic on 4-d tensors are supported)")


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


def _unpooling_conv(cv: Converter, x: Tensor, weight: Tensor, bias: Any) -> Tensor:
    """A transposed convolution whose stride is its kernel (U-Net's 2x2 / stride-2 upsampling:
    the windows do not overlap): each input pixel times the weights gives a ``kh x kw`` block of
    the output — a 1x1 convolution to ``C_out * kh * kw`` channels, its result moved into place by
    a reshape / permute (the convolution's epilogue), without the zeros the general form
    inserts (three quarters of its multiplications at stride 2)."""
    n, cin, h, w = x.shape
    _, cout, kh, kw = weight.shape
    wp = cv.reshape(cv.permute(weight, (1, 2, 3, 0)), (cout * kh * kw, cin, 1, 1))
    z = cv.reshape(cv.op(OpKind.CONV2D, [x, wp], Conv2dAttrs()), (n, cout, kh, kw, h, w))
    y = cv.reshape(cv.permute(z, (0, 1, 4, 2, 5, 3)), (n, cout, h * kh, w * kw))
    return y if bias is None else cv.binary(BinaryFn.ADD, y, cv.reshape(bias, (1, cout, 1, 1)))


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
    if g == 1 and stride == (kh, kw) and padding == output_padding == (0, 0) and dilation == (1, 1):
        return _unpooling_conv(cv, x, weight, bias)
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
