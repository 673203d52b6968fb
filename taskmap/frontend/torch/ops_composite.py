"""Registry: PyTorch operators that taskmap composes from its own ops — statistics (std,
logsumexp, vector norms, normalize, cosine similarity, any / all), group / instance / RMS / local
response norm, prelu and index transforms (flip, roll, tril / triu, diagonal, pixel (un)shuffle,
channel shuffle, repeat_interleave,
tile, movedim, unflatten, tensor_split, one_hot, unfold / fold).  (Element-wise compositions:
:mod:`.ops_math`; upsampling: :mod:`.ops_upsample`.)

Every composition is injective ops around at most the reductions it needs, so the fusion pass
folds it into as few kernels as the hand-written op would take (``flip`` is a slice of step -1,
``pixel_shuffle`` a reshape / permute)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, NormAttrs, OpKind, PadAttrs, ReduceFn, SliceAttrs, Tensor, \
    UnaryFn, WhereAttrs
from ...ir.dtypes import bool_, i32
from .ops_nn import _axes, _pair, _reduce, _repeat_each
from .ops_tensor import repeat
from .registry import Converter, NotConvertible, from_torch_dtype, norm_axis, register

nn = torch.nn


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
    m = cv.where_scalar(cv.binary(BinaryFn.EQ, cv.unary(UnaryFn.ABS, m), math.inf), 0.0, m)
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
    """The ``ord``-norm over ``dim`` (torch's vector norms, any order): 2, 1 and inf directly; 0
    counts the nonzeros; -inf is the least magnitude; others ``sum(|x|^ord)^(1/ord)``."""
    axes = _axes(x, dim)
    if ord in (2, 2.0, "fro"):
        return cv.unary(UnaryFn.SQRT, _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.SQUARE, x), axes, keepdim))
    if ord in (1, 1.0):
        return _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.ABS, x), axes, keepdim)
    if ord in (math.inf, "inf"):
        return _reduce(cv, ReduceFn.MAX, cv.unary(UnaryFn.ABS, x), axes, keepdim)
    if ord in (-math.inf, "-inf"):
        return _reduce(cv, ReduceFn.MIN, cv.unary(UnaryFn.ABS, x), axes, keepdim)
    if ord == 0:
        return _reduce(cv, ReduceFn.SUM, cv.cast(cv.binary(BinaryFn.NE, x, 0.0), x.dtype), axes, keepdim)
    if isinstance(ord, bool) or not isinstance(ord, (int, float)):
        raise NotConvertible(f"vector norm of order {ord!r} (a number, 'fro' or inf)")
    powers = cv.binary(BinaryFn.POW, cv.unary(UnaryFn.ABS, x), float(ord))
    return cv.binary(BinaryFn.POW, _reduce(cv, ReduceFn.SUM, powers, axes, keepdim), 1.0 / float(ord))


@register(torch.linalg.vector_norm)
def vector_norm(cv: Converter, x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None) -> Tensor:
    if dtype is not None:
        raise NotConvertible("vector_norm(dtype=...)")
    return _vector_norm(cv, x, ord, dim, bool(keepdim))


@register(torch.norm, "norm")
def norm(cv: Converter, x: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False, out: Any = None,
         dtype: Any = None) -> Tensor:
    if out is not None:
        raise NotConvertible("norm(out=...)")
    if dtype is not None or (p == "fro" and isinstance(dim, (tuple, list)) and len(dim) > 2):
        raise NotConvertible("norm with dtype or a Frobenius norm over more than two dims")
    return _vector_norm(cv, x, p, dim, bool(keepdim))


@register(F.normalize)
def normalize(cv: Converter, x: Tensor, p: Any = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Tensor:
    n = _vector_norm(cv, x, p, dim, True)
    return cv.binary(BinaryFn.DIV, x, cv.binary(BinaryFn.MAXIMUM, n, float(eps)))


def _stat_mean(var: bool) -> Any:
    def handler(cv: Converter, x: Tensor, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *,
                correction: Any = None) -> tuple[Tensor, Tensor]:
        if isinstance(dim, bool):
            dim, unbiased = None, dim
        corr = int(correction) if correction is not None else (1 if unbiased else 0)
        v = _reduce(cv, ReduceFn.VAR, x, _axes(x, dim), bool(keepdim), corr)
        return (v if var else cv.unary(UnaryFn.SQRT, v)), _reduce(cv, ReduceFn.MEAN, x, _axes(x, dim), bool(keepdim))
    return handler


register(torch.var_mean)(_stat_mean(True))
register(torch.std_mean)(_stat_mean(False))


@register(F.cosine_similarity, torch.cosine_similarity)
def cosine_similarity(cv: Converter, a: Tensor, b: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """``sum(a b) / sqrt(max(|a|^2 |b|^2, eps^2))`` (PyTorch's form)."""
    axes = (norm_axis(dim, max(a.ndim, b.ndim)),)
    dot = _reduce(cv, ReduceFn.SUM, cv.binary(BinaryFn.MUL, a, b), axes, False)
    na = _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.SQUARE, a), (norm_axis(dim, a.ndim),), False)
    nb = _reduce(cv, ReduceFn.SUM, cv.unary(UnaryFn.SQUARE, b), (norm_axis(dim, b.ndim),), False)
    den = cv.unary(UnaryFn.SQRT, cv.binary(BinaryFn.MAXIMUM, cv.binary(BinaryFn.MUL, na, nb), float(eps) ** 2))
    return cv.binary(BinaryFn.DIV, dot, den)


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


@register(F.rms_norm, torch.rms_norm)
def rms_norm(cv: Converter, x: Tensor, normalized_shape: Any, weight: Any = None, eps: Any = None) -> Tensor:
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing ``normalized_shape`` (``eps``
    None: the dtype's machine epsilon, as torch)."""
    ns = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
    if tuple(x.shape[x.ndim - len(ns):]) != ns:
        raise NotConvertible(f"rms_norm over {ns} of a tensor of shape {tuple(x.shape)}")
    if eps is None:
        eps = float(torch.finfo(torch.float32 if x.dtype.name == "float32" else torch.float16).eps) \
            if x.dtype.name in ("float32", "float16") else float(torch.finfo(torch.float32).eps)
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    ms = _reduce(cv, ReduceFn.MEAN, cv.unary(UnaryFn.SQUARE, x), axes, True)
    y = cv.binary(BinaryFn.MUL, x, cv.unary(UnaryFn.RSQRT, cv.binary(BinaryFn.ADD, ms, float(eps))))
    return y if weight is None else cv.binary(BinaryFn.MUL, y, weight)


@register(F.local_response_norm)
def local_response_norm(cv: Converter, x: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> Tensor:
    """``x / (k + alpha * mean(x^2 over a window of size channels))^beta``, the window zero-padded
    (``size // 2`` channels before, ``(size - 1) // 2`` after): a sum of shifted slices."""
    if x.ndim < 3:
        raise NotConvertible("local_response_norm of a tensor with fewer than 3 dims")
    c = x.shape[1]
    widths = [(0, 0)] * x.ndim
    widths[1] = (size // 2, (size - 1) // 2)
    sq = cv.op(OpKind.PAD, [cv.unary(UnaryFn.SQUARE, x)], PadAttrs(tuple(widths)))
    total = cv.slice(sq, 1, 0, c)
    for j in range(1, int(size)):
        total = cv.binary(BinaryFn.ADD, total, cv.slice(sq, 1, j, j + c))
    scale = cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, total, float(alpha) / int(size)), float(k))
    return cv.binary(BinaryFn.DIV, x, cv.binary(BinaryFn.POW, scale, float(beta)))


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
        return cv.where_scalar(cv.const(drop), zero, x)


_triangle(True, torch.tril, "tril")
_triangle(False, torch.triu, "triu")


@register(torch.diagonal, "diagonal")
def diagonal_(cv: Converter, x: Tensor, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
    """The two dims moved last and flattened: the diagonal is a slice of step ``m + 1``."""
    d1, d2 = norm_axis(dim1, x.ndim), norm_axis(dim2, x.ndim)
    if d1 == d2:
        raise NotConvertible("diagonal of a dimension with itself")
    rest = [d for d in range(x.ndim) if d not in (d1, d2)]
    y = cv.permute(x, (*rest, d1, d2))
    n, m = x.shape[d1], x.shape[d2]
    length = max(0, min(n, m - offset) if offset >= 0 else min(n + offset, m))
    lead = tuple(x.shape[d] for d in rest)
    if length == 0:
        raise NotConvertible("an empty diagonal")
    flat = cv.reshape(y, (*lead, n * m))
    start = offset if offset >= 0 else -offset * m
    return cv.op(OpKind.SLICE, [flat], SliceAttrs(len(lead), start, m + 1, length))


@register(torch.diag, "diag")
def diag(cv: Converter, x: Tensor, diagonal: int = 0) -> Tensor:
    """A 2-d tensor's diagonal, or the square matrix with a 1-d tensor on its ``diagonal``-th one
    (the vector, padded to the matrix's size, broadcast along rows or columns, kept on the
    diagonal)."""
    if x.ndim == 2:
        return diagonal_(cv, x, diagonal, 0, 1)
    if x.ndim != 1:
        raise NotConvertible(f"diag of a {x.ndim}-d tensor")
    k = abs(diagonal)
    n = x.shape[0] + k
    padded = cv.op(OpKind.PAD, [x], PadAttrs(((0, k),))) if k else x
    src = cv.reshape(padded, (n, 1) if diagonal >= 0 else (1, n))
    zero = 0.0 if x.dtype.is_float else False if x.dtype is bool_ else 0
    return cv.where_scalar(cv.const(~np.eye(n, k=diagonal, dtype=bool)), zero, cv.expand(src, (n, n)))


@register(torch.movedim, torch.moveaxis, "movedim", "moveaxis")
def movedim(cv: Converter, x: Tensor, source: Any, destination: Any) -> Tensor:
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    src, dst = [norm_axis(d, x.ndim) for d in src], [norm_axis(d, x.ndim) for d in dst]
    rest = iter(d for d in range(x.ndim) if d not in src)
    order = [src[dst.index(k)] if k in dst else next(rest) for k in range(x.ndim)]
    return cv.permute(x, order)


@register("unflatten", torch.unflatten)
def unflatten(cv: Converter, x: Tensor, dim: int, sizes: Any) -> Tensor:
    d = norm_axis(dim, x.ndim)
    sizes = [int(v) for v in sizes]
    if -1 in sizes:
        known = int(np.prod([v for v in sizes if v != -1]))
        sizes[sizes.index(-1)] = x.shape[d] // known
    return cv.reshape(x, (*x.shape[:d], *sizes, *x.shape[d + 1:]))


@register(torch.tensor_split, "tensor_split")
def tensor_split(cv: Converter, x: Tensor, indices_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    d = norm_axis(dim, x.ndim)
    n = x.shape[d]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        bounds = [i * (n // k) + min(i, n % k) for i in range(k + 1)]
    else:
        bounds = [0, *[int(i) for i in indices_or_sections], n]
    bounds = [min(max(b + n if b < 0 else b, 0), n) for b in bounds]
    return tuple(cv.slice(x, d, lo, max(lo, hi)) for lo, hi in zip(bounds, bounds[1:]))


@register(torch.tile, "tile")
def tile(cv: Converter, x: Tensor, *dims: Any) -> Tensor:
    """``x.repeat`` with the repeats padded with ones on the left to ``x``'s rank."""
    reps = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)
    return repeat(cv, x, *([1] * (x.ndim - len(reps)) + reps))


@register(F.one_hot)
def one_hot(cv: Converter, x: Tensor, num_classes: int = -1) -> Tensor:
    if num_classes < 0:
        raise NotConvertible("one_hot without num_classes (the count depends on the data)")
    classes = cv.const(np.arange(num_classes, dtype=np.int64))
    hit = cv.binary(BinaryFn.EQ, cv.reshape(x, (*x.shape, 1)), classes)
    return cv.cast(hit, from_torch_dtype(torch.int64))


@register(torch.channel_shuffle, torch.native_channel_shuffle)
def channel_shuffle(cv: Converter, x: Tensor, groups: int) -> Tensor:
    """Channels ``(g, c / g)`` read as ``(c / g, g)``: a reshape and a transposition."""
    n, c, rest = x.shape[0], x.shape[1], tuple(x.shape[2:])
    g = int(groups)
    if c % g:
        raise NotConvertible(f"channel_shuffle of {c} channels in {g} groups")
    y = cv.reshape(x, (n, g, c // g, *rest))
    y = cv.permute(y, (0, 2, 1, *range(3, y.ndim)))
    return cv.reshape(y, x.shape)


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


def _blocks(size: int, k: int, s: int, p: int, d: int) -> int:
    """Window positions along one side of ``unfold`` / ``fold``: ``size`` padded by ``p`` each end."""
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


@register(F.unfold, nn.Unfold)
def unfold(cv: Converter, x: Any, kernel_size: Any = None, dilation: Any = 1, padding: Any = 0,
           stride: Any = 1) -> Tensor:
    """im2col: ``(N, C * kh * kw, L)``, one strided slice of the padded input per tap, stacked
    after the channels (torch's order: channel, then tap row, then tap column)."""
    if isinstance(x, nn.Module):
        m, x = x, kernel_size
        kernel_size, dilation, padding, stride = m.kernel_size, m.dilation, m.padding, m.stride
    if x.ndim != 4:
        raise NotConvertible(f"unfold of a {x.ndim}-d input (N, C, H, W expected)")
    (kh, kw), (dh, dw), (ph, pw), (sh, sw) = map(_pair, (kernel_size, dilation, padding, stride))
    n, c, h, w = x.shape
    oh, ow = _blocks(h, kh, sh, ph, dh), _blocks(w, kw, sw, pw, dw)
    if oh <= 0 or ow <= 0:
        raise NotConvertible(f"unfold: a {kh}x{kw} window does not fit a {h}x{w} input")
    if ph or pw:
        x = cv.op(OpKind.PAD, [x], PadAttrs(((0, 0), (0, 0), (ph, ph), (pw, pw))))
    taps = []
    for i in range(kh):
        for j in range(kw):
            rows = cv.slice(x, 2, i * dh, i * dh + sh * (oh - 1) + 1, sh)
            t = cv.slice(rows, 3, j * dw, j * dw + sw * (ow - 1) + 1, sw)
            taps.append(cv.reshape(t, (n, c, 1, oh * ow)))
    cols = taps[0] if len(taps) == 1 else cv.op(OpKind.CONCAT, taps, AxisAttrs(2))
    return cv.reshape(cols, (n, c * kh * kw, oh * ow))


@register(F.fold, nn.Fold)
def fold(cv: Converter, x: Any, output_size: Any = None, kernel_size: Any = None, dilation: Any = 1,
         padding: Any = 0, stride: Any = 1) -> Tensor:
    """col2im, the inverse placement of :func:`unfold` (overlaps summed): blocks that tile the
    output (stride = kernel, no padding or dilation: MobileViT-v2's patches) are a reshape and a
    transposition; otherwise each tap's ``(oh, ow)`` values are spread by the stride (zeros
    inserted by padding a unit axis), padded into place and summed."""
    if isinstance(x, nn.Module):
        m, x = x, output_size
        output_size, kernel_size, dilation, padding, stride = m.output_size, m.kernel_size, m.dilation, m.padding, \
            m.stride
    batched = x.ndim == 3
    if not batched:
        x = cv.reshape(x, (1, *x.shape))
    if x.ndim != 3:
        raise NotConvertible(f"fold of a {x.ndim}-d input ((N,) C * kh * kw, L expected)")
    (hh, ww), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = map(_pair, (output_size, kernel_size, dilation, padding, stride))
    n, ckk, length = x.shape
    oh, ow = _blocks(hh, kh, sh, ph, dh), _blocks(ww, kw, sw, pw, dw)
    if ckk % (kh * kw) or oh <= 0 or ow <= 0 or oh * ow != length:
        raise NotConvertible(f"fold of {ckk} x {length} blocks into {hh}x{ww} with a {kh}x{kw} kernel")
    c = ckk // (kh * kw)
    cols = cv.reshape(x, (n, c, kh, kw, oh, ow))
    if (sh, sw) == (kh, kw) and (dh, dw, ph, pw) == (1, 1, 0, 0) and (oh * kh, ow * kw) == (hh, ww):
        y = cv.reshape(cv.permute(cols, (0, 1, 4, 2, 5, 3)), (n, c, hh, ww))
    else:
        hp, wp = hh + 2 * ph, ww + 2 * pw
        y = None
        for i in range(kh):
            for j in range(kw):
                t = cv.reshape(cv.slice(cv.slice(cols, 2, i, i + 1), 3, j, j + 1), (n, c, oh, 1, ow, 1))
                t = cv.op(OpKind.PAD, [t], PadAttrs(((0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1))))
                t = cv.reshape(t, (n, c, oh * sh, ow * sw))
                t = cv.slice(cv.slice(t, 2, 0, hp - i * dh), 3, 0, wp - j * dw)
                t = cv.op(OpKind.PAD, [t], PadAttrs(((0, 0), (0, 0), (i * dh, hp - i * dh - t.shape[2]),
                                                     (j * dw, wp - j * dw - t.shape[3]))))
                y = t if y is None else cv.binary(BinaryFn.ADD, y, t)
        if ph or pw:
            y = cv.slice(cv.slice(y, 2, ph, ph + hh), 3, pw, pw + ww)
    return y if batched else cv.reshape(y, y.shape[1:])


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
