"""Registry: layers and anchors — linear, matmul / bmm / addmm / baddbmm, conv2d (groups,
dilation, stride, padding), batch_norm (inference), layer_norm, embedding, pooling and adaptive
pooling, scaled_dot_product_attention, reductions, argmax / argmin, the scans (cumsum / cumprod /
logcumsumexp / cummax / cummin), topk / sort."""
from __future__ import annotations

import operator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import (AdaptivePoolAttrs, AttentionAttrs, AxisAttrs, BinaryFn, Conv2dAttrs, NormAttrs, OpKind, PadAttrs,
                      Pool2dAttrs, ReduceAttrs, ReduceFn, Tensor, TopkAttrs, WhereAttrs)
from ...ops.scan import MAX_SORT
from .ops_tensor import pad
from .registry import Converter, NotConvertible, from_torch_dtype, norm_axis, register

nn = torch.nn


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (tuple, list)):
        return (int(v[0]), int(v[-1])) if len(v) in (1, 2) else _fail(f"expected 1 or 2 values, got {v}")
    return int(v), int(v)


def _fail(msg: str) -> Any:
    raise NotConvertible(msg)


# ----------------------------------------------------------------------------- linear algebra


@register(F.linear, torch._C._nn.linear, nn.Linear)
def linear(cv: Converter, x: Any, weight: Any = None, bias: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, weight
        weight, bias = cv.param(m.weight, "weight"), cv.param(m.bias, "bias")
    ins = [x, weight] + ([bias] if bias is not None else [])
    return cv.op(OpKind.LINEAR, ins)


@register(torch.matmul, operator.matmul, operator.imatmul, "matmul", "__matmul__", torch.bmm, "bmm", torch.mm, "mm")
def matmul(cv: Converter, a: Tensor, b: Tensor) -> Tensor:
    return cv.op(OpKind.MATMUL, [a, b])


def _scaled_sum(cv: Converter, base: Tensor, prod: Tensor, beta: Any, alpha: Any) -> Tensor:
    if alpha != 1:
        prod = cv.binary(BinaryFn.MUL, prod, alpha)
    if beta == 0:
        return prod
    if beta != 1:
        base = cv.binary(BinaryFn.MUL, base, beta)
    return cv.binary(BinaryFn.ADD, prod, base)


@register(torch.addmm, "addmm")
def addmm(cv: Converter, input: Tensor, mat1: Tensor, mat2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_sum(cv, input, cv.op(OpKind.MATMUL, [mat1, mat2]), beta, alpha)   # torch's argument names


@register(torch.baddbmm, "baddbmm")
def baddbmm(cv: Converter, input: Tensor, batch1: Tensor, batch2: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    return _scaled_sum(cv, input, cv.op(OpKind.MATMUL, [batch1, batch2]), beta, alpha)


# ----------------------------------------------------------------------------- convolution


def conv_module(cv: Converter, m: nn.Module, x: Tensor) -> tuple[Any, ...]:
    """A convolution module's input, weight, bias, stride, padding, dilation and groups: with a
    padding mode other than zeros the input comes padded (reflect, replicate, circular) and the
    padding is 0, as PyTorch's ``_conv_forward`` does."""
    padding = m.padding
    if m.padding_mode != "zeros":
        x = pad(cv, x, m._reversed_padding_repeated_twice, m.padding_mode)
        padding = 0
    return x, cv.param(m.weight, "weight"), cv.param(m.bias, "bias"), m.stride, padding, m.dilation, m.groups


@register(F.conv2d, torch.conv2d, nn.Conv2d)
def conv2d(cv: Converter, x: Any, weight: Any = None, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    if isinstance(x, nn.Module):
        x, weight, bias, stride, padding, dilation, groups = conv_module(cv, x, weight)
    if x.ndim != 4:
        raise NotConvertible(f"conv2d of a {x.ndim}-d input (NCHW expected)")
    stride, dilation = _pair(stride), _pair(dilation)
    kh, kw = weight.shape[2:]
    if isinstance(padding, str):
        if padding == "valid":
            padding = (0, 0)
        else:  # same: total padding d*(k-1), the extra on the right/bottom as torch does
            tot = (dilation[0] * (kh - 1), dilation[1] * (kw - 1))
            lo = (tot[0] // 2, tot[1] // 2)
            if tot[0] % 2 or tot[1] % 2:
                x = cv.op(OpKind.PAD, [x], PadAttrs(((0, 0), (0, 0), (lo[0], tot[0] - lo[0]), (lo[1], tot[1] - lo[1]))))
                lo = (0, 0)
            padding = lo
    padding = _pair(padding)
    ins = [x, weight] + ([bias] if bias is not None else [])
    return cv.op(OpKind.CONV2D, ins, Conv2dAttrs(stride, padding, dilation, int(groups)))


# ----------------------------------------------------------------------------- normalisation


@register(F.batch_norm, nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
def batch_norm(cv: Converter, x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
               bias: Any = None, training: bool = False, momentum: Any = 0.1, eps: float = 1e-5,
               *rest: Any) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, running_mean
        if m.training or m.running_mean is None:
            raise NotConvertible("batch_norm in training mode (call model.eval())")
        running_mean, running_var = cv.param(m.running_mean, "running_mean"), cv.param(m.running_var, "running_var")
        weight, bias, eps = cv.param(m.weight, "weight"), cv.param(m.bias, "bias"), m.eps
    elif training or running_mean is None:
        raise NotConvertible("batch_norm in training mode (call model.eval())")
    ins = [x, running_mean, running_var] + [p for p in (weight, bias) if p is not None]
    return cv.op(OpKind.BATCH_NORM, ins, NormAttrs(float(eps), (), weight is not None, bias is not None))


@register(torch.batch_norm)
def batch_norm_aten(cv: Converter, x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any,
                    training: bool, momentum: Any, eps: float, cudnn_enabled: bool = True) -> Tensor:
    """``torch.batch_norm`` (ATen's order: weight and bias before the statistics)."""
    return batch_norm(cv, x, running_mean, running_var, weight, bias, training, momentum, eps)


@register(F.layer_norm, torch.layer_norm, nn.LayerNorm)
def layer_norm(cv: Converter, x: Any, normalized_shape: Any = None, weight: Any = None, bias: Any = None,
               eps: float = 1e-5, *rest: Any) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, normalized_shape
        normalized_shape, eps = m.normalized_shape, m.eps
        weight, bias = cv.param(m.weight, "weight"), cv.param(m.bias, "bias")
    ns = (int(normalized_shape),) if isinstance(normalized_shape, int) else tuple(int(s) for s in normalized_shape)
    ins = [x] + [p for p in (weight, bias) if p is not None]
    return cv.op(OpKind.LAYER_NORM, ins, NormAttrs(float(eps), ns, weight is not None, bias is not None))


@register(F.embedding, nn.Embedding)
def embedding(cv: Converter, idx: Any, weight: Any = None, padding_idx: Any = None, max_norm: Any = None,
              *rest: Any, **kwargs: Any) -> Tensor:
    if isinstance(idx, nn.Module):
        m, idx = idx, weight
        weight, max_norm = cv.param(m.weight, "weight"), m.max_norm
    if max_norm is not None:
        raise NotConvertible("embedding with max_norm")
    if idx.ndim == 0:
        raise NotConvertible("embedding of a 0-d index")
    return cv.op(OpKind.EMBEDDING, [weight, idx])


@register(torch.embedding)
def embedding_aten(cv: Converter, weight: Any, idx: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
                   sparse: bool = False) -> Tensor:
    """``torch.embedding`` (ATen's order: the table first; the rest only changes gradients)."""
    return embedding(cv, idx, weight)


# ----------------------------------------------------------------------------- pooling


def max_pool_module(m: nn.Module) -> tuple[Any, ...]:
    """A max-pooling module's kernel size, stride, padding, dilation, ceil_mode and return_indices."""
    return m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices


def _pool_attrs(kernel: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: bool, count_include_pad: bool = True,
                divisor_override: Any = None) -> Pool2dAttrs:
    k = _pair(kernel)
    s = _pair(stride) if stride not in (None, [], ()) else k
    return Pool2dAttrs(k, s, _pair(padding), _pair(dilation), bool(ceil_mode), bool(count_include_pad),
                       divisor_override)


@register(F.max_pool2d, torch.max_pool2d, nn.MaxPool2d, F.max_pool2d_with_indices)
def max_pool2d(cv: Converter, x: Any, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        x, (kernel_size, stride, padding, dilation, ceil_mode, return_indices) = kernel_size, max_pool_module(x)
    if return_indices:
        raise NotConvertible("max_pool2d(return_indices=True)")
    return cv.op(OpKind.MAX_POOL2D, [x], _pool_attrs(kernel_size, stride, padding, dilation, ceil_mode))


@register(F.avg_pool2d, torch._C._nn.avg_pool2d, nn.AvgPool2d)
def avg_pool2d(cv: Converter, x: Any, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True, divisor_override: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, kernel_size
        kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override = (
            m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad, m.divisor_override)
    return cv.op(OpKind.AVG_POOL2D, [x], _pool_attrs(kernel_size, stride, padding, 1, ceil_mode, count_include_pad,
                                                     divisor_override))


def _adaptive(kind: OpKind, *targets: Any) -> Any:
    @register(*targets)
    def handler(cv: Converter, x: Any, output_size: Any = None, return_indices: bool = False) -> Tensor:
        if isinstance(x, nn.Module):
            m, x = x, output_size
            output_size = m.output_size
            return_indices = getattr(m, "return_indices", False)
        if return_indices:
            raise NotConvertible("adaptive_max_pool2d(return_indices=True)")
        size = output_size if isinstance(output_size, (tuple, list)) else (output_size, output_size)
        size = tuple(int(s) if s is not None else x.shape[-2 + k] for k, s in enumerate(size))
        return cv.op(kind, [x], AdaptivePoolAttrs(size))
    return handler


adaptive_avg_pool2d = _adaptive(OpKind.ADAPTIVE_AVG_POOL2D, F.adaptive_avg_pool2d,
                                torch._C._nn.adaptive_avg_pool2d, nn.AdaptiveAvgPool2d)
adaptive_max_pool2d = _adaptive(OpKind.ADAPTIVE_MAX_POOL2D, F.adaptive_max_pool2d, nn.AdaptiveMaxPool2d)


# ----------------------------------------------------------------------------- attention


def _repeat_each(cv: Converter, x: Tensor, axis: int, times: int) -> Tensor:
    """Every element of ``axis`` repeated ``times`` times in place (a broadcast, then a reshape)."""
    shape = x.shape
    y = cv.reshape(x, (*shape[:axis + 1], 1, *shape[axis + 1:]))
    y = cv.expand(y, (*shape[:axis + 1], times, *shape[axis + 1:]))
    return cv.reshape(y, (*shape[:axis], shape[axis] * times, *shape[axis + 1:]))


def _repeat_heads(cv: Converter, t: Tensor, heads: int) -> Tensor:
    """Grouped-query attention's keys / values ``(..., H_kv, L, D)`` repeated to ``heads`` heads
    (each one ``heads / H_kv`` times in a row, as ``repeat_interleave``)."""
    hkv = t.shape[-3]
    if heads % hkv:
        raise NotConvertible(f"scaled_dot_product_attention(enable_gqa=True): {heads} query heads are not a "
                             f"multiple of {hkv} key / value heads")
    return _repeat_each(cv, t, t.ndim - 3, heads // hkv)


@register(F.scaled_dot_product_attention)
def sdpa(cv: Converter, q: Tensor, k: Tensor, v: Tensor, attn_mask: Any = None, dropout_p: float = 0.0,
         is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Tensor:
    if dropout_p:
        raise NotConvertible("scaled_dot_product_attention with dropout")
    if enable_gqa and k.ndim >= 3 and q.ndim == k.ndim and k.shape[-3] != q.shape[-3]:
        k, v = (_repeat_heads(cv, t, q.shape[-3]) for t in (k, v))
    ins = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    return cv.op(OpKind.ATTENTION, ins, AttentionAttrs(bool(is_causal), None if scale is None else float(scale),
                                                       attn_mask is not None))


# ----------------------------------------------------------------------------- reductions


def _axes(x: Tensor, dim: Any) -> tuple[int, ...]:
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted({norm_axis(d, x.ndim) for d in dims}))


def _reduction(fn: ReduceFn, *targets: Any) -> None:
    @register(*targets)
    def handler(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False, *, dtype: Any = None,
                axis: Any = None) -> Any:
        if isinstance(dim, bool):
            raise NotConvertible("positional keepdim")
        if isinstance(dim, Tensor) and fn in (ReduceFn.MAX, ReduceFn.MIN):  # torch.max(a, b): element-wise
            return cv.binary(BinaryFn.MAXIMUM if fn is ReduceFn.MAX else BinaryFn.MINIMUM, x, dim)
        if dtype is not None:
            x = cv.cast(x, from_torch_dtype(dtype))
        if fn in (ReduceFn.MAX, ReduceFn.MIN) and dim is not None and isinstance(dim, int) and \
                targets[0] in (torch.max, torch.min):          # (values, indices)
            return (_reduce(cv, fn, x, (norm_axis(dim, x.ndim),), bool(keepdim)),
                    _arg_extreme(cv, x, dim, bool(keepdim), fn is ReduceFn.MAX))
        return cv.op(OpKind.REDUCE, [x], ReduceAttrs(fn, _axes(x, axis if axis is not None else dim), bool(keepdim)))


def _reduce(cv: Converter, fn: ReduceFn, x: Tensor, axes: tuple[int, ...], keepdim: bool, corr: int = 0) -> Tensor:
    return cv.op(OpKind.REDUCE, [x], ReduceAttrs(fn, axes, keepdim, corr))


def _arg_extreme(cv: Converter, x: Tensor, dim: Any, keepdim: bool, largest: bool) -> Tensor:
    """The index of the first maximum (minimum) along ``dim`` — of the first NaN where there is
    one, as torch — as the least position where ``x`` equals the row's extreme (the extreme of
    a row with a NaN is NaN): two reductions around injective ops."""
    if dim is None:
        x, axis, keepdim = cv.reshape(x, (x.numel,)), 0, False
    else:
        axis = norm_axis(dim, x.ndim)
    n = x.shape[axis]
    m = _reduce(cv, ReduceFn.MAX if largest else ReduceFn.MIN, x, (axis,), True)
    hit = cv.binary(BinaryFn.EQ, x, m)
    if x.dtype.is_float:
        hit = cv.where_scalar(cv.binary(BinaryFn.NE, x, x), True, hit)
    shape = [1] * x.ndim
    shape[axis] = n
    pos = cv.const(np.arange(n, dtype=np.int64).reshape(shape))
    return _reduce(cv, ReduceFn.MIN, cv.op(OpKind.WHERE, [hit, pos], WhereAttrs(b_scalar=n)), (axis,), keepdim)


def _scan(kind: OpKind, *targets: Any) -> None:
    """A scan along ``dim``: one result, or for the running extrema (cummax / cummin) the values
    and their indices."""
    extrema = kind in (OpKind.CUMMAX, OpKind.CUMMIN)

    @register(*targets)
    def handler(cv: Converter, x: Tensor, dim: int, *, dtype: Any = None) -> Any:
        name = kind.name.lower()
        if not str(x.device).startswith("cpu"):
            raise NotConvertible(f"{name} on {x.device} (taskmap's scan runs on the CPU only)")
        if dtype is not None:
            x = cv.cast(x, from_torch_dtype(dtype))
        if kind is OpKind.LOGCUMSUMEXP and not x.dtype.is_float:
            raise NotConvertible(f"logcumsumexp of a {x.dtype.name} tensor (floats only, as torch)")
        if extrema and x.dtype.is_bool:
            raise NotConvertible(f"{name} of a bool tensor")
        attrs = AxisAttrs(norm_axis(dim, max(x.ndim, 1)))
        return cv.builder.op_multi(kind, [x], attrs, source=cv.source) if extrema else cv.op(kind, [x], attrs)


_scan(OpKind.CUMSUM, torch.cumsum, "cumsum", "cumsum_")
_scan(OpKind.CUMPROD, torch.cumprod, "cumprod", "cumprod_")
_scan(OpKind.LOGCUMSUMEXP, torch.logcumsumexp, "logcumsumexp")
_scan(OpKind.CUMMAX, torch.cummax, "cummax")
_scan(OpKind.CUMMIN, torch.cummin, "cummin")


def _topk_op(cv: Converter, x: Tensor, k: int, dim: int, largest: bool) -> tuple[Tensor, Tensor]:
    if not str(x.device).startswith("cpu"):
        raise NotConvertible(f"topk / sort on {x.device} (taskmap's runs on the CPU only)")
    if x.dtype.is_bool:
        raise NotConvertible("topk / sort of a bool tensor")
    return cv.builder.op_multi(OpKind.TOPK, [x], TopkAttrs(int(k), norm_axis(dim, max(x.ndim, 1)), bool(largest)),
                               source=cv.source)


@register(torch.topk, "topk")
def topk(cv: Converter, x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    return _topk_op(cv, x, k, dim, largest)


@register(torch.sort, "sort")
def sort(cv: Converter, x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Any:
    n = x.shape[norm_axis(dim, max(x.ndim, 1))] if x.ndim else 1
    if n > MAX_SORT:
        raise NotConvertible(f"sort of rows of {n} elements (taskmap's insertion sort takes at most {MAX_SORT})")
    return _topk_op(cv, x, n, dim, descending)


@register(torch.argsort, "argsort")
def argsort(cv: Converter, x: Tensor, dim: int = -1, descending: bool = False, stable: bool = False) -> Tensor:
    return sort(cv, x, dim, descending)[1]


@register(torch.argmax, "argmax")
def argmax(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _arg_extreme(cv, x, dim, bool(keepdim), True)


@register(torch.argmin, "argmin")
def argmin(cv: Converter, x: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _arg_extreme(cv, x, dim, bool(keepdim), False)


_reduction(ReduceFn.SUM, torch.sum, "sum")
_reduction(ReduceFn.MEAN, torch.mean, "mean")
_reduction(ReduceFn.MAX, torch.amax, "amax")
_reduction(ReduceFn.MIN, torch.amin, "amin")
_reduction(ReduceFn.PROD, torch.prod, "prod")
_reduction(ReduceFn.MAX, torch.max, "max")
_reduction(ReduceFn.MIN, torch.min, "min")


@register(torch.var, "var")
def var(cv: Converter, x: Tensor, dim: Any = None, unbiased: Any = True, keepdim: bool = False, *,
        correction: Any = None) -> Tensor:
    corr = int(correction) if correction is not None else (1 if unbiased else 0)
    return cv.op(OpKind.REDUCE, [x], ReduceAttrs(ReduceFn.VAR, _axes(x, dim), bool(keepdim), corr))


__all__: list[str] = []
