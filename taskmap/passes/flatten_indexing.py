"""Flatten multi-dimensional tensor indexing to one element offset through each tensor's layout.

Expects: no ``MappingFor``.  Produces: every ``Load``/``Store`` has exactly one index — the
element references of GPU primitives (``atomic_add(t[i, j], v)``) included: they are ``Load``
children of the ``PrimCall``, flattened here like any load.
"""
from __future__ import annotations

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.func import Module
from ..ir.functor import IRRewriter


def _flat(tensor: E.Var, indices: tuple[E.Expr, ...]) -> tuple[E.Expr, ...]:
    if len(indices) != tensor.type.ndim:
        raise ValueError(f"tensor {tensor.name} has {tensor.type.ndim} dimensions, indexed with {len(indices)}")
    return (tensor.type.layout.offset(indices),)


class _Flatten(IRRewriter):
    def visit_Load(self, node: E.Load) -> E.Expr:
        indices = tuple(self.visit(i) for i in node.indices)
        return E.Load(node.tensor, _flat(node.tensor, indices))

    def visit_Store(self, node: S.Store) -> S.Stmt:
        indices = tuple(self.visit(i) for i in node.indices)
        return S.Store(node.tensor, _flat(node.tensor, indices), self.visit(node.value), node.stream)


def flatten_indexing(module: Module) -> Module:
    return module.map_functions(lambda f: f.with_body(_Flatten().visit(f.body)))
