"""Lowering fusion groups to kernels: what the runtime launches for a graph.

``lower_graph(graph, target)`` partitions the graph (:mod:`.partition`) and gives one
:class:`KernelGroup` per group, in a topological order:

* an **anchored** group (matmul / linear / conv2d with prologues and an epilogue) becomes ONE
  kernel by post-scheduling fusion (:mod:`.lower_anchor`); when fusion is refused
  (:class:`~taskmap.errors.FusionError`) the group is split — the anchor alone (the template,
  unfused), each prologue and the epilogue as injective groups — and the reason is kept in
  ``fallback``;
* an anchored group around a reduction (sum / mean / max / min / prod, global average pool)
  and an **injective** group become one rule-based kernel of their composed compute
  definitions;
* an anchored group around a **template anchor** (softmax, log_softmax, layer_norm, pooling,
  depthwise conv2d, attention: :mod:`.lower_template`) becomes ONE kernel of the op's template
  with its prologues and epilogue spliced in; when fusion is refused the group is split as
  above (the template alone is still one prepared kernel launch);
* a 1x1-convolution group whose result only a depthwise convolution reads, and that depthwise
  group, become ONE kernel together (:mod:`.lower_pwdw`, CPU): :func:`lowered` gives the pair's
  launch at the depthwise group and none at the other;
* a group that only slices and reshapes one contiguous range of a tensor is a **view** of that
  tensor's buffer (:mod:`.views`: ``view`` is the tensor and the byte offset; no kernel);
* a **single** op that is not injective and has no template lowering (PyTorch fallback,
  shapes / dtypes / targets the lowerings do not take) is run by its ``taskmap.ops`` runner
  (``kernel is None``).

A kernel group's ``args`` are, per kernel parameter in order, a graph tensor (viewed as
``shapes[i]``), a :class:`~.lower_anchor.Workspace` (scratch shared by all kernels: each slot
as large as the largest request), :class:`~.lower_anchor.Zeros` or a
:class:`~.lower_template.Scalar`.  It writes ``outputs`` — or, placed by :mod:`.concat_place`,
its range of a concatenation's output (``into``), which several groups then fill.
"""
from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..backends import Target, TargetKind
from ..compute.nodes import dag_str, graph_inputs
from ..errors import FusionError, UnsupportedError
from ..runtime.kernel import Kernel
from ..schedule.rule_based import schedule
from .attrs import BinaryFn
from .ir import Graph, Op, Tensor
from .kernel_cache import cached_kernel
from .lower_anchor import (
    AnchorPlan,
    Arg,
    Workspace,
    Zeros,
    anchor_problem,
    compose,
    fusable,
    gemm_takes_prologue,
    kernel_shape,
    plan_anchor,
)
from .lower_reduce import reduction_fusable
from .lower_pwdw import merged, pointwise_depthwise_pairs
from .lower_template import Scalar, plan_problem, plan_template, template_fusable, template_prologue_inputs
from .kinds import OpKind
from .passes import debug_enabled
from .views import View, view_groups
from .partition import (
    FusionGroup,
    GroupKind,
    default_prologue_inputs,
    groups_str,
    partition,
)


@dataclass(eq=False)
class KernelGroup:
    """One launch of the compiled graph (see the module docstring)."""

    group: FusionGroup
    kernel: Kernel | None
    args: tuple[Arg, ...] = ()
    shapes: tuple[tuple[int, ...] | None, ...] = ()
    fallback: str = ""
    then: tuple[AnchorPlan, ...] = ()     # more launches of this step (split-K's reduction)
    into: Tensor | None = None            # writes its result inside this concat's output (.concat_place)
    view: View | None = None              # no kernel: a view of this tensor at this byte offset (.views)

    @classmethod
    def of(cls, group: FusionGroup, plan: AnchorPlan, fallback: str = "") -> "KernelGroup":
        """The group run as ``plan``'s launches."""
        return cls(group, plan.kernel, plan.args, plan.shapes, fallback, plan.then)

    @property
    def launches(self) -> tuple[tuple[Kernel, tuple[Arg, ...], tuple[tuple[int, ...] | None, ...]], ...]:
        """``(kernel, args, shapes)`` of each launch of the step, in order (none for a runner)."""
        if self.kernel is None:
            return ()
        return ((self.kernel, self.args, self.shapes), *((p.kernel, p.args, p.shapes) for p in self.then))

    @property
    def name(self) -> str:
        return self.group.name

    @property
    def ops(self) -> tuple[Op, ...]:
        return self.group.ops

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        return self.group.outputs if self.into is None else (self.into,)

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        return self.group.inputs

    @property
    def fused(self) -> bool:
        """Whether several ops run as this one kernel."""
        return self.kernel is not None and len(self.group.ops) > 1

    def __repr__(self) -> str:
        how = "view" if self.view is not None else "runner" if self.kernel is None else \
            "+".join(k.__name__ for k, _, _ in self.launches)
        return f"KernelGroup({self.group.kind.value} {self.name} -> {how}{' (fallback)' if self.fallback else ''})"


def injective_kernel(ops: Sequence[Op], target: Target) -> tuple[Kernel, list[Tensor], tuple[int, ...]]:
    """The rule-based kernel of injective ops composed — around at most one reduction anchor
    (:mod:`.lower_reduce`) — (the last op's output is the result), the graph tensors it reads
    in parameter order (then the output), and the shape its output parameter has."""
    leaves: dict[str, Tensor] = {}
    nodes = compose(ops, {}, leaves, "x")
    root = nodes[ops[-1].output]
    used = graph_inputs(root)
    name = "_".join(dict.fromkeys(op.kind.name.lower() for op in ops))[:60]
    parts = ("rule_based", dag_str(root), repr(root.dtype), root._shape_str(), tuple(n.name for n in used), name,
             target)
    kernel = cached_kernel(parts, lambda: schedule(root, target, inputs=used, name=name), target)
    return kernel, [leaves[n.name] for n in used], tuple(root.shape)


def _injective_group(group: FusionGroup, target: Target, fallback: str = "") -> KernelGroup:
    out = group.last.output
    if out.numel == 0:
        return KernelGroup(group, None, fallback=fallback)
    kernel, reads, out_shape = injective_kernel(group.ops, target)
    shapes = (*(kernel_shape(t.shape) for t in reads), out_shape)
    return KernelGroup(group, kernel, (*reads, out), shapes, fallback)


def _split(group: FusionGroup, target: Target, reason: str) -> list[KernelGroup]:
    """The anchored group as separate kernels: prologues, the anchor alone, the epilogue."""
    out: list[KernelGroup] = []
    for _, ops in group.prologues:
        out.append(_injective_group(FusionGroup(GroupKind.INJECTIVE, ops), target, reason))
    anchor = group.anchor
    assert anchor is not None
    try:
        plan = _plan(anchor, (), (), target)
        out.append(KernelGroup.of(FusionGroup(GroupKind.SINGLE, (anchor,)), plan, reason))
    except FusionError:
        out.append(KernelGroup(FusionGroup(GroupKind.SINGLE, (anchor,)), None, fallback=reason))
    if group.epilogue:
        out.append(_injective_group(FusionGroup(GroupKind.INJECTIVE, group.epilogue), target, reason))
    return out


def lower_group(group: FusionGroup, target: Target) -> list[KernelGroup]:
    """The kernel group(s) of one fusion group (several when fusion falls back)."""
    if group.kind is GroupKind.INJECTIVE:
        return [_injective_group(group, target)]
    if group.kind is GroupKind.SINGLE:
        op = group.ops[0]
        if op.definition.category.is_injective and len(op.outputs) == 1:
            return [_injective_group(group, target)]
        if template_fusable(op, target):
            try:
                plan = plan_template(op, (), (), target)
                return [KernelGroup.of(group, plan)]
            except FusionError as e:
                return [KernelGroup(group, None, fallback=str(e))]
        return [KernelGroup(group, None)]
    if reduction_fusable(group.anchor):         # rule-based: the composed definitions, one kernel
        try:
            return [_injective_group(group, target)]
        except UnsupportedError as e:
            return _split(group, target, str(e))
    try:
        plan = _plan(group.anchor, group.prologues, group.epilogue, target)
    except FusionError as e:
        return _partly_fused(group, target, str(e))
    return [KernelGroup.of(group, plan)]


def _partly_fused(group: FusionGroup, target: Target, reason: str) -> list[KernelGroup]:
    """A group whose one kernel was refused, as two: the anchor with its prologues, then the
    epilogue as an injective kernel (softmax's CPU kernel reads its output back); or the prologues
    as injective kernels, then the anchor with its epilogue (a direct convolution reads its input
    in place: a half-precision one on the CPU keeps its float32 result's cast and ReLU fused).
    Else :func:`_split`."""
    anchor = group.anchor
    assert anchor is not None
    if group.epilogue and group.prologues:
        before = {op for _, ops in group.prologues for op in ops}
        tries = [(group.prologues, ())] if template_fusable(anchor, target) else []
        for pro, epi in (*tries, ((), group.epilogue)):
            try:
                plan = _plan(anchor, pro, epi, target)
            except FusionError:
                continue
            apart = before if epi else set(group.epilogue)
            kept = FusionGroup(GroupKind.ANCHORED, tuple(op for op in group.ops if op not in apart), anchor, pro, epi)
            injective = [_injective_group(FusionGroup(GroupKind.INJECTIVE, ops), target, reason)
                         for ops in ([ops for _, ops in group.prologues] if epi else [group.epilogue])]
            fused = KernelGroup.of(kept, plan, reason)
            return [*injective, fused] if epi else [fused, *injective]
    return _split(group, target, reason)


def _plan(anchor: Op, prologues: Sequence[tuple[int, Sequence[Op]]], epilogue: Sequence[Op],
          target: Target) -> AnchorPlan:
    """The fused kernel of an anchor: its template (:mod:`.lower_template`) or the matmul / conv
    lowering (:mod:`.lower_anchor`).  Reshapes ending the epilogue are views: the kernel writes
    the tensor before them, seen as it is, into the group's output (same elements in the same
    order) — spliced in, a reshape's index arithmetic (group norm's ``(N, C, H, W)`` to ``(N, G,
    C / G * H * W)``) kept a direct convolution's stores scalar: U-Net's first layer 0.45 -> 1.28 ms."""
    views = 0
    while views < len(epilogue) and epilogue[len(epilogue) - 1 - views].kind is OpKind.RESHAPE:
        views += 1
    if views:
        kept = epilogue[:len(epilogue) - views]
        plan = _plan(anchor, prologues, kept, target)
        return _written_into(plan, kept[-1].output if kept else anchor.output, epilogue[-1].output)
    if template_fusable(anchor, target):
        return plan_template(anchor, prologues, epilogue, target)
    return plan_anchor(anchor, prologues, epilogue, target)


def _written_into(plan: AnchorPlan, written: Tensor, into: Tensor) -> AnchorPlan:
    """``plan`` with ``into`` passed wherever it passes ``written`` (viewed as before)."""
    return replace(plan, args=tuple(into if a is written else a for a in plan.args),
                   then=tuple(_written_into(p, written, into) for p in plan.then))


def _prologue_inputs(op: Op, target: Target) -> tuple[int, ...]:
    """The inputs a prologue may be spliced into on ``target`` — none for a convolution on the
    direct template, which reads its input in place (its producer's ops then end the producer's
    kernel as epilogues — a half-precision model's widening cast —, where they would have been
    a kernel of their own).  (A bf16 product on the CPU's dot products takes reshapes only, read
    in place: other prologues are split off when it is lowered.)"""
    if target.kind is TargetKind.CPU and op.kind is OpKind.CONV2D and fusable(op, target) and \
            anchor_problem(op, target).direct is not None:
        return ()
    return tuple(default_prologue_inputs(op)) or template_prologue_inputs(op)


def _channel_scale(graph: Graph, op: Op) -> Op | None:
    """The producer of a CONV2D op's input when it is squeeze-and-excitation's ``x * scale``: a
    multiply by a computed per-channel scale (``N x C x 1 x 1``), read by this op alone and not a
    graph output.  No kernel before it can take it as an epilogue (its scale is reduced from
    ``x``): it is a prologue of the convolution or a kernel of its own
    (:func:`.lower_anchor.gemm_takes_prologue`)."""
    if op.kind is not OpKind.CONV2D:
        return None
    x = op.inputs[0]
    prod = graph.producer(x)
    readers = graph.consumers(x)
    if prod is None or prod.kind is not OpKind.BINARY or prod.attrs.fn is not BinaryFn.MUL or \
            len(prod.inputs) != 2 or len(readers) != 1 or readers[0] is not op or x.ndim != 4 or \
            any(t is x for t in graph.outputs):
        return None
    a, b = prod.inputs
    scale = b if a.shape == x.shape else a if b.shape == x.shape else None
    if scale is None or scale.data is not None or scale.shape != (*x.shape[:2], 1, 1):
        return None
    return prod


def graph_groups(graph: Graph, target: Target) -> list[FusionGroup]:
    """The graph's fusion groups for ``target`` (anchors fused where the lowering can).

    With ``TASKMAP_DEBUG=groups`` the groups are printed to stderr."""
    if target.kind is TargetKind.CPU:
        for op in graph.ops:
            scale = _channel_scale(graph, op)
            if scale is not None:
                gemm_takes_prologue(op, scale.output.numel, target)
    groups = partition(graph, lambda op: fusable(op, target) or reduction_fusable(op) or template_fusable(op, target),
                       lambda op: _prologue_inputs(op, target))
    if debug_enabled("groups"):
        print(f"// fusion groups of {graph.name}: {len(groups)}\n{groups_str(groups)}", file=sys.stderr)
    return groups


def lowered(graph: Graph, groups: Sequence[FusionGroup], target: Target) -> Iterator[list[KernelGroup]]:
    """Per fusion group of ``graph`` (in order), its kernel group(s) — none for a pointwise
    convolution fused into the depthwise one after it (:mod:`.lower_pwdw`), whose group lowers
    the pair; a view (:mod:`.views`) for a group of slices of one contiguous range."""
    pairs = pointwise_depthwise_pairs(graph, groups, target)
    producers = {j for j, _ in pairs.values()}
    views = view_groups(graph, groups)
    if pairs and debug_enabled("groups"):
        print(f"// fused 1x1 + depthwise pairs of {graph.name}: "
              + ", ".join(f"{groups[j].name} -> {groups[i].name}" for i, (j, _) in pairs.items()), file=sys.stderr)
    for i, g in enumerate(groups):
        if i in producers:
            yield []
        elif i in views:
            yield [KernelGroup(g, None, view=views[i])]
        elif i in pairs:
            j, tp = pairs[i]
            try:
                plan = plan_problem(tp, g.anchor, (), g.epilogue, target)
                yield [KernelGroup.of(merged(groups[j], g), plan)]
            except FusionError:
                yield lower_group(groups[j], target) + lower_group(g, target)
        else:
            yield lower_group(g, target)


def lower_graph(graph: Graph, target: Target) -> list[KernelGroup]:
    """Every group of ``graph`` lowered for ``target`` (see the module docstring)."""
    return [kg for kgs in lowered(graph, graph_groups(graph, target), target) for kg in kgs]


def workspace_sizes(groups: Sequence[KernelGroup]) -> dict[str, int]:
    """Elements of each workspace slot: the largest request of any kernel."""
    sizes: dict[str, int] = {}
    for kg in groups:
        for a in (a for _, args, _ in kg.launches for a in args):
            if isinstance(a, Workspace):
                sizes[a.slot] = max(sizes.get(a.slot, 1), a.words)
    return sizes


def kernel_count(groups: Sequence[KernelGroup]) -> int:
    """Launches per run: kernels plus runner calls."""
    return len(groups)


def summary(groups: Sequence[KernelGroup]) -> dict[str, Any]:
    """Counts for reports: groups, fused kernels, runner calls, fallbacks."""
    return {"launches": len(groups), "ops": sum(len(g.ops) for g in groups),
            "fused": sum(g.fused for g in groups), "runners": sum(g.kernel is None for g in groups),
            "fallbacks": [(g.name, g.fallback) for g in groups if g.fallback]}


__all__ = ["KernelGroup", "Scalar", "Workspace", "Zeros", "graph_groups", "injective_kernel", "kernel_count",
           "lower_graph", "lower_group", "lowered", "summary", "workspace_sizes"]
