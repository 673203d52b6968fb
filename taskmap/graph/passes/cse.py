"""Common-subexpression elimination: two ops of the same kind and attributes reading the same
tensors compute the same values; the later one is dropped and its readers read the earlier
one's outputs.  PyTorch fallback ops are never merged (they may be impure), nor ops whose
attributes are not hashable.  Constants with equal bytes are merged too (small ones only)."""
from __future__ import annotations

from typing import Any

from ..ir import Graph, Op, Tensor
from ..kinds import OpKind
from .common import rebuild, resolve

#: Constants up to this size are compared by value.
MAX_CONST_BYTES = 1 << 16


def _const_key(t: Tensor) -> Any:
    if not t.is_constant or t.nbytes > MAX_CONST_BYTES:
        return None
    return (t.shape, t.dtype.name, t.device, t.data.tobytes())


def cse(graph: Graph) -> Graph:
    """Merge ops that compute the same thing (see the module docstring)."""
    replace: dict[Tensor, Tensor] = {}
    consts: dict[Any, Tensor] = {}
    seen: dict[Any, Op] = {}
    ops: list[Op] = []
    outputs = set(graph.outputs)
    for op in graph.ops:
        ins = []
        for t in op.inputs:
            t = resolve(t, replace)
            ck = _const_key(t)
            if ck is not None:
                t = consts.setdefault(ck, t)
                if consts[ck] is not t:
                    replace[t] = consts[ck]
                    t = consts[ck]
            ins.append(t)
        key = None
        if op.kind is not OpKind.TORCH:
            key = (op.kind, op.attrs, tuple(ins))
            try:
                hash(key)
            except TypeError:
                key = None
        first = seen.get(key) if key is not None else None
        if first is not None and len(first.outputs) == len(op.outputs) and not outputs.intersection(op.outputs):
            for a, b in zip(op.outputs, first.outputs):
                replace[a] = b
            continue
        if key is not None:
            seen[key] = op
        ops.append(op)
    if not replace:
        return graph
    return rebuild(graph, ops, replace)


__all__ = ["cse"]
