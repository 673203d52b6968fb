"""Definitions of the element-wise and transform op kinds: shape/dtype inference and the compute
definition, built from the ``*_compute`` functions of :mod:`taskmap.ops` (never duplicated)."""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..compute.nodes import TensorNode
from ..errors import OpError
from ..ir.dtypes import ScalarType, f32, promote
from ..ops.elementwise import (UNARY, binary_compute, binary_types, broadcast_shapes, cast_compute, result_type,
                               unary_compute, where_compute)
from ..ops.misc import batch_norm_compute, embedding_compute
from ..ops.transform import (broadcast_compute, concat_compute, gather_compute, pad_compute, permute_compute,
                             reshape_compute, slice_compute)
from .attrs import (AxisAttrs, BinaryAttrs, CastAttrs, NormAttrs, PadAttrs, PermuteAttrs, ShapeAttrs, SliceAttrs,
                    UnaryAttrs, WhereAttrs)
from .kinds import OpCategory, OpDef, OpKind, register_def

Spec = list[tuple[tuple[int, ...], ScalarType]]


def _expect(kind: OpKind, inputs: Sequence[Any], n: int | tuple[int, ...]) -> None:
    ok = (n,) if isinstance(n, int) else n
    if len(inputs) not in ok:
        raise OpError(f"{kind.name.lower()}: expected {' or '.join(map(str, ok))} inputs, got {len(inputs)}")


# ----------------------------------------------------------------------------- element-wise


def _infer_unary(xs: Sequence[Any], a: UnaryAttrs) -> Spec:
    _expect(OpKind.UNARY, xs, 1)
    t = xs[0].dtype
    return [(xs[0].shape, t if t.is_float or not UNARY[a.fn.value][1] else f32)]


def _compute_unary(nodes: Sequence[TensorNode], a: UnaryAttrs, shape: Sequence[int]) -> TensorNode:
    return unary_compute(a.fn.value, nodes[0])


def _operands(nodes: Sequence[Any], a: BinaryAttrs) -> tuple[Any, Any]:
    if a.scalar is None:
        return nodes[0], nodes[1]
    return (a.scalar, nodes[0]) if a.scalar_first else (nodes[0], a.scalar)


def _infer_binary(xs: Sequence[Any], a: BinaryAttrs) -> Spec:
    _expect(OpKind.BINARY, xs, 1 if a.scalar is not None else 2)
    shape = broadcast_shapes(a.fn.value, *(x.shape for x in xs))
    t = result_type([x.dtype for x in xs], [a.scalar] if a.scalar is not None else [])
    return [(shape, binary_types(a.fn.value, t)[1])]


def _compute_binary(nodes: Sequence[TensorNode], a: BinaryAttrs, shape: Sequence[int]) -> TensorNode:
    lhs, rhs = _operands(nodes, a)
    return binary_compute(a.fn.value, lhs, rhs, shape)


def _where_operands(nodes: Sequence[Any], a: WhereAttrs) -> tuple[Any, Any, Any]:
    it = iter(nodes[1:])
    x = a.a_scalar if a.a_scalar is not None else next(it)
    y = a.b_scalar if a.b_scalar is not None else next(it)
    return nodes[0], x, y


def _infer_where(xs: Sequence[Any], a: WhereAttrs) -> Spec:
    _expect(OpKind.WHERE, xs, 1 + (a.a_scalar is None) + (a.b_scalar is None))
    shape = broadcast_shapes("where", *(x.shape for x in xs))
    types = [x.dtype for x in xs[1:]]
    scalars = [s for s in (a.a_scalar, a.b_scalar) if s is not None]
    t = result_type(types, scalars) if types else (f32 if any(isinstance(s, float) for s in scalars) else None)
    if t is None:
        raise OpError("where: two integer scalars are not supported; fold them in the frontend")
    return [(shape, t)]


def _compute_where(nodes: Sequence[TensorNode], a: WhereAttrs, shape: Sequence[int]) -> TensorNode:
    return where_compute(*_where_operands(nodes, a), shape)


def _infer_cast(xs: Sequence[Any], a: CastAttrs) -> Spec:
    _expect(OpKind.CAST, xs, 1)
    return [(xs[0].shape, a.dtype)]


def _infer_batch_norm(xs: Sequence[Any], a: NormAttrs) -> Spec:
    _expect(OpKind.BATCH_NORM, xs, 3 + a.has_weight + a.has_bias)
    x = xs[0]
    c = x.shape[1] if x.ndim > 1 else 1
    for p in xs[1:]:
        if tuple(p.shape) != (c,):
            raise OpError(f"batch_norm: parameters must have shape ({c},), got {tuple(p.shape)}")
    return [(x.shape, x.dtype)]


def _compute_batch_norm(nodes: Sequence[TensorNode], a: NormAttrs, shape: Sequence[int]) -> TensorNode:
    it = iter(nodes[3:])
    w = next(it) if a.has_weight else None
    b = next(it) if a.has_bias else None
    return batch_norm_compute(nodes[0], nodes[1], nodes[2], w, b, a.eps)


# ----------------------------------------------------------------------------- transforms


def _infer_reshape(xs: Sequence[Any], a: ShapeAttrs) -> Spec:
    _expect(OpKind.RESHAPE, xs, 1)
    if math.prod(a.shape) != math.prod(xs[0].shape):
        raise OpError(f"reshape: cannot reshape {tuple(xs[0].shape)} into {a.shape}")
    return [(a.shape, xs[0].dtype)]


def _infer_expand(xs: Sequence[Any], a: ShapeAttrs) -> Spec:
    _expect(OpKind.EXPAND, xs, 1)
    src = tuple(xs[0].shape)
    lead = len(a.shape) - len(src)
    if lead < 0 or any(s not in (1, a.shape[lead + d]) for d, s in enumerate(src)):
        raise OpError(f"expand: cannot broadcast shape {src} to {a.shape}")
    return [(a.shape, xs[0].dtype)]


def _infer_permute(xs: Sequence[Any], a: PermuteAttrs) -> Spec:
    _expect(OpKind.PERMUTE, xs, 1)
    if sorted(a.dims) != list(range(xs[0].ndim)):
        raise OpError(f"permute: {a.dims} is not a permutation of {xs[0].ndim} dimensions")
    return [(tuple(xs[0].shape[d] for d in a.dims), xs[0].dtype)]


def _infer_slice(xs: Sequence[Any], a: SliceAttrs) -> Spec:
    _expect(OpKind.SLICE, xs, 1)
    shape = tuple(xs[0].shape)
    last = a.start + a.step * (a.length - 1)
    if not 0 <= a.axis < len(shape) or a.step == 0 or a.length < 0 or \
            (a.length and not (0 <= min(a.start, last) and max(a.start, last) < shape[a.axis])):
        raise OpError(f"slice: {a} is out of range for shape {shape}")
    return [(tuple(a.length if d == a.axis else s for d, s in enumerate(shape)), xs[0].dtype)]


def _infer_concat(xs: Sequence[Any], a: AxisAttrs) -> Spec:
    if not xs:
        raise OpError("concat: needs at least one input")
    first = tuple(xs[0].shape)
    for x in xs[1:]:
        if len(x.shape) != len(first) or any(p != q for d, (p, q) in enumerate(zip(x.shape, first)) if d != a.axis):
            raise OpError(f"concat: shapes {[tuple(x.shape) for x in xs]} differ outside axis {a.axis}")
    t = xs[0].dtype
    for x in xs[1:]:
        t = promote(t, x.dtype)
    return [(tuple(sum(x.shape[a.axis] for x in xs) if d == a.axis else s for d, s in enumerate(first)), t)]


def _infer_pad(xs: Sequence[Any], a: PadAttrs) -> Spec:
    _expect(OpKind.PAD, xs, 1)
    if len(a.widths) != xs[0].ndim:
        raise OpError(f"pad: {len(a.widths)} widths for a {xs[0].ndim}-d tensor")
    return [(tuple(s + lo + hi for s, (lo, hi) in zip(xs[0].shape, a.widths)), xs[0].dtype)]


def _infer_gather(xs: Sequence[Any], a: AxisAttrs) -> Spec:
    _expect(OpKind.GATHER, xs, 2)
    if xs[1].dtype.name not in ("int32", "int64") or xs[1].ndim != xs[0].ndim:
        raise OpError("gather: the index must be an int32/int64 tensor with as many dimensions as the input")
    return [(tuple(xs[1].shape), xs[0].dtype)]


def _infer_embedding(xs: Sequence[Any], a: None) -> Spec:
    _expect(OpKind.EMBEDDING, xs, 2)
    w, ix = xs
    if ix.dtype.name not in ("int32", "int64") or w.ndim < 1 or ix.ndim < 1:
        raise OpError("embedding: needs a weight table and int32/int64 indices of at least one dimension")
    return [((*ix.shape, *w.shape[1:]), w.dtype)]


def _def(kind: OpKind, category: OpCategory, infer: Any, compute: Any, attrs_type: type | None) -> None:
    register_def(OpDef(kind, category, infer, attrs_type, compute=compute))


_def(OpKind.UNARY, OpCategory.ELEMENTWISE, _infer_unary, _compute_unary, UnaryAttrs)
_def(OpKind.BINARY, OpCategory.BROADCAST, _infer_binary, _compute_binary, BinaryAttrs)
_def(OpKind.WHERE, OpCategory.BROADCAST, _infer_where, _compute_where, WhereAttrs)
_def(OpKind.CAST, OpCategory.ELEMENTWISE, _infer_cast, lambda n, a, s: cast_compute(n[0], a.dtype), CastAttrs)
_def(OpKind.BATCH_NORM, OpCategory.BROADCAST, _infer_batch_norm, _compute_batch_norm, NormAttrs)
_def(OpKind.RESHAPE, OpCategory.INJECTIVE, _infer_reshape, lambda n, a, s: reshape_compute(n[0], s), ShapeAttrs)
_def(OpKind.EXPAND, OpCategory.BROADCAST, _infer_expand, lambda n, a, s: broadcast_compute(n[0], s), ShapeAttrs)
_def(OpKind.PERMUTE, OpCategory.INJECTIVE, _infer_permute, lambda n, a, s: permute_compute(n[0], a.dims),
     PermuteAttrs)
_def(OpKind.SLICE, OpCategory.INJECTIVE, _infer_slice,
     lambda n, a, s: slice_compute(n[0], a.axis, a.start, a.step, a.length), SliceAttrs)
_def(OpKind.CONCAT, OpCategory.INJECTIVE, _infer_concat, lambda n, a, s: concat_compute(n, a.axis), AxisAttrs)
_def(OpKind.PAD, OpCategory.INJECTIVE, _infer_pad,
     lambda n, a, s: pad_compute(n[0], a.widths, a.mode.value, a.value), PadAttrs)
_def(OpKind.GATHER, OpCategory.INJECTIVE, _infer_gather, lambda n, a, s: gather_compute(n[0], a.axis, n[1]),
     AxisAttrs)
_def(OpKind.EMBEDDING, OpCategory.INJECTIVE, _infer_embedding, lambda n, a, s: embedding_compute(n[0], n[1]), None)

__all__: list[str] = []
