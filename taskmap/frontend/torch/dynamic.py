"""Dynamic sizes under ``torch.compile``: one set of kernels for every size.

When dynamo marks a size dynamic (at its second shape, or with ``dynamic=True``) the graph it
hands over has symbolic sizes.  taskmap's kernels are compiled for static shapes, so there are
two ways to run such a graph (``options={"dynamic_sizes": ...}``):

* ``"specialize"``: a graph per concrete shape (:class:`.dynamo.DynamoGraph`).  Right when a
  few shapes repeat (batches of a few sequence lengths); every new shape pays a compile.
* ``"split"``: :class:`SplitGraph`.  The calls that involve a symbolic size — whose result's
  shape is symbolic, or that take a symbolic size or a tensor of symbolic shape — run in
  PyTorch; the regions between them have static shapes and are compiled once each.  A
  transformer's decode step is the case: only the key / value cache's concatenation and the
  attention over it depend on the cache length, the projections, MLPs and norms (nearly all
  the work) do not — so a generation compiles once instead of once per token.
* ``"auto"`` (the default): split when the compiled regions hold at least :data:`SPLIT_SHARE`
  of the graph's estimated work at the sizes of the call that compiled it, else specialize.

A graph that writes in place (``out[:, t] = v``, ``x.add_(y)``) is always specialized
(:func:`writes`).

Regions are formed as early as their inputs allow (a call joins the first region of its kind
after everything it reads), so consecutive layers' static parts share one region.  A region
without real work (views, indexing, size arithmetic) or with less than :data:`MIN_SHARE` of it
runs in PyTorch too.
``TASKMAP_DEBUG=dynamic`` prints the choice and the regions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx

from .importer import writes_in_place

#: ``"auto"`` splits when the static regions hold at least this share of the estimated work.
SPLIT_SHARE = 0.8
#: A static region with less of the work than this runs in PyTorch (a call costs more than it).
MIN_SHARE = 0.005
MODES = ("auto", "split", "specialize")

_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
#: calls that only re-view, index or do size arithmetic: a region of these alone is not compiled
_VIEWS = {"view", "reshape", "transpose", "permute", "contiguous", "unsqueeze", "squeeze", "flatten",
          "expand", "size", "dim", "t", "split", "chunk", "unbind", "getitem", "to", "type_as", "dropout",
          "clone", "detach", "numel", "float", "half", "bfloat16"}
#: matmul-like calls: which tensor argument's last dimension is the reduction
_MATMULS = {"linear": 0, "addmm": 1, "mm": 0, "matmul": 0, "bmm": 0, "baddbmm": 1}


def symbolic(value: Any) -> bool:
    """Whether ``value`` (a node's ``example_value``) is or has a symbolic size."""
    if isinstance(value, _SYM):
        return True
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in value.shape)
    if isinstance(value, (list, tuple)):
        return any(symbolic(v) for v in value)
    return False


def _hint(d: Any) -> int:
    """A size at the call that compiled the graph (a symbol's hint)."""
    if isinstance(d, torch.SymInt):
        hint = d.node.hint
        return int(hint) if hint is not None else 1
    return int(d)


def _numel(value: Any) -> int:
    return math.prod(_hint(d) for d in value.shape) if isinstance(value, torch.Tensor) else 0


def _name(node: torch.fx.Node) -> str:
    return str(node.target) if node.op == "call_method" else getattr(node.target, "__name__", str(node.target))


def work(node: torch.fx.Node) -> int:
    """Estimated multiply-adds of a call (its result's elements for anything but matmuls,
    convolutions and attention)."""
    out = node.meta.get("example_value")
    name = _name(node)
    tensors = [a.meta.get("example_value") for a in node.args if isinstance(a, torch.fx.Node)]
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    if name in _MATMULS and len(tensors) > _MATMULS[name]:
        a = tensors[_MATMULS[name]]
        return _numel(out) * (_hint(a.shape[-1]) if a.dim() else 1)
    if name.startswith("conv") and len(tensors) >= 2:
        w = tensors[1]
        return _numel(out) * (_numel(w) // max(_hint(w.shape[0]), 1))
    if name == "scaled_dot_product_attention" and len(tensors) >= 2:
        return 2 * _numel(tensors[0]) * _hint(tensors[1].shape[-2])
    return _numel(out) if isinstance(out, torch.Tensor) else 0


def writes(gm: torch.fx.GraphModule) -> bool:
    """Whether any call of ``gm`` writes in place.  Such a graph is not split: a later reader of
    the written tensor is tied to it by program order only (fx records no edge from the write),
    and a view made in one region and written in another would not reach its base."""
    return any(writes_in_place(n, gm.get_submodule(str(n.target)) if n.op == "call_module" else n.target)
               for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))


def is_dynamic(gm: torch.fx.GraphModule) -> bool:
    """Whether any of ``gm``'s inputs has a symbolic size."""
    return any(symbolic(n.meta.get("example_value")) for n in gm.graph.nodes if n.op == "placeholder")


@dataclass
class Region:
    """Consecutive calls of one kind: ``static`` or not; ``compiled`` when static and worth a
    compiled graph (set by :func:`regions`)."""

    index: int
    static: bool
    nodes: list[torch.fx.Node]
    work: int = 0
    compiled: bool = False


def _real(node: torch.fx.Node) -> bool:
    return node.op == "call_module" or node.op in ("call_function", "call_method") and _name(node) not in _VIEWS


def regions(gm: torch.fx.GraphModule) -> list[Region]:
    """``gm``'s calls in regions: even indices static, odd ones dynamic, each call in the first
    region of its kind after all it reads (as soon as possible)."""
    stage: dict[torch.fx.Node, int] = {}
    dynamic: set[torch.fx.Node] = set()          # nodes whose value has a symbolic size
    out: dict[int, Region] = {}
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "get_attr"):
            if node.op == "placeholder" and symbolic(node.meta.get("example_value")):
                dynamic.add(node)
            continue
        if node.op == "output":
            continue
        meta = node.meta.get("example_value")
        inputs = node.all_input_nodes
        is_static = "example_value" in node.meta and not symbolic(meta) and not any(n in dynamic for n in inputs)
        if symbolic(meta) or "example_value" not in node.meta:
            dynamic.add(node)
        k = 0
        for n in inputs:
            s = stage.get(n)
            if s is not None:
                k = max(k, s if (s % 2 == 0) == is_static else s + 1)
        if (k % 2 == 0) != is_static:
            k += 1
        stage[node] = k
        region = out.setdefault(k, Region(k, is_static, []))
        region.nodes.append(node)
        region.work += work(node)
    parts = [out[k] for k in sorted(out)]
    total = sum(r.work for r in parts)
    for r in parts:
        r.compiled = r.static and any(_real(n) for n in r.nodes) and r.work >= MIN_SHARE * total
    return parts


def describe(parts: Sequence[Region], mode: str) -> str:
    """What :func:`regions` made of a graph, one line per region (``TASKMAP_DEBUG=dynamic``)."""
    total = sum(r.work for r in parts) or 1
    lines = [f"taskmap: a graph with symbolic sizes: {mode}; the compiled regions would hold "
             f"{100 * static_share(parts):.1f}% of the estimated work"]
    for r in parts:
        kinds = sorted({_name(n) for n in r.nodes if n.op != "get_attr"})
        where = "compiled" if r.compiled else "PyTorch "
        lines.append(f"  region {r.index:3} {where} {len(r.nodes):4} calls {100 * r.work / total:5.1f}%  "
                     f"{', '.join(kinds)[:100]}")
    return "\n".join(lines)


def static_share(parts: Sequence[Region]) -> float:
    total = sum(r.work for r in parts)
    return sum(r.work for r in parts if r.compiled) / total if total else 0.0


def _subgraph(gm: torch.fx.GraphModule, region: Region, used_later: set[torch.fx.Node]
              ) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[torch.fx.Node]]:
    """``region`` as a GraphModule: its inputs (values from outside it, in first-use order) as
    placeholders, constants (``get_attr``) copied in, and a tuple of what is read after it."""
    graph = torch.fx.Graph()
    attrs: dict[str, Any] = {}
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    inputs: list[torch.fx.Node] = []
    members = set(region.nodes)

    def outside(n: torch.fx.Node) -> torch.fx.Node:
        if n not in env:
            if n.op == "get_attr":
                attrs[str(n.target)] = attr(gm, str(n.target))
                env[n] = graph.get_attr(str(n.target))
            else:
                env[n] = graph.placeholder(n.name)
                inputs.append(n)
            env[n].meta = dict(n.meta)
        return env[n]

    for node in region.nodes:
        if node.op == "call_module":
            attrs[str(node.target)] = gm.get_submodule(str(node.target))
        for n in node.all_input_nodes:
            if n not in members:
                outside(n)
        env[node] = graph.node_copy(node, lambda n: env[n])
    outputs = [n for n in region.nodes if n in used_later]
    graph.output(tuple(env[n] for n in outputs))
    return torch.fx.GraphModule(attrs, graph), inputs, outputs


def attr(root: Any, target: str) -> Any:
    """The attribute a ``get_attr`` target names (dotted)."""
    for part in target.split("."):
        root = getattr(root, part)
    return root


class SplitGraph:
    """``gm`` (dynamo's graph with symbolic sizes; frozen constants as ``get_attr``) run region
    by region: static regions by the runners ``compile_region(sub_gm)`` makes (compiled once,
    at their first call), the others by PyTorch."""

    def __init__(self, gm: torch.fx.GraphModule, compile_region: Callable[[torch.fx.GraphModule], Callable]) -> None:
        self.gm = gm
        self.regions = regions(gm)
        output = next(n for n in gm.graph.nodes if n.op == "output")
        where = {n: r.index for r in self.regions for n in r.nodes}
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.steps: list[tuple[Callable, list[torch.fx.Node], list[torch.fx.Node], bool]] = []
        for region in self.regions:
            later = {n for n in region.nodes
                     if any(where.get(u) != region.index for u in n.users)}
            sub, inputs, outputs = _subgraph(gm, region, later)
            run = compile_region(sub) if region.compiled else sub
            self.steps.append((run, inputs, outputs, region.compiled))
        self.output = output

    @property
    def compiled(self) -> list[Callable]:
        """The runners of the compiled regions."""
        return [s[0] for s in self.steps if s[3]]

    def __call__(self, *args: Any) -> Any:
        env: dict[torch.fx.Node, Any] = dict(zip(self.placeholders, args))
        for run, inputs, outputs, _ in self.steps:
            values = run(*[env[n] for n in inputs])
            env.update(zip(outputs, values))
        return torch.fx.node.map_arg(self.output.args[0],
                                     lambda n: env[n] if n in env else attr(self.gm, str(n.target)))


__all__ = ["MODES", "SPLIT_SHARE", "Region", "SplitGraph", "attr", "describe", "is_dynamic", "regions", "static_share",
           "symbolic", "work", "writes"]
