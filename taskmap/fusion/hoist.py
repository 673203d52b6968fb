"""Hoisting of loop-invariant index arithmetic out of vector loops, after splicing.

A spliced prologue often computes, per element, index arithmetic that only depends on the
enclosing loops — img2col's ``(kd // 9, kd // 3 % 3, kd % 3)`` of the K row a packing loop
is at.  Left inside a ``vectorize()`` loop, gcc's data-reference analysis gives up on the
address (divisions of an outer induction variable) and falls back to gathers; as scalars
declared just before the loop, the address is affine in the lane and the loads become
(masked) vector loads.

:func:`hoist_invariants` declares, before every vectorized mapping loop, one scalar per
distinct maximal subexpression of its body that (1) reads none of the variables bound in the
loop, (2) is pure arithmetic (no loads, calls or primitives), (3) contains an integer ``//``,
``%`` or ``/`` — by non-zero constants only, so evaluating it unconditionally cannot trap.
Everything else (the template's own index arithmetic) is left as it is.
"""
from __future__ import annotations

from typing import Any

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.functor import IRRewriter, IRVisitor, children
from ..ir.func import Function
from ..ir.mapping import MappingLoopKind
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


class _Hoister(IRRewriter):
    def visit_MappingFor(self, loop: S.MappingFor) -> S.Stmt:
        body = self.visit(loop.body)
        if loop.kind is not MappingLoopKind.VECTORIZE:
            return loop if body is loop.body else S.MappingFor(loop.vars, loop.mapping, loop.worker, loop.kind, body,
                                                             loop.ordinal)
        decls: dict[Any, E.Var] = {}
        new_body = _Replace(_Facts(_bound(S.MappingFor(loop.vars, loop.mapping, loop.worker, loop.kind, body,
                                                       loop.ordinal))), decls).visit(body)
        new_loop = S.MappingFor(loop.vars, loop.mapping, loop.worker, loop.kind, new_body, loop.ordinal)
        if not decls:
            return new_loop if body is not loop.body else loop
        return S.seq(*(S.DeclScalar(v, e) for e, v in decls.items()), new_loop)


def hoist_invariants(func: Function) -> Function:
    """``func`` with invariant dividing index arithmetic hoisted out of its vector loops."""
    return func.with_body(_Hoister().visit(func.body))


__all__ = ["hoist_invariants"]
