"""Kernels of the reduction templates: one *row program* run four ways.

A row program (:class:`RowProgram`) says what an operator does with each row of ``extent``
elements — the input viewed as ``(outer, extent, inner)``, a row being the ``extent`` elements
at one ``(o, i)``, ``inner`` apart: a few reductions in order, each over a per-element value
that may use earlier results (softmax: the max, then the sum of ``exp(x - max)``), scalar
steps between them, and either an element-wise output (softmax, norms) or one value per row
(sum, mean, var).  The four kernels below run any program:

* ``cpu_rows`` (``inner == 1``): a core per row (``spatial(outer).parallel()``), each reduction
  accumulated by ``spatial(width).vectorize()`` lanes (``width`` = vectors x SIMD lanes), then
  combined across lanes; the row stays in the core's cache between passes;
* ``cpu_columns`` (``inner > 1``): lanes over ``inner`` (contiguous), the reduction loop outside;
* ``gpu_rows``: ``spatial(rows_per_block, lanes).on(threadIdx.x)`` — a group of lanes per row
  (sub-warp, warp, or the whole block), elements held in registers between passes
  (``enumerate((repeat(e) * spatial(lanes)).on(lane))``), shuffle butterflies, shared-memory
  partials for whole-block rows;
* ``gpu_columns``: a thread per ``(o, i)``, coalesced over ``i``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

from ..compute.nodes import ReduceOp
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType
from ..ir.expr import Expr, Var, blockIdx, threadIdx
from ..ir.func import FuncKind, Function, LaunchConfig, Module
from ..ir.mapping import repeat, spatial
from ..ir.types import TensorType
from ..schedule.builder import MIN_WARP, Builder
from ..schedule.fastmath import exp_nonpositive, helpers_for

Env = Mapping[str, Expr]
ElemFn = Callable[[Expr, Env, Expr, "Math"], Expr]  # (x element, results so far, index in row, math) -> value


@dataclass(frozen=True)
class Reduce:
    """``name = op over the row of value(x, ...)``.  ``stash``: kernels that can (the CPU's,
    when the output holds the compute type) also store each value in the output, where the
    element-wise step finds it as ``env["stash"]`` instead of computing it again (softmax's
    ``exp``)."""

    name: str
    op: ReduceOp
    value: ElemFn
    stash: bool = False


@dataclass(frozen=True)
class Let:
    name: str
    value: Callable[[Env], Expr]


@dataclass(frozen=True)
class Math:
    """Math that depends on the kernel: on CPU lanes ``exp`` (of a non-positive value here) is
    computed with multiply-adds and bit-casts (see :mod:`taskmap.schedule.fastmath`)."""

    cpu: bool

    def exp_nonpositive(self, x: Expr) -> Expr:
        return exp_nonpositive(x) if self.cpu else E.call(E.Intrinsic.EXP, x)


@dataclass(frozen=True)
class RowProgram:
    """``steps`` (reductions and scalar lets, in order), then ``elementwise`` (one output per
    element, written to ``y[o, k, i]``) or ``per_row`` (one output per row, ``y[o, i]``).
    ``params`` are extra 1-D inputs of ``extent`` elements (norm weights), read as ``p[k]``."""

    name: str
    steps: tuple[Reduce | Let, ...]
    compute: ScalarType
    elementwise: ElemFn | None = None
    per_row: Callable[[Env], Expr] | None = None
    params: tuple[str, ...] = ()


@dataclass(frozen=True)
class Shape:
    outer: int
    extent: int
    inner: int

    @property
    def rows(self) -> int:
        return self.outer * self.inner


def _tensors(prog: RowProgram, shape: Shape, x_t: ScalarType, y_t: ScalarType,
             p_t: ScalarType) -> tuple[Var, list[Var], Var]:
    o, k, i = shape.outer, shape.extent, shape.inner
    x = Var("x", TensorType(x_t, tuple(E.const(d) for d in (o, k, i))))
    params = [Var(n, TensorType(p_t, (E.const(k),))) for n in prog.params]
    y_shape = (o, k, i) if prog.elementwise is not None else (o, i)
    y = Var("y", TensorType(y_t, tuple(E.const(d) for d in y_shape)))
    return x, params, y


def _run_steps(b: Builder, prog: RowProgram, env: dict[str, Expr],
               reduce_row: Callable[[Reduce, dict[str, Expr]], Expr]) -> None:
    for step in prog.steps:
        if isinstance(step, Reduce):
            env[step.name] = reduce_row(step, env)
        else:
            env[step.name] = b.let(step.name, E.cast(step.value(env), prog.compute))


def _load(x: Var, o: Expr, k: Expr, i: Expr, t: ScalarType) -> Expr:
    return E.cast(E.Load(x, (o, k, i)), t)


# ----------------------------------------------------------------------------- CPU


def cpu_rows(prog: RowProgram, shape: Shape, x_t: ScalarType, y_t: ScalarType, p_t: ScalarType,
             lanes: int, vectors: int, parallel: bool) -> Module:
    """``inner == 1``: a worker per row over the cores; SIMD lanes inside the row."""
    x, params, y = _tensors(prog, shape, x_t, y_t, p_t)
    K, ct, m = shape.extent, prog.compute, Math(cpu=True)
    width = min(lanes * vectors, K)
    can_stash = y_t is ct and prog.elementwise is not None
    stashed: list[bool] = []  # whether each reduction stored its values in y
    b = Builder()
    rows = spatial(shape.outer)
    with b.mapping(rows.parallel() if parallel else rows.sequential(), "r") as (r,):
        zero = E.const(0)
        env: dict[str, Expr] = {}

        def elem(k: Expr) -> Expr:
            return _load(x, r, k, zero, ct)

        def reduce_row(step: Reduce, env: dict[str, Expr]) -> Expr:
            acc = b.register(f"acc_{step.name}", ct, [width])
            with b.mapping(spatial(width).vectorize(), "l") as (l,):
                b.store(acc, (l,), step.op.identity(ct))
            stash = step.stash and can_stash

            def accumulate(l: Expr, k: Expr) -> None:
                v = step.value(elem(k), env, k, m)
                if stash:
                    v = b.let("v", v)
                    b.store(y, (r, k, zero), v)
                b.store(acc, (l,), step.op.combine(E.Load(acc, (l,)), v))

            full = K // width
            with b.loop("t", 0, full) as t:
                with b.mapping(spatial(width).vectorize(), "l") as (l,):
                    accumulate(l, t * width + l)
            if K % width:
                with b.mapping(spatial(K % width).vectorize(), "l") as (l,):
                    accumulate(l, full * width + l)
            stashed.append(stash)
            left = width
            if width % lanes == 0:  # fold the accumulator vectors into the first, lane-wise
                for v in range(1, width // lanes):
                    with b.mapping(spatial(lanes).vectorize(), "l") as (l,):
                        b.store(acc, (l,), step.op.combine(E.Load(acc, (l,)), E.Load(acc, (v * lanes + l,))))
                left = lanes
            total = b.let(step.name, step.op.identity(ct))
            with b.loop("l", 0, left) as l:  # then across the lanes
                b.assign(total, step.op.combine(total, E.Load(acc, (l,))))
            return total

        _run_steps(b, prog, env, reduce_row)
        if prog.elementwise is not None:
            with b.mapping(spatial(K).vectorize(), "k") as (k,):
                pv = {n: E.Load(p, (k,)) for n, p in zip(prog.params, params)}
                if any(stashed):
                    pv["stash"] = E.Load(y, (r, k, zero))
                b.store(y, (r, k, zero), prog.elementwise(elem(k), env | pv, k, m))
        else:
            assert prog.per_row is not None
            b.store(y, (r, zero), prog.per_row(env))
    return _cpu_module(prog, x, params, y, b)


def cpu_columns(prog: RowProgram, shape: Shape, x_t: ScalarType, y_t: ScalarType, p_t: ScalarType,
                lanes: int, vectors: int, parallel: bool) -> Module:
    """``inner > 1``: lanes over the contiguous ``inner`` dimension, the row loop outside them."""
    x, params, y = _tensors(prog, shape, x_t, y_t, p_t)
    K, n, ct, m = shape.extent, shape.inner, prog.compute, Math(cpu=True)
    width = min(lanes * vectors, n)
    chunks = -(-n // width)
    b = Builder()
    workers = spatial(shape.outer, chunks)
    with b.mapping(workers.parallel() if parallel else workers.sequential(), "oc") as (o, c):
        count = E.minimum(n - c * width, width) if n % width else E.const(width)
        regs: dict[str, Var] = {}

        def lane_env(l: Expr) -> dict[str, Expr]:
            return {name: E.Load(v, (l,)) for name, v in regs.items()}

        for step in prog.steps:
            reg = b.register(f"r_{step.name}", ct, [width])
            if isinstance(step, Reduce):
                with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                    b.store(reg, (l,), step.op.identity(ct))
                with b.loop("k", 0, K) as k:
                    with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                        v = step.value(_load(x, o, k, c * width + l, ct), lane_env(l), k, m)
                        b.store(reg, (l,), step.op.combine(E.Load(reg, (l,)), v))
            else:
                with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                    b.store(reg, (l,), step.value(lane_env(l)))
            regs[step.name] = reg
        if prog.elementwise is not None:
            with b.loop("k", 0, K) as k:
                with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                    pv = {nm: E.Load(p, (k,)) for nm, p in zip(prog.params, params)}
                    xv = _load(x, o, k, c * width + l, ct)
                    b.store(y, (o, k, c * width + l), prog.elementwise(xv, lane_env(l) | pv, k, m))
        else:
            assert prog.per_row is not None
            with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                b.store(y, (o, c * width + l), prog.per_row(lane_env(l)))
    return _cpu_module(prog, x, params, y, b)


def _cpu_module(prog: RowProgram, x: Var, params: list[Var], y: Var, b: Builder) -> Module:
    name = f"{prog.name}_cpu"
    body = b.finish()
    return Module((Function(name, FuncKind.CPU_KERNEL, (x, *params, y), body), *helpers_for(body)), name)


# ----------------------------------------------------------------------------- GPU

#: Elements per thread kept in registers between the passes of a GPU row (more: re-read).
MAX_CACHED = 16


def gpu_rows(prog: RowProgram, shape: Shape, x_t: ScalarType, y_t: ScalarType, p_t: ScalarType,
             lanes: int, rows_per_block: int) -> Module:
    """``inner == 1``: ``lanes`` threads per row (a power of two; a whole block when > 32)."""
    assert shape.inner == 1 and (lanes <= 32 or rows_per_block == 1)
    x, params, y = _tensors(prog, shape, x_t, y_t, p_t)
    K, rows, ct, m = shape.extent, shape.outer, prog.compute, Math(cpu=False)
    per_lane = -(-K // lanes)
    cached = per_lane <= MAX_CACHED
    block = lanes * rows_per_block
    b = Builder()
    scratch = b.shared("partials", ct, [block // MIN_WARP]) if lanes > 32 else None
    tasks = repeat(per_lane) * spatial(lanes)  # lane l's elements: l, l + lanes, ... (coalesced)
    zero = E.const(0)
    with b.mapping(spatial(rows_per_block, lanes).on(threadIdx.x), "rl") as (r, lane):
        row = blockIdx.x * rows_per_block + r if rows_per_block > 1 else blockIdx.x
        ragged_rows = rows % rows_per_block != 0
        valid = E.compare(E.CmpOp.LT, row, rows) if ragged_rows else E.const(True)
        rowc = E.minimum(row, rows - 1) if ragged_rows else row
        in_row = (lambda k: E.compare(E.CmpOp.LT, k, K)) if K % lanes else (lambda k: E.const(True))
        xr = b.register("xr", ct, [per_lane]) if cached else None
        if xr is not None:
            with b.enumerate(tasks.on(lane), "k") as (q, (k,)):
                b.store(xr, (q,), E.select(in_row(k), _load(x, rowc, E.minimum(k, K - 1), zero, ct), 0.0)
                        if K % lanes else _load(x, rowc, k, zero, ct))

        def elem(q: Expr, k: Expr) -> Expr:
            return E.Load(xr, (q,)) if xr is not None else _load(x, rowc, k, zero, ct)

        def reduce_row(step: Reduce, env: dict[str, Expr]) -> Expr:
            acc = b.let(step.name, step.op.identity(ct))
            with b.enumerate(tasks.on(lane), "k") as (q, (k,)), b.if_(in_row(k)):
                b.assign(acc, step.op.combine(acc, step.value(elem(q, k), env, k, m)))
            if scratch is not None:
                b.block_allreduce(acc, step.op, block, scratch)
            else:
                b.butterfly(acc, step.op, lanes)
            return acc

        env: dict[str, Expr] = {}
        _run_steps(b, prog, env, reduce_row)
        if prog.elementwise is not None:
            with b.enumerate(tasks.on(lane), "k") as (q, (k,)), b.if_(_and(in_row(k), valid)):
                pv = {n: E.Load(p, (k,)) for n, p in zip(prog.params, params)}
                b.store(y, (rowc, k, zero), prog.elementwise(elem(q, k), env | pv, k, m))
        else:
            assert prog.per_row is not None
            with b.if_(_and(E.compare(E.CmpOp.EQ, lane, 0), valid)):
                b.store(y, (rowc, zero), prog.per_row(env))
    grid = -(-rows // rows_per_block)
    return _gpu_module(prog, x, params, y, b, grid, block)


def gpu_columns(prog: RowProgram, shape: Shape, x_t: ScalarType, y_t: ScalarType, p_t: ScalarType,
                block: int) -> Module:
    """A thread per row ``(o, i)``; neighbouring threads read neighbouring ``i`` (coalesced)."""
    x, params, y = _tensors(prog, shape, x_t, y_t, p_t)
    K, n, ct, m = shape.extent, shape.inner, prog.compute, Math(cpu=False)
    cols = shape.rows
    b = Builder()
    with b.mapping(spatial(block).on(threadIdx.x), "t") as (t,):
        e = blockIdx.x * block + t
        with b.if_(E.compare(E.CmpOp.LT, e, cols)):
            o, i = (e // n, e % n) if n > 1 else (e, E.const(0))
            env: dict[str, Expr] = {}

            def reduce_row(step: Reduce, env: dict[str, Expr]) -> Expr:
                acc = b.let(step.name, step.op.identity(ct))
                with b.loop("k", 0, K) as k:
                    b.assign(acc, step.op.combine(acc, step.value(_load(x, o, k, i, ct), env, k, m)))
                return acc

            _run_steps(b, prog, env, reduce_row)
            if prog.elementwise is not None:
                with b.loop("k", 0, K) as k:
                    pv = {nm: E.Load(p, (k,)) for nm, p in zip(prog.params, params)}
                    b.store(y, (o, k, i), prog.elementwise(_load(x, o, k, i, ct), env | pv, k, m))
            else:
                assert prog.per_row is not None
                b.store(y, (o, i), prog.per_row(env))
    return _gpu_module(prog, x, params, y, b, -(-cols // block), block)


def _and(a: Expr, c: Expr) -> Expr:
    if isinstance(a, E.Const):
        return c if a.value else a
    if isinstance(c, E.Const):
        return a if c.value else c
    return E.logical_and(a, c)


def _gpu_module(prog: RowProgram, x: Var, params: list[Var], y: Var, b: Builder, grid: int, block: int) -> Module:
    name = f"{prog.name}_gpu"
    one = E.const(1)
    launch = LaunchConfig((E.const(grid), one, one), (E.const(block), one, one))
    body = b.finish()
    return Module((Function(name, FuncKind.GPU_KERNEL, (x, *params, y), body, launch=launch), *helpers_for(body)),
                  name)


def lanes_of(vector_bytes: int, dtype: ScalarType) -> int:
    """SIMD lanes of ``dtype`` in a vector register of ``vector_bytes``."""
    return max(1, min(16, vector_bytes // dtype.nbytes))


def pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


__all__ = ["Let", "Math", "MAX_CACHED", "Reduce", "RowProgram", "Shape", "cpu_columns", "cpu_rows",
           "gpu_columns", "gpu_rows", "lanes_of", "pow2_floor"]
