"""Concatenations without a copy: the producers write their results into the concatenated buffer.

A ``concat`` along an axis whose leading dimensions are all 1 (channels of a batch-1 NCHW
tensor, Inception's blocks, a ``stack`` of a recurrent layer's steps) places each input in one
contiguous range of its output.  When every input (seen through the reshapes the copy kernel
makes: a stack's unsqueezes) is the single output of a kernel step of the memory plan, not
placed in another concat, and starts 64-byte aligned in the output, those kernels can write
their results straight into their ranges of the output: the concat's copy kernel — a read and a
write of the whole tensor — disappears from the steps.  Other steps may read an input too (the
next step of a recurrent layer): they read it there.

:func:`elide_concats` finds such concats and returns the steps without their copies, and for
each input slot the output slot it lives in and its byte offset there.  The memory plan
(:meth:`taskmap.runtime.graph.CompiledGraph._plan`) then gives the output its buffer from the
first producer on, and carves the inputs' views out of it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..graph.ir import Graph
from ..graph.kinds import OpKind

#: input slot -> (the concat's output slot, byte offset of the input's range in it)
Aliases = dict[int, tuple[int, int]]

#: Every input's range starts this many bytes aligned, as a buffer of its own would (vector
#: stores, a GPU's 16-byte accesses).
ALIGN = 64


def elide_concats(graph: Graph, slots: dict[Any, int], steps: Sequence[Any], constants: set[int]
                  ) -> tuple[list[Any], Aliases]:
    """``steps`` without the copy of each concat whose inputs can be written in place, and the
    aliases of those inputs (see the module docstring)."""
    keep = {slots[t] for t in (*graph.outputs, *graph.inputs)} | constants
    made_by = {op.output: op for op in graph.ops if op.kind in (OpKind.CONCAT, OpKind.RESHAPE)}
    tensor = {k: t for t, k in slots.items()}
    producer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    for i, st in enumerate(steps):
        for k in st.outputs:
            producer[k] = i
        for k in set(st.inputs):
            readers.setdefault(k, []).append(i)
    aliases: Aliases = {}
    dropped: set[int] = set()
    for i, st in enumerate(steps):
        if st.kind is not OpKind.CONCAT or st.kernel is None or not st.planned or len(st.outputs) != 1:
            continue
        out = st.outputs[0]
        parts = _parts(tensor[out], made_by, producer, slots)
        if parts is None or out in keep:
            continue
        ins = [slots[t] for t, _ in parts]
        if len(set(ins)) != len(ins) or set(ins) != set(st.inputs) or any(o % ALIGN for _, o in parts) or \
                not all(_writable(k, i, steps, producer, readers, keep, dropped, aliases) for k in ins):
            continue
        for k, (_, o) in zip(ins, parts):
            if producer[k] in dropped:          # a concat elided before, inside this one: its parts move
                for m, (host, off) in list(aliases.items()):
                    if host == k:
                        aliases[m] = (out, o + off)
            else:
                aliases[k] = (out, o)
        dropped.add(i)
    return [st for i, st in enumerate(steps) if i not in dropped], aliases


def _parts(t: Any, made_by: dict[Any, Any], producer: dict[int, int], slots: dict[Any, int]
           ) -> list[tuple[Any, int]] | None:
    """The tensors the concat of ``t`` (with the concats and reshapes fused into its step:
    Inception's nested concats, a stack's unsqueezed parts) copies, each with its byte offset in
    ``t``; None when a range is not contiguous (a leading dimension above 1) or a dtype changes."""
    op = made_by.get(t)
    if op is None or op.kind is not OpKind.CONCAT or math.prod(op.output.shape[:op.attrs.axis]) != 1 or \
            any(u.dtype != op.output.dtype for u in op.inputs):
        return None
    parts: list[tuple[Any, int]] = []
    offset = 0
    for u in op.inputs:
        v = u
        while v in made_by and made_by[v].kind is OpKind.RESHAPE and slots[v] not in producer:
            v = made_by[v].inputs[0]         # a reshape computed inside the copy kernel: the same bytes
        if v in made_by and made_by[v].kind is OpKind.CONCAT and slots[v] not in producer:
            inner = _parts(v, made_by, producer, slots)
            if inner is None:
                return None
            parts += [(w, offset + o) for w, o in inner]
        else:
            parts.append((v, offset))
        offset += u.nbytes
    return parts


def _writable(k: int, concat: int, steps: Sequence[Any], producer: dict[int, int], readers: dict[int, list[int]],
              keep: set[int], dropped: set[int], aliases: Aliases) -> bool:
    """Whether the tensor of slot ``k`` can live inside the concat's output: read by the concat
    (and maybe by other steps: the plan keeps the output's buffer as long as its parts are read),
    the only output of a planned kernel step or the output of a concat elided before (Inception's
    nested concats)."""
    i = producer.get(k)
    if i is None or k in keep or k in aliases or concat not in readers.get(k, ()):
        return False
    if i in dropped:
        return True
    st = steps[i]
    return st.planned and st.kernel is not None and st.outputs == (k,)


__all__ = ["Aliases", "elide_concats"]
