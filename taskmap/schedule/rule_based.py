"""Rule-based scheduling (Hidet paper §5.1.3): a compute DAG becomes a kernel with no template.

The DAG is first *planned*: every injective ``compute`` node is inlined into its consumer, so
what is left is one output expression over the inputs, optionally wrapped around one reduction
(the output is the reduction, or an injective epilogue that reads the reduction at the output's
own index — ``mean = sum / n``).  Then one rule per (target kind, has reduction) writes the loop
nest with task mappings:

=====================  ==================================================================
CPU, injective         ``spatial(*outer, chunks).parallel()`` over rows (and chunks of long
                       rows) on the cores; the innermost contiguous dimensions (fused until
                       they are a few vectors long) as a ``vectorize()``d loop; a concat's
                       parts piece by piece
CPU, reduction         inner reductions: a worker per output, ``spatial(T).vectorize()`` lanes
                       accumulating ``T`` partial results, then a horizontal reduction (short
                       rows: blocks of outputs, each row folded into a vector, then one vector
                       loop over the block's outputs summing their lanes); outer
                       reductions (the reduced axis is not the contiguous one): lanes over
                       the output's contiguous dimension, the reduction loop outside them
GPU, injective         ``repeat(R) * spatial(256)`` on ``threadIdx.x``: coalesced, predicated
                       (a concat's parts: a branch per part, each loading its own)
GPU, reduction         inner reductions of 8 or more: ``spatial(rows, lanes).on(threadIdx.x)`` —
                       a group of 8..32 lanes (the whole block past 1024) per output, strided
                       coalesced loads ``(repeat(n) * spatial(lanes)).on(lane)``, a shuffle
                       butterfly (and shared-memory partials for a block); short or outer
                       reductions: one thread per output
=====================  ==================================================================

Shapes must be static (ints): kernels are built per instance, and callers cache them per
(operator, shapes, dtypes, target).  Every kernel is correct for any size (predicated tails).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..backends import Target, TargetKind, resolve_target
from ..compute.analysis import inline
from ..compute.indexmap import unflat_index as unflatten
from ..compute.nodes import ReduceNode, ReduceOp, TensorInput, TensorNode, graph_inputs, walk
from ..errors import UnsupportedError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.expr import Expr, Var, blockIdx, threadIdx
from ..ir.func import FuncKind, Function, LaunchConfig, Module
from ..ir.functor import IRRewriter, collect, substitute
from ..ir.mapping import repeat, spatial
from ..ir.types import TensorType
from ..runtime.kernel import Kernel
from .builder import Builder, MIN_WARP, reduce_rows_in_blocks
from .fastmath import helpers_for

#: Below this many elements of work a CPU kernel runs on one core (OpenMP's fork costs more).
PARALLEL_MIN_WORK = 1 << 15
#: A CPU kernel computes a value piecewise along an axis (a concatenation's parts) up to this many
#: pieces: a vector loop each.
MAX_PIECES = 128
#: Threads per block of the GPU schedules.
GPU_BLOCK = 256
#: An inner reduction of at most this many vectors per output, over at least ``SHORT_BLOCK``
#: outputs, runs in blocks of ``SHORT_BLOCK`` outputs (:func:`_cpu_reduce_short`): each output's
#: row folded into one vector of partials, then a vector loop over the block's outputs sums them —
#: no horizontal reduction per output.  A global average pool of 8 x 1088 planes of 7 x 7 took
#: 82 us with a vector and a halving per plane, the window template's blocked one 18 (Zen 4,
#: two cores).
SHORT_ROW_VECTORS = 4
SHORT_BLOCK = 16


@dataclass(frozen=True)
class Reduction:
    """The one reduction of a plan: ``op`` of ``value`` over ``reduce_axes`` in ``reduce_shape``
    for each output index ``axes``; the plan's value reads the result as the scalar ``acc``."""

    node: ReduceNode
    axes: tuple[Var, ...]
    reduce_axes: tuple[Var, ...]
    reduce_shape: tuple[int, ...]
    op: ReduceOp
    value: Expr
    acc: Var

    @property
    def extent(self) -> int:
        return math.prod(self.reduce_shape)


@dataclass(frozen=True)
class Plan:
    """A DAG ready to schedule: ``out[axes] = value`` over ``inputs`` (static shapes)."""

    output: TensorNode
    inputs: tuple[TensorInput, ...]
    out: Var
    shape: tuple[int, ...]
    axes: tuple[Var, ...]
    value: Expr
    reduction: Reduction | None

    def at(self, index: Sequence[Expr], acc: Expr | None = None) -> Expr:
        """The output element at ``index`` (``acc``: the reduction's result there)."""
        env: dict[Any, Any] = dict(zip(self.axes, index))
        if self.reduction is not None:
            env[self.reduction.acc] = E.cast(acc, self.reduction.node.dtype)
        return E.cast(substitute(self.value, env), self.output.dtype)

    def reduce_value(self, index: Sequence[Expr], k: Expr) -> Expr:
        """The reduction's value at output ``index`` and flat reduction index ``k``."""
        red = self.reduction
        assert red is not None
        env = dict(zip(red.axes, index)) | dict(zip(red.reduce_axes, unflatten(k, red.reduce_shape)))
        return E.cast(substitute(red.value, env), red.node.acc_dtype)


def _static(node: TensorNode, shape: Sequence[Any]) -> tuple[int, ...]:
    if not all(isinstance(s, int) for s in shape):
        raise UnsupportedError(f"rule-based scheduling needs static shapes; {node.name} has shape "
                               f"{tuple(shape)} (bind the sizes first)")
    return tuple(shape)


def plan(output: TensorNode, inputs: Sequence[TensorInput] | None = None) -> Plan:
    """Inline the DAG under ``output`` and check that one kernel can compute it."""
    found = graph_inputs(output)
    ins = tuple(inputs) if inputs is not None else tuple(found)
    if {id(x) for x in ins} != {id(x) for x in found} or len(ins) != len(found):
        names = [x.name for x in found]
        raise ValueError(f"inputs must be exactly the DAG's inputs {names}, got {[x.name for x in ins]}")
    for x in (*ins, output):
        _static(x, x.shape)
    out = Var(output.name, TensorType(output.dtype, tuple(E.const(s) for s in output.shape)))
    inl = inline(output)
    reduction = None
    value = inl.value
    if isinstance(output, ReduceNode):
        acc = Var("acc", output.dtype)
        reduction = _reduction(output, output.axes, acc)
        value = acc
    else:
        loads = [ld for ld in inl.reads() if not any(ld.tensor is x.var for x in ins)]
        nodes = {id(ld.tensor) for ld in loads}
        if nodes:
            red_node = next(n for n in _dag_reductions(output) if id(n.var) in nodes)
            if len(nodes) > 1 or not all(_own_index(ld.indices, inl.axes, output.shape) for ld in loads):
                raise UnsupportedError(
                    f"rule-based scheduling of {output.name}: a reduction may only be the output, or be read "
                    "by an injective epilogue at the output's own index; use a template (taskmap.templates."
                    "reduce) or split the definition")
            acc = Var("acc", red_node.dtype)
            reduction = _reduction(red_node, inl.axes, acc)
            value = substitute(inl.value, {ld: acc for ld in loads})
    return Plan(output, ins, out, tuple(output.shape), inl.axes, value, reduction)  # type: ignore[arg-type]


def _own_index(indices: Sequence[Expr], axes: Sequence[Var], shape: Sequence[Any]) -> bool:
    """Whether a load at ``indices`` reads the output's own element: each index its axis, or 0
    on an axis of extent 1 (the simplifier folds such an axis to 0: a reduction's kept
    dimensions, a row-wise statistic of a single row)."""
    return len(indices) == len(axes) and all(
        i == a or (n == 1 and isinstance(i, E.Const) and i.value == 0)
        for i, a, n in zip(indices, axes, shape))


def _dag_reductions(node: TensorNode) -> list[ReduceNode]:
    return [n for n in walk(node) if isinstance(n, ReduceNode)]


def _reduction(node: ReduceNode, axes: tuple[Var, ...], acc: Var) -> Reduction:
    inl = inline(node)
    if any(isinstance(n, ReduceNode) for n in _dag_reductions(node) if n is not node):
        raise UnsupportedError(f"rule-based scheduling of {node.name}: nested reductions need a template "
                               "(taskmap.templates.reduce)")
    value = substitute(inl.value, dict(zip(node.axes, axes)))
    shape = _static(node, node.reduce_shape)
    return Reduction(node, axes, node.reduce_axes, shape, node.op, value, acc)


def _inner_reduction(red: Reduction) -> bool:
    """Whether the reduced axis is the contiguous one of the inputs it reads (else: outer)."""
    inner = outer = False
    for ld in collect(red.value, E.Load):
        if not ld.indices:
            continue
        used = {id(v) for v in collect(ld.indices[-1], Var)}
        inner |= id(red.reduce_axes[-1]) in used
        outer |= bool(red.axes) and id(red.axes[-1]) in used
    return inner or not outer


def _lanes(target: Target, dtype: Any) -> int:
    return max(1, min(16, target.vector_bytes // max(1, dtype.nbytes)))


# ----------------------------------------------------------------------------- CPU rules


class _Piece(IRRewriter):
    """The value on the range ``[lo, hi)`` of output axis ``axis``: each select that tests
    ``axis < c`` with ``c`` outside the range replaced by the branch it takes there."""

    def __init__(self, axis: Var, lo: int, hi: int) -> None:
        super().__init__()
        self.axis, self.lo, self.hi = axis, lo, hi

    def visit_Select(self, s: E.Select) -> Expr:
        c = _cut(s.cond, self.axis)
        if c is not None and self.hi <= c:
            return self.visit(s.a)
        if c is not None and self.lo >= c:
            return self.visit(s.b)
        return self.generic_visit(s)


def _cut(cond: Expr, axis: Var) -> int | None:
    """``c`` when ``cond`` is ``axis < c`` (how a concat picks its part), else None."""
    if isinstance(cond, E.Compare) and cond.op is E.CmpOp.LT and cond.a is axis and isinstance(cond.b, E.Const):
        return int(cond.b.value)
    return None


def _pieces(p: Plan) -> tuple[int, list[tuple[int, int]]]:
    """The output dimension along which the value is piecewise — a concatenation's selects between
    its parts, ``axis < offset`` — and its pieces ``[lo, hi)``: the dimension with the most cuts,
    the outer one of a tie (-1 and no pieces when there is none)."""
    cuts: dict[int, set[int]] = {}
    for sel in collect(p.value, E.Select):
        for d, axis in enumerate(p.axes):
            c = _cut(sel.cond, axis)
            if c is not None and 0 < c < p.shape[d]:
                cuts.setdefault(d, set()).add(c)
    d = min(cuts, key=lambda k: (-len(cuts[k]), k), default=-1)
    if d < 0 or len(cuts[d]) >= MAX_PIECES:
        return -1, []
    bounds = [0, *sorted(cuts[d]), p.shape[d]]
    return d, list(zip(bounds, bounds[1:]))


def _piece_plans(p: Plan, d: int, ranges: list[tuple[int, int]]) -> list[tuple[int, int, Plan]]:
    """``(lo, hi, the plan on that range of dimension d)`` for each piece."""
    return [(lo, hi, replace(p, value=_Piece(p.axes[d], lo, hi).visit(p.value))) for lo, hi in ranges]


def _cpu_injective(p: Plan, t: Target, b: Builder) -> None:
    """Rows of the output on the cores, each a vector loop over the trailing dimensions.  A value
    that is piecewise along one dimension (a concatenation's parts, :func:`_pieces`) is computed
    piece by piece, each reading its own part alone: per row when the dimension is an outer one,
    as consecutive ranges of the vector loop when it leads the fused trailing dimensions (the
    vector loop fuses no dimension before it)."""
    shape, n = p.shape, len(p.shape)
    if n == 0:
        b.store(p.out, (), p.at(()))
        return
    lanes = _lanes(t, p.output.dtype)
    d, ranges = _pieces(p)
    m, inner = 1, shape[-1]
    while m < n - max(d, 0) and inner < 4 * lanes:  # fuse small trailing dimensions into the vector loop
        if inner >= lanes and _broadcast_along(p, n - m - 1, n - m):
            break
        m += 1
        inner *= shape[n - m]
    outer = list(shape[: n - m])
    rows = math.prod(outer)
    chunk = inner
    if rows < 4 * t.num_cores and inner >= 8 * lanes:  # few long rows: split them too
        pieces = min(-(-inner // (4 * lanes)), -(-4 * t.num_cores // rows))
        chunk = -(-(-(-inner // pieces)) // lanes) * lanes
    chunks = -(-inner // chunk)
    plans = _piece_plans(p, d, ranges) or [(0, shape[n - m], p)]
    lead = math.prod(shape[n - m + 1:])       # vector-loop elements per step of its leading dimension
    workers = spatial(*(outer or [1]), chunks)
    par = math.prod(shape) >= PARALLEL_MIN_WORK and t.num_cores > 1
    with b.mapping(workers.parallel() if par else workers.sequential(), "abcdefgh") as ws:
        o, c = list(ws[:-1]) if outer else [], ws[-1]
        if chunks == 1 and len(plans) == 1:
            with b.mapping(spatial(inner).vectorize(), "j") as (j,):
                idx = o + unflatten(j, shape[n - m:])
                b.store(p.out, idx, p.at(idx))
            return
        start: Expr = E.const(0) if chunks == 1 else c * chunk
        stop: Expr = E.const(inner) if chunks == 1 else \
            E.minimum(c * chunk + chunk, inner) if inner % chunk else c * chunk + chunk
        for lo, hi, q in plans:
            cond: Expr = E.const(True)
            first, last = start, stop
            if 0 <= d < n - m:      # an outer dimension: the rows of this piece
                if lo:
                    cond = E.compare(E.CmpOp.GE, o[d], lo)
                if hi < shape[d]:
                    cond = _and(cond, E.compare(E.CmpOp.LT, o[d], hi))
            elif d >= 0:            # the vector loop's leading dimension: a range of the loop
                first = E.maximum(start, lo * lead) if lo else start
                last = E.minimum(stop, hi * lead) if hi < shape[d] else stop
            with b.if_(cond):
                with b.loop("j", first, last, S.ForKind.VECTORIZE) as j:
                    idx = o + unflatten(j, shape[n - m:])
                    b.store(p.out, idx, q.at(idx))


def _broadcast_along(p: Plan, outer: int, first: int) -> bool:
    """Whether an input is read at an index that follows output axis ``outer`` but none of the
    axes from ``first`` on (a per-channel scale of NCHW pixels): fusing ``outer`` into a vector
    loop over those axes would make each of its reads a gather at ``j // extent`` (EfficientNet's
    squeeze-and-excitation ``x * scale`` at 7x7: 1152 x 49 elements, 19 -> 14 us in the flow)."""
    inner = {id(a) for a in p.axes[first:]}
    for ld in collect(p.value, E.Load):
        used = {id(v) for i in ld.indices for v in collect(i, Var)}
        if id(p.axes[outer]) in used and not used & inner:
            return True
    return False


def _partials(k: int, lanes: int) -> int:
    """Partial results an inner reduction of ``k`` keeps per output: a power of two (summed in
    halves at the end), up to four vectors (they hide the combine's latency on long rows), at most
    half of ``k`` (a global average pool of 7 x 7: one vector, 3 full steps and one lane).
    Summing 49 partials one after the other, a global pool of 8 x 1280 planes ran 2.6x as long
    as PyTorch's (Xeon, two cores)."""
    return 1 << (max(1, min(4 * lanes, k // 2)).bit_length() - 1)


def _cpu_reduce(p: Plan, t: Target, b: Builder) -> None:
    red = p.reduction
    assert red is not None
    acc_t, op, K = red.node.acc_dtype, red.op, red.extent
    lanes = _lanes(t, acc_t)
    par = math.prod(p.shape) * K >= PARALLEL_MIN_WORK and math.prod(p.shape) > 1 and t.num_cores > 1
    if _inner_reduction(red) and p.shape and K <= SHORT_ROW_VECTORS * lanes and \
            math.prod(p.shape) >= SHORT_BLOCK:
        _cpu_reduce_short(p, lanes, par, b)
        return
    if _inner_reduction(red) or not p.shape:
        width = _partials(K, lanes)
        workers = spatial(*(p.shape or (1,)))
        with b.mapping(workers.parallel() if par else workers.sequential(), "abcdefgh") as o:
            o = list(o) if p.shape else []
            acc = b.register("acc", acc_t, [width])
            with b.mapping(spatial(width).vectorize(), "l") as (l,):
                b.store(acc, (l,), op.identity(acc_t))
            full = K // width
            with b.loop("t", 0, full) as tt:
                with b.mapping(spatial(width).vectorize(), "l") as (l,):
                    b.store(acc, (l,), op.combine(E.Load(acc, (l,)), p.reduce_value(o, tt * width + l)))
            if K % width:
                with b.mapping(spatial(K % width).vectorize(), "l") as (l,):
                    b.store(acc, (l,), op.combine(E.Load(acc, (l,)), p.reduce_value(o, full * width + l)))
            half = width // 2                # the partial sums in halves: log2(width) vector steps
            while half:
                with b.mapping(spatial(half).vectorize(), "l") as (l,):
                    b.store(acc, (l,), op.combine(E.Load(acc, (l,)), E.Load(acc, (l + half,))))
                half //= 2
            b.store(p.out, o, p.at(o, E.Load(acc, (E.const(0),))))
        return
    n_inner = p.shape[-1]
    width = min(4 * lanes, n_inner)
    chunks = -(-n_inner // width)
    workers = spatial(*p.shape[:-1], chunks)
    with b.mapping(workers.parallel() if par else workers.sequential(), "abcdefgh") as ws:
        o, c = list(ws[:-1]), ws[-1]
        acc = b.register("acc", acc_t, [width])
        count = E.minimum(n_inner - c * width, width) if n_inner % width else E.const(width)
        with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
            b.store(acc, (l,), op.identity(acc_t))
        with b.loop("k", 0, K) as k:
            with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
                idx = [*o, c * width + l]
                b.store(acc, (l,), op.combine(E.Load(acc, (l,)), p.reduce_value(idx, k)))
        with b.loop("l", 0, count, S.ForKind.VECTORIZE) as l:
            idx = [*o, c * width + l]
            b.store(p.out, idx, p.at(idx, E.Load(acc, (l,))))


def _cpu_reduce_short(p: Plan, lanes: int, par: bool, b: Builder) -> None:
    """Short inner reductions (:data:`SHORT_ROW_VECTORS`): blocks of :data:`SHORT_BLOCK`
    outputs, a parallel task each (the last, partial block after them); per output its row folded
    into ``width`` lanes (the largest power of two within the row and a vector; a last partial
    step masked), then per lane of a vector loop over the block's outputs one output's lanes
    summed in turn, its epilogue and store."""
    red = p.reduction
    assert red is not None
    acc_t, op, K = red.node.acc_dtype, red.op, red.extent

    def store(o: Expr, total: Expr) -> None:
        idx = unflatten(o, p.shape)
        b.store(p.out, idx, p.at(idx, total))

    reduce_rows_in_blocks(b, math.prod(p.shape), SHORT_BLOCK, par, K, lanes, acc_t, op,
                          lambda o, j: p.reduce_value(unflatten(o, p.shape), j), store)


# ----------------------------------------------------------------------------- GPU rules


def _gpu_injective(p: Plan, t: Target, b: Builder) -> LaunchConfig:
    total = math.prod(p.shape)
    block = min(GPU_BLOCK, -(-total // MIN_WARP) * MIN_WARP)
    per_thread = 4 if total >= block * 4 * max(1, t.num_cores) * 4 else 1
    tile = block * per_thread
    with b.mapping((repeat(per_thread) * spatial(block)).on(threadIdx.x), "e") as (e_local,):
        e = blockIdx.x * tile + e_local
        with b.if_(E.compare(E.CmpOp.LT, e, total)):
            idx = unflatten(e, p.shape)
            d, ranges = _pieces(p)
            if not ranges:
                b.store(p.out, idx, p.at(idx))
            for lo, hi, q in _piece_plans(p, d, ranges):     # a concat's parts: the thread loads its own
                with b.if_(_and(E.compare(E.CmpOp.GE, idx[d], lo), E.compare(E.CmpOp.LT, idx[d], hi))):
                    b.store(p.out, idx, q.at(idx))
    return _launch(-(-total // tile), block)


def _gpu_reduce(p: Plan, t: Target, b: Builder) -> LaunchConfig:
    red = p.reduction
    assert red is not None
    acc_t, op, K = red.node.acc_dtype, red.op, red.extent
    rows = math.prod(p.shape)
    if K < 8 or not (_inner_reduction(red) or rows == 1):
        return _gpu_thread_per_output(p, b)
    lanes = GPU_BLOCK if K > 1024 else min(32, 1 << (K.bit_length() - 1))
    rpb = GPU_BLOCK // lanes
    scratch = b.shared("partials", acc_t, [GPU_BLOCK // MIN_WARP]) if lanes == GPU_BLOCK else None
    with b.mapping(spatial(rpb, lanes).on(threadIdx.x), "rl") as (r, lane):
        row = blockIdx.x * rpb + r if rpb > 1 else blockIdx.x
        valid = E.compare(E.CmpOp.LT, row, rows) if rows % rpb else E.const(True)
        idx = unflatten(E.minimum(row, rows - 1) if rows % rpb else row, p.shape)
        acc = b.let("acc", op.identity(acc_t))
        with b.mapping((repeat(-(-K // lanes)) * spatial(lanes)).on(lane), "k") as (k,):
            in_row = E.compare(E.CmpOp.LT, k, K) if K % lanes else E.const(True)
            with b.if_(_and(in_row, valid)):
                b.assign(acc, op.combine(acc, p.reduce_value(idx, k)))
        if scratch is not None:
            b.block_allreduce(acc, op, GPU_BLOCK, scratch)
        else:
            b.butterfly(acc, op, lanes)
        with b.if_(_and(E.compare(E.CmpOp.EQ, lane, 0), valid)):
            b.store(p.out, idx, p.at(idx, acc))
    return _launch(-(-rows // rpb), GPU_BLOCK)


def _gpu_thread_per_output(p: Plan, b: Builder) -> LaunchConfig:
    red = p.reduction
    assert red is not None
    rows = math.prod(p.shape)
    block = min(GPU_BLOCK, -(-rows // MIN_WARP) * MIN_WARP)
    with b.mapping(spatial(block).on(threadIdx.x), "o") as (o,):
        e = blockIdx.x * block + o
        with b.if_(E.compare(E.CmpOp.LT, e, rows)):
            idx = unflatten(e, p.shape)
            acc = b.let("acc", red.op.identity(red.node.acc_dtype))
            with b.loop("k", 0, red.extent) as k:
                b.assign(acc, red.op.combine(acc, p.reduce_value(idx, k)))
            b.store(p.out, idx, p.at(idx, acc))
    return _launch(-(-rows // block), block)


def _and(a: Expr, b: Expr) -> Expr:
    if isinstance(a, E.Const):
        return b if a.value else a
    if isinstance(b, E.Const):
        return a if b.value else b
    return E.logical_and(a, b)


def _launch(grid: int, block: int) -> LaunchConfig:
    one = E.const(1)
    return LaunchConfig((E.const(grid), one, one), (E.const(block), one, one))


# ----------------------------------------------------------------------------- entry points


def _target(target: Target | str, arch: str | None) -> Target:
    return target if isinstance(target, Target) else resolve_target(target, arch)


def build_module(output: TensorNode, target: Target | str = "cpu", *, arch: str | None = None,
                 inputs: Sequence[TensorInput] | None = None, name: str | None = None) -> Module:
    """The IR module computing ``output`` on ``target``: parameters are the inputs, then the output."""
    t = _target(target, arch)
    p = plan(output, inputs)
    b = Builder()
    gpu = t.kind is not TargetKind.CPU
    kname = re.sub(r"\W", "_", name or output.name) + ("_gpu" if gpu else "_cpu")
    if gpu:
        launch = (_gpu_reduce if p.reduction is not None else _gpu_injective)(p, t, b)
        func = Function(kname, FuncKind.GPU_KERNEL, (*(x.var for x in p.inputs), p.out), b.finish(), launch=launch)
    else:
        (_cpu_reduce if p.reduction is not None else _cpu_injective)(p, t, b)
        func = Function(kname, FuncKind.CPU_KERNEL, (*(x.var for x in p.inputs), p.out), b.finish())
    return Module((func, *helpers_for(func.body)), kname)


def schedule(output: TensorNode, target: Target | str = "cpu", *, arch: str | None = None,
             inputs: Sequence[TensorInput] | None = None, name: str | None = None) -> Kernel:
    """A :class:`~taskmap.Kernel` computing ``output``; call it as ``kernel(*inputs, out)``.

    ``target`` is a :class:`Target` or "cpu" / "cuda" / "hip" (with ``arch``).  A GPU target gives
    a GPU-style kernel: built for that GPU with ``kernel.build("cuda", arch=...)``, and run with
    GPU semantics on the CPU when called with numpy arrays."""
    return Kernel(build_module(output, target, arch=arch, inputs=inputs, name=name))


__all__ = ["Plan", "Reduction", "build_module", "plan", "schedule", "unflatten"]
