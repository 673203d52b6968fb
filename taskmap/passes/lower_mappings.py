"""Lower mapping loops (``for i, j in m.on(w)``) to plain loops and index arithmetic.

Expects: any IR.  Produces: no ``MappingFor``.

For ``m.on(worker)`` the worker's tasks are enumerated by ``len(m.loop_extents())`` nested loops
and each task index is ``m.task_index(worker, loop_vars)`` (the paper's semantics, §5.1).  When
the worker expression may exceed the mapping's workers (a mapping of 128 workers in a block of
256 threads) or be negative, the loops are guarded by ``0 <= worker < num_workers``; the
simplifier drops the parts of the guard the launch configuration proves.

An ``enumerate`` ordinal becomes ``k1 * e2 + k2`` over the task loops: a constant once they are
unrolled, so register tiles indexed by it stay in registers.

Without a worker (``for t in m``, ``m.parallel()``, ``m.vectorize()``) the loop runs every
worker's tasks: sequentially (worker-major order); with the workers spread over CPU cores (a
parallel worker loop outside the task loops); or with the workers as SIMD lanes (the task loops
outside, the lane loop innermost — legal because distinct workers' tasks are independent).
"""
from __future__ import annotations

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.func import Module
from ..ir.functor import IRRewriter, substitute
from ..ir.mapping import MappingLoopKind

#: Mapping loops with at most this many tasks per worker are fully unrolled.
UNROLL_LIMIT = 64


def _task_loops(extents: tuple[int, ...], body: S.Stmt, vars_: list[E.Var], unroll: bool) -> S.Stmt:
    kind = S.ForKind.UNROLL if unroll else S.ForKind.SERIAL
    for v, extent in reversed(list(zip(vars_, extents))):
        body = S.For(v, E.const(0), E.const(extent), 1, body, kind)
    return body


class _LowerMappings(IRRewriter):
    def __init__(self) -> None:
        super().__init__()
        self.counter = 0

    def _fresh(self, prefix: str) -> E.Var:
        self.counter += 1
        return E.Var(f"{prefix}{self.counter}", E.i32)

    def visit_MappingFor(self, node: S.MappingFor) -> S.Stmt:
        body = self.visit(node.body)
        m = node.mapping
        extents = m.loop_extents()
        loop_vars = [self._fresh("k") for _ in extents]
        unroll = m.tasks_per_worker <= UNROLL_LIMIT
        worker = node.worker if node.worker is not None else self._fresh("w")
        task = m.task_index(worker, loop_vars)
        if len(task) != len(node.vars):
            raise ValueError(f"mapping {m!r} has {len(task)} task dimensions, loop binds {len(node.vars)}")
        env: dict[E.Expr, E.Expr] = {v: E.as_expr(t) for v, t in zip(node.vars, task)}
        if node.ordinal is not None:
            ordinal: E.Expr = E.const(0)
            for v, extent in zip(loop_vars, extents):
                ordinal = ordinal * extent + v
            env[node.ordinal] = ordinal
        inner = substitute(body, env)
        if node.worker is not None:
            loops = _task_loops(extents, inner, loop_vars, unroll)
            # A worker outside 0..num_workers-1 has no tasks (the simplifier drops what it can prove).
            guard = E.logical_and(E.compare(E.CmpOp.GE, worker, 0), E.compare(E.CmpOp.LT, worker, m.num_workers))
            return S.If(guard, loops)
        assert isinstance(worker, E.Var)
        if node.kind is MappingLoopKind.VECTORIZE:
            lanes = S.For(worker, E.const(0), E.const(m.num_workers), 1, inner, S.ForKind.VECTORIZE)
            return _task_loops(extents, lanes, loop_vars, unroll)
        loops = _task_loops(extents, inner, loop_vars, unroll)
        kind = S.ForKind.PARALLEL if node.kind is MappingLoopKind.PARALLEL else S.ForKind.SERIAL
        return S.For(worker, E.const(0), E.const(m.num_workers), 1, loops, kind)


def lower_mappings(module: Module) -> Module:
    return module.map_functions(lambda f: f.with_body(_LowerMappings().visit(f.body)))
