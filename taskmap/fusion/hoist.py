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

from ..ir import stmt as S
from ..ir.func import Function
from ..ir.functor import IRRewriter
from ..ir.mapping import MappingLoopKind
from ..passes.hoist_invariants import hoisted


class _Hoister(IRRewriter):
    def visit_MappingFor(self, loop: S.MappingFor) -> S.Stmt:
        body = self.visit(loop.body)

        def rebuild(b: S.Stmt) -> S.Stmt:
            return S.MappingFor(loop.vars, loop.mapping, loop.worker, loop.kind, b, loop.ordinal)
        if loop.kind is not MappingLoopKind.VECTORIZE:
            return loop if body is loop.body else rebuild(body)
        return hoisted(loop, body, rebuild)


def hoist_invariants(func: Function) -> Function:
    """``func`` with invariant dividing index arithmetic hoisted out of its vector loops."""
    return func.with_body(_Hoister().visit(func.body))


__all__ = ["hoist_invariants"]
