"""Slices without a copy: a group that only slices and reshapes one tensor, reading one
contiguous range of it, becomes a view of that tensor's buffer at a byte offset.

A slice along an axis whose leading dimensions are all 1 (``x[t]`` of a time-major sequence,
the channels of a batch-1 NCHW tensor, ``chunk`` along the first axis) reads a contiguous range
of its input, and a reshape keeps it one.  Such a group needs no kernel: the runtime makes its
result a view of the input's buffer (:mod:`taskmap.runtime.views`), and the kernels that read it
take that view as any other array.  The recurrent layers unrolled by the PyTorch frontend read
each step's slice of the input projection so: every step's kernels are then the same, compiled
once, where a copy kernel per step would differ from the others by its offset alone.

A group qualifies when its ops (slices with step 1, reshapes) form one chain from a tensor that
a step of the graph computes (not a graph input or a constant, which the runtime does not plan),
its result is not a graph output (returned arrays own their memory), and the range starts
:data:`ALIGN` bytes aligned, as a buffer of its own would (vector loads, a GPU's 16-byte accesses).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from .ir import Graph, Op, Tensor
from .kinds import OpKind
from .partition import FusionGroup, GroupKind

#: Every view starts this many bytes into its source's buffer, a multiple of it.
ALIGN = 64

#: A view: the tensor whose buffer it lies in and its byte offset there.
View = tuple[Tensor, int]


def contiguous_range(ops: Sequence[Op]) -> View | None:
    """The source and byte offset of the range that the chain ``ops`` (slices with step 1 or of
    one element, reshapes; each reading the previous one's result) reads; None when it is not a
    chain of such ops or the range is not contiguous."""
    if not ops or any(op.kind not in (OpKind.SLICE, OpKind.RESHAPE) or len(op.inputs) != 1 or len(op.outputs) != 1
                      for op in ops):
        return None
    src = t = ops[0].inputs[0]
    offset = 0
    for op in ops:
        if op.inputs[0] is not t:
            return None
        if op.kind is OpKind.SLICE:
            a = op.attrs
            if math.prod(t.shape[:a.axis]) != 1 or (a.step != 1 and a.length > 1):
                return None
            offset += a.start * math.prod(t.shape[a.axis + 1:])
        t = op.output
    return src, offset * src.dtype.nbytes


def view_groups(graph: Graph, groups: Sequence[FusionGroup]) -> dict[int, View]:
    """The groups (by index) whose result is a view (see the module docstring): each one's source
    tensor and byte offset."""
    outputs, inputs = set(graph.outputs), set(graph.inputs)
    views: dict[int, View] = {}
    for i, g in enumerate(groups):
        if g.kind is GroupKind.ANCHORED or len(g.outputs) != 1:
            continue
        found = contiguous_range(g.ops)
        if found is None:
            continue
        src, offset = found
        out = g.outputs[0]
        if src.data is None and src not in inputs and out not in outputs and out.numel and offset % ALIGN == 0 \
                and out.dtype == src.dtype:
            views[i] = found
    return views


__all__ = ["ALIGN", "View", "contiguous_range", "view_groups"]
