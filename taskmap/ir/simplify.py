"""Simplification of statements: constant control flow, empty and one-iteration loops, with the
ranges of loop variables, launch dimensions and ``If`` conditions fed to the expression
simplifier (``expr_simplifier``).
"""
from __future__ import annotations

from . import stmt as S
from .arith import NEGATE, SWAP, UNKNOWN, Range, int_const, is_sint, r_meet
from .expr import BinOp, Binary, CmpOp, Compare, Const, Expr, Select, SizeVar, Special, SpecialReg, UnOp, Unary
from .expr_simplifier import ExprSimplifier, is_pure, bound_of, simplify_expr
from .func import Function, Module
from .functor import collect, substitute
from .primitives import PrimCall


def _is_empty(s: S.Stmt | None) -> bool:
    return isinstance(s, S.Seq) and not s.stmts


_EMPTY = S.Seq(())


class Simplifier(ExprSimplifier):
    """Simplifies expressions and statements, tracking integer ranges of variables in scope."""

    def _refine(self, cond: Expr, positive: bool) -> dict[Expr, Range]:
        """Ranges implied by ``cond`` (or by its negation) for immutable integer variables."""
        out: dict[Expr, Range] = {}

        def go(c: Expr, pos: bool) -> None:
            if isinstance(c, Unary) and c.op is UnOp.NOT:
                go(c.a, not pos)
            elif isinstance(c, Binary) and (c.op is BinOp.AND and pos or c.op is BinOp.OR and not pos):
                go(c.a, pos)
                go(c.b, pos)
            elif isinstance(c, Compare) and is_sint(c.a.dtype) and is_sint(c.b.dtype):
                op = c.op if pos else NEGATE[c.op]
                for x, y, o in ((c.a, c.b, op), (c.b, c.a, SWAP[op])):
                    if not (isinstance(x, (Special, SizeVar)) or x in self._fixed):
                        continue
                    lo, hi = self.range_of(y)
                    r = {CmpOp.LT: (None, None if hi is None else hi - 1), CmpOp.LE: (None, hi),
                         CmpOp.GT: (None if lo is None else lo + 1, None), CmpOp.GE: (lo, None),
                         CmpOp.EQ: (lo, hi), CmpOp.NE: UNKNOWN}[o]
                    out[x] = r_meet(out.get(x, self.range_of(x)), r)

        go(cond, positive)
        if any(r[0] is not None and r[1] is not None and r[0] > r[1] for r in out.values()):
            return {}  # the branch cannot run; keep what is known
        return out

    def visit_Select(self, node: Select) -> Expr:
        """A choice between two values (a fused concatenation's parts) has each branch simplified
        under its condition, as an ``If``'s: ``select(j < 32, -x[min(max(j, 0), 31) + 32],
        x[max(j - 32, 0)])`` loses its clamps, so that both loads are contiguous in ``j`` and a
        vectorized loop over ``j`` needs no gather (only the branch taken is evaluated: C's
        ``?:``).  A guard against a constant (``select(k < K, a[min(k, K - 1)], 0)``, zero
        padding) keeps its clamps: a GPU copy with zero fill (``cp_async``) takes the load's
        address whatever the guard, and it must stay in bounds."""
        if isinstance(node.a, Const) or isinstance(node.b, Const):
            return super().visit_Select(node)
        cond = self.visit(node.cond)
        with self._scope(self._refine(cond, True)):
            a = self.visit(node.a)
        with self._scope(self._refine(cond, False)):
            b = self.visit(node.b)
        return self._select(node, cond, a, b)

    def visit_function(self, func: Function) -> Function:
        saved_bounds, saved_fixed = self._bounds, self._fixed
        self._bounds, self._fixed = dict(saved_bounds), set(saved_fixed)
        self._has_prims = bool(collect(func.body, PrimCall))
        self._invalidate()
        try:
            if func.launch is not None:
                regs = ((SpecialReg.BLOCK_IDX, SpecialReg.GRID_DIM, func.launch.grid_dim),
                        (SpecialReg.THREAD_IDX, SpecialReg.BLOCK_DIM, func.launch.block_dim))
                for idx_reg, dim_reg, dims in regs:
                    for d, extent in enumerate(dims):
                        lo, hi = self.range_of(self.visit(extent))
                        self._bounds[Special(dim_reg, d)] = (max(lo or 1, 1), hi)
                        self._bounds[Special(idx_reg, d)] = (0, None if hi is None else hi - 1)
                self._invalidate()
            return func.with_body(self.visit(func.body))
        finally:
            self._bounds, self._fixed = saved_bounds, saved_fixed
            self._invalidate()

    def visit_Seq(self, s: S.Seq) -> S.Stmt:
        new = [self.visit(c) for c in s.stmts]
        if all(x is y for x, y in zip(new, s.stmts)):
            return s
        return S.seq(*(x for x in new if not _is_empty(x)))

    def visit_For(self, s: S.For) -> S.Stmt:
        start, stop = self.visit(s.start), self.visit(s.stop)
        a, b = int_const(start), int_const(stop)
        lo: int | None
        hi: int | None
        if a is not None and b is not None and s.step != 0:
            n = len(range(a, b, s.step))
            if n == 0:
                return _EMPTY
            if n == 1 and s.kind in (S.ForKind.SERIAL, S.ForKind.UNROLL):
                return self.visit(substitute(s.body, {s.var: Const(a, s.var.dtype)}))
            last = a + (n - 1) * s.step
            lo, hi = min(a, last), max(a, last)
        elif s.step > 0:
            lo, hi = self.range_of(start)[0], self.range_of(stop)[1]
            hi = None if hi is None else hi - 1
        else:
            lo, hi = self.range_of(stop)[0], self.range_of(start)[1]
            lo = None if lo is None else lo + 1
        self._fixed.add(s.var)
        with self._scope({s.var: (lo, hi)} if is_sint(s.var.dtype) else {}):
            body = self.visit(s.body)
        if _is_empty(body) and is_pure(start, stop):
            return _EMPTY
        if start is s.start and stop is s.stop and body is s.body:
            return s
        return S.For(s.var, start, stop, s.step, body, s.kind)

    def visit_MappingFor(self, s: S.MappingFor) -> S.Stmt:
        worker = self.visit(s.worker)
        self._fixed.update(s.vars)
        tasks = {v: (0, d - 1) for v, d in zip(s.vars, s.mapping.task_shape) if is_sint(v.dtype)}
        with self._scope(tasks):                 # every task lies in the mapping's task grid
            body = self.visit(s.body)
        if worker is s.worker and body is s.body:
            return s
        return S.MappingFor(s.vars, s.mapping, worker, s.kind, body, s.ordinal)

    def visit_If(self, s: S.If) -> S.Stmt:
        cond = self.visit(s.cond)
        if isinstance(cond, Const):
            if cond.value:
                return self.visit(s.then)
            return self.visit(s.else_) if s.else_ is not None else _EMPTY
        with self._scope(self._refine(cond, True)):
            then = self.visit(s.then)
        else_ = None
        if s.else_ is not None:
            with self._scope(self._refine(cond, False)):
                else_ = self.visit(s.else_)
            else_ = None if _is_empty(else_) else else_
        if _is_empty(then):
            if else_ is None:
                return _EMPTY if is_pure(cond) else S.If(cond, then)
            return S.If(self._unary(Unary(UnOp.NOT, cond)), else_)
        if cond is s.cond and then is s.then and else_ is s.else_:
            return s
        return S.If(cond, then, else_)

    def visit_While(self, s: S.While) -> S.Stmt:
        cond = self.visit(s.cond)
        if isinstance(cond, Const) and not cond.value:
            return _EMPTY
        body = self.visit(s.body)
        return s if cond is s.cond and body is s.body else S.While(cond, body)

    def visit_DeclScalar(self, s: S.DeclScalar) -> S.Stmt:
        init = self.visit(s.init)
        return s if init is s.init else S.DeclScalar(s.var, init)

    def visit_DeclTensor(self, s: S.DeclTensor) -> S.Stmt:
        return s

    def visit_Assign(self, s: S.Assign) -> S.Stmt:
        value = self.visit(s.value)
        return s if value is s.value else S.Assign(s.var, value)

    def visit_Store(self, s: S.Store) -> S.Stmt:
        indices = tuple(self.visit(i) for i in s.indices)
        value = self.visit(s.value)
        if value is s.value and all(x is y for x, y in zip(indices, s.indices)):
            return s
        return S.Store(s.tensor, indices, value, s.stream)



# ----------------------------------------------------------------------------- entry points


def simplify_function(f: Function) -> Function:
    return Simplifier().visit_function(f)


def simplify_module(m: Module) -> Module:
    return m.map_functions(simplify_function)


__all__ = ["Simplifier", "bound_of", "simplify_expr", "simplify_function", "simplify_module"]
