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
from typing import Any, Callable, Iterator, Sequence

from ..compute.nodes import ReduceOp
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, u32
from ..ir.expr import Expr, Special, SpecialReg, Var
from ..ir.mapping import MappingLoop, MappingLoopKind, MappingOn, TaskMapping, spatial
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


def reduce_rows_in_blocks(b: Builder, outputs: int, block: int, parallel: bool, k: int, lanes: int,
                          acc_t: ScalarType, op: ReduceOp, value: Callable[[Expr, Expr], Expr],
                          store: Callable[[Expr, Expr], None]) -> None:
    """``outputs`` results, each the ``op`` of a row of ``k`` values (``value(o, j)``: output
    ``o``'s ``j``-th), in blocks of ``block`` outputs (a parallel task each where ``parallel``; the
    last, partial block after them): each row folded into ``width`` lanes (the largest power of two
    within the row and a vector of ``lanes``; a last partial step masked) held in a register tile,
    then one vector loop over the block's outputs combining each one's lanes in turn and
    ``store(o, total)`` — no horizontal reduction per output (short rows: a global pool's 7 x 7
    planes)."""
    width = min(lanes, 1 << (k.bit_length() - 1))
    full, rest = divmod(k, width)

    def rows(first: Expr, count: int) -> None:
        part = b.register("part", acc_t, [count, width])
        with b.loop("q", 0, count) as q:
            with b.loop("l", 0, width, S.ForKind.VECTORIZE) as l:
                acc = b.let("acc", value(first + q, l), acc_t)
                for t in range(1, full):
                    b.assign(acc, op.combine(acc, E.cast(value(first + q, l + t * width), acc_t)))
                if rest:
                    v = b.let("v", value(first + q, E.minimum(l, rest - 1) + full * width), acc_t)
                    b.assign(acc, E.select(E.compare(E.CmpOp.LT, l, rest), op.combine(acc, v), acc))
                b.store(part, (q, l), acc)
        with b.loop("q", 0, count, S.ForKind.VECTORIZE) as q:
            total = b.let("total", E.Load(part, (q, E.const(0))), acc_t)
            with b.loop("l", 1, width) as l:
                b.assign(total, op.combine(total, E.Load(part, (q, l))))
            store(first + q, total)

    blocks = outputs // block
    if blocks:
        workers = spatial(blocks)
        with b.mapping(workers.parallel() if parallel and blocks > 1 else workers.sequential(), "g") as (g,):
            rows(g * block, block)
    if outputs % block:
        rows(E.const(blocks * block), outputs % block)


__all__ = ["Builder", "FULL_MASK", "MAX_WARP", "MIN_WARP", "lane_id", "reduce_rows_in_blocks", "warp_id",
           "warp_size"]
