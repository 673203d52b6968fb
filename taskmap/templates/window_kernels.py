"""Kernels of the sliding-window template (:mod:`.window`): pooling and depthwise convolution.

Every output ``y[n, c, oh, ow]`` combines a window of one input plane ``x[n, ci, :, :]``
(``ci = c // mult`` for a depthwise convolution with channel multiplier ``mult``, ``c`` for
pooling): a max, a sum divided by the window's divisor, or a dot product with ``w[c, :]``.

* ``cpu_window``: workers ``spatial(N*C / planes, chunks).parallel()`` over the cores, a chunk
  being some output rows of one plane (or whole planes of a block of small ones).  A worker
  stages the input rows its chunk reads in a buffer on its stack — padded (0, or -inf for max),
  in the compute type, and split into ``stride`` phases so that every tap reads contiguous
  lanes; all the block's planes before the first tap — then computes each output row as blocks of
  ``lanes`` outputs, ``spatial(lanes).vectorize()``: one vector FMA (max, add) per tap, the
  weight broadcast, no predicate, no scalar tail (the last block overlaps the one before).
  A group of output rows shares the loads of the input rows their windows cover.  Max pooling
  scans the staged input for NaN once per chunk: without one (the usual case) each tap is a plain
  vector maximum, else a compare and a blend that let NaN win (as torch); 1.3-2x faster.
* ``cpu_global``: the window is the whole plane (global pooling): blocks of 16 planes, each
  folded into a vector of lanes, then one lane per plane finishes its sum (no horizontal
  reduction per plane).
* ``gpu_window``: a thread per output, ``spatial(block).on(threadIdx.x)``; neighbouring threads
  own neighbouring ``ow`` (coalesced loads, ``stride`` apart), predicated taps.

Adaptive pooling (window ``[floor(o*H/OH), ceil((o+1)*H/OH))``), windows of more than
``MAX_UNROLLED_TAPS`` taps and rows too wide to stage run the per-output code
(``_cpu_per_output``).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ..compute.indexmap import unflat_index
from ..compute.nodes import ReduceOp
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, i32
from ..ir.expr import Expr, Var, blockIdx, threadIdx
from ..ir.func import FuncKind, Function, LaunchConfig, Module
from ..ir.mapping import spatial
from ..ir.types import TensorType
from ..schedule.builder import Builder, reduce_rows_in_blocks

if TYPE_CHECKING:
    from .window import WindowProblem

#: Taps at most this many are unrolled (Python loops); more run as loops.
MAX_UNROLLED_TAPS = 64


def _and(*conds: Expr) -> Expr:
    live = [c for c in conds if not (isinstance(c, E.Const) and c.value)]
    if any(isinstance(c, E.Const) and not c.value for c in live):
        return E.const(False)
    if not live:
        return E.const(True)
    return live[0] if len(live) == 1 else E.logical_and(*live)


def _within(v: Expr, n: int) -> Expr:
    return _and(E.compare(E.CmpOp.GE, v, 0), E.compare(E.CmpOp.LT, v, n))


class _Kernel:
    """What the kernels share: the tensors, the reduction, and the per-output finishing step."""

    def __init__(self, p: WindowProblem) -> None:
        self.p = p
        self.x_t, self.y_t = p.scalar, p.scalar
        self.ct: ScalarType = p.compute_type
        d = lambda *s: tuple(E.const(int(v)) for v in s)
        self.x = Var("x", TensorType(self.x_t, d(p.n, p.c_in, p.h, p.w)))
        self.wt = Var("w", TensorType(self.x_t, d(p.c_out, p.kh * p.kw))) if p.op == "conv" else None
        self.bias = Var("bias", TensorType(self.x_t, d(p.c_out))) if p.op == "conv" and p.bias else None
        self.y = Var("y", TensorType(self.y_t, d(p.n, p.c_out, p.oh, p.ow)))
        self.rop = ReduceOp.MAX if p.op == "max" else ReduceOp.SUM

    @property
    def params(self) -> tuple[Var, ...]:
        return tuple(v for v in (self.x, self.wt, self.bias, self.y) if v is not None)

    def channels(self, nc: Expr) -> tuple[Expr, Expr, Expr]:
        """(n, c, ci) of the flat plane index ``nc``."""
        p = self.p
        n, c = (E.const(0), nc) if p.n == 1 else (nc // p.c_out, nc % p.c_out)
        ci = c // p.mult if p.mult > 1 else c
        return n, c, ci

    def identity(self) -> Expr:
        return self.rop.identity(self.ct)

    def start(self, c: Expr) -> Expr:
        """The accumulator's first value: the bias of a convolution, else the identity."""
        if self.bias is not None:
            return E.cast(E.Load(self.bias, (c,)), self.ct)
        return self.identity()

    def tap(self, acc: Expr, n: Expr, ci: Expr, c: Expr, ih: Expr, iw: Expr, kh: Expr | int, kw: Expr | int) -> Expr:
        v = E.cast(E.Load(self.x, (n, ci, ih, iw)), self.ct)
        if self.wt is not None:
            w = E.cast(E.Load(self.wt, (c, E.as_expr(kh) * self.p.kw + kw)), self.ct)
            return acc + v * w
        return self.rop.combine(acc, v)

    def finish(self, acc: Expr, divisor: Expr | None) -> Expr:
        if self.p.op == "avg":
            assert divisor is not None
            return acc / divisor
        return acc

    def divisor(self, h0: Expr, w0: Expr) -> Expr | None:
        """avg: the divisor of the window starting at (h0, w0) (torch's rules)."""
        p = self.p
        if p.op != "avg":
            return None
        if p.divisor is not None:
            return E.const(float(p.divisor), self.ct)
        return E.cast(self.count(h0, p.kh, p.h, p.ph) * self.count(w0, p.kw, p.w, p.pw), self.ct)

    def count(self, s: Expr, k: int, size: int, pad: int) -> Expr:
        """How many of the window's ``k`` positions from ``s`` count along one axis."""
        end = E.minimum(s + k, size + pad)
        if self.p.count_include_pad:
            return end - s
        return E.minimum(end, size) - E.maximum(s, 0)

    def adaptive_range(self, o: Expr, size: int, out: int) -> tuple[Expr, Expr]:
        return (o * size) // out, ((o + 1) * size + out - 1) // out

    # ------------------------------------------------------------------ one output, predicated
    def one_output(self, b: Builder, n: Expr, c: Expr, ci: Expr, oh: Expr, ow: Expr) -> Expr:
        """The output at (n, c, oh, ow), taps checked one by one (borders, GPU, adaptive)."""
        p = self.p
        acc = b.let("acc", self.start(c), self.ct)
        if p.adaptive:
            hs, he = self.adaptive_range(oh, p.h, p.oh)
            ws, we = self.adaptive_range(ow, p.w, p.ow)
            hs, he, ws, we = (b.let(nm, v) for nm, v in (("hs", hs), ("he", he), ("ws", ws), ("we", we)))
            with b.loop("ih", hs, he) as ih, b.loop("iw", ws, we) as iw:
                b.assign(acc, self.tap(acc, n, ci, c, ih, iw, 0, 0))
            if p.op == "avg":
                return E.cast(acc / E.cast((he - hs) * (we - ws), self.ct), self.y_t)
            return E.cast(acc, self.y_t)
        h0 = b.let("h0", oh * p.sh - p.ph)
        w0 = b.let("w0", ow * p.sw - p.pw)

        def body(kh: Expr | int, kw: Expr | int) -> None:
            ih, iw = h0 + E.as_expr(kh) * p.dh, w0 + E.as_expr(kw) * p.dw
            with b.if_(_and(_within(ih, p.h), _within(iw, p.w))):
                b.assign(acc, self.tap(acc, n, ci, c, ih, iw, kh, kw))

        self.taps(b, body)
        return E.cast(self.finish(acc, self.divisor(h0, w0)), self.y_t)

    def taps(self, b: Builder, body: Callable[[Expr | int, Expr | int], None]) -> None:
        p = self.p
        if p.kh * p.kw <= MAX_UNROLLED_TAPS:
            for kh in range(p.kh):
                for kw in range(p.kw):
                    body(kh, kw)
        else:
            with b.loop("kh", 0, p.kh) as kh, b.loop("kw", 0, p.kw) as kw:
                body(kh, kw)


# ----------------------------------------------------------------------------- CPU


#: Rows of at most this many vectors are staged by unrolled vector copies.
MAX_UNROLLED_COPIES = 16
#: The largest staging buffer of a CPU worker (bytes, on its stack): past it, rows of one output
#: at a time with predicated taps.
MAX_STAGING_BYTES = 96 * 1024


def staging(p: WindowProblem, rows: int) -> tuple[int, int]:
    """(rows, columns) of the staged input of a chunk of ``rows`` output rows: the padded input
    rows it reads, each split into ``sw`` phases of ``phase_width`` columns."""
    return (rows - 1) * p.sh + (p.kh - 1) * p.dh + 1, p.sw * phase_width(p)


def phase_width(p: WindowProblem) -> int:
    """Columns of one phase of a staged row: padded column ``j`` is at ``(j % sw, j // sw)``, so
    that a tap reads ``ow + const`` of one phase — contiguous lanes whatever the stride."""
    return -(-((p.ow - 1) * p.sw + (p.kw - 1) * p.dw + 1) // p.sw)


def cpu_window(p: WindowProblem, lanes: int, rows: int, row_group: int, parallel: bool, planes: int = 1) -> Module:
    """Workers ``spatial(N*C / planes, chunks)`` over the cores, a chunk being ``rows`` output
    rows of ``planes`` planes (``planes > 1``: whole planes).  A worker first stages the input
    rows its chunk reads, padded (0, or -inf for max) and in the compute type, in a buffer on its
    stack — every plane of its block before computing any, so that the taps' loads do not wait
    for the staging stores to leave the store queue (a load spanning two recent stores cannot be
    forwarded).  Then every output row is blocks of ``lanes`` outputs,
    ``spatial(lanes).vectorize()``, each lane summing its window's taps in a register (the last
    block overlaps the one before instead of a scalar tail).  ``row_group`` output rows are
    computed together: each load of an input row feeds every output row whose window covers it
    (fewer loads per FMA).  No tap is predicated."""
    k = _Kernel(p)
    b = Builder()
    ct = k.ct
    ir1, wb1 = staging(p, 1)
    if p.adaptive or p.taps > MAX_UNROLLED_TAPS or ir1 * wb1 * ct.nbytes > MAX_STAGING_BYTES:
        return _cpu_per_output(p, k, b, parallel)
    chunks = -(-p.oh // rows)
    assert planes == 1 or chunks == 1, (planes, chunks)
    ir, wb = staging(p, rows)
    pad = k.identity() if p.op == "max" else E.const(0.0, ct)
    workers = spatial(p.n * p.c_out // planes, chunks)
    with b.mapping(workers.parallel() if parallel else workers.sequential(), "rq") as (blk, q):
        r0 = q * rows if chunks > 1 else E.const(0)
        # a row shorter than the lanes is computed in a vector of ``short`` lanes (a power of
        # two): the spare lanes read past the last staged row, into one padded slack row
        short = min(lanes, 1 << (p.ow - 1).bit_length()) if p.ow < lanes else p.ow
        slack = 1 if short > p.ow else 0
        buf = b.register("buf", ct, [planes, ir + slack, wb])

        def each_plane(body: Callable[[Expr, Expr], None]) -> None:
            """``body(pl, nc)`` for the worker's planes (``pl``: the plane's place in ``buf``)."""
            if planes == 1:
                body(E.const(0), blk)
            else:
                with b.loop("pl", 0, planes) as pl:
                    body(pl, blk * planes + pl)

        def stage(pl: Expr, nc: Expr) -> None:
            n, _, ci = k.channels(nc)
            if slack:
                with b.loop("j", 0, wb, S.ForKind.VECTORIZE) as j:
                    b.store(buf, (pl, E.const(ir), j), pad)
            top = b.let("top", r0 * p.sh - p.ph)
            with b.loop("i", 0, ir) as i:
                ih = top + i
                ok = _within(ih, p.h)
                with b.if_(ok):
                    _stage_row(b, k, buf, (pl, i), n, ci, ih, wb, lanes, pad)
                with b.if_(E.logical_not(ok)), b.loop("j", 0, wb, S.ForKind.VECTORIZE) as j:
                    b.store(buf, (pl, i, j), pad)

        each_plane(stage)
        if p.op == "max" and ct.is_float:
            # NaN must win a max (as torch), which costs a compare and a blend per tap; scan the
            # staged input once and take plain vector maxima when it holds no NaN (the usual case)
            nan = b.let("nan", E.const(0, i32))
            with b.loop("pl", 0, planes) as pl, b.loop("i", 0, ir + slack) as i, b.loop("j", 0, wb) as j:
                v = E.Load(buf, (pl, i, j))
                b.assign(nan, E.binary(E.BinOp.BITOR, nan, E.cast(E.compare(E.CmpOp.NE, v, v), i32)))
            with b.if_(E.compare(E.CmpOp.NE, nan, 0)):
                each_plane(lambda pl, nc: _compute_rows(b, k, buf, pl, nc, r0, rows, row_group, lanes, short))
            with b.if_(E.compare(E.CmpOp.EQ, nan, 0)):
                each_plane(lambda pl, nc: _compute_rows(b, k, buf, pl, nc, r0, rows, row_group, lanes, short,
                                                        ordered=True))
        else:
            each_plane(lambda pl, nc: _compute_rows(b, k, buf, pl, nc, r0, rows, row_group, lanes, short))
    return _module(p, k, b, None)


def _compute_rows(b: Builder, k: _Kernel, buf: Var, pl: Expr, nc: Expr, r0: Expr, rows: int, row_group: int,
                  lanes: int, short: int, ordered: bool = False) -> None:
    """Output rows ``r0 .. r0 + rows`` of plane ``nc`` from its staged input ``buf[pl]`` (see
    :func:`cpu_window`); ``ordered``: the input holds no NaN, maxima are plain vector maxima."""
    p, ct = k.p, k.ct
    n, c, _ = k.channels(nc)
    nq = phase_width(p)
    weights = {}
    if k.wt is not None:
        for kh in range(p.kh):
            for kw in range(p.kw):
                weights[kh, kw] = b.let("wv", E.cast(E.Load(k.wt, (c, E.const(kh * p.kw + kw))), ct))
    first = b.let("first", k.start(c), ct) if k.bias is not None else k.identity()
    count = E.minimum(rows, p.oh - r0) if p.oh % rows else E.const(rows)
    group = min(row_group, rows)
    # rows shorter than the lanes go through a buffer of the chunk's outputs, stored to ``y`` by
    # one flat loop: gcc 12 keeps a loop of 7 stores scalar, and a fused SiLU's exp with it
    # (1152 channels 5x5 at 7x7 + SiLU: 101 -> 45 us)
    flat = b.register("flat", k.y_t, [rows * p.ow]) if short > p.ow else None

    def rows_of(r: Expr, nrows: int) -> None:
        """Output rows ``r .. r + nrows`` of the chunk, sharing the loads of their input rows."""
        scales: list[Expr | None] = []
        for j in range(nrows):
            if p.op == "avg" and p.divisor is None:
                oh = r0 + r + j
                scales.append(b.let("hcount", E.cast(k.count(oh * p.sh - p.ph, p.kh, p.h, p.ph), ct)))
            else:
                scales.append(None)

        def block(base: Expr, width: int, stored: int) -> None:
            """Outputs ``base .. base + width`` of the rows; the first ``stored`` go to ``y``
            (``width > stored``: a short row computed in a full vector, the spare lanes
            reading the buffer's slack)."""
            tiles = [b.register("res", k.y_t, [width]) for _ in range(nrows)] if width > stored else None
            with b.loop("l", 0, width, S.ForKind.VECTORIZE) as l:
                ow = base + l
                accs = [b.let("acc", first, ct) for _ in range(nrows)]
                users: dict[int, list[tuple[int, int]]] = {}  # input row -> (output row, kh)
                for j in range(nrows):
                    for kh in range(p.kh):
                        users.setdefault(j * p.sh + kh * p.dh, []).append((j, kh))
                for ii in sorted(users):
                    for kw in range(p.kw):
                        phase, shift = divmod(kw * p.dw, p.sw)[::-1]
                        col = ow + (phase * nq + shift)
                        v = b.let("v", E.Load(buf, (pl, r * p.sh + ii, col)))
                        for j, kh in users[ii]:
                            acc = accs[j]
                            b.assign(acc, acc + v * weights[kh, kw] if k.wt is not None else
                                     E.select(E.compare(E.CmpOp.GT, v, acc), v, acc) if ordered else
                                     k.rop.combine(acc, v))
                for j, acc in enumerate(accs):
                    out: Expr = acc
                    if p.op == "avg":
                        if p.divisor is not None:
                            out = acc * E.const(1.0 / p.divisor, ct)
                        else:
                            hs = scales[j]
                            assert hs is not None
                            out = acc / (hs * E.cast(k.count(ow * p.sw - p.pw, p.kw, p.w, p.pw), ct))
                    if tiles is not None:
                        b.store(tiles[j], (l,), E.cast(out, k.y_t))
                    else:
                        b.store(k.y, (n, c, r0 + r + j, ow), E.cast(out, k.y_t))
            if tiles is not None:
                for j, tile in enumerate(tiles):
                    with b.loop("l", 0, stored, S.ForKind.VECTORIZE) as l:
                        if flat is not None:
                            b.store(flat, ((r + j) * p.ow + base + l,), E.Load(tile, (l,)))
                        else:
                            b.store(k.y, (n, c, r0 + r + j, base + l), E.Load(tile, (l,)))

        if p.ow >= lanes:
            with b.loop("t", 0, p.ow // lanes) as t:
                block(t * lanes, lanes, lanes)
            if p.ow % lanes:
                block(E.const(p.ow - lanes), lanes, lanes)  # overlaps the previous block
        else:
            block(E.const(0), short, p.ow)

    with b.loop("g", 0, count // group if group > 1 else count) as g:
        rows_of(g * group if group > 1 else g, group)
    if group > 1 and (p.oh % group or rows % group):
        with b.loop("r", count // group * group, count) as r:
            rows_of(r, 1)
    if flat is not None:
        with b.loop("q", 0, count * p.ow, S.ForKind.VECTORIZE) as q:
            b.store(k.y, (n, c, r0 + q // p.ow, q % p.ow), E.Load(flat, (q,)))


def _stage_row(b: Builder, k: _Kernel, buf: Var, at_row: tuple[Expr, ...], n: Expr, ci: Expr, ih: Expr, wb: int,
               lanes: int, pad: Expr) -> None:
    """``buf[*at_row, :] = `` input row ``ih``, padded, split into ``sw`` phases (see
    :func:`phase_width`).  Stride 1 copies in blocks of ``lanes`` (the last overlapping the one
    before), each a fixed-size copy — one vector move, where a whole-row copy would become a slow
    ``rep movs``; larger strides gather each phase in one vectorized loop."""
    p = k.p
    nq = phase_width(p)
    for ph in range(p.sw):
        # padded column q * sw + ph is input column q * sw + ph - pw: valid for q in [lo, hi)
        lo = min(nq, max(0, -(-(p.pw - ph) // p.sw)))
        hi = max(lo, min(nq, -(-(p.w + p.pw - ph) // p.sw)))
        for a, z in ((0, lo), (hi, nq)):
            if z > a:
                with b.loop("j", a + ph * nq, z + ph * nq, S.ForKind.VECTORIZE) as j:
                    b.store(buf, (*at_row, j), pad)
        width = hi - lo
        if width <= 0:
            continue
        first = lo * p.sw + ph - p.pw  # input column of q = lo

        def block(base: Expr, count: int, at: int = ph * nq + lo, first: int = first) -> None:
            with b.loop("j", 0, count, S.ForKind.VECTORIZE) as j:
                q = base + j
                b.store(buf, (*at_row, q + at), E.cast(E.Load(k.x, (n, ci, ih, q * p.sw + first)), k.ct))

        if p.sw > 1:
            block(E.const(0), width)
        elif width >= lanes:
            full = width // lanes
            if full <= MAX_UNROLLED_COPIES:  # separate copies: a loop of them becomes ``rep movs``
                for t in range(full):
                    block(E.const(t * lanes), lanes)
            else:  # long rows: a ``rep movs`` is fast enough
                with b.loop("t", 0, full) as t:
                    block(t * lanes, lanes)
            if width % lanes:
                block(E.const(width - lanes), lanes)
        else:
            block(E.const(0), width)


def _cpu_per_output(p: WindowProblem, k: _Kernel, b: Builder, parallel: bool) -> Module:
    """Adaptive windows and rows too wide to stage: one output at a time, taps predicated."""
    rows = spatial(p.n * p.c_out, p.oh)
    with b.mapping(rows.parallel() if parallel else rows.sequential(), "ro") as (nc, oh):
        n, c, ci = k.channels(nc)
        with b.loop("ow", 0, p.ow) as ow:
            b.store(k.y, (n, c, oh, ow), k.one_output(b, n, c, ci, oh, ow))
    return _module(p, k, b, None)


#: Planes reduced together by the global-pooling CPU kernel (one SIMD lane each at the end).
GLOBAL_PLANES = 16


def cpu_global(p: WindowProblem, lanes: int, parallel: bool) -> Module:
    """The window is the whole plane (global pooling).  Blocks of ``GLOBAL_PLANES`` planes: each
    plane is folded into ``width`` lanes (``spatial(width).vectorize()``, a masked tail), then
    one lane per plane sums its partial vector — no horizontal reduction per plane."""
    k = _Kernel(p)
    b = Builder()
    K, P = p.h * p.w, p.n * p.c_out
    x = Var("x", TensorType(k.x_t, (E.const(P), E.const(K))))
    y = Var("y", TensorType(k.y_t, (E.const(P),)))
    ct, rop = k.ct, k.rop
    scale = E.const(1.0 / (p.divisor if p.divisor is not None else K), ct) if p.op == "avg" else None

    def store(o: Expr, total: Expr) -> None:
        b.store(y, (o,), E.cast(total * scale if scale is not None else total, k.y_t))

    reduce_rows_in_blocks(b, P, GLOBAL_PLANES, parallel, K, lanes, ct, rop, lambda o, j: E.Load(x, (o, j)), store)
    name = f"global_{p.op}_pool_cpu"
    return Module((Function(name, FuncKind.CPU_KERNEL, (x, y), b.finish()),), name)


# ----------------------------------------------------------------------------- GPU


def gpu_window(p: WindowProblem, block: int) -> Module:
    """A thread per output, ``ow`` fastest (coalesced)."""
    k = _Kernel(p)
    b = Builder()
    total = p.n * p.c_out * p.oh * p.ow
    with b.mapping(spatial(block).on(threadIdx.x), "t") as (t,):
        e = blockIdx.x * block + t  # not bound to a variable: the simplifier sees it is non-negative
        with b.if_(E.compare(E.CmpOp.LT, e, total)):
            nc, oh, ow = unflat_index(e, (p.n * p.c_out, p.oh, p.ow))
            n, c, ci = k.channels(nc)
            b.store(k.y, (n, c, oh, ow), k.one_output(b, n, c, ci, oh, ow))
    one = E.const(1)
    launch = LaunchConfig((E.const(-(-total // block)), one, one), (E.const(block), one, one))
    return _module(p, k, b, launch)


def _module(p: WindowProblem, k: _Kernel, b: Builder, launch: LaunchConfig | None) -> Module:
    kind = "depthwise_conv2d" if p.op == "conv" else ("adaptive_" if p.adaptive else "") + f"{p.op}_pool2d"
    name = f"{kind}_{'gpu' if launch is not None else 'cpu'}"
    fk = FuncKind.GPU_KERNEL if launch is not None else FuncKind.CPU_KERNEL
    return Module((Function(name, fk, k.params, b.finish(), launch=launch),), name)


__all__ = ["MAX_UNROLLED_TAPS", "cpu_global", "cpu_window", "gpu_window"]
