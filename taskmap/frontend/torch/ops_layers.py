"""Registry: composite ``nn`` layers that ``symbolic_trace`` keeps as leaves —
``nn.MultiheadAttention`` (and its functional form, which dynamo inlines it into) and
``nn.TransformerEncoderLayer`` — decomposed into graph ops
(linear projections, head split, ``softmax(q k^T * scale + mask) v``, head merge); the 1-d
convolutions and pools, as their 2-d forms over a ``(N, C, 1, L)`` view; 3-d convolutions as 2-d
ones per depth tap."""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, PadAttrs, ReduceAttrs, ReduceFn, Tensor, UnaryFn, WhereAttrs
from .ops_nn import (adaptive_avg_pool2d, adaptive_max_pool2d, avg_pool2d, conv2d, conv_module, layer_norm, linear,
                     max_pool2d, max_pool_module)
from .ops_upsample import conv_transpose2d
from .registry import Converter, NotConvertible, register

nn = torch.nn


# ----------------------------------------------------------------------------- 1-d layers as 2-d


def _one(v: Any) -> int:
    return int(v[0]) if isinstance(v, (tuple, list)) else int(v)


def _as_2d(cv: Converter, x: Tensor, name: str) -> tuple[Tensor, tuple[int, ...]]:
    """``(N, C, L)`` (or unbatched ``(C, L)``) as ``(N, C, 1, L)``, and the shape to return to."""
    if x.ndim not in (2, 3):
        raise NotConvertible(f"{name} of a {x.ndim}-d input ((N, C, L) or (C, L) expected)")
    lead = x.shape[:-1] if x.ndim == 3 else (1, x.shape[0])
    return cv.reshape(x, (*lead, 1, x.shape[-1])), lead


def _back(cv: Converter, y: Tensor, x: Tensor, lead: tuple[int, ...]) -> Tensor:
    shape = (y.shape[0], y.shape[1], y.shape[3]) if x.ndim == 3 else (y.shape[1], y.shape[3])
    return cv.reshape(y, shape)


@register(F.conv1d, torch.conv1d, nn.Conv1d)
def conv1d(cv: Converter, x: Any, weight: Any = None, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    if isinstance(x, nn.Module):
        x, weight, bias, stride, padding, dilation, groups = conv_module(cv, x, weight)
    x2, lead = _as_2d(cv, x, "conv1d")
    w2 = cv.reshape(weight, (weight.shape[0], weight.shape[1], 1, weight.shape[2]))
    pad = padding if isinstance(padding, str) else (0, _one(padding))
    y = conv2d(cv, x2, w2, bias, (1, _one(stride)), pad, (1, _one(dilation)), groups)
    return _back(cv, y, x, lead)


def _triple(v: Any) -> tuple[int, int, int]:
    return tuple(int(a) for a in v) if isinstance(v, (tuple, list)) else (int(v),) * 3  # type: ignore[return-value]


@register(F.conv3d, torch.conv3d, nn.Conv3d)
def conv3d(cv: Converter, x: Any, weight: Any = None, bias: Any = None, stride: Any = 1, padding: Any = 0,
           dilation: Any = 1, groups: int = 1) -> Tensor:
    """A 3-d convolution as one 2-d convolution per depth tap, summed: tap ``t`` convolves the
    depth slices ``t * dilation + stride * i`` (folded into the batch: ``(N * D_out, C, H, W)``)
    with the weights' slice ``t`` (video models' tubelet embeddings: one tap per output slice)."""
    if isinstance(x, nn.Module):
        x, weight, bias, stride, padding, dilation, groups = conv_module(cv, x, weight)
    unbatched = x.ndim == 4
    if unbatched:
        x = cv.reshape(x, (1, *x.shape))
    if x.ndim != 5:
        raise NotConvertible(f"conv3d of a {x.ndim}-d input (N, C, D, H, W expected)")
    (sd, sh, sw), (dd, dh, dw) = _triple(stride), _triple(dilation)
    co, cig, kd, kh, kw = weight.shape
    if isinstance(padding, str):            # "valid", or "same" (the odd extra after, as torch)
        total = (0, 0, 0) if padding == "valid" else (dd * (kd - 1), dh * (kh - 1), dw * (kw - 1))
        widths = ((0, 0), (0, 0)) + tuple((t // 2, t - t // 2) for t in total)
        x = x if not any(total) else cv.op(OpKind.PAD, [x], PadAttrs(widths))
        padding = 0
    pd, ph, pw = _triple(padding)
    if pd:
        x = cv.op(OpKind.PAD, [x], PadAttrs(((0, 0), (0, 0), (pd, pd), (0, 0), (0, 0))))
    n, c, depth, h, w = x.shape
    od = (depth - dd * (kd - 1) - 1) // sd + 1
    if od <= 0:
        raise NotConvertible(f"conv3d: a depth-{kd} window does not fit a depth of {depth}")
    y = None
    for t in range(kd):
        xs = cv.slice(x, 2, t * dd, t * dd + sd * (od - 1) + 1, sd)
        xs = cv.reshape(cv.permute(xs, (0, 2, 1, 3, 4)), (n * od, c, h, w))
        wt = cv.reshape(cv.slice(weight, 2, t, t + 1), (co, cig, kh, kw))
        yt = conv2d(cv, xs, wt, bias if t == 0 else None, (sh, sw), (ph, pw), (dh, dw), groups)
        y = yt if y is None else cv.binary(BinaryFn.ADD, y, yt)
    out = cv.permute(cv.reshape(y, (n, od, co, *y.shape[2:])), (0, 2, 1, 3, 4))
    return cv.reshape(out, out.shape[1:]) if unbatched else out


@register(F.max_pool1d, torch.max_pool1d, nn.MaxPool1d, F.max_pool1d_with_indices)
def max_pool1d(cv: Converter, x: Any, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
               dilation: Any = 1, ceil_mode: bool = False, return_indices: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        x, (kernel_size, stride, padding, dilation, ceil_mode, return_indices) = kernel_size, max_pool_module(x)
    x2, lead = _as_2d(cv, x, "max_pool1d")
    stride = kernel_size if stride in (None, [], ()) else stride
    y = max_pool2d(cv, x2, (1, _one(kernel_size)), (1, _one(stride)), (0, _one(padding)), (1, _one(dilation)),
                   ceil_mode, return_indices)
    return _back(cv, y, x, lead)


@register(F.avg_pool1d, torch.avg_pool1d, nn.AvgPool1d)
def avg_pool1d(cv: Converter, x: Any, kernel_size: Any = None, stride: Any = None, padding: Any = 0,
               ceil_mode: bool = False, count_include_pad: bool = True) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, kernel_size
        kernel_size, stride, padding, ceil_mode, count_include_pad = (
            m.kernel_size, m.stride, m.padding, m.ceil_mode, m.count_include_pad)
    x2, lead = _as_2d(cv, x, "avg_pool1d")
    stride = kernel_size if stride in (None, [], ()) else stride
    y = avg_pool2d(cv, x2, (1, _one(kernel_size)), (1, _one(stride)), (0, _one(padding)), ceil_mode,
                   count_include_pad)
    return _back(cv, y, x, lead)


@register(F.adaptive_avg_pool1d, torch.adaptive_avg_pool1d, nn.AdaptiveAvgPool1d)
def adaptive_avg_pool1d(cv: Converter, x: Any, output_size: Any = None) -> Tensor:
    if isinstance(x, nn.Module):
        x, output_size = output_size, x.output_size
    x2, lead = _as_2d(cv, x, "adaptive_avg_pool1d")
    return _back(cv, adaptive_avg_pool2d(cv, x2, (1, _one(output_size))), x, lead)


@register(F.adaptive_max_pool1d, torch.adaptive_max_pool1d, nn.AdaptiveMaxPool1d)
def adaptive_max_pool1d(cv: Converter, x: Any, output_size: Any = None, return_indices: bool = False) -> Tensor:
    if isinstance(x, nn.Module):
        x, output_size, return_indices = output_size, x.output_size, x.return_indices
    if return_indices:
        raise NotConvertible("adaptive_max_pool1d(return_indices=True)")
    x2, lead = _as_2d(cv, x, "adaptive_max_pool1d")
    return _back(cv, adaptive_max_pool2d(cv, x2, (1, _one(output_size))), x, lead)


@register(F.conv_transpose1d, torch.conv_transpose1d, nn.ConvTranspose1d)
def conv_transpose1d(cv: Converter, x: Any, weight: Any = None, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     output_padding: Any = 0, groups: int = 1, dilation: Any = 1) -> Tensor:
    if isinstance(x, nn.Module):
        m, x = x, weight
        x, weight, bias, stride, padding, dilation, groups = conv_module(cv, m, x)
        output_padding = m.output_padding
    if isinstance(padding, str):
        raise NotConvertible("conv_transpose1d with string padding")
    x2, lead = _as_2d(cv, x, "conv_transpose1d")
    w2 = cv.reshape(weight, (weight.shape[0], weight.shape[1], 1, weight.shape[2]))
    y = conv_transpose2d(cv, x2, w2, bias, (1, _one(stride)), (0, _one(padding)), (0, _one(output_padding)), groups,
                         (1, _one(dilation)))
    return _back(cv, y, x, lead)


# ----------------------------------------------------------------------------- attention layers


def _mask_bias(cv: Converter, mask: Any, like: Tensor) -> Tensor | None:
    """An additive float mask from a bool (True: masked out) or float mask."""
    if mask is None:
        return None
    if mask.dtype.is_bool:
        return cv.op(OpKind.WHERE, [mask], WhereAttrs(float("-inf"), 0.0))
    return cv.cast(mask, like.dtype)


def _split_heads(cv: Converter, x: Tensor, heads: int) -> Tensor:
    n, length, e = x.shape  # batch-first
    return cv.permute(cv.reshape(x, (n, length, heads, e // heads)), (0, 2, 1, 3))


@register(nn.MultiheadAttention)
def multihead_attention(cv: Converter, m: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor,
                        key_padding_mask: Any = None, need_weights: bool = True, attn_mask: Any = None,
                        average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Any, Any]:
    if not m._qkv_same_embed_dim or m.bias_k is not None or m.add_zero_attn or (m.training and m.dropout):
        raise NotConvertible("MultiheadAttention with kdim/vdim, bias_k/v, add_zero_attn or training dropout")
    if not m.batch_first:  # (L, N, E) -> (N, L, E)
        query, key, value = (cv.permute(t, (1, 0, 2)) for t in (query, key, value))
    w, b = cv.param(m.in_proj_weight, "in_proj_weight"), cv.param(m.in_proj_bias, "in_proj_bias")
    w_out, b_out = cv.param(m.out_proj.weight, "out_proj.weight"), cv.param(m.out_proj.bias, "out_proj.bias")
    out, weights = _attention(cv, query, key, value, m.num_heads, w, b, w_out, b_out, key_padding_mask, need_weights,
                              attn_mask, average_attn_weights, is_causal)
    return (out if m.batch_first else cv.permute(out, (1, 0, 2))), weights


@register(F.multi_head_attention_forward)
def multi_head_attention_forward(cv: Converter, query: Tensor, key: Tensor, value: Tensor, embed_dim_to_check: int,
                                 num_heads: int, in_proj_weight: Tensor, in_proj_bias: Any, bias_k: Any, bias_v: Any,
                                 add_zero_attn: bool, dropout_p: float, out_proj_weight: Tensor, out_proj_bias: Any,
                                 training: bool = True, key_padding_mask: Any = None, need_weights: bool = True,
                                 attn_mask: Any = None, use_separate_proj_weight: bool = False,
                                 q_proj_weight: Any = None, k_proj_weight: Any = None, v_proj_weight: Any = None,
                                 static_k: Any = None,
                                 static_v: Any = None, average_attn_weights: bool = True,
                                 is_causal: bool = False) -> tuple[Any, Any]:
    """The functional form (what dynamo inlines ``nn.MultiheadAttention`` into): sequence-first."""
    if bias_k is not None or bias_v is not None or add_zero_attn or use_separate_proj_weight or \
            static_k is not None or static_v is not None or (training and dropout_p):
        raise NotConvertible("multi_head_attention_forward with bias_k/v, add_zero_attn, separate projections, "
                             "static keys or training dropout")
    query, key, value = (cv.permute(t, (1, 0, 2)) for t in (query, key, value))
    out, weights = _attention(cv, query, key, value, num_heads, in_proj_weight, in_proj_bias, out_proj_weight,
                              out_proj_bias, key_padding_mask, need_weights, attn_mask, average_attn_weights, is_causal)
    return cv.permute(out, (1, 0, 2)), weights


def _attention(cv: Converter, query: Tensor, key: Tensor, value: Tensor, h: int, w: Tensor, b: Any, w_out: Tensor,
               b_out: Any, key_padding_mask: Any, need_weights: bool, attn_mask: Any, average_attn_weights: bool,
               is_causal: bool) -> tuple[Tensor, Any]:
    """Multi-head attention on batch-first ``(N, L, E)`` inputs with the packed input projection
    ``w`` / ``b`` (q, k, v stacked) and the output projection: the output and, with
    ``need_weights``, the attention weights (averaged over heads with ``average_attn_weights``)."""
    if is_causal and attn_mask is None:
        raise NotConvertible("MultiheadAttention(is_causal=True) without attn_mask")
    e = query.shape[-1]
    parts = []
    for k, x in enumerate((query, key, value)):
        wk = cv.slice(w, 0, k * e, (k + 1) * e)
        bk = cv.slice(b, 0, k * e, (k + 1) * e) if b is not None else None
        parts.append(_split_heads(cv, linear(cv, x, wk, bk), h))
    q, kk, v = parts                                                   # (N, H, L, D)
    scores = cv.op(OpKind.MATMUL, [q, cv.permute(kk, (0, 1, 3, 2))])   # (N, H, L, S)
    scores = cv.binary(BinaryFn.MUL, scores, 1.0 / math.sqrt(e // h))
    bias = _mask_bias(cv, attn_mask, scores)
    if bias is not None:
        if bias.ndim == 3:  # (N*H, L, S)
            bias = cv.reshape(bias, (scores.shape[0], h, *bias.shape[1:]))
        scores = cv.binary(BinaryFn.ADD, scores, bias)
    pad = _mask_bias(cv, key_padding_mask, scores)
    if pad is not None:
        scores = cv.binary(BinaryFn.ADD, scores, cv.reshape(pad, (pad.shape[0], 1, 1, pad.shape[1])))
    probs = cv.op(OpKind.SOFTMAX, [scores], AxisAttrs(3))
    out = cv.op(OpKind.MATMUL, [probs, v])                              # (N, H, L, D)
    n, _, length, _ = out.shape
    out = linear(cv, cv.reshape(cv.permute(out, (0, 2, 1, 3)), (n, length, e)), w_out, b_out)
    weights = None
    if need_weights:
        weights = cv.op(OpKind.REDUCE, [probs], ReduceAttrs(ReduceFn.MEAN, (1,))) if average_attn_weights else probs
    return out, weights


@register(nn.TransformerEncoderLayer)
def transformer_encoder_layer(cv: Converter, m: nn.TransformerEncoderLayer, src: Tensor, src_mask: Any = None,
                              src_key_padding_mask: Any = None, is_causal: bool = False) -> Tensor:
    if m.training:
        raise NotConvertible("TransformerEncoderLayer in training mode")
    act = m.activation
    if act is F.relu or isinstance(act, nn.ReLU):
        fn = UnaryFn.RELU
    elif act is F.gelu or isinstance(act, nn.GELU) and act.approximate == "none":
        fn = UnaryFn.GELU
    else:
        raise NotConvertible(f"TransformerEncoderLayer activation {act!r}")
    prefix = cv.prefix

    def sub(name: str) -> Converter:
        return cv.sub(f"{prefix}.{name}")

    def sa(x: Tensor) -> Tensor:
        return multihead_attention(sub("self_attn"), m.self_attn, x, x, x, src_key_padding_mask, False, src_mask)[0]

    def ff(x: Tensor) -> Tensor:
        y = cv.unary(fn, linear(sub("linear1"), m.linear1, x))
        return linear(sub("linear2"), m.linear2, y)

    def norm(k: int, x: Tensor) -> Tensor:
        return layer_norm(sub(f"norm{k}"), getattr(m, f"norm{k}"), x)

    return _encoder_layer(cv, src, m.norm_first, sa, ff, norm)


def _encoder_layer(cv: Converter, x: Tensor, norm_first: bool, sa: Any, ff: Any, norm: Any) -> Tensor:
    """A transformer encoder layer's residual structure around its self-attention ``sa``, feed-
    forward ``ff`` and layer norms ``norm(1 | 2, x)``."""
    if norm_first:
        x = cv.binary(BinaryFn.ADD, x, sa(norm(1, x)))
        return cv.binary(BinaryFn.ADD, x, ff(norm(2, x)))
    x = norm(1, cv.binary(BinaryFn.ADD, x, sa(x)))
    return norm(2, cv.binary(BinaryFn.ADD, x, ff(x)))


def _fast_path_masks(mask: Any, mask_type: Any) -> tuple[Any, Any]:
    """(attention mask, key padding mask) of the fused ops' merged ``mask``: type 0 an ``(L, S)``
    attention mask, 1 an ``(N, S)`` key padding mask, 2 an ``(N, H, L, S)`` merged one."""
    if mask is None:
        return None, None
    if mask_type == 1:
        return None, mask
    if mask_type in (0, 2):
        return mask, None
    raise NotConvertible(f"mask_type {mask_type!r}")


@register(torch._native_multi_head_attention)
def native_multi_head_attention(cv: Converter, query: Tensor, key: Tensor, value: Tensor, embed_dim: int,
                                num_head: int, qkv_weight: Tensor, qkv_bias: Tensor, proj_weight: Tensor,
                                proj_bias: Tensor, mask: Any = None, need_weights: bool = True,
                                average_attn_weights: bool = True, mask_type: Any = None) -> tuple[Any, Any]:
    """``nn.MultiheadAttention``'s eval-mode fast path (what dynamo records under torch.compile
    with grad off): batch-first inputs, the packed projections."""
    attn_mask, pad = _fast_path_masks(mask, mask_type)
    return _attention(cv, query, key, value, int(num_head), qkv_weight, qkv_bias, proj_weight, proj_bias, pad,
                      need_weights, attn_mask, average_attn_weights, False)


@register(torch._transformer_encoder_layer_fwd)
def transformer_encoder_layer_fwd(cv: Converter, src: Tensor, embed_dim: int, num_heads: int, qkv_weight: Tensor,
                                  qkv_bias: Tensor, proj_weight: Tensor, proj_bias: Tensor, use_gelu: bool,
                                  norm_first: bool, eps: float, norm_weight_1: Tensor, norm_bias_1: Tensor,
                                  norm_weight_2: Tensor, norm_bias_2: Tensor, ffn_weight_1: Tensor,
                                  ffn_bias_1: Tensor, ffn_weight_2: Tensor, ffn_bias_2: Tensor, mask: Any = None,
                                  mask_type: Any = None) -> Tensor:
    """``nn.TransformerEncoderLayer``'s eval-mode fast path (dynamo records it under torch.compile
    with grad off; ``taskmap.compile`` captures with the fast path off): batch-first, exact GELU or
    ReLU."""
    attn_mask, pad = _fast_path_masks(mask, mask_type)
    norms = ((norm_weight_1, norm_bias_1), (norm_weight_2, norm_bias_2))

    def sa(x: Tensor) -> Tensor:
        return _attention(cv, x, x, x, int(num_heads), qkv_weight, qkv_bias, proj_weight, proj_bias, pad, False,
                          attn_mask, True, False)[0]

    def ff(x: Tensor) -> Tensor:
        y = cv.unary(UnaryFn.GELU if use_gelu else UnaryFn.RELU, linear(cv, x, ffn_weight_1, ffn_bias_1))
        return linear(cv, y, ffn_weight_2, ffn_bias_2)

    def norm(k: int, x: Tensor) -> Tensor:
        return layer_norm(cv, x, (int(embed_dim),), *norms[k - 1], eps)

    return _encoder_layer(cv, src, norm_first, sa, ff, norm)


@register(nn.TransformerEncoder)
def transformer_encoder(cv: Converter, m: nn.TransformerEncoder, src: Tensor, mask: Any = None,
                        src_key_padding_mask: Any = None, is_causal: Any = None) -> Tensor:
    x = src
    for k, layer in enumerate(m.layers):
        x = transformer_encoder_layer(cv.sub(f"{cv.prefix}.layers.{k}"), layer, x, mask, src_key_padding_mask)
    if m.norm is not None:
        x = layer_norm(cv.sub(f"{cv.prefix}.norm"), m.norm, x)
    return x


__all__: list[str] = []
