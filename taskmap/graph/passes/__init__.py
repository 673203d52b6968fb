"""Graph passes, run in the order of :data:`PASSES` by :func:`optimize`.

Each pass is a ``Graph -> Graph`` function in a file of its own; it returns the same graph
when it changes nothing.  Graph inputs keep their identity and order (they are the compiled
graph's signature); outputs keep their order (a folded output may become a constant).

With ``TASKMAP_DEBUG=passes`` (comma-separated with other debug names) the graph is printed
to stderr after every pass that changed it, headed by the pass name.

The partition into fusion groups (:mod:`taskmap.graph.partition`) and the lowering of each
group to one kernel (:mod:`taskmap.graph.lower`) come after these passes.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

from ..ir import Graph
from ..printer import graph_str
from .combine_linears import combine_linears
from .cse import cse
from .dce import dce
from .fold_batch_norm import fold_batch_norm
from .fold_constants import fold_constants
from .pointwise_as_linear import pointwise_as_linear
from .reorder_pool import reorder_pool
from .simplify import simplify
from .widen_half import widen_half

GraphPass = Callable[[Graph], Graph]

#: The graph pipeline: name and pass, in order.
PASSES: tuple[tuple[str, GraphPass], ...] = (
    ("widen_half", widen_half),
    ("simplify", simplify),
    ("fold_constants", fold_constants),
    ("fold_batch_norm", fold_batch_norm),
    ("reorder_pool", reorder_pool),
    ("pointwise_as_linear", pointwise_as_linear),
    ("combine_linears", combine_linears),
    ("cse", cse),
    ("simplify_again", simplify),
    ("dce", dce),
)


def debug_enabled(name: str) -> bool:
    return name in os.environ.get("TASKMAP_DEBUG", "").split(",")


def optimize(graph: Graph, passes: tuple[tuple[str, GraphPass], ...] = PASSES) -> Graph:
    """Run ``passes`` (default: every pass of :data:`PASSES`) in order."""
    dump = debug_enabled("passes")
    for name, fn in passes:
        new = fn(graph)
        if dump and new is not graph:
            print(f"// after graph pass {name}: {len(new.ops)} ops\n{graph_str(new)}", file=sys.stderr)
        graph = new
    return graph


__all__ = ["PASSES", "GraphPass", "combine_linears", "cse", "dce", "debug_enabled", "fold_batch_norm",
           "fold_constants", "optimize", "pointwise_as_linear", "reorder_pool", "simplify", "widen_half"]
