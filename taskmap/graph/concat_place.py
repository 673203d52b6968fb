"""Concatenations at batch > 1 without a copy: each input's kernel writes its result straight into
its range of the concatenation's output.

At batch 1 a channel concat's inputs are contiguous ranges of its output, and the runtime only
carves their buffers out of it (:mod:`taskmap.runtime.concat_inplace`).  With leading dimensions
above 1 an input's range is strided — image ``n`` of input ``i`` starts at ``n * C * H * W +
offset_i * H * W`` — so the kernel that computes the input must itself write with the larger
image stride.  The lowering does that by :func:`taskmap.fusion.place`: the producer kernel's
output parameter, viewed as the launch views it (``(N, c_i, H * W)``, ``(N, c_i, H, W)``, ...),
is replaced by the concat's output viewed alike, every store shifted by ``offset_i`` along the
concatenated dimension.  Then the concat's copy — a read and a write of the whole tensor — is
dropped.

A concat qualifies when each input is the single output of another group, read by that concat
alone (:func:`concat_inputs`: their kernels wait to be built), and the concat is lowered as a
group of concats only — standalone, or split off a consumer whose fusion refused it —, its
output not a graph output (:func:`concat_parts`; Inception's nested concats along one axis
included).  The producers' kernels are then placed (:func:`place_group`); if any one cannot be
(a kernel that reads its output back, a launch view that merges the concatenated dimension with
others, a split-K chain that writes the output in two launches), every input keeps its buffer
and the copy stays.  A concat fused into its consumer needs neither.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..backends import Target
from ..backends.clike import written_tensors
from ..compute.nodes import tensor_input
from ..errors import FusionError
from ..fusion import place
from .ir import Graph, Op, Tensor
from .kernel_cache import derived_kernel
from .kinds import OpKind
from .lower import KernelGroup
from .partition import FusionGroup


@dataclass(frozen=True)
class Part:
    """``tensor`` lives at ``offset`` along ``axis`` of ``into`` (a concat's output)."""

    tensor: Tensor
    into: Tensor
    axis: int
    offset: int


def concat_inputs(graph: Graph, groups: list[FusionGroup]) -> set[Tensor]:
    """The tensors that a concat with leading dimensions above 1 alone reads and that one group
    computes as its single output: those whose kernels may be placed (decided at the concat's
    group, :func:`concat_parts`)."""
    readers: dict[Tensor, list[Op]] = {}
    for op in graph.ops:
        for t in op.inputs:
            readers.setdefault(t, []).append(op)
    made_by = {t: g for g in groups for t in g.outputs}
    keep = {*graph.outputs, *graph.inputs}
    return {t for t, ops in readers.items()
            if len(ops) == 1 and ops[0].kind is OpKind.CONCAT and t not in keep and t.data is None
            and t in made_by and made_by[t].outputs == (t,) and made_by[t].last.kind is not OpKind.CONCAT
            and t.dtype == ops[0].output.dtype and math.prod(t.shape[:ops[0].attrs.axis]) > 1}


def concat_parts(group: FusionGroup, graph: Graph) -> list[Part] | None:
    """The parts of a group of concats only (a standalone concat, or the concats a consumer's
    fusion refused) when each may be written in place: its output is not a graph output."""
    if not group.ops or any(op.kind is not OpKind.CONCAT for op in group.ops):
        return None
    root = group.last
    if root.output in graph.outputs:
        return None
    parts = _parts(root, 0, {op.output: op for op in group.ops}, root.attrs.axis)
    if parts is None or len({t for t, _ in parts}) != len(parts):
        return None
    return [Part(t, root.output, root.attrs.axis, o) for t, o in parts]


def _parts(op: Op, offset: int, inside: dict[Tensor, Op], axis: int) -> list[tuple[Tensor, int]] | None:
    """The tensors concat ``op`` copies (through the concats of its own group), each with its
    offset along ``axis``; None when a nested concat runs along another axis."""
    if op.attrs.axis != axis:
        return None
    out: list[tuple[Tensor, int]] = []
    for u in op.inputs:
        if u in inside:
            inner = _parts(inside[u], offset, inside, axis)
            if inner is None:
                return None
            out += inner
        else:
            out.append((u, offset))
        offset += u.shape[axis]
    return out


def place_group(kg: KernelGroup, part: Part, target: Target) -> KernelGroup | None:
    """``kg`` (which computes ``part.tensor``) writing inside ``part.into`` instead; None when its
    kernels cannot (see the module docstring)."""
    t = part.tensor
    launches = kg.launches
    hits = [i for i, (_, args, _) in enumerate(launches) if t in args]
    if kg.kernel is None or len(hits) != 1:
        return None
    i = hits[0]
    kernel, args, shapes = launches[i]
    params = kernel.func.params
    if args.count(t) != 1 or len(args) != len(params):
        return None
    j = args.index(t)
    if id(params[j]) not in written_tensors(kernel.module):
        return None
    view = tuple(shapes[j] or t.shape)
    geometry = _geometry(view, t.shape, part)
    if geometry is None:
        return None
    into_shape, offset = geometry
    names = {p.name for p in params}
    name = next(n for n in (f"placed{k or ''}" for k in range(len(names) + 1)) if n not in names)
    into = tensor_input(name, t.dtype, into_shape)
    try:
        placed = derived_kernel(kernel, ("placed", params[j].name, name, into_shape, offset, view),
                                lambda: place(kernel, params[j].name, into, offset, view), target)
    except FusionError:
        return None
    new_args = args[:j] + (part.into,) + args[j + 1:]
    new_shapes = shapes[:j] + (into_shape,) + shapes[j + 1:]
    if i == 0:
        return replace(kg, kernel=placed, args=new_args, shapes=new_shapes, into=part.into)
    then = list(kg.then)
    then[i - 1] = replace(then[i - 1], kernel=placed, args=new_args, shapes=new_shapes)
    return replace(kg, then=tuple(then), into=part.into)


def _geometry(view: tuple[int, ...], shape: tuple[int, ...], part: Part
              ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The concat's output viewed as the launch views ``part.tensor`` (``view``), and the offset
    of the part in it: ``view`` must keep the concatenated dimension whole, with the dimensions
    before it and those after it each regrouped among themselves."""
    a = part.axis
    outer, inner = math.prod(shape[:a]), math.prod(shape[a + 1:])
    for k, d in enumerate(view):
        if d == shape[a] and math.prod(view[:k]) == outer and math.prod(view[k + 1:]) == inner:
            into = view[:k] + (part.into.shape[a],) + view[k + 1:]
            return into, (0,) * k + (part.offset,) + (0,) * (len(view) - k - 1)
    return None


__all__ = ["Part", "concat_inputs", "concat_parts", "place_group"]
