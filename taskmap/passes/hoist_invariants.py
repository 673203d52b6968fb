"""Hoisting of loop-invariant index arithmetic out of vector loops (the last lowering pass).

A vector loop's addresses often divide indices that only depend on the enclosing loops — a
spliced epilogue's ``(j * 64 + lane) // 64 % 12``, which the simplifier turns into ``j % 12``
once it knows the lane's range.  Left inside the loop, gcc's vectorizer gives up on the store
or load (an inlined floor division of an outer variable in the address) and the loop runs
scalar; as scalars declared just before the loop, the address is affine in the lane.

:func:`hoisted` declares, before a vector loop, one scalar per distinct maximal subexpression of
its body that (1) reads none of the variables bound in the loop, (2) is pure arithmetic (no
loads, calls or primitives), (3) contains an integer ``//``, ``%`` or ``/`` — by non-zero
constants only, so evaluating it unconditionally cannot trap.  :mod:`taskmap.fusion.hoist` does
the same for the mapping loops of a spliced kernel, before lowering.

Expects: lowered IR (``For`` loops).  Produces: the same program.
"""
from __future__ import annotations

from typing import Any, Callable

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.func import Module
from ..ir.functor import IRRewriter, IRVisitor, children
from ..ir.primitives import PrimCall

_DIVS = (E.BinOp.FLOORDIV, E.BinOp.MOD, E.BinOp.DIV)
_PURE = (E.Binary, E.Unary, E.Cast, E.BitCast, E.Compare, E.Const, E.Var, E.SizeVar)


def _bound(body: S.Stmt) -> set[int]:
    """Variables bound inside ``body`` (declared, assigned, loop variables)."""
    out: set[int] = set()

    class _V(IRVisitor):
        def visit(self, n: Any) -> None:
            if isinstance(n, (S.DeclScalar, S.Assign, S.For)):
                out.add(id(n.var))
            elif isinstance(n, S.MappingFor):
                out.update(id(v) for v in n.vars)
                if n.ordinal is not None:
                    out.add(id(n.ordinal))
            self.generic_visit(n)

    _V().visit(body)
    return out


class _Facts:
    """Per expression: pure and invariant, and whether it divides."""

    def __init__(self, bound: set[int]) -> None:
        self.bound = bound
        self.memo: dict[int, tuple[bool, bool]] = {}

    def __call__(self, e: Any) -> tuple[bool, bool]:
        hit = self.memo.get(id(e))
        if hit is not None:
            return hit
        if not isinstance(e, _PURE) or isinstance(e, PrimCall):
            out = (False, False)
        elif isinstance(e, E.Var):
            out = (not e.is_tensor and id(e) not in self.bound, False)
        elif isinstance(e, (E.Const, E.SizeVar)):
            out = (True, False)
        else:
            kids = [self(c) for c in children(e)]
            ok = all(k[0] for k in kids)
            divides = any(k[1] for k in kids)
            if isinstance(e, E.Binary) and e.op in _DIVS:
                safe = isinstance(e.b, E.Const) and e.b.value != 0
                ok = ok and safe
                divides = divides or (e.dtype.is_integer and safe)
            out = (ok, divides)
        self.memo[id(e)] = out
        return out


class _Replace(IRRewriter):
    def __init__(self, facts: _Facts, decls: dict[Any, E.Var]) -> None:
        super().__init__()
        self.facts, self.decls = facts, decls

    def visit(self, node: Any) -> Any:
        if isinstance(node, E.Expr) and not isinstance(node, (E.Var, E.Const, E.SizeVar)):
            ok, divides = self.facts(node)
            if ok and divides:
                v = self.decls.get(node)
                if v is None:
                    v = self.decls[node] = E.Var(f"inv{len(self.decls)}", node.dtype)
                return v
        return super().visit(node)


def hoisted(loop: S.Stmt, body: S.Stmt, rebuild: Callable[[S.Stmt], S.Stmt]) -> S.Stmt:
    """The vector loop ``loop`` (its body already visited: ``body``) with its invariant dividing
    arithmetic declared before it; ``rebuild(new_body)`` makes the loop around a new body."""
    decls: dict[Any, E.Var] = {}
    new_body = _Replace(_Facts(_bound(rebuild(body))), decls).visit(body)
    if not decls:
        return loop if body is getattr(loop, "body", None) else rebuild(body)
    return S.seq(*(S.DeclScalar(v, e) for e, v in decls.items()), rebuild(new_body))


class _Hoister(IRRewriter):
    def visit_For(self, loop: S.For) -> S.Stmt:
        body = self.visit(loop.body)

        def rebuild(b: S.Stmt) -> S.Stmt:
            return S.For(loop.var, loop.start, loop.stop, loop.step, b, loop.kind)
        if loop.kind is not S.ForKind.VECTORIZE:
            return loop if body is loop.body else rebuild(body)
        return hoisted(loop, body, rebuild)


def hoist_invariants(module: Module) -> Module:
    return module.map_functions(lambda f: f.with_body(_Hoister().visit(f.body)))


__all__ = ["hoist_invariants", "hoisted"]
