"""Generic traversal of the IR: a visitor and a rewriter.

Subclasses override ``visit_<NodeClass>`` for the nodes they care about.  The rewriter rebuilds a
node only when one of its children changed, and otherwise returns the very same node, so
``new is old`` tells whether a pass changed anything.
"""
from __future__ import annotations

from typing import Any, Callable

from . import expr as E
from . import stmt as S
from .func import Function
from .primitives import PrimCall


class IRVisitor:
    """Walks expressions and statements in program order; override ``visit_<Node>``."""

    def visit(self, node: Any) -> None:
        method = getattr(self, "visit_" + type(node).__name__, None)
        if method is not None:
            method(node)
        else:
            self.generic_visit(node)

    def generic_visit(self, node: Any) -> None:
        for child in children(node):
            self.visit(child)

    def visit_function(self, func: Function) -> None:
        for p in func.params:
            self.visit(p)
        self.visit(func.body)


def children(node: Any) -> tuple[Any, ...]:
    """The direct sub-expressions and sub-statements of ``node``, in program order."""
    fn = _CHILDREN.get(type(node))
    return fn(node) if fn is not None else ()


def _opt(*xs: Any) -> tuple[Any, ...]:
    return tuple(x for x in xs if x is not None)


_CHILDREN: dict[type, Callable[[Any], tuple[Any, ...]]] = {
    E.Binary: lambda n: (n.a, n.b),
    E.Compare: lambda n: (n.a, n.b),
    E.Unary: lambda n: (n.a,),
    E.Cast: lambda n: (n.a,),
    E.BitCast: lambda n: (n.a,),
    E.Select: lambda n: (n.cond, n.a, n.b),
    E.Load: lambda n: (n.tensor, *n.indices),
    E.Call: lambda n: n.args,
    E.CallFunc: lambda n: n.args,
    PrimCall: lambda n: n.args,
    S.Evaluate: lambda n: (n.expr,),
    S.DeclScalar: lambda n: _opt(n.var, n.init),
    S.DeclTensor: lambda n: (n.var,),
    S.Assign: lambda n: (n.var, n.value),
    S.Store: lambda n: (n.tensor, *n.indices, n.value),
    S.Seq: lambda n: n.stmts,
    S.For: lambda n: (n.var, n.start, n.stop, n.body),
    S.MappingFor: lambda n: (*n.vars, *_opt(n.worker, n.ordinal), n.body),
    S.If: lambda n: _opt(n.cond, n.then, n.else_),
    S.While: lambda n: (n.cond, n.body),
    S.Return: lambda n: _opt(n.value),
}


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class IRRewriter:
    """Rebuilds the IR bottom-up; override ``visit_<Node>`` and call ``self.visit`` on children.

    Expression results are memoised per node object within one rewriter instance.
    """

    def __init__(self) -> None:
        self._memo: dict[int, tuple[Any, Any]] = {}

    def visit(self, node: Any) -> Any:
        if node is None:
            return None
        key = id(node)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is node:
            return hit[1]
        method = getattr(self, "visit_" + type(node).__name__, None)
        out = method(node) if method is not None else self.generic_visit(node)
        if isinstance(node, E.Expr):
            self._memo[key] = (node, out)
        return out

    def visit_function(self, func: Function) -> Function:
        return func.with_body(self.visit(func.body))

    def generic_visit(self, node: Any) -> Any:
        rebuild = _REBUILD.get(type(node))
        if rebuild is None:
            return node  # leaves: Const, Var, SizeVar, Special, Break, Continue, Barrier
        old = children(node)
        new = tuple(self.visit(c) for c in old)
        return node if _same(old, new) else rebuild(node, new)


def _rebuild_decl_scalar(n: S.DeclScalar, c: tuple[Any, ...]) -> S.DeclScalar:
    return S.DeclScalar(c[0], c[1] if len(c) > 1 else None)


def _rebuild_if(n: S.If, c: tuple[Any, ...]) -> S.If:
    return S.If(c[0], c[1], c[2] if len(c) > 2 else None)


def _rebuild_mapping_for(n: S.MappingFor, c: tuple[Any, ...]) -> S.MappingFor:
    k = len(n.vars)
    rest = list(c[k:-1])
    worker = rest.pop(0) if n.worker is not None else None
    ordinal = rest.pop(0) if n.ordinal is not None else None
    return S.MappingFor(tuple(c[:k]), n.mapping, worker, n.kind, c[-1], ordinal)


_REBUILD: dict[type, Callable[[Any, tuple[Any, ...]], Any]] = {
    E.Binary: lambda n, c: E.Binary(n.op, c[0], c[1]),
    E.Compare: lambda n, c: E.Compare(n.op, c[0], c[1]),
    E.Unary: lambda n, c: E.Unary(n.op, c[0]),
    E.Cast: lambda n, c: E.Cast(c[0], n.type),
    E.BitCast: lambda n, c: E.BitCast(c[0], n.type),
    E.Select: lambda n, c: E.Select(c[0], c[1], c[2]),
    E.Load: lambda n, c: E.Load(c[0], tuple(c[1:])),
    E.Call: lambda n, c: E.Call(n.fn, tuple(c)),
    E.CallFunc: lambda n, c: E.CallFunc(n.name, tuple(c), n.ret),
    PrimCall: lambda n, c: PrimCall(n.op, tuple(c), n.type),
    S.Evaluate: lambda n, c: S.Evaluate(c[0]),
    S.DeclScalar: _rebuild_decl_scalar,
    S.DeclTensor: lambda n, c: S.DeclTensor(c[0]),
    S.Assign: lambda n, c: S.Assign(c[0], c[1]),
    S.Store: lambda n, c: S.Store(c[0], tuple(c[1:-1]), c[-1], n.stream),
    S.Seq: lambda n, c: S.seq(*c),
    S.For: lambda n, c: S.For(c[0], c[1], c[2], n.step, c[3], n.kind),
    S.MappingFor: _rebuild_mapping_for,
    S.If: _rebuild_if,
    S.While: lambda n, c: S.While(c[0], c[1]),
    S.Return: lambda n, c: S.Return(c[0] if c else None),
}


class Substitute(IRRewriter):
    """Replaces variables (or any expression nodes, matched by identity or structure)."""

    def __init__(self, mapping: dict[Any, Any]) -> None:
        super().__init__()
        self.mapping = mapping

    def visit(self, node: Any) -> Any:
        if isinstance(node, E.Expr):
            try:
                hit = self.mapping.get(node)
            except TypeError:
                hit = None
            if hit is not None:
                return hit
        return super().visit(node)


def substitute(node: Any, mapping: dict[Any, Any]) -> Any:
    return Substitute(mapping).visit(node)


def collect(node: Any, cls: type | tuple[type, ...]) -> list[Any]:
    """All nodes of the given class(es) under ``node``, in program order."""
    found: list[Any] = []

    class _Collector(IRVisitor):
        def visit(self, n: Any) -> None:
            if isinstance(n, cls):
                found.append(n)
            self.generic_visit(n)

    _Collector().visit(node)
    return found


def written_tensors(node: Any) -> list[E.Var]:
    """The tensors written under ``node``: stored to, or written by a primitive (the target of an
    atomic, the destination of a copy, an ``mma`` accumulator), in program order."""
    out: list[E.Var] = []
    for n in collect(node, (S.Store, PrimCall)):
        if isinstance(n, S.Store):
            out.append(n.tensor)
        else:
            out.extend(n.args[i].tensor for i in n.op.spec.writes if isinstance(n.args[i], E.Load))
    return out
