"""Reductions as rule-based anchors: ``REDUCE`` (sum, mean, max, min, prod of floats) and the
global average pool (``ADAPTIVE_AVG_POOL2D`` to 1x1) as compute definitions, so that a fusion
group around them is ONE rule-based kernel: the injective prologue ops are composed into the
reduction's input and the element-wise epilogue reads the reduction at the output's own index
(what :mod:`taskmap.schedule.rule_based` takes: one reduction, an injective epilogue).

Softmax, log-softmax and layer norm reduce twice (the rule-based scheduler takes one
reduction): they are template anchors (:mod:`.lower_template`), their ``taskmap.ops`` templates
with prologues / epilogues spliced in.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..compute.nodes import TensorNode, compute, reduce
from .attrs import ReduceFn
from .ir import Op
from .kinds import OpKind

_OPS = {ReduceFn.SUM: "sum", ReduceFn.MEAN: "sum", ReduceFn.MAX: "max", ReduceFn.MIN: "min", ReduceFn.PROD: "prod"}


def _form(op: Op) -> tuple[tuple[int, ...], bool, ReduceFn] | None:
    """(axes, keepdim, fn) of a reduction the rule-based path computes, else None."""
    x = op.inputs[0]
    if not x.dtype.is_float or op.output.dtype is not x.dtype or x.ndim == 0 or op.output.numel == 0:
        return None
    if op.kind is OpKind.REDUCE and op.attrs.fn in _OPS and op.attrs.axes:
        return tuple(sorted(op.attrs.axes)), op.attrs.keepdim, op.attrs.fn
    if op.kind is OpKind.ADAPTIVE_AVG_POOL2D and op.attrs.output_size == (1, 1):
        return (x.ndim - 2, x.ndim - 1), True, ReduceFn.MEAN
    return None


def reduction_fusable(op: Op) -> bool:
    """Whether ``op`` is a reduction anchor the rule-based scheduler fuses around."""
    return op.kind in (OpKind.REDUCE, OpKind.ADAPTIVE_AVG_POOL2D) and _form(op) is not None


def reduction_compute(op: Op, nodes: Sequence[TensorNode], out_shape: Sequence[int]) -> TensorNode:
    """The reduction as a compute definition over ``nodes[0]`` (its input's node)."""
    form = _form(op)
    assert form is not None, op
    axes, keepdim, fn = form
    x = nodes[0]
    kept = [d for d in range(x.ndim) if d not in axes]
    red_shape = [x.shape[d] for d in axes]
    n_out = len(out_shape)

    def value(*idx: Any) -> Any:
        out_i, red_i = idx[:n_out], iter(idx[n_out:])
        full = []
        kept_i = iter(out_i if keepdim else (out_i if kept else ()))
        for d in range(x.ndim):
            if d in axes:
                full.append(next(red_i))
                if keepdim:
                    next(kept_i)
            else:
                full.append(next(kept_i))
        return x[tuple(full)]

    r = reduce(f"{op.kind.name.lower()}_acc", out_shape, value, red_shape, _OPS[fn])
    count = float(math.prod(red_shape))
    return compute(f"{op.kind.name.lower()}_out", out_shape, lambda *i: r[i] / count if fn is ReduceFn.MEAN else r[i])


__all__ = ["reduction_compute", "reduction_fusable"]
