"""Helpers shared by the graph passes: rebuilding a graph with some tensors replaced, use
counts, and making a constant tensor from a numpy result.

A pass never edits a graph: it lists the ops to keep (possibly new ones) and a map
``replace[old] = new`` of tensors whose readers must read another tensor; :func:`rebuild`
makes the new :class:`~taskmap.graph.ir.Graph` (graph inputs keep their identity and order;
outputs are remapped, so a graph output may become a constant or another op's result).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

import numpy as np

from ...ir.dtypes import scalar_type
from ..ir import Graph, Op, Tensor


def resolve(t: Tensor, replace: Mapping[Tensor, Tensor]) -> Tensor:
    """``t`` after following ``replace`` (chains allowed)."""
    while t in replace:
        t = replace[t]
    return t


def rebuild(graph: Graph, ops: Iterable[Op], replace: Mapping[Tensor, Tensor] | None = None) -> Graph:
    """A graph with ``ops`` (in order), every input read through ``replace``."""
    replace = replace or {}
    out_ops = []
    for op in ops:
        ins = tuple(resolve(t, replace) for t in op.inputs)
        if any(a is not b for a, b in zip(ins, op.inputs)):
            op = dataclasses.replace(op, inputs=ins)
        out_ops.append(op)
    outputs = [resolve(t, replace) for t in graph.outputs]
    return Graph(graph.inputs, outputs, out_ops, graph.name)


def use_counts(graph: Graph) -> dict[Tensor, int]:
    """How many ops read each tensor (each op once), plus one per appearance as a graph output."""
    uses: dict[Tensor, int] = {}
    for op in graph.ops:
        for t in dict.fromkeys(op.inputs):
            uses[t] = uses.get(t, 0) + 1
    for t in graph.outputs:
        uses[t] = uses.get(t, 0) + 1
    return uses


def constant_like(t: Tensor, data: np.ndarray, name: str = "") -> Tensor:
    """A constant with ``t``'s shape, dtype and device holding ``data`` (cast, made contiguous)."""
    arr = np.asarray(np.asarray(data).astype(t.dtype.numpy_dtype, copy=False).reshape(t.shape), order="C")
    return Tensor(t.shape, scalar_type(arr.dtype.name), t.device, name or t.name, arr)


def foldable_dtype(t: Tensor) -> bool:
    """Whether numpy can hold the tensor's values (bfloat16: with the ``ml_dtypes`` package)."""
    try:
        t.dtype.numpy_dtype
    except TypeError:
        return False
    return True


__all__ = ["constant_like", "foldable_dtype", "rebuild", "resolve", "use_counts"]
