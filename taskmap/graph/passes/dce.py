"""Dead-code elimination: ops none of whose outputs are read (by a kept op or as a graph
output) are dropped, from the end backwards (graph inputs stay, used or not: they are the
compiled graph's signature)."""
from __future__ import annotations

from ..ir import Graph, Tensor
from .common import rebuild


def dce(graph: Graph) -> Graph:
    live: set[Tensor] = set(graph.outputs)
    keep = []
    for op in reversed(graph.ops):
        if any(t in live for t in op.outputs):
            keep.append(op)
            live.update(op.inputs)
    if len(keep) == len(graph.ops):
        return graph
    return rebuild(graph, reversed(keep))


__all__ = ["dce"]
