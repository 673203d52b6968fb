"""Facts about compute DAGs that scheduling and fusion need.

* :func:`inline` substitutes every injective ``compute`` node into its consumers: the result
  reads only inputs and reductions.
* :func:`has_reduction`, :func:`is_injective` (no reduction anywhere), :func:`is_bijective`
  (injective, and each element of each input feeds exactly one output element: elementwise
  operators, transpose, reshape — not broadcast, slice or concat).
* :func:`index_map` (output index -> input index, when an injective node reads an input at one
  index) and :func:`inverse_index_map` (input index -> output index, for bijective reads).

Bijectivity of a read ``x[f(i)]`` is decided exactly for static shapes by :mod:`.indexmap`'s
mixed-radix analysis (a transpose of a reshape of a transpose is recognised); with symbolic
sizes only structural permutations of the axes are.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..ir import expr as E
from ..ir.expr import Expr, Var
from ..ir.functor import collect, substitute
from ..ir.simplify import simplify_expr
from .indexmap import IndexMap, invert_read
from .nodes import ComputeNode, ReduceNode, TensorInput, TensorNode, walk


def has_reduction(node: TensorNode) -> bool:
    """Whether some node of the DAG is a reduction."""
    return any(isinstance(n, ReduceNode) for n in walk(node))


def is_injective(node: TensorNode) -> bool:
    """No reduction anywhere: each output element is one expression of input elements."""
    return not has_reduction(node)


@dataclass(frozen=True)
class Inlined:
    """A node with its injective producers substituted in: ``value`` at ``axes`` reads inputs and
    reductions only (``reduce_axes`` are set for a reduction node)."""

    node: TensorNode
    axes: tuple[Var, ...]
    value: Expr
    reduce_axes: tuple[Var, ...] = ()

    def reads(self) -> list[E.Load]:
        return collect(self.value, E.Load)


def _simplify_indices(value: Expr) -> Expr:
    """Index expressions simplified (so that equal reads look equal)."""
    loads = collect(value, E.Load)
    env: dict[Any, Any] = {}
    for ld in loads:
        new = tuple(simplify_expr(i) for i in ld.indices)
        if any(a is not b for a, b in zip(new, ld.indices)):
            env[ld] = E.Load(ld.tensor, new)
    return substitute(value, env) if env else value


def inline(node: TensorNode, keep: Sequence[TensorNode] = ()) -> Inlined:
    """``node``'s value with every ``compute`` producer substituted (not those in ``keep``)."""
    kept = {id(n) for n in keep}
    memo: dict[int, Expr] = {}
    by_var: dict[int, TensorNode] = {id(n.var): n for n in walk(node)}

    def expand(value: Expr) -> Expr:
        env: dict[Any, Any] = {}
        for ld in collect(value, E.Load):
            producer = by_var.get(id(ld.tensor))
            if isinstance(producer, ComputeNode) and id(producer) not in kept and ld not in env:
                body = memo.get(id(producer))
                if body is None:
                    body = memo[id(producer)] = expand(producer.value)
                index = tuple(expand(i) for i in ld.indices)    # producers read inside the index too
                env[ld] = substitute(body, dict(zip(producer.axes, index)))
        return substitute(value, env) if env else value

    if isinstance(node, TensorInput):
        axes = tuple(Var(f"i{k}", E.i32) for k in range(node.ndim))
        return Inlined(node, axes, node[axes] if axes else E.Load(node.var, ()))
    value = _simplify_indices(expand(node.value))  # type: ignore[attr-defined]
    red = node.reduce_axes if isinstance(node, ReduceNode) else ()
    return Inlined(node, node.axes, value, red)  # type: ignore[attr-defined]


def bounded_view(node: TensorNode) -> TensorNode:
    """``node`` as one compute over what it reads (its compute producers inlined), every read's
    index simplified knowing each axis lies in ``0 .. extent - 1``: a chain of slices, reshapes
    and permutes then collapses to the affine index of a strided read where it is one (without
    the ranges a reshape's ``//`` and ``%`` stay, and a kernel the view is spliced into computes
    them per element).  Other nodes (inputs, reductions, symbolic extents) come back as they are."""
    if not isinstance(node, ComputeNode) or not all(isinstance(d, int) for d in node.shape):
        return node
    inl = inline(node)
    bounds = {ax: (0, ext - 1) for ax, ext in zip(inl.axes, node.shape)}
    env: dict[Any, Any] = {}
    for ld in inl.reads():
        new = tuple(simplify_expr(i, bounds) for i in ld.indices)
        if any(a is not b for a, b in zip(new, ld.indices)):
            env[ld] = E.Load(ld.tensor, new)
    value = substitute(inl.value, env) if env else inl.value
    by_var = {id(n.var): n for n in walk(node)}
    reads: dict[int, TensorNode] = {}
    for ld in collect(value, E.Load):
        reads.setdefault(id(ld.tensor), by_var[id(ld.tensor)])
    return ComputeNode(node.name, node.dtype, node.shape, inl.axes, value, tuple(reads.values()))


def _reads_of(node: TensorNode, inp: TensorNode) -> tuple[Inlined, list[E.Load]]:
    if not is_injective(node):
        raise ValueError(f"{node.name} has a reduction: index maps are defined for injective nodes only")
    if inp not in [n for n in walk(node)]:
        raise ValueError(f"{inp.name} is not part of the compute definition of {node.name}")
    inl = inline(node, keep=[inp])
    return inl, [ld for ld in inl.reads() if ld.tensor is inp.var]


def index_map(node: TensorNode, inp: TensorNode) -> IndexMap | None:
    """Output index of ``node`` -> the index of ``inp`` it reads, when every read of ``inp`` (after
    inlining) uses the same index; None when ``inp`` is read at several indices or not at all."""
    inl, loads = _reads_of(node, inp)
    distinct = {ld.indices for ld in loads}
    if len(distinct) != 1:
        return None
    return IndexMap(inl.axes, loads[0].indices)


def inverse_index_map(node: TensorNode, inp: TensorNode) -> IndexMap | None:
    """Index of ``inp`` -> the one output index of ``node`` that reads it, when that read is a
    bijection between the two index spaces; else None."""
    fwd = index_map(node, inp)
    if fwd is None:
        return None
    return invert_read(fwd.vars, node.shape, fwd.indices, inp.shape)


def is_bijective(node: TensorNode) -> bool:
    """Injective, and every element of every input feeds exactly one output element."""
    if not is_injective(node) or isinstance(node, TensorInput):
        return isinstance(node, TensorInput)
    inputs = [n for n in walk(node) if isinstance(n, TensorInput)]
    return bool(inputs) and all(inverse_index_map(node, x) is not None for x in inputs)


def numel(shape: Sequence[Any]) -> int:
    return math.prod(int(s) for s in shape)


__all__ = ["IndexMap", "Inlined", "bounded_view", "has_reduction", "index_map", "inline", "inverse_index_map",
           "is_bijective", "is_injective"]
