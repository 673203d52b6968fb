"""Constant folding: an op whose inputs are all constants is evaluated once, at compile time,
and its output becomes a constant.

Transforms (reshape, permute, expand, slice, concat, pad, cast, gather, embedding) and the
common element-wise functions are evaluated with numpy; other injective ops run their compute
definition through the rule-based scheduler on the CPU; anchors (matmul, reductions, ...) run
their ``taskmap.ops`` runner on numpy arrays.  PyTorch fallback ops (opaque) are left alone,
and so are results larger than :data:`MAX_FOLD_BYTES` that an op would compute from smaller
constants (``expand`` of a scalar to a large tensor stays an op: it costs nothing fused and
saves memory) — except casts (a half-precision weight widened to float32 for the CPU's kernels
is folded whatever its size).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ...compute.nodes import graph_inputs, tensor_input
from ...ir.dtypes import bf16, f32
from ...schedule.rule_based import schedule
from ..attrs import BinaryFn, PadMode, UnaryFn
from ..derived import derived
from ..ir import Graph, Op, Tensor
from ..kinds import OpCategory, OpKind
from .common import constant_like, foldable_dtype, rebuild, resolve

#: Results bigger than this (and bigger than every input) are not materialised.
MAX_FOLD_BYTES = 1 << 22

_UNARY: dict[UnaryFn, Callable[[np.ndarray], np.ndarray]] = {
    UnaryFn.EXP: np.exp, UnaryFn.LOG: np.log, UnaryFn.SQRT: np.sqrt, UnaryFn.RSQRT: lambda x: 1 / np.sqrt(x),
    UnaryFn.TANH: np.tanh, UnaryFn.SIN: np.sin, UnaryFn.COS: np.cos, UnaryFn.ABS: np.abs, UnaryFn.NEG: np.negative,
    UnaryFn.RELU: lambda x: np.maximum(x, 0), UnaryFn.SIGMOID: lambda x: 1 / (1 + np.exp(-x)),
}
_BINARY: dict[BinaryFn, Callable[[Any, Any], Any]] = {
    BinaryFn.ADD: np.add, BinaryFn.SUB: np.subtract, BinaryFn.MUL: np.multiply, BinaryFn.MAXIMUM: np.maximum,
    BinaryFn.MINIMUM: np.minimum, BinaryFn.EQ: np.equal, BinaryFn.NE: np.not_equal, BinaryFn.LT: np.less,
    BinaryFn.LE: np.less_equal, BinaryFn.GT: np.greater, BinaryFn.GE: np.greater_equal,
    BinaryFn.BITWISE_AND: np.bitwise_and, BinaryFn.BITWISE_OR: np.bitwise_or, BinaryFn.BITWISE_XOR: np.bitwise_xor,
}


def _numpy(op: Op, xs: Sequence[np.ndarray]) -> np.ndarray | None:
    """The op evaluated with numpy, or None when there is no exact numpy form here."""
    k, a = op.kind, op.attrs
    out = op.output
    if k is OpKind.RESHAPE:
        return xs[0].reshape(a.shape)
    if k is OpKind.EXPAND:
        return np.broadcast_to(xs[0], a.shape)
    if k is OpKind.PERMUTE:
        return np.transpose(xs[0], a.dims)
    if k is OpKind.SLICE:
        idx = [slice(None)] * xs[0].ndim
        stop = a.start + a.step * a.length
        idx[a.axis] = slice(a.start, stop if stop >= 0 else None, a.step) if a.length else slice(0, 0)
        return xs[0][tuple(idx)]
    if k is OpKind.CONCAT:
        return np.concatenate([x.astype(out.dtype.name) for x in xs], axis=a.axis)
    if k is OpKind.CAST:
        return xs[0]
    if k is OpKind.PAD and a.mode is PadMode.CONSTANT:
        return np.pad(xs[0], a.widths, constant_values=a.value)
    if k is OpKind.GATHER:
        return np.take_along_axis(xs[0], xs[1].astype(np.int64), axis=a.axis)
    if k is OpKind.EMBEDDING:
        return xs[0][np.clip(xs[1], 0, xs[0].shape[0] - 1)]
    if k is OpKind.UNARY and a.fn in _UNARY and out.dtype.is_float:
        return _UNARY[a.fn](xs[0].astype(out.dtype.name))
    if k is OpKind.BINARY and a.fn in _BINARY:
        lhs, rhs = (xs[0], xs[1]) if a.scalar is None else ((a.scalar, xs[0]) if a.scalar_first else (xs[0], a.scalar))
        return _BINARY[a.fn](lhs, rhs)
    return None


def _kernel(op: Op, xs: Sequence[np.ndarray]) -> np.ndarray:
    """An injective op run through its compute definition (rule-based kernel on the CPU)."""
    shapes = [tuple(x.shape) or (1,) for x in xs]
    nodes = [tensor_input(f"x{k}", t.dtype, s) for k, (t, s) in enumerate(zip(op.inputs, shapes))]
    out = op.output
    oshape = out.shape or (1,)
    node = op.definition.compute(nodes, op.attrs, oshape)
    read = {id(n) for n in graph_inputs(node)}
    used = [k for k, n in enumerate(nodes) if id(n) in read]
    kernel = schedule(node, "cpu", inputs=[nodes[k] for k in used], name=f"fold_{op.kind.name.lower()}")
    res = np.empty(oshape, out.dtype.name)
    kernel(*[np.ascontiguousarray(xs[k]).reshape(shapes[k]) for k in used], res)
    return res


def evaluate(op: Op, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The op's outputs for constant inputs ``xs`` (numpy arrays)."""
    d = op.definition
    if d.category.is_injective:
        res = _numpy(op, xs)
        return [res if res is not None else _kernel(op, xs)]
    res = d.run([np.asarray(x, order="C") for x in xs], op.attrs)
    res = res if isinstance(res, (tuple, list)) else (res,)
    return [np.asarray(r) for r in res]


def _widened(op: Op, xs: Sequence[np.ndarray]) -> tuple[Op, list[np.ndarray]]:
    """``op`` and its inputs with bfloat16 as float32: numpy and the CPU kernels evaluate bf16 ops
    in float32 (as PyTorch computes them); :func:`constant_like` rounds the results back."""
    if not any(t.dtype is bf16 for t in (*op.inputs, *op.outputs)):
        return op, list(xs)
    def wide(t: Tensor) -> Tensor:
        return Tensor(t.shape, f32, t.device, t.name) if t.dtype is bf16 else t
    return (Op(op.kind, tuple(map(wide, op.inputs)), tuple(map(wide, op.outputs)), op.attrs, op.name, op.source),
            [x.astype(np.float32) if x.dtype.name == "bfloat16" else x for x in xs])


def _worth(op: Op) -> bool:
    if op.definition.category is OpCategory.OPAQUE or not op.inputs:
        return False
    if not all(t.is_constant for t in op.inputs) or not all(foldable_dtype(t) for t in (*op.inputs, *op.outputs)):
        return False
    if op.kind is OpKind.CAST:          # at most a few times its input: half weights widened for the CPU
        return True
    biggest = max(t.nbytes for t in op.inputs)
    return all(t.nbytes <= max(MAX_FOLD_BYTES, biggest) for t in op.outputs)


def fold_constants(graph: Graph) -> Graph:
    """Evaluate every op whose inputs are all constants (after earlier folds)."""
    replace: dict[Tensor, Tensor] = {}
    ops: list[Op] = []
    for op in graph.ops:
        ins = [resolve(t, replace) for t in op.inputs]
        probe = Op(op.kind, tuple(ins), op.outputs, op.attrs, op.name, op.source)
        if _worth(probe):
            xs = [t.data for t in ins]
            wide, wxs = _widened(probe, xs)
            results = [derived(xs, (op.kind, op.attrs, tuple((t.shape, t.dtype.name) for t in op.outputs)),
                               lambda: evaluate(wide, wxs)[0])] if len(op.outputs) == 1 else evaluate(wide, wxs)
            for t, r in zip(op.outputs, results):
                replace[t] = constant_like(t, r)
            continue
        ops.append(op)
    if not replace:
        return graph
    return rebuild(graph, ops, replace)


__all__ = ["MAX_FOLD_BYTES", "evaluate", "fold_constants"]
