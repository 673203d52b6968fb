"""Definitions of the anchor op kinds (matmul, conv, pooling, reductions, softmax, norms,
attention, scans, top-k / sort) and of the PyTorch fallback: shape/dtype inference and the :mod:`taskmap.ops`
function that runs each."""
from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from .. import ops
from ..errors import OpError
from ..ir.dtypes import ScalarType, i64, scalar_type
from .attrs import (AdaptivePoolAttrs, AttentionAttrs, AxisAttrs, Conv2dAttrs, InputRef, MatmulAttrs, NormAttrs,
                    Pool2dAttrs, ReduceAttrs, ReduceFn, ScatterAttrs, TopkAttrs, TorchAttrs)
from .kinds import OpCategory, OpDef, OpKind, register_def

Spec = list[tuple[tuple[int, ...], ScalarType]]

# ----------------------------------------------------------------------------- linear algebra


def _infer_matmul(xs: Sequence[Any], a: None) -> Spec:
    sa, sb = tuple(xs[0].shape), tuple(xs[1].shape)
    if not sa or not sb:
        raise OpError(f"matmul: 0-d operands {sa} @ {sb}")
    sa2 = (1, sa[0]) if len(sa) == 1 else sa
    sb2 = (sb[0], 1) if len(sb) == 1 else sb
    if sa2[-1] != sb2[-2]:
        raise OpError(f"matmul: inner dimensions differ: {sa} @ {sb}")
    batch = _broadcast(sa2[:-2], sb2[:-2])
    shape = batch + ((sa2[-2],) if len(sa) > 1 else ()) + ((sb2[-1],) if len(sb) > 1 else ())
    return [(shape, xs[0].dtype)]


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    if any(p != q and 1 not in (p, q) for p, q in zip(a, b)):
        raise OpError(f"matmul: batch dimensions {a} and {b} do not broadcast")
    return tuple(max(p, q) if 1 in (p, q) else p for p, q in zip(a, b))


def _infer_linear(xs: Sequence[Any], a: None) -> Spec:
    x, w = xs[0], xs[1]
    if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
        raise OpError(f"linear: input {tuple(x.shape)} and weight {tuple(w.shape)} do not match")
    return [((*x.shape[:-1], w.shape[0]), x.dtype)]


def _conv_out(n: int, k: int, s: int, p: int, d: int, ceil: bool = False) -> int:
    span = n + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= n + p:  # torch: the last window must start inside the input or left pad
        out -= 1
    return out


def _infer_conv2d(xs: Sequence[Any], a: Conv2dAttrs) -> Spec:
    x, w = xs[0], xs[1]
    if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[1] * a.groups or w.shape[0] % a.groups:
        raise OpError(f"conv2d: input {tuple(x.shape)}, weight {tuple(w.shape)} and groups {a.groups} do not match")
    oh = _conv_out(x.shape[2], w.shape[2], a.stride[0], a.padding[0], a.dilation[0])
    ow = _conv_out(x.shape[3], w.shape[3], a.stride[1], a.padding[1], a.dilation[1])
    return [((x.shape[0], w.shape[0], oh, ow), x.dtype)]


def _run_conv2d(arrays: Sequence[Any], a: Conv2dAttrs) -> Any:
    x, w = arrays[0], arrays[1]
    b = arrays[2] if len(arrays) > 2 else None
    c = x.shape[1]
    if a.groups == c and a.groups > 1 and w.shape[0] == c:
        return ops.depthwise_conv2d(x, w, b, a.stride, a.padding, a.dilation)
    return ops.conv2d(x, w, b, a.stride, a.padding, a.dilation, a.groups)


# ----------------------------------------------------------------------------- pooling


def _infer_pool(xs: Sequence[Any], a: Pool2dAttrs) -> Spec:
    x = xs[0]
    if x.ndim not in (3, 4):
        raise OpError(f"pool2d: expected a 3-d or 4-d input, got {tuple(x.shape)}")
    h, w = x.shape[-2:]
    oh = _conv_out(h, a.kernel[0], a.stride[0], a.padding[0], a.dilation[0], a.ceil_mode)
    ow = _conv_out(w, a.kernel[1], a.stride[1], a.padding[1], a.dilation[1], a.ceil_mode)
    return [((*x.shape[:-2], oh, ow), x.dtype)]


def _infer_adaptive(xs: Sequence[Any], a: AdaptivePoolAttrs) -> Spec:
    x = xs[0]
    if x.ndim not in (3, 4):
        raise OpError(f"adaptive pool2d: expected a 3-d or 4-d input, got {tuple(x.shape)}")
    return [((*x.shape[:-2], *a.output_size), x.dtype)]


def _run_max_pool(arrays: Sequence[Any], a: Pool2dAttrs) -> Any:
    return ops.max_pool2d(arrays[0], a.kernel, a.stride, a.padding, a.dilation, a.ceil_mode)


def _run_avg_pool(arrays: Sequence[Any], a: Pool2dAttrs) -> Any:
    return ops.avg_pool2d(arrays[0], a.kernel, a.stride, a.padding, a.ceil_mode, a.count_include_pad,
                          a.divisor_override)


# ----------------------------------------------------------------------------- reductions, norms


def _infer_reduce(xs: Sequence[Any], a: ReduceAttrs) -> Spec:
    x = xs[0]
    if any(not 0 <= d < max(x.ndim, 1) for d in a.axes):
        raise OpError(f"reduce: axes {a.axes} out of range for shape {tuple(x.shape)}")
    shape = tuple(1 if d in a.axes else s for d, s in enumerate(x.shape)) if a.keepdim else \
        tuple(s for d, s in enumerate(x.shape) if d not in a.axes)
    t = x.dtype
    if a.fn in (ReduceFn.SUM, ReduceFn.PROD) and not t.is_float:
        t = i64
    return [(shape, t)]


def _run_reduce(arrays: Sequence[Any], a: ReduceAttrs) -> Any:
    fn = {ReduceFn.SUM: ops.sum, ReduceFn.MEAN: ops.mean, ReduceFn.MAX: ops.max, ReduceFn.MIN: ops.min,
          ReduceFn.PROD: ops.prod}.get(a.fn)
    if fn is None:
        return ops.var(arrays[0], a.axes, keepdim=a.keepdim, correction=a.correction)
    return fn(arrays[0], a.axes, a.keepdim)


def _infer_same(xs: Sequence[Any], a: Any) -> Spec:
    return [(tuple(xs[0].shape), xs[0].dtype)]


def _infer_layer_norm(xs: Sequence[Any], a: NormAttrs) -> Spec:
    x = xs[0]
    n = len(a.normalized_shape)
    if tuple(x.shape[x.ndim - n:]) != a.normalized_shape:
        raise OpError(f"layer_norm: normalized_shape {a.normalized_shape} is not the end of {tuple(x.shape)}")
    return [(tuple(x.shape), x.dtype)]


def _run_layer_norm(arrays: Sequence[Any], a: NormAttrs) -> Any:
    it = iter(arrays[1:])
    w = next(it) if a.has_weight else None
    b = next(it) if a.has_bias else None
    return ops.layer_norm(arrays[0], a.normalized_shape, w, b, a.eps)


# ----------------------------------------------------------------------------- attention, fallback


def _infer_attention(xs: Sequence[Any], a: AttentionAttrs) -> Spec:
    q, k, v = xs[:3]
    if q.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise OpError(f"attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} do not match")
    return [((*q.shape[:-1], v.shape[-1]), q.dtype)]


def _run_attention(arrays: Sequence[Any], a: AttentionAttrs) -> Any:
    mask = arrays[3] if a.has_mask else None
    return ops.scaled_dot_product_attention(arrays[0], arrays[1], arrays[2], mask, 0.0, a.is_causal, a.scale)


def fill_refs(template: Any, arrays: Sequence[Any]) -> Any:
    """``template`` with every :class:`InputRef` replaced by its array (tuples, lists, dicts);
    a complex one by the complex tensor its real view holds."""
    if isinstance(template, InputRef):
        x = arrays[template.index]
        return sys.modules["torch"].view_as_complex(x) if template.complex else x
    if isinstance(template, tuple):
        return tuple(fill_refs(t, arrays) for t in template)
    if isinstance(template, list):
        return [fill_refs(t, arrays) for t in template]
    if isinstance(template, dict):
        return {k: fill_refs(v, arrays) for k, v in template.items()}
    return template


def _run_torch(arrays: Sequence[Any], a: TorchAttrs, on_meta: bool = False) -> Any:
    """The op's result: a tensor, or the tensors of a (nested) tuple or list in order; complex
    ones as their real views."""
    torch = sys.modules["torch"]
    out = _call_torch(arrays, a, on_meta)
    if isinstance(out, (tuple, list)) and any(isinstance(o, (tuple, list, dict)) for o in out):
        out = tuple(v for v in torch.utils._pytree.tree_leaves(out) if isinstance(v, torch.Tensor))  # (nn.LSTM's)
    return tuple(map(real_view, out)) if isinstance(out, (tuple, list)) else real_view(out)


def real_view(t: Any) -> Any:
    """A complex tensor as the real tensor of its parts (a last axis of 2); others as they are."""
    if getattr(t, "is_complex", None) is None or not t.is_complex():
        return t
    return sys.modules["torch"].view_as_real(t.resolve_conj())


def _call_torch(arrays: Sequence[Any], a: TorchAttrs, on_meta: bool) -> Any:
    args = fill_refs(a.args, arrays)
    kwargs = {k: fill_refs(v, arrays) for k, v in a.kwargs}
    if on_meta:         # tensors held in the attributes, or by a module, join the meta inputs
        torch = sys.modules["torch"]
        args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), (args, kwargs))
        if isinstance(a.target, torch.nn.Module):
            state = {k: v.to("meta") for k, v in [*a.target.named_parameters(), *a.target.named_buffers()]}
            try:
                return torch.func.functional_call(a.target, state, tuple(args), kwargs)
            finally:    # the parameters come back past nn.RNNBase's __setattr__: its list of them would stay meta
                for m in a.target.modules():
                    if isinstance(m, torch.nn.RNNBase):
                        m._init_flat_weights()
    if a.method:
        self = args[0]
        if a.target.endswith("_") and not a.target.startswith("_") and hasattr(self, "clone"):
            self = self.clone()  # in-place methods run on a copy: graph ops are functional
        return getattr(self, a.target)(*args[1:], **kwargs)
    return a.target(*args, **kwargs)


def torch_meta(xs: Sequence[Any], a: TorchAttrs) -> Any:
    """The op's result on meta tensors of the inputs' shapes, as it returns it (nested too); for
    an op without a meta kernel (``istft`` checks its window with ``aten::equal``), its result on
    the CPU, constants with their values and the other inputs once zeros, once random (sizes that
    still depend on the data would differ at run time, where they are checked)."""
    torch = sys.modules["torch"]
    metas = [torch.empty(x.shape, dtype=getattr(torch, x.dtype.name), device="meta") for x in xs]
    try:
        return _call_torch(metas, a, on_meta=True)
    except NotImplementedError as no_meta:
        try:    # on zeros and on random values: sizes that differ depend on the data (nonzero)
            outs = [_call_torch([_probe(x, fill) for x in xs], a, on_meta=False) for fill in (0, 1)]
        except Exception:
            raise no_meta from None
        shapes = [[tuple(t.shape) for t in torch.utils._pytree.tree_leaves(o) if isinstance(t, torch.Tensor)]
                  for o in outs]
        if shapes[0] != shapes[1]:
            raise no_meta
        return torch.utils._pytree.tree_map_only(torch.Tensor, lambda t: t.to("meta"), outs[0])


def _probe(x: Any, fill: int) -> Any:
    """An input to run an op on at compile time: a constant's value, else zeros (``fill`` 0) or
    random values (1)."""
    torch = sys.modules["torch"]
    data = getattr(x, "data", None)
    if isinstance(data, np.ndarray) and data.dtype.kind in "fiub":
        return torch.from_numpy(np.array(data))
    t = torch.zeros(x.shape, dtype=getattr(torch, x.dtype.name))
    return t.random_(0, 2) if fill and t.dtype == torch.bool else t.random_(-3, 4) if fill else t


def _infer_torch(xs: Sequence[Any], a: TorchAttrs) -> Spec:
    """Shapes by running the op on meta tensors (the frontend usually knows them already)."""
    torch = sys.modules["torch"]
    out = torch_meta(xs, a)
    outs = [real_view(v) for v in torch.utils._pytree.tree_leaves(out) if isinstance(v, torch.Tensor)] \
        if isinstance(out, (tuple, list)) else (real_view(out),)
    from_torch = {getattr(torch, t.name): t for t in (x.dtype for x in xs)}
    return [(tuple(o.shape), from_torch.get(o.dtype) or _scalar_of(o.dtype)) for o in outs]


def _scalar_of(dtype: Any) -> ScalarType:
    return scalar_type(str(dtype).replace("torch.", ""))


def _scan_shape(x: Any, a: AxisAttrs, what: str) -> tuple[int, ...]:
    if not 0 <= a.axis < max(x.ndim, 1):
        raise OpError(f"{what}: axis {a.axis} out of range for shape {tuple(x.shape)}")
    return tuple(x.shape)


def _infer_scan(xs: Sequence[Any], a: AxisAttrs) -> Spec:
    """Running sums / products: the input's shape; integers and bools give int64 (as torch)."""
    x = xs[0]
    return [(_scan_shape(x, a, "cumsum / cumprod / logcumsumexp"), x.dtype if x.dtype.is_float else i64)]


def _infer_cumext(xs: Sequence[Any], a: AxisAttrs) -> Spec:
    """Running maxima / minima: the input's shape and dtype, and int64 indices."""
    shape = _scan_shape(xs[0], a, "cummax / cummin")
    return [(shape, xs[0].dtype), (shape, i64)]


def _infer_topk(xs: Sequence[Any], a: TopkAttrs) -> Spec:
    x = xs[0]
    if not 0 <= a.axis < max(x.ndim, 1) or not 0 <= a.k <= (x.shape[a.axis] if x.ndim else 1):
        raise OpError(f"topk: k={a.k} along axis {a.axis} of shape {tuple(x.shape)}")
    shape = tuple(a.k if d == a.axis else n for d, n in enumerate(x.shape))
    return [(shape, x.dtype), (shape, i64)]


def _infer_scatter(xs: Sequence[Any], a: ScatterAttrs) -> Spec:
    """``x``'s shape and dtype; ``index`` (integers, ``x``'s rank) no larger than ``src`` (of
    ``x``'s dtype), nor than ``x`` outside the axis: torch's rules."""
    x, index, src = xs
    shape = tuple(x.shape)
    if index.dtype.name not in ("int32", "int64") or src.dtype != x.dtype:
        raise OpError(f"scatter: index must be int32 / int64 and src of x's dtype {x.dtype.name}; got "
                      f"{index.dtype.name} and {src.dtype.name}")
    if not 0 <= a.axis < max(x.ndim, 1) or not len(index.shape) == len(src.shape) == len(shape) \
            or any(i > n for i, n in zip(index.shape, src.shape)) \
            or any(i > n for d, (i, n) in enumerate(zip(index.shape, shape)) if d != a.axis):
        raise OpError(f"scatter: along axis {a.axis}, index {tuple(index.shape)} must be no larger than src "
                      f"{tuple(src.shape)}, nor than x {shape} outside the axis")
    return [(shape, x.dtype)]


def _def(kind: OpKind, category: OpCategory, infer: Any, run: Any, attrs_type: type | None, run_name: str) -> None:
    register_def(OpDef(kind, category, infer, attrs_type, run=run, run_name=run_name))


_def(OpKind.MATMUL, OpCategory.OUT_FUSABLE, _infer_matmul, lambda xs, a: ops.matmul(xs[0], xs[1]), MatmulAttrs,
     "taskmap.ops.matmul")
_def(OpKind.LINEAR, OpCategory.OUT_FUSABLE, _infer_linear,
     lambda xs, a: ops.linear(xs[0], xs[1], xs[2] if len(xs) > 2 else None), MatmulAttrs, "taskmap.ops.linear")
_def(OpKind.CONV2D, OpCategory.OUT_FUSABLE, _infer_conv2d, _run_conv2d, Conv2dAttrs, "taskmap.ops.conv2d")
_def(OpKind.MAX_POOL2D, OpCategory.REDUCTION, _infer_pool, _run_max_pool, Pool2dAttrs, "taskmap.ops.max_pool2d")
_def(OpKind.AVG_POOL2D, OpCategory.REDUCTION, _infer_pool, _run_avg_pool, Pool2dAttrs, "taskmap.ops.avg_pool2d")
_def(OpKind.ADAPTIVE_AVG_POOL2D, OpCategory.REDUCTION, _infer_adaptive,
     lambda xs, a: ops.adaptive_avg_pool2d(xs[0], a.output_size), AdaptivePoolAttrs, "taskmap.ops.adaptive_avg_pool2d")
_def(OpKind.ADAPTIVE_MAX_POOL2D, OpCategory.REDUCTION, _infer_adaptive,
     lambda xs, a: ops.adaptive_max_pool2d(xs[0], a.output_size), AdaptivePoolAttrs, "taskmap.ops.adaptive_max_pool2d")
_def(OpKind.REDUCE, OpCategory.REDUCTION, _infer_reduce, _run_reduce, ReduceAttrs, "taskmap.ops.<reduction>")
_def(OpKind.SOFTMAX, OpCategory.REDUCTION, _infer_same, lambda xs, a: ops.softmax(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.softmax")
_def(OpKind.LOG_SOFTMAX, OpCategory.REDUCTION, _infer_same, lambda xs, a: ops.log_softmax(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.log_softmax")
_def(OpKind.LAYER_NORM, OpCategory.REDUCTION, _infer_layer_norm, _run_layer_norm, NormAttrs, "taskmap.ops.layer_norm")
_def(OpKind.ATTENTION, OpCategory.OPAQUE, _infer_attention, _run_attention, AttentionAttrs,
     "taskmap.ops.scaled_dot_product_attention")
_def(OpKind.CUMSUM, OpCategory.OPAQUE, _infer_scan, lambda xs, a: ops.cumsum(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.cumsum")
_def(OpKind.CUMPROD, OpCategory.OPAQUE, _infer_scan, lambda xs, a: ops.cumprod(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.cumprod")
_def(OpKind.LOGCUMSUMEXP, OpCategory.OPAQUE, _infer_scan, lambda xs, a: ops.logcumsumexp(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.logcumsumexp")
_def(OpKind.CUMMAX, OpCategory.OPAQUE, _infer_cumext, lambda xs, a: ops.cummax(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.cummax")
_def(OpKind.CUMMIN, OpCategory.OPAQUE, _infer_cumext, lambda xs, a: ops.cummin(xs[0], a.axis), AxisAttrs,
     "taskmap.ops.cummin")
_def(OpKind.TOPK, OpCategory.OPAQUE, _infer_topk, lambda xs, a: ops.topk(xs[0], a.k, a.axis, a.largest), TopkAttrs,
     "taskmap.ops.topk")
_def(OpKind.SCATTER, OpCategory.OPAQUE, _infer_scatter,
     lambda xs, a: ops.scatter(xs[0], a.axis, xs[1], xs[2], a.reduce, a.include_self), ScatterAttrs,
     "taskmap.ops.scatter")
_def(OpKind.TORCH, OpCategory.OPAQUE, _infer_torch, _run_torch, TorchAttrs, "PyTorch (fallback)")

__all__ = ["fill_refs", "torch_meta"]
