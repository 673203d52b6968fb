"""Operators the graph frontend needs beyond the element-wise / transform / reduction families:
``embedding`` (rows of a table picked by indices), inference ``batch_norm``, ``masked_fill``
and ``full``.  Each is a compute definition (``*_compute``, reused by the graph IR and by
fusion) run by the rule-based scheduler.

``arange``, ``zeros``, ``ones`` and ``full`` in a traced model have constant inputs only: the
frontend folds them into constants, so they need no kernel.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..compute.nodes import TensorInput, TensorNode, compute
from ..errors import OpError
from ..ir import expr as E
from ..ir.expr import Expr
from ._dispatch import FLOATS, filled, prepare, run_compute
from .elementwise import compute_type, where


def embedding_compute(weight: TensorNode, indices: TensorNode) -> TensorNode:
    """``out[i.., j] = weight[indices[i..], j]`` (indices clamped into the table)."""
    rows = weight.shape[0]
    shape = (*indices.shape, *weight.shape[1:])
    nlead = indices.ndim

    def fn(*i: Expr) -> Expr:
        r = E.minimum(E.maximum(E.cast(indices[i[:nlead]], E.i32), 0), rows - 1)
        return weight[(r, *i[nlead:])]
    return compute("embedding", shape, fn)


def embedding(indices: Any, weight: Any) -> Any:
    """torch.nn.functional.embedding (no max_norm): ``weight[indices]``."""
    args = prepare("embedding", weight, indices)
    ws, ixs = args.shapes
    if args.dtypes[1] not in ("int32", "int64"):
        raise OpError(f"embedding(): indices must be int32 or int64, got {args.dtypes[1]}")
    if len(ws) < 1 or not ixs:
        raise OpError("embedding(): needs a weight of at least one dimension and indices of at least one")
    out = (*ixs, *ws[1:])
    return run_compute("embedding", (), args, out, args.dtypes[0],
                       lambda xs: embedding_compute(xs[0], xs[1]))


def batch_norm_compute(x: TensorNode, mean: TensorNode, var: TensorNode, weight: TensorNode | None,
                       bias: TensorNode | None, eps: float) -> TensorNode:
    """Inference batch norm over channel axis 1: ``(x - mean) / sqrt(var + eps) * w + b``."""
    t = x.dtype
    ct = compute_type(t)

    def fn(*i: Expr) -> Expr:
        c = (i[1],) if x.ndim > 1 else (E.const(0),)
        v = (E.cast(x[i], ct) - E.cast(mean[c], ct)) * E.call(E.Intrinsic.RSQRT, E.cast(var[c], ct) + float(eps))
        if weight is not None:
            v = v * E.cast(weight[c], ct)
        if bias is not None:
            v = v + E.cast(bias[c], ct)
        return E.cast(v, t)
    return compute("batch_norm", x.shape, fn)


def batch_norm(x: Any, running_mean: Any, running_var: Any, weight: Any = None, bias: Any = None,
               eps: float = 1e-5) -> Any:
    """torch.nn.functional.batch_norm in inference mode (running statistics, channel axis 1)."""
    params = [p for p in (weight, bias) if p is not None]
    args = prepare("batch_norm", x, running_mean, running_var, *params, allowed=FLOATS)
    shape = args.shapes[0]
    channels = shape[1] if len(shape) > 1 else 1
    for s in args.shapes[1:]:
        if tuple(s) != (channels,):
            raise OpError(f"batch_norm(): statistics and affine parameters must have shape ({channels},), got "
                          f"{tuple(s)}")
    hw, hb = weight is not None, bias is not None

    def define(xs: list[TensorInput]) -> TensorNode:
        it = iter(xs[3:])
        w = next(it) if hw else None
        b = next(it) if hb else None
        return batch_norm_compute(xs[0], xs[1], xs[2], w, b, eps)

    return run_compute("batch_norm", (hw, hb, float(eps)), args, shape, args.dtypes[0], define)


def masked_fill(x: Any, mask: Any, value: float | int | bool) -> Any:
    """``value`` where ``mask`` is true, else ``x`` (torch.Tensor.masked_fill; mask broadcasts)."""
    if not isinstance(value, (bool, int, float)):
        raise OpError(f"masked_fill(): value must be a Python number, got {type(value).__name__}")
    return where(mask, value, x)


def full(like: Any, shape: Sequence[int], value: float | int | bool, dtype: str = "float32") -> Any:
    """A new array of ``like``'s kind (numpy / torch, device) filled with ``value``."""
    args = prepare("full", like)
    return filled(args.kind, tuple(shape), dtype, value)


__all__ = ["batch_norm", "batch_norm_compute", "embedding", "embedding_compute", "full", "masked_fill"]
