"""Partition of a graph into fusion groups (Hidet §4.2, TVM's operator classes).

A :class:`FusionGroup` becomes one kernel (or one runner call).  Kinds:

* **anchored** — an anchor op (``REDUCTION`` / ``OUT_FUSABLE`` that the lowering can fuse
  into: ``fusable(op)``) with

  - *prologues*: per anchor input that the anchor accepts a prologue on (``prologue_inputs``),
    the tree of INJECTIVE ops computing it whose intermediate results are read only inside the
    group (each such tensor has exactly one reader and is not a graph output);
  - an *epilogue*: the chain of ops after the anchor, each the only reader of the previous
    result, element-wise / broadcast in it (the chain value is not broadcast) or a reshape /
    permute (bijective; not after a reduction, whose epilogue must read it at the output's own
    index): ``relu(bn(conv(x)) + identity)``; the other operands of the chain (a bias, a
    residual) become inputs of the kernel.  Where a value has several readers, the chain goes
    on through a *diamond*: the element-wise ops from it to the first tensor they all flow into,
    their results read inside only (``y * sigmoid(y)``, GELU's tanh form in GPT-2).

* **injective** — a tree of INJECTIVE ops not absorbed by an anchor, with a single root: its
  compute definitions are composed (each op's definition reads the previous ones' nodes) and
  scheduled once by the rule-based scheduler.  A view op (:data:`VIEW_KINDS`) whose readers are
  all in the group (or in one prologue) joins it even with several readers: each recomputes its
  index map.
* **single** — one op run alone: OPAQUE ops the lowering does not fuse into (PyTorch fallback;
  attention whose operands the template cannot read in place) and other anchors the lowering
  cannot fuse into (their ``taskmap.ops`` runner), or multi-output ops.  Which anchors fuse is
  the caller's ``fusable``: :func:`taskmap.graph.lower.graph_groups` takes matmul / linear /
  conv2d, rule-based reductions and the template anchors of :mod:`.lower_template` (softmax,
  log_softmax, layer_norm, pooling, depthwise conv2d, attention).

Groups are listed in the order of their last op, which is a topological order of groups: every
tensor a group reads from outside is the last op's output of a group listed before it.
"""
from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .ir import Graph, Op, Tensor
from .kinds import OpCategory, OpKind

#: Op kinds an epilogue chain may pass through (they read the chain value bijectively).
EPILOGUE_KINDS = frozenset({OpKind.UNARY, OpKind.BINARY, OpKind.WHERE, OpKind.CAST, OpKind.BATCH_NORM,
                            OpKind.RESHAPE, OpKind.PERMUTE})


#: Op kinds inside an epilogue's diamond (several of them read one value at the same index), and
#: the most ops one may hold.
DIAMOND_KINDS = frozenset({OpKind.UNARY, OpKind.BINARY, OpKind.WHERE, OpKind.CAST})
MAX_DIAMOND = 16

#: The most inputs of a concatenation in an anchor's prologue or inside another concatenation's
#: group.  Every element read through one picks its input by a chain of selects; a wider one (the
#: stacked steps of a recurrent layer, read by the next layer's projection; the chunks of a long
#: stack) is its own group, which the runtime drops where its inputs are written in place
#: (:mod:`taskmap.runtime.concat_inplace`, nested too), and whose copy kernel, when one is
#: built, takes a few parameters rather than one per step.
MAX_PROLOGUE_CONCAT = 4

#: Index-only op kinds an injective group recomputes for each of its readers instead of writing
#: them out when all their readers are in the group (a strided slice read by two parts of one
#: concatenation: Swin's patch merging, YOLO's focus layer).
VIEW_KINDS = frozenset({OpKind.SLICE, OpKind.RESHAPE, OpKind.PERMUTE, OpKind.EXPAND})


class GroupKind(enum.Enum):
    ANCHORED = "anchored"
    INJECTIVE = "injective"
    SINGLE = "single"


@dataclass(frozen=True, eq=False)
class FusionGroup:
    """Ops that become one kernel (see the module docstring).  ``prologues[k]`` are the ops
    computing the anchor's input ``k`` (topological order); ``epilogue`` the chain after it."""

    kind: GroupKind
    ops: tuple[Op, ...]                                   # every op, in graph order
    anchor: Op | None = None
    prologues: tuple[tuple[int, tuple[Op, ...]], ...] = ()
    epilogue: tuple[Op, ...] = ()

    @property
    def last(self) -> Op:
        return self.ops[-1]

    @property
    def outputs(self) -> tuple[Tensor, ...]:
        """The graph tensors the group writes (read outside it)."""
        return self.last.outputs

    @property
    def inputs(self) -> tuple[Tensor, ...]:
        """The tensors the group reads from outside (graph inputs, constants, other groups)."""
        made = {t for op in self.ops for t in op.outputs}
        return tuple(dict.fromkeys(t for op in self.ops for t in op.inputs if t not in made))

    @property
    def name(self) -> str:
        return "+".join(op.name or op.kind.name.lower() for op in self.ops)

    def __repr__(self) -> str:
        return f"FusionGroup({self.kind.value}: {self.name})"


def default_fusable(op: Op) -> bool:
    """Anchors with a template the lowering fuses into: matmul, linear, conv2d."""
    return op.kind in (OpKind.MATMUL, OpKind.LINEAR, OpKind.CONV2D)


def default_prologue_inputs(op: Op) -> tuple[int, ...]:
    """The anchor inputs a prologue may be spliced into (matmul operands, linear's input, a
    reduction's input)."""
    return {OpKind.MATMUL: (0, 1), OpKind.LINEAR: (0,), OpKind.REDUCE: (0,),
            OpKind.ADAPTIVE_AVG_POOL2D: (0,)}.get(op.kind, ())


def _epilogue_ok(op: Op, t: Tensor, anchor: Op) -> bool:
    if op.kind not in EPILOGUE_KINDS or len(op.outputs) != 1:
        return False
    if anchor.definition.category is OpCategory.REDUCTION and op.kind in (OpKind.RESHAPE, OpKind.PERMUTE):
        return False                      # a reduction's epilogue reads it at the output's own index
    y = op.output
    if y.numel != t.numel or sum(x is t for x in op.inputs) != 1:
        return False
    if op.kind in (OpKind.RESHAPE, OpKind.PERMUTE):
        return True
    if op.kind is OpKind.BATCH_NORM and op.inputs[0] is not t:
        return False
    return y.shape == t.shape


class _Partitioner:
    def __init__(self, graph: Graph, fusable: Callable[[Op], bool],
                 prologue_inputs: Callable[[Op], Sequence[int]]) -> None:
        self.g = graph
        self.fusable, self.prologue_inputs = fusable, prologue_inputs
        self.pos = {op: i for i, op in enumerate(graph.ops)}
        self.outs = outs = set(graph.outputs)
        self.private = {t for t in graph.tensors() if t not in outs and len(graph.consumers(t)) == 1}
        self.claimed: set[Op] = set()

    def absorb(self, t: Tensor, prologue: bool = False, into_concat: bool = False) -> list[Op]:
        """The injective ops computing ``t`` that only this group reads (claimed); no concatenation
        of more than :data:`MAX_PROLOGUE_CONCAT` inputs in an anchor's ``prologue`` or read by a
        concatenation (``into_concat``)."""
        p = self.g.producer(t)
        if p is None or p in self.claimed or t not in self.private or len(p.outputs) != 1 \
                or not p.definition.category.is_injective \
                or ((prologue or into_concat) and p.kind is OpKind.CONCAT and len(p.inputs) > MAX_PROLOGUE_CONCAT):
            return []
        self.claimed.add(p)
        found = [p]
        for x in dict.fromkeys(p.inputs):
            found += self.absorb(x, prologue, p.kind is OpKind.CONCAT)
        return found

    def shared_views(self, ops: Sequence[Op]) -> list[Op]:
        """View ops (:data:`VIEW_KINDS`) whose output several of ``ops`` read and nothing else,
        with what computes their inputs (:meth:`absorb`), claimed."""
        members, found = set(ops), []
        queue = list(ops)
        while queue:
            for t in dict.fromkeys(queue.pop().inputs):
                p = self.g.producer(t)
                if p is None or p in self.claimed or p.kind not in VIEW_KINDS or len(p.outputs) != 1 \
                        or t in self.outs or not all(c in members for c in self.g.consumers(t)):
                    continue
                self.claimed.add(p)
                new = [p] + [x for u in dict.fromkeys(p.inputs) for x in self.absorb(u)]
                members.update(new)
                found += new
                queue += new
        return found

    def anchored(self, anchor: Op) -> FusionGroup:
        self.claimed.add(anchor)
        chain: list[Op] = []
        t = anchor.output
        while True:
            if t in self.private:
                c = self.g.consumers(t)[0]
                if c in self.claimed or not _epilogue_ok(c, t, anchor):
                    break
                step, t = [c], c.output
            else:
                found = self.diamond(t)
                if found is None:
                    break
                step, t = found
            chain += step
            self.claimed.update(step)
        pro = []
        for k in self.prologue_inputs(anchor):
            if anchor.inputs.count(anchor.inputs[k]) == 1:
                ops = self.absorb(anchor.inputs[k], prologue=True)
                ops += self.shared_views(ops)
                if ops:
                    pro.append((k, tuple(sorted(ops, key=self.pos.__getitem__))))
        ops = sorted([anchor, *chain, *(op for _, p in pro for op in p)], key=self.pos.__getitem__)
        return FusionGroup(GroupKind.ANCHORED, tuple(ops), anchor, tuple(pro), tuple(chain))

    def diamond(self, t: Tensor) -> tuple[list[Op], Tensor] | None:
        """The element-wise ops from ``t`` (read by several of them) to the first tensor all of
        them flow into — ``x * sigmoid(x)``, the tanh form of GELU — and that tensor; None when
        a path leaves (a graph output, an op of another kind, shape or group) first."""
        if t in self.outs or not self.g.consumers(t):
            return None
        region: list[Op] = []
        inside = {t}
        queue = sorted(set(self.g.consumers(t)), key=self.pos.__getitem__)
        while queue and len(region) < MAX_DIAMOND:
            op = queue.pop(0)
            y = op.output if len(op.outputs) == 1 else None
            if op in self.claimed or op.kind not in DIAMOND_KINDS or y is None or y.shape != t.shape \
                    or any(x in inside and x.shape != t.shape for x in op.inputs):
                return None
            region.append(op)
            inside.add(y)
            if all(c in region for x in inside if x is not y for c in self.g.consumers(x)):
                return region, y          # every other tensor of the region is read inside it only
            if y in self.outs:
                return None
            queue = sorted(set(queue) | set(self.g.consumers(y)), key=self.pos.__getitem__)
        return None

    def run(self) -> list[FusionGroup]:
        groups: list[FusionGroup] = []
        for op in self.g.ops:
            if op not in self.claimed and op.definition.category.is_anchor and len(op.outputs) == 1 \
                    and self.fusable(op):
                groups.append(self.anchored(op))
        for op in reversed(self.g.ops):
            if op in self.claimed:
                continue
            if op.definition.category.is_injective and len(op.outputs) == 1:
                self.claimed.add(op)
                ops = [op] + [x for t in dict.fromkeys(op.inputs)
                              for x in self.absorb(t, into_concat=op.kind is OpKind.CONCAT)]
                ops += self.shared_views(ops)
                groups.append(FusionGroup(GroupKind.INJECTIVE, tuple(sorted(ops, key=self.pos.__getitem__))))
            else:
                self.claimed.add(op)
                groups.append(FusionGroup(GroupKind.SINGLE, (op,)))
        groups.sort(key=lambda grp: self.pos[grp.last])
        return groups


def partition(graph: Graph, fusable: Callable[[Op], bool] = default_fusable,
              prologue_inputs: Callable[[Op], Sequence[int]] = default_prologue_inputs) -> list[FusionGroup]:
    """The graph's fusion groups in a topological order (see the module docstring).

    ``fusable(op)`` says which anchors take prologues / epilogues (the others run alone);
    ``prologue_inputs(op)`` which of an anchor's inputs accept a prologue."""
    return _Partitioner(graph, fusable, prologue_inputs).run()


def groups_str(groups: Sequence[FusionGroup]) -> str:
    """One line per group: its kind and ops (anchor in brackets)."""
    lines = []
    for g in groups:
        names = [f"[{op.name}]" if op is g.anchor else op.name for op in g.ops]
        lines.append(f"{g.kind.value:9s} {' '.join(names)}")
    return "\n".join(lines)


__all__ = ["EPILOGUE_KINDS", "VIEW_KINDS", "FusionGroup", "GroupKind", "default_fusable", "default_prologue_inputs",
           "groups_str", "partition"]
