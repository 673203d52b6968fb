"""A small builder for tensor-IR statements, used by the rule-based scheduler.

Loops are context managers that yield their variables, so a schedule reads like the kernel it
builds::

    b = Builder()
    with b.mapping(spatial(rows).parallel()) as (r,):
        acc = b.register("acc", f32, [lanes])
        with b.mapping(spatial(lanes).vectorize()) as (l,):
            b.store(acc, (l,), 0.0)
    body = b.finish()

plus the warp and block reductions (shuffle butterflies, shared-memory partials) that GPU
schedules share.  Everything here is warp-size generic: the code is valid for warps of 32 or 64
lanes, because the backend resolves ``warp_size()`` per target.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from ..compute.nodes import ReduceOp
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, u32
from ..ir.expr import Expr, Special, SpecialReg, Var
from ..ir.mapping import MappingLoop, MappingLoopKind, MappingOn, TaskMapping
from ..ir.primitives import Prim, PrimCall
from ..ir.types import MemScope, TensorType

FULL_MASK = 0xFFFFFFFF
#: The smallest warp of any target (32): sizes shared-memory partials for every warp size.
MIN_WARP = 32
#: The largest warp of any target (64, CDNA wavefronts).
MAX_WARP = 64


def lane_id() -> Expr:
    return Special(SpecialReg.LANE_ID, 0)


def warp_id() -> Expr:
    return Special(SpecialReg.WARP_ID, 0)


def warp_size() -> Expr:
    return Special(SpecialReg.WARP_SIZE, 0)


class Builder:
    """Collects statements; nested blocks are opened by the context managers below."""

    def __init__(self) -> None:
        self._blocks: list[list[S.Stmt]] = [[]]

    def emit(self, s: S.Stmt) -> None:
        self._blocks[-1].append(s)

    def finish(self) -> S.Stmt:
        assert len(self._blocks) == 1, "unclosed block"
        return S.seq(*self._blocks[0]) if self._blocks[0] else S.Seq(())

    @contextmanager
    def _block(self) -> Iterator[list[S.Stmt]]:
        self._blocks.append([])
        try:
            yield self._blocks[-1]
        finally:
            self._blocks.pop()

    def _body(self, stmts: list[S.Stmt]) -> S.Stmt:
        return S.seq(*stmts) if stmts else S.Seq(())

    # ---------------------------------------------------------------------- loops and branches
    @contextmanager
    def mapping(self, m: TaskMapping | MappingOn | MappingLoop, names: str = "ijklmnopqrst") -> Iterator[tuple[Var, ...]]:
        """``for vars in m`` (``m.on(worker)``, ``m.parallel()``, ``m.vectorize()`` or ``m``)."""
        with self._mapping_for(m, names, None) as vars_:
            yield vars_

    @contextmanager
    def enumerate(self, m: TaskMapping | MappingOn | MappingLoop,
                  names: str = "ijklmnopqrst") -> Iterator[tuple[Var, tuple[Var, ...]]]:
        """``for q, vars in enumerate(m)``: ``q`` is the task's slot in its worker's list, a
        constant once the task loops are unrolled (it indexes register tiles)."""
        q = Var("q", E.i32)
        with self._mapping_for(m, names, q) as vars_:
            yield q, vars_

    @contextmanager
    def _mapping_for(self, m: TaskMapping | MappingOn | MappingLoop, names: str,
                     ordinal: Var | None) -> Iterator[tuple[Var, ...]]:
        if isinstance(m, MappingOn):
            mapping, worker, kind = m.mapping, E.as_expr(m.worker), MappingLoopKind.SEQUENTIAL
        elif isinstance(m, MappingLoop):
            mapping, worker, kind = m.mapping, None, m.kind
        else:
            mapping, worker, kind = m, None, MappingLoopKind.SEQUENTIAL
        vars_ = tuple(Var(names[k % len(names)], E.i32) for k in range(mapping.ndim))
        with self._block() as body:
            yield vars_
        self.emit(S.MappingFor(vars_, mapping, worker, kind, self._body(body), ordinal))

    @contextmanager
    def loop(self, name: str, start: Any, stop: Any, kind: S.ForKind = S.ForKind.SERIAL,
             step: int = 1) -> Iterator[Var]:
        v = Var(name, E.i32)
        with self._block() as body:
            yield v
        self.emit(S.For(v, E.as_expr(start), E.as_expr(stop), step, self._body(body), kind))

    @contextmanager
    def if_(self, cond: Expr) -> Iterator[None]:
        if isinstance(cond, E.Const):
            if cond.value:
                yield
            else:
                with self._block():
                    yield
            return
        with self._block() as body:
            yield
        self.emit(S.If(cond, self._body(body)))

    # ---------------------------------------------------------------------- variables and memory
    def let(self, name: str, value: Any, dtype: ScalarType | None = None) -> Var:
        e = E.as_expr(value)
        if dtype is not None:
            e = E.cast(e, dtype)
        v = Var(name, e.dtype)
        self.emit(S.DeclScalar(v, e))
        return v

    def assign(self, var: Var, value: Any) -> None:
        self.emit(S.Assign(var, E.cast(E.as_expr(value, like=var), var.dtype)))

    def store(self, tensor: Var, indices: Sequence[Any], value: Any) -> None:
        e = E.as_expr(value, like=E.Load(tensor, ()))
        self.emit(S.Store(tensor, tuple(E.as_expr(i) for i in indices), E.cast(e, tensor.dtype)))

    def tensor(self, name: str, dtype: ScalarType, shape: Sequence[int], scope: MemScope) -> Var:
        v = Var(name, TensorType(dtype, tuple(E.const(int(s)) for s in shape), scope))
        self.emit(S.DeclTensor(v))
        return v

    def register(self, name: str, dtype: ScalarType, shape: Sequence[int]) -> Var:
        return self.tensor(name, dtype, shape, MemScope.REGISTER)

    def shared(self, name: str, dtype: ScalarType, shape: Sequence[int]) -> Var:
        return self.tensor(name, dtype, shape, MemScope.SHARED)

    def sync(self) -> None:
        self.emit(S.Barrier())

    # ---------------------------------------------------------------------- GPU reductions
    def shfl_xor(self, value: Expr, mask: int) -> Expr:
        """A butterfly shuffle; bind it to a variable before combining (a select may name its
        operands twice, and every lane must execute a shuffle exactly once)."""
        return PrimCall(Prim.SHFL_XOR, (E.const(FULL_MASK, u32), value, E.const(mask)), value.dtype)

    def butterfly(self, acc: Var, op: ReduceOp, lanes: int) -> None:
        """All-reduce ``acc`` over aligned groups of ``lanes`` consecutive lanes (a power of two at
        most 32, so that a group never straddles a warp); every lane ends with the result."""
        off = lanes // 2
        while off >= 1:
            self.assign(acc, op.combine(acc, self.let("other", self.shfl_xor(acc, off))))
            off //= 2

    def warp_allreduce(self, acc: Var, op: ReduceOp) -> None:
        """All-reduce ``acc`` over the whole warp, whatever its size (32 or 64 lanes)."""
        with self.if_(E.compare(E.CmpOp.GT, warp_size(), 32)):
            self.assign(acc, op.combine(acc, self.let("other", self.shfl_xor(acc, 32))))
        self.butterfly(acc, op, 32)

    def block_allreduce(self, acc: Var, op: ReduceOp, threads: int, scratch: Var) -> None:
        """All-reduce ``acc`` over a block of ``threads`` threads (a multiple of 64): each warp's
        result goes to ``scratch`` (shared, ``threads // 32`` elements), warp 0 reduces those, and
        every thread reads the total back.  Ends with a barrier, so ``scratch`` may be reused."""
        self.warp_allreduce(acc, op)
        with self.if_(E.compare(E.CmpOp.EQ, lane_id(), 0)):
            self.store(scratch, (warp_id(),), acc)
        self.sync()
        nwarps = E.const(threads) // warp_size()
        part = self.let("part", E.select(E.compare(E.CmpOp.LT, lane_id(), nwarps),
                                         E.Load(scratch, (E.minimum(lane_id(), threads // MIN_WARP - 1),)),
                                         op.identity(acc.dtype)))
        self.warp_allreduce(part, op)
        self.assign(acc, part)
        self.sync()


__all__ = ["Builder", "FULL_MASK", "MAX_WARP", "MIN_WARP", "lane_id", "warp_id", "warp_size"]
