"""Algebraic simplifications that remove ops: identity reshapes / expands / permutes / casts /
full slices, a reshape of a reshape (one reshape of the original), and arithmetic identities
with a scalar (``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``) that keep the dtype.  Dropout in
eval mode is already removed by the frontend."""
from __future__ import annotations

import dataclasses

from ..attrs import BinaryFn
from ..ir import Graph, Op, Tensor
from ..kinds import OpKind
from .common import rebuild, resolve


def _identity(op: Op) -> bool:
    """Whether the op returns its (first) input unchanged."""
    k, a = op.kind, op.attrs
    if len(op.outputs) != 1 or not op.inputs:
        return False
    x, y = op.inputs[0], op.outputs[0]
    if x.shape != y.shape or x.dtype is not y.dtype:
        return False
    if k in (OpKind.RESHAPE, OpKind.EXPAND, OpKind.CAST):
        return True
    if k is OpKind.PERMUTE:
        return tuple(a.dims) == tuple(range(len(a.dims))) or all(x.shape[d] == 1 for d in range(x.ndim)
                                                                if a.dims[d] != d)
    if k is OpKind.SLICE:
        return a.start == 0 and a.step == 1 and a.length == x.shape[a.axis]
    if k is OpKind.CONCAT:
        return len(op.inputs) == 1
    if k is OpKind.BINARY and a.scalar is not None and not isinstance(a.scalar, bool):
        if a.fn in (BinaryFn.ADD,) and a.scalar == 0:
            return True
        if a.fn is BinaryFn.SUB and a.scalar == 0 and not a.scalar_first:
            return True
        if a.fn is BinaryFn.MUL and a.scalar == 1:
            return True
        if a.fn is BinaryFn.DIV and a.scalar == 1 and not a.scalar_first:
            return True
    return False


def simplify(graph: Graph) -> Graph:
    """Drop identity ops (their readers read the input) and merge chained reshapes."""
    replace: dict[Tensor, Tensor] = {}
    ops: list[Op] = []
    made: dict[Tensor, Op] = {}
    outputs = set(graph.outputs)
    for op in graph.ops:
        ins = tuple(resolve(t, replace) for t in op.inputs)
        if any(a is not b for a, b in zip(ins, op.inputs)):
            op = dataclasses.replace(op, inputs=ins)
        if _identity(op) and op.output not in outputs:
            replace[op.output] = op.inputs[0]
            continue
        src = made.get(op.inputs[0]) if op.inputs else None
        if op.kind is OpKind.RESHAPE and src is not None and src.kind is OpKind.RESHAPE:
            op = dataclasses.replace(op, inputs=(src.inputs[0],))     # the first reshape may become dead (DCE)
            if op.output.shape == op.inputs[0].shape and op.output not in outputs:
                replace[op.output] = op.inputs[0]
                continue
        ops.append(op)
        for t in op.outputs:
            made[t] = op
    if len(ops) == len(graph.ops) and not replace and all(a is b for a, b in zip(ops, graph.ops)):
        return graph
    return rebuild(graph, ops, replace)


__all__ = ["simplify"]
