"""Scatter-style writes: ``scatter`` / ``scatter_add`` / ``scatter_reduce``, ``index_copy`` /
``index_add`` (as ``torch``'s functional forms: a new array, the input unchanged).

``y = x`` with, for every position ``p`` of ``index``, ``y[p with p[dim] = index[p]]`` set to
``src[p]`` (``scatter``) or combined with it (``reduce``: ``"sum"``, ``"prod"``, ``"amax"``,
``"amin"``, ``"mean"``; ``include_self=False`` leaves ``x``'s values out of the positions
written).  ``index_copy`` / ``index_add`` pick whole slices: ``index`` is 1-d, one entry per
slice of ``source`` along ``dim``.

One CPU kernel per (reduce, include_self, dtypes), its sizes symbolic.  Arrays are viewed as
``(outer, extent, inner)`` around ``dim`` (``index`` and ``src`` as ``(outer, n, inner)``).
The cores take blocks of :data:`BLOCK` columns of one ``outer`` row: two positions of ``index``
write the same element only if they share their column, so each element is written by one core,
in the order of ``index`` along ``dim`` — deterministic, and the last write wins where ``index``
repeats a position (as torch does on the CPU).  Positions of ``index`` out of ``[0, extent)``
are skipped and reported (``OpError``), as torch raises.  ``include_self=False`` and ``"mean"``
count the writes per element in an int32 workspace (set for the elements written, first, so it
needs no clearing).  float16 / bfloat16 compute in float32 (rounded once, as torch's CPU kernels
accumulate); bool reductions compute in int32 (any / all).  GPU arrays are not supported yet
(``UnsupportedError``).
"""

import math
from typing import Any

import numpy as np

from ..errors import OpError, UnsupportedError
from ..ir.dtypes import ScalarType, i32, i64, scalar_type
from ..lang import parallel, symbol
from ..lang.kernel import kernel
from ..runtime.args import view
from ..runtime.kernel import Kernel
from ._dispatch import SUPPORTED, _cached, _launch, new_output, normalize_axis, prepare, target_for
from .elementwise import cast, mul
from .arrays import shape_of
from .transform import broadcast_to, concat, reshape
from .transform import slice as slice_

REDUCTIONS = ("sum", "prod", "amax", "amin", "mean")
#: Columns (elements along the inner dimensions) a core takes at a time.
BLOCK = 256


def build_scatter(reduce: str | None, include_self: bool, t: ScalarType, ti: ScalarType) -> Kernel:
    outer, extent, n, inner, cells = symbol("outer"), symbol("extent"), symbol("n"), symbol("inner"), symbol("cells")
    blocks_expr = (inner + BLOCK - 1) // BLOCK
    COUNT = reduce == "mean" or (reduce is not None and not include_self)
    FIRST = reduce is not None and not include_self
    SUM, PROD, MAX, MIN, MEAN = (reduce == r for r in REDUCTIONS)
    FLOOR = reduce == "mean" and not t.is_float
    B = BLOCK

    @kernel
    def scatter(x: t[outer, extent, inner], index: ti[outer, n, inner], src: t[outer, n, inner],
                y: t[outer, extent, inner], cnt: i32[cells], bad: i64[2]):
        for r in parallel(outer * blocks_expr):
            o = r // blocks_expr
            j0 = (r % blocks_expr) * B
            j1 = min(j0 + B, inner)
            for e in range(extent):
                for j in range(j0, j1):
                    y[o, e, j] = x[o, e, j]
            if COUNT:
                for i in range(n):
                    for j in range(j0, j1):
                        k = index[o, i, j]
                        if k >= 0 and k < extent:
                            if include_self:
                                cnt[(o * extent + k) * inner + j] = 1
                            else:
                                cnt[(o * extent + k) * inner + j] = 0
            for i in range(n):
                for j in range(j0, j1):
                    k = index[o, i, j]
                    if k >= 0 and k < extent:
                        v = src[o, i, j]
                        w = y[o, k, j]
                        if reduce is None:
                            w = v
                        elif SUM or MEAN:
                            w = w + v
                        elif PROD:
                            w = w * v
                        elif MAX:
                            if v > w or v != v:
                                w = v
                        elif MIN:
                            if v < w or v != v:
                                w = v
                        if FIRST:
                            if cnt[(o * extent + k) * inner + j] == 0:
                                w = v
                        y[o, k, j] = w
                        if COUNT:
                            cnt[(o * extent + k) * inner + j] = cnt[(o * extent + k) * inner + j] + 1
                    else:
                        bad[0] = i64(1)
                        bad[1] = i64(k)
            if MEAN:
                for i in range(n):
                    for j in range(j0, j1):
                        k = index[o, i, j]
                        if k >= 0 and k < extent:
                            c = cnt[(o * extent + k) * inner + j]
                            if c > 0:
                                if FLOOR:
                                    q = y[o, k, j] // t(c)
                                    y[o, k, j] = q
                                else:
                                    y[o, k, j] = y[o, k, j] / t(c)
                                cnt[(o * extent + k) * inner + j] = 0

    return scatter


def _int_scalar(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def scatter(x: Any, dim: int, index: Any, src: Any, reduce: str | None = None, include_self: bool = True) -> Any:
    """``torch.scatter(x, dim, index, src)`` (``reduce``: also ``torch.scatter_reduce``): ``x``
    with ``src[p]`` written to (combined into) ``x[p with p[dim] = index[p]]`` for every position
    ``p`` of ``index``.  ``src`` is an array of ``x``'s dtype, at least ``index``'s size in every
    dimension; ``index`` int32 / int64 of ``x``'s rank, at most ``x``'s size outside ``dim``."""
    op = "scatter" if reduce is None else "scatter_reduce"
    if reduce is not None and reduce not in REDUCTIONS:
        raise OpError(f"{op}(): reduce must be one of {', '.join(REDUCTIONS)}, got {reduce!r}")
    args = prepare(op, x, index, src, allowed=SUPPORTED)
    (xs, ixs, ss), (dt, dti, dts) = args.shapes, args.dtypes
    if dti not in ("int32", "int64"):
        raise OpError(f"{op}(): index must be int32 or int64, got {dti}")
    if dts != dt:
        raise OpError(f"{op}(): src must have x's dtype {dt}, got {dts}")
    rank = max(len(xs), 1)
    if max(len(ixs), 1) != rank or max(len(ss), 1) != rank:
        raise OpError(f"{op}(): x, index and src must have the same number of dimensions; got shapes "
                      f"{tuple(xs)}, {tuple(ixs)}, {tuple(ss)}")
    ax = normalize_axis(op, dim, len(xs))
    xs, ixs, ss = (tuple(s) or (1,) for s in (xs, ixs, ss))
    if any(i > s for i, s in zip(ixs, ss)) or any(i > n for d, (i, n) in enumerate(zip(ixs, xs)) if d != ax):
        raise OpError(f"{op}(): index {ixs} must be no larger than src {ss} in every dimension and than x {xs} "
                      f"outside dim {ax}")
    if reduce == "mean" and dt == "bool":
        raise OpError(f"{op}(): reduce='mean' of a bool array")
    target = target_for(args.kind)
    if target.kind.value != "cpu":
        raise UnsupportedError(f"{op}() runs on the CPU only for now; got a {target.kind.value} array")
    xa, ia, sa = args.arrays
    for d, (i, s) in enumerate(zip(ixs, ss)):        # src: index's shape
        if s != i:
            sa = slice_(sa, d, 0, i)
    box = [i if d != ax else n for d, (i, n) in enumerate(zip(ixs, xs))]
    if tuple(box) != xs:                             # index covers part of x outside dim: scatter into that part
        part = xa
        for d, b in enumerate(box):
            if b != xs[d]:
                part = slice_(part, d, 0, b)
        return _paste(xa, scatter(part, ax, ia, sa, reduce, include_self), box)
    work = "float32" if dt in ("float16", "bfloat16") else "int32" if dt == "bool" and reduce else dt
    if work != dt:
        return cast(scatter(cast(xa, work), ax, ia, cast(sa, work), reduce, include_self), dt)
    if math.prod(ixs) == 0:                          # nothing written: a copy of x
        return broadcast_to(xa, xs)
    out = new_output(args.kind, xs, dt)
    t, ti = scalar_type(dt), scalar_type(dti)
    outer, extent, inner = math.prod(xs[:ax]), xs[ax], math.prod(xs[ax + 1:])
    count = reduce == "mean" or (reduce is not None and not include_self)
    cnt = np.empty(outer * extent * inner if count else 1, np.int32)
    bad = np.zeros(2, np.int64)
    kern = _cached(("scatter", reduce, bool(include_self), t.name, ti.name, target),
                   lambda: build_scatter(reduce, bool(include_self), t, ti))
    n = ixs[ax]
    _launch(kern, args.kind, [view(xa, (outer, extent, inner)), view(ia, (outer, n, inner)),
                              view(sa, (outer, n, inner)), view(out, (outer, extent, inner)), cnt, bad])
    if int(bad[0]):
        raise OpError(f"{op}(): index {int(bad[1])} is out of bounds for dimension {ax} with size {extent}")
    return out


def _paste(x: Any, part: Any, box: list[int]) -> Any:
    """``x`` with its leading corner of shape ``box`` replaced by ``part``: ``part`` joined, one
    dimension after the other, with the rest of ``x`` along it."""
    cur = part
    for d, (b, n) in enumerate(zip(box, shape_of(x))):
        if b == n:
            continue
        rest = slice_(x, d, b, n)
        for e in range(d + 1, len(box)):
            if box[e] != shape_of(x)[e]:
                rest = slice_(rest, e, 0, box[e])
        cur = concat([cur, rest], d)
    return cur


def scatter_add(x: Any, dim: int, index: Any, src: Any) -> Any:
    """``torch.scatter_add``: :func:`scatter` adding ``src`` into ``x``."""
    return scatter(x, dim, index, src, "sum")


def scatter_reduce(x: Any, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Any:
    """``torch.scatter_reduce``: :func:`scatter` combining by ``reduce`` (``"sum"``, ``"prod"``,
    ``"amax"``, ``"amin"``, ``"mean"``; integer means round down, as torch's)."""
    return scatter(x, dim, index, src, reduce, include_self)


def _slices_index(op: str, x: Any, dim: int, index: Any, source: Any) -> tuple[int, Any]:
    """``index`` (1-d, one entry per slice of ``source`` along ``dim``) as a :func:`scatter` index
    of ``source``'s shape."""
    args = prepare(op, x, index, source)
    (xs, ixs, ss), dti = args.shapes, args.dtypes[1]
    if dti not in ("int32", "int64"):
        raise OpError(f"{op}(): index must be int32 or int64, got {dti}")
    ax = normalize_axis(op, dim, len(xs))
    if len(ixs) > 1 or len(ss) != len(xs) or (xs and (math.prod(ixs) != ss[ax] or
                                                      any(a != b for d, (a, b) in enumerate(zip(xs, ss)) if d != ax))):
        raise OpError(f"{op}(): source {tuple(ss)} must match x {tuple(xs)} outside dim {ax} and have one slice "
                      f"per entry of the 1-d index {tuple(ixs)}")
    shape = [1] * max(len(ss), 1)
    shape[ax] = math.prod(ixs)
    return ax, broadcast_to(reshape(args.arrays[1], shape), tuple(ss) or (1,))


def index_copy(x: Any, dim: int, index: Any, source: Any) -> Any:
    """``torch.index_copy``: ``x`` with its slice ``index[i]`` along ``dim`` replaced by slice
    ``i`` of ``source``."""
    ax, full = _slices_index("index_copy", x, dim, index, source)
    return scatter(x, ax, full, source)


def index_add(x: Any, dim: int, index: Any, source: Any, alpha: float = 1) -> Any:
    """``torch.index_add``: ``x`` with ``alpha`` times slice ``i`` of ``source`` added to its slice
    ``index[i]`` along ``dim``."""
    ax, full = _slices_index("index_add", x, dim, index, source)
    return scatter(x, ax, full, source if alpha == 1 else mul(source, alpha), "sum")


__all__ = ["BLOCK", "REDUCTIONS", "build_scatter", "index_add", "index_copy", "scatter", "scatter_add",
           "scatter_reduce"]
