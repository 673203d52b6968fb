"""Sequential operators along an axis: prefix scans — ``cumsum``, ``cumprod``, ``cummax`` and
``cummin``, ``logcumsumexp`` — and selection — ``topk`` and ``sort`` (as their ``torch`` namesakes).

The input is viewed as ``(outer, extent, inner)`` with the scanned axis in the middle.  One CPU
kernel per (op, dtypes), its sizes symbolic: the cores take blocks of ``outer``; each output row
``y[o, i, :]`` is ``y[o, i - 1, :] (+|*) x[o, i, :]``, a vector loop over ``inner`` (contiguous)
that reads back the row it just wrote — no accumulator array, whatever ``inner`` is.  Scanning
the last axis (``inner = 1``) is a dependent chain per row, the cores splitting the rows.

``cummax`` / ``cummin`` also give the index of each running extremum (int64): the latest of equal
values, and NaN wins from where it first appears, each later NaN taking over the index — as torch.
Their values keep the input's dtype (bool inputs are refused).

Types of ``cumsum`` / ``cumprod`` follow torch: integer and bool inputs give int64; float16 / bfloat16 accumulate in
float32 (the row read back stays in float32 until the result is rounded once, by a final
cast); ``dtype=`` converts first.

``topk`` keeps each row's ``k`` best in its outputs, in order, by insertion (``k`` compares and
moves at most per element: meant for small ``k``); ``sort`` is ``topk`` of the whole row
(insertion sort: rows up to :data:`MAX_SORT` long).  NaN ranks above every number, as in torch;
equal values keep their order (the first one ranks higher).  GPU arrays are not supported yet
(``UnsupportedError``).
"""

import math
from typing import Any

from ..errors import OpError, UnsupportedError
from ..ir.dtypes import ScalarType, f32, i64, scalar_type
from ..lang import exp, log1p, parallel, select, symbol
from ..lang.kernel import kernel
from ..runtime.args import view
from ..runtime.kernel import Kernel
from ._dispatch import SUPPORTED, _cached, _launch, dtype_name, new_output, normalize_axis, prepare, target_for
from .elementwise import cast

SCANS = ("cumsum", "cumprod", "logcumsumexp", "cummax", "cummin")
#: The longest row ``sort`` takes (insertion sort: quadratic in the row).
MAX_SORT = 4096


def scan_type(dtype: str) -> ScalarType:
    """The type a scan of ``dtype`` computes and returns (before any final rounding)."""
    t = scalar_type(dtype)
    if t.is_float:
        return f32 if t.nbytes == 2 else t
    return i64


def build_scan(op: str, t_in: ScalarType, t_out: ScalarType) -> Kernel:
    outer, extent, inner = symbol("outer"), symbol("extent"), symbol("inner")
    LN2 = math.log(2.0)

    @kernel
    def scan(x: t_in[outer, extent, inner], y: t_out[outer, extent, inner]):
        for o in parallel(outer):
            for j in range(inner):
                y[o, 0, j] = t_out(x[o, 0, j])
            for i in range(1, extent):
                for j in range(inner):
                    a = y[o, i - 1, j]
                    b = t_out(x[o, i, j])
                    if op == "cumprod":
                        y[o, i, j] = a * b
                    elif op == "cumsum":
                        y[o, i, j] = a + b
                    else:       # log(exp(a) + exp(b)): equal terms (infinities too) add log 2; NaN stays
                        m = select(a > b, a, b)
                        d = select(a > b, b, a) - m
                        y[o, i, j] = select(a != a or b != b, a + b, select(a == b, a + LN2, m + log1p(exp(d))))

    return scan


def build_cumext(largest: bool, t: ScalarType) -> Kernel:
    """The running maximum (``largest``) or minimum along ``extent`` and its index."""
    outer, extent, inner = symbol("outer"), symbol("extent"), symbol("inner")
    FLOAT = t.is_float

    @kernel
    def cumext(x: t[outer, extent, inner], y: t[outer, extent, inner], ix: i64[outer, extent, inner]):
        for o in parallel(outer):
            for j in range(inner):
                y[o, 0, j] = x[o, 0, j]
                ix[o, 0, j] = i64(0)
            for i in range(1, extent):
                for j in range(inner):
                    v = x[o, i, j]
                    w = y[o, i - 1, j]
                    if FLOAT:
                        take = v != v or (w == w and (v >= w if largest else v <= w))
                    else:
                        take = v >= w if largest else v <= w
                    y[o, i, j] = select(take, v, w)
                    ix[o, i, j] = select(take, i64(i), ix[o, i - 1, j])

    return cumext


def build_topk(k: int, largest: bool, t: ScalarType) -> Kernel:
    outer, extent, inner = symbol("outer"), symbol("extent"), symbol("inner")
    K = k
    FLOAT = t.is_float

    @kernel
    def topk(x: t[outer, extent, inner], y: t[outer, K, inner], ix: i64[outer, K, inner]):
        for r in parallel(outer * inner):
            o = r // inner
            j = r % inner
            for i in range(extent):
                v = x[o, i, j]
                pos = min(i, K)
                moving = True
                while moving and pos > 0:
                    w = y[o, pos - 1, j]
                    if largest:
                        better = v > w or (FLOAT and v != v and w == w)
                    else:
                        better = v < w or (FLOAT and w != w and v == v)
                    if better:
                        if pos < K:
                            y[o, pos, j] = w
                            ix[o, pos, j] = ix[o, pos - 1, j]
                        pos = pos - 1
                    else:
                        moving = False
                if pos < K:
                    y[o, pos, j] = v
                    ix[o, pos, j] = i64(i)

    return topk


def topk(x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Any, Any]:  # noqa: A002
    """``torch.topk``: the ``k`` largest (smallest) along ``dim``, in order, and their indices."""
    return _select("topk", x, k, dim, largest)


def sort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False) -> tuple[Any, Any]:
    """``torch.sort``: values along ``dim`` in order and their indices (equal values keep their
    order, as ``stable=True``; rows up to :data:`MAX_SORT` long)."""
    return _select("sort", x, None, dim, descending)


def _select(op: str, x: Any, k: int | None, dim: int, largest: bool) -> tuple[Any, Any]:
    args = prepare(op, x, allowed=[d for d in SUPPORTED if d != "bool"])
    axis, outer, extent, inner = _along(op, args, dim)
    if k is None:
        if extent > MAX_SORT:
            raise UnsupportedError(f"sort(): rows of {extent} elements; taskmap's insertion sort takes at most "
                                   f"{MAX_SORT}")
        k = extent
    if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= extent:
        raise OpError(f"{op}(): k must be an int in 0..{extent} (the size of dim {dim}), got {k!r}")
    out_shape = tuple(k if d == axis else n for d, n in enumerate(args.shapes[0]))
    t = scalar_type(args.dtypes[0])
    values, indices = new_output(args.kind, out_shape, t.name), new_output(args.kind, out_shape, "int64")
    if math.prod(out_shape) == 0:
        return values, indices
    kern = _cached(("topk", k, bool(largest), t.name, target_for(args.kind)), lambda: build_topk(k, bool(largest), t))
    _launch(kern, args.kind, [view(args.arrays[0], (outer, extent, inner)), view(values, (outer, k, inner)),
                              view(indices, (outer, k, inner))])
    return values, indices


def _along(op: str, args: Any, dim: Any) -> tuple[int, int, int, int]:
    """``(axis, outer, extent, inner)`` of ``op``'s array along ``dim`` (a 0-d array as one
    element), after checking ``dim`` and that the array is on the CPU."""
    shape = tuple(args.shapes[0]) or (1,)
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise OpError(f"{op}(): dim must be an int, got {dim!r}")
    axis = normalize_axis(op, dim, len(shape))
    target = target_for(args.kind)
    if target.kind.value != "cpu":
        raise UnsupportedError(f"{op}() runs on the CPU only for now; got a {target.kind.value} array")
    return axis, math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])


def _scan(op: str, x: Any, dim: int, dtype: Any = None) -> Any:
    if dtype is not None:
        x = cast(x, dtype_name(dtype))
    args = prepare(op, x, allowed=SUPPORTED)
    _, outer, extent, inner = _along(op, args, dim)
    t_in = scalar_type(args.dtypes[0])
    t_acc = scan_type(args.dtypes[0])
    out = new_output(args.kind, args.shapes[0], t_acc.name)
    if outer * extent * inner == 0:
        return out
    k = _cached(("scan", op, t_in.name, t_acc.name, target_for(args.kind)), lambda: build_scan(op, t_in, t_acc))
    _launch(k, args.kind, [view(args.arrays[0], (outer, extent, inner)), view(out, (outer, extent, inner))])
    return out if t_acc is t_in or not t_in.is_float else cast(out, t_in.name)


def cumsum(x: Any, dim: int, dtype: Any = None) -> Any:
    """``torch.cumsum(x, dim, dtype=None)``: running sums along ``dim``."""
    return _scan("cumsum", x, dim, dtype)


def logcumsumexp(x: Any, dim: int) -> Any:
    """``torch.logcumsumexp(x, dim)``: running ``log(sum(exp(x)))`` along ``dim`` (floats)."""
    args = prepare("logcumsumexp", x, allowed=[d for d in SUPPORTED if scalar_type(d).is_float])
    return _scan("logcumsumexp", args.arrays[0], dim)


def cumprod(x: Any, dim: int, dtype: Any = None) -> Any:
    """``torch.cumprod(x, dim, dtype=None)``: running products along ``dim``."""
    return _scan("cumprod", x, dim, dtype)


def _cumext(op: str, x: Any, dim: int) -> tuple[Any, Any]:
    args = prepare(op, x, allowed=[d for d in SUPPORTED if d != "bool"])
    _, outer, extent, inner = _along(op, args, dim)
    t = scalar_type(args.dtypes[0])
    values, indices = new_output(args.kind, args.shapes[0], t.name), new_output(args.kind, args.shapes[0], "int64")
    if outer * extent * inner == 0:
        return values, indices
    largest = op == "cummax"
    kern = _cached(("cumext", largest, t.name, target_for(args.kind)), lambda: build_cumext(largest, t))
    _launch(kern, args.kind, [view(a, (outer, extent, inner)) for a in (args.arrays[0], values, indices)])
    return values, indices


def cummax(x: Any, dim: int) -> tuple[Any, Any]:
    """``torch.cummax(x, dim)``: the running maxima along ``dim`` and their indices."""
    return _cumext("cummax", x, dim)


def cummin(x: Any, dim: int) -> tuple[Any, Any]:
    """``torch.cummin(x, dim)``: the running minima along ``dim`` and their indices."""
    return _cumext("cummin", x, dim)


__all__ = ["MAX_SORT", "SCANS", "build_cumext", "build_scan", "build_topk", "cummax", "cummin", "cumprod", "cumsum",
           "logcumsumexp", "scan_type", "sort", "topk"]
