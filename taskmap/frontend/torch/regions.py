"""Parts of an fx graph that run in PyTorch as one op.

Dynamo traces ``torch.vmap`` (transformers' Mamba under ``torch.compile``: its associative
scan) into the graph as functorch's level bookkeeping around batched ops —
``_vmap_increment_nesting``, ``_add_batch_dim``, the ops, ``_remove_batch_dim``,
``_vmap_decrement_nesting`` — which no graph op of taskmap's can hold one by one.  With
``fallback``, :func:`functorch_region` cuts such a region out as a ``GraphModule`` of its own,
which PyTorch runs as one opaque op between taskmap's kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx

#: functorch's bookkeeping calls that open and close a transform's level
_OPEN = frozenset({"_vmap_increment_nesting", "_grad_increment_nesting", "_jvp_increment_nesting",
                   "_func_increment_nesting"})
_CLOSE = frozenset({"_vmap_decrement_nesting", "_grad_decrement_nesting", "_jvp_decrement_nesting",
                    "_func_decrement_nesting"})
#: functorch calls with no effect on values that dynamo puts before a region
NO_OPS = frozenset({"lazy_load_decompositions"})


def is_functorch(target: object) -> bool:
    return str(getattr(target, "__module__", "")).startswith(("torch._C._functorch", "torch._functorch"))


def opens(node: torch.fx.Node) -> bool:
    return is_functorch(node.target) and getattr(node.target, "__name__", "") in _OPEN


@dataclass(frozen=True)
class Region:
    """The nodes from a level's opening to its closing; the values they read from before
    (``inputs``, the module's placeholders in order) and those read after (``outputs``)."""

    nodes: tuple[torch.fx.Node, ...]
    inputs: tuple[torch.fx.Node, ...]
    outputs: tuple[torch.fx.Node, ...]
    module: torch.fx.GraphModule


def functorch_region(start: torch.fx.Node) -> Region | None:
    """The region that ``start`` (a level's opening) begins; None when it is not closed."""
    nodes, depth, node = [], 0, start
    while node.op != "output":
        nodes.append(node)
        name = getattr(node.target, "__name__", "") if is_functorch(node.target) else ""
        depth += (name in _OPEN) - (name in _CLOSE)
        if depth == 0:
            break
        node = node.next
    if depth:
        return None
    inside = set(nodes)
    inputs = tuple(dict.fromkeys(a for n in nodes for a in n.all_input_nodes if a not in inside))
    outputs = tuple(n for n in nodes if any(u not in inside for u in n.users))
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    for x in inputs:
        env[x] = graph.placeholder(x.name)
        env[x].meta = dict(x.meta)
    for n in nodes:
        env[n] = graph.node_copy(n, env.__getitem__)
    graph.output(tuple(env[o] for o in outputs))
    return Region(tuple(nodes), inputs, outputs, torch.fx.GraphModule(start.graph.owning_module or {}, graph))


__all__ = ["NO_OPS", "Region", "functorch_region", "is_functorch", "opens"]
