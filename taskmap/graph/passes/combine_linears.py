"""Parallel linears: ``LINEAR`` ops that read the same input with constant weights (a transformer's
query, key and value projections) become ONE linear whose weight stacks theirs (and whose bias
joins theirs), followed by a ``SLICE`` of its last axis per original result::

    q = linear(x, Wq, bq); k = linear(x, Wk, bk); v = linear(x, Wv, bv)
    ->  qkv = linear(x, [Wq; Wk; Wv], [bq; bk; bv]); q, k, v = qkv[..., :n], qkv[..., n:2n], ...

One matmul of N = 3n instead of three of n: a third of the launches (on a GPU, of the split-K
reductions too) and three times the output tiles to spread over the cores — what GPT-2's
``c_attn`` already is.  The slices are injective: the partition folds each into its readers'
loads (the attention's prologue reads q, k and v in place, as GPT-2's does).

Linears combine when they read the same tensor and have the same dtype and attributes, 2-D
constant weights, and all or none a constant bias.  The results keep their identity (each
slice writes the tensor its linear wrote), so readers and graph outputs are unchanged.

GPU graphs only: on the CPU (Cascade Lake, 2 cores, BERT-base batch 1, alternating rounds in one
process) the whole model ran as fast either way (172 vs 174 ms) while the combined projections'
steps took 10-20% longer than the three they replace (49.7-52.4 vs 41.6-47.2 ms in per-step
profiles): a CPU launch costs little, and the CPU template's choice for N = 3n is no better.
"""
from __future__ import annotations

import numpy as np

from ..attrs import SliceAttrs
from ..ir import Graph, Op, Tensor
from ..kinds import OpKind
from .common import foldable_dtype, rebuild


def _key(op: Op) -> tuple | None:
    """What linears must share to combine (None: this one does not take part)."""
    if op.kind is not OpKind.LINEAR or len(op.inputs) < 2 or op.output.device.startswith("cpu"):
        return None
    x, w = op.inputs[0], op.inputs[1]
    bias = op.inputs[2] if len(op.inputs) > 2 else None
    if w.ndim != 2 or not w.is_constant or not foldable_dtype(w) or w.dtype != x.dtype or x.ndim < 1:
        return None
    if bias is not None and (not bias.is_constant or bias.shape != (w.shape[0],) or bias.dtype != w.dtype):
        return None
    return id(x), w.dtype, w.shape[1], op.attrs, bias is not None


def _combined(group: list[Op]) -> list[Op]:
    """The stacked linear and one slice per member (in the members' order)."""
    first = group[0]
    x, w0 = first.inputs[0], first.inputs[1]
    widths = [op.inputs[1].shape[0] for op in group]
    n = sum(widths)
    data = np.concatenate([op.inputs[1].data for op in group], axis=0)
    w = Tensor((n, w0.shape[1]), w0.dtype, w0.device, f"{w0.name}_combined", np.ascontiguousarray(data))
    ins = [x, w]
    if len(first.inputs) > 2:
        b0 = first.inputs[2]
        ins.append(Tensor((n,), b0.dtype, b0.device, f"{b0.name}_combined",
                          np.concatenate([op.inputs[2].data for op in group])))
    out = Tensor(first.output.shape[:-1] + (n,), first.output.dtype, first.output.device, f"{first.name}_combined")
    name = "+".join(op.name for op in group)
    ops = [Op(OpKind.LINEAR, tuple(ins), (out,), first.attrs, f"{first.name}_combined", first.source)]
    start = 0
    for op, width in zip(group, widths):
        ops.append(Op(OpKind.SLICE, (out,), (op.output,), SliceAttrs(out.ndim - 1, start, 1, width),
                      f"{op.name}_slice", f"{op.source} (combined: {name})".strip()))
        start += width
    return ops


def combine_linears(graph: Graph) -> Graph:
    """Combine every group of two or more linears that read the same input (see the module)."""
    groups: dict[tuple, list[Op]] = {}
    for op in graph.ops:
        key = _key(op)
        if key is not None:
            groups.setdefault(key, []).append(op)
    groups = {k: g for k, g in groups.items() if len(g) > 1}
    if not groups:
        return graph
    first = {g[0]: g for g in groups.values()}
    members = {op for g in groups.values() for op in g}
    ops: list[Op] = []
    for op in graph.ops:
        if op in first:
            ops.extend(_combined(first[op]))
        elif op not in members:
            ops.append(op)
    return rebuild(graph, ops)


__all__ = ["combine_linears"]
