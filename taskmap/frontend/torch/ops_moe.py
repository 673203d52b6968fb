"""Mixture-of-experts routing: the grouped matrix product (``F.grouped_mm``, ``torch._grouped_mm``,
ATen's ``_grouped_mm`` and transformers' ``grouped_mm_fallback``) and ``torch.histc``, which
transformers uses to count each expert's tokens.

**Grouped product.**  ``a (S, K)`` holds the tokens sorted by expert; ``offs (E,)`` ends each
expert's rows (``offs[e-1] <= s < offs[e]``); ``b (E, K, N)`` holds the experts' matrices; row ``s``
of the result is ``a[s] @ b[e]``.  The sizes of the groups are data, the graph's shapes are not, so
the product is built from ops of static shapes:

* **Rows in blocks of** ``BM`` (:func:`block_rows`): each expert's rows are cut into blocks of
  ``BM`` (its last block partial), the blocks of all experts numbered in order.  At most
  ``NB = (S + min(E, S) * (BM - 1)) // BM`` blocks exist whatever the routing.  Block ``j`` gathers
  its rows of ``a`` and its expert's matrix, and one batched product computes all blocks
  ``(NB, BM, K) @ (NB, K, N)`` — the gathers are injective, so they fuse into the product's
  operand reads; on the CPU the experts' stack is packed once and each block reads its expert's
  panels by index (``MatmulProblem.b_groups``: no copy of a matrix per block).  Row ``s`` of the result is row
  ``bstart[e] * BM + (s - offs[e-1])`` of the blocks' output, another gather.
* ``BM = 1`` (few rows an expert, as when decoding) is one matrix-vector product per row with its
  expert's matrix: no padding and nothing to gather back.

The padding rows and the unused blocks (their expert's last block, the blocks past the last
expert's) are computed and dropped: at most ``min(E, S) * (BM - 1)`` rows, which
:func:`block_rows` bounds by choosing ``BM`` no larger than half of the average group.  Rows past
``offs[-1]`` are zeros (as transformers' fallback; ``torch._grouped_mm`` leaves them unwritten).

Also converted: both operands 3-d without ``offs`` (a batched product).  Not converted, with the
reason: a 2-d ``b`` (the weight-gradient form, groups along K), ``bias`` (torch refuses it too).

**histc** counts the values in ``bins`` equal bins between ``min`` and ``max`` (the data's own
extremes when they are equal, as torch — moved 1 apart when those are equal too), values outside
left out, a value equal to ``max`` in the last bin.  A value's bin is the number of inner bin
edges at or below it — the edges torch computes (``linspace``), so a value on an edge lands where
torch puts it — and each bin counts its values (one comparison per value and bin, then a sum:
right for the few bins of routing and of quantization statistics, quadratic for large
histograms).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, ReduceFn, Tensor, WhereAttrs
from ...ir.dtypes import i64
from .ops_nn import _reduce
from .ops_search import _count_below
from .registry import Converter, NotConvertible, from_torch_dtype, register

#: The largest row block of the blocked grouped product.  Measured on Zen 4, two cores (the CPU
#: template's panels outer, each expert's panels then read once): 256 rows of 1024 -> 5632 over 8
#: experts 27.4 ms in blocks of 16, 32.1 in blocks of 32 and 33.6 in blocks of 8; 1024 rows of
#: 1024 -> 2816, 38.2 ms in blocks of 16, 43.4 in 32, 52.9 in 8.
MAX_BLOCK_ROWS = 16


def block_rows(rows: int, groups: int) -> int:
    """``BM``: the largest power of two up to :data:`MAX_BLOCK_ROWS` and half the average group
    (``rows / groups / 2``), so the padding stays under about half of the rows; 1 when groups
    average fewer than four rows."""
    bm = 1
    while bm * 2 <= MAX_BLOCK_ROWS and bm * 2 * 2 * groups <= rows:
        bm *= 2
    return bm


def _gather(cv: Converter, table: Tensor, index: Tensor) -> Tensor:
    """``table[index]`` along the first dimension (``index`` of any shape)."""
    return cv.op(OpKind.EMBEDDING, [table, index])


def _pick(cv: Converter, vector: Tensor, index: Tensor) -> Tensor:
    """``vector[index]`` of a 1-d ``vector``: the result has ``index``'s shape."""
    return cv.reshape(_gather(cv, cv.reshape(vector, (vector.shape[0], 1)), index), index.shape)


def _arange(cv: Converter, n: int) -> Tensor:
    return cv.const(np.arange(n, dtype=np.int64))


def _clamp(cv: Converter, x: Tensor, lo: int, hi: int) -> Tensor:
    return cv.binary(BinaryFn.MINIMUM, cv.binary(BinaryFn.MAXIMUM, x, lo), hi)


def _inclusive_sum(cv: Converter, x: Tensor) -> Tensor:
    """The running sum of a short 1-d vector as one masked reduction (no scan kernel: any device)."""
    n = x.shape[0]
    lower = cv.const(np.tril(np.ones((n, n), dtype=np.int64)))
    return _reduce(cv, ReduceFn.SUM, cv.binary(BinaryFn.MUL, lower, cv.reshape(x, (1, n))), (1,), False)


def grouped_rows(cv: Converter, a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """``out[s] = a[s] @ b[e]`` for ``offs[e-1] <= s < offs[e]``, zeros past ``offs[-1]``."""
    (rows, k), (groups, _, n) = a.shape, b.shape
    ends = cv.cast(offs, i64)
    starts = cv.op(OpKind.CONCAT, [cv.const(np.zeros(1, np.int64)), cv.slice(ends, 0, 0, groups - 1)], AxisAttrs(0)) \
        if groups > 1 else cv.const(np.zeros(1, np.int64))
    s = _arange(cv, rows)
    group = _count_below(cv, ends, s, True, False)              # (S,): experts ending at or before s
    inside = cv.binary(BinaryFn.LT, group, groups)
    group = cv.binary(BinaryFn.MINIMUM, group, groups - 1)
    bm = block_rows(rows, groups)
    if bm == 1:
        per_row = cv.op(OpKind.MATMUL, [cv.reshape(a, (rows, 1, k)), _gather(cv, b, group)])
        out = cv.reshape(per_row, (rows, n))
    else:
        nblocks = (rows + min(groups, rows) * (bm - 1)) // bm
        counts = cv.binary(BinaryFn.MAXIMUM, cv.binary(BinaryFn.SUB, ends, starts), 0)
        nblk = cv.binary(BinaryFn.FLOOR_DIVIDE, cv.binary(BinaryFn.ADD, counts, bm - 1), bm)
        bend = _inclusive_sum(cv, nblk)
        bstart = cv.binary(BinaryFn.SUB, bend, nblk)
        j = _arange(cv, nblocks)
        owner = cv.binary(BinaryFn.MINIMUM, _count_below(cv, bend, j, True, False), groups - 1)   # (NB,)
        first = cv.binary(BinaryFn.ADD, _pick(cv, starts, owner),
                          cv.binary(BinaryFn.MUL, cv.binary(BinaryFn.SUB, j, _pick(cv, bstart, owner)), bm))
        block_row = cv.binary(BinaryFn.ADD, cv.reshape(first, (nblocks, 1)),
                              cv.const(np.arange(bm, dtype=np.int64).reshape(1, bm)))
        a_blocks = _gather(cv, a, _clamp(cv, block_row, 0, rows - 1))                  # (NB, BM, K)
        c = cv.op(OpKind.MATMUL, [a_blocks, _gather(cv, b, owner)])                    # (NB, BM, N)
        local = cv.binary(BinaryFn.SUB, s, _pick(cv, starts, group))
        at = cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, _pick(cv, bstart, group), bm), local)
        out = _gather(cv, cv.reshape(c, (nblocks * bm, n)), _clamp(cv, at, 0, nblocks * bm - 1))
    return cv.op(OpKind.WHERE, [cv.reshape(inside, (rows, 1)), out], WhereAttrs(b_scalar=0))


#: The grouped products this torch has (``F.grouped_mm`` since 2.10, ``torch._grouped_mm`` since 2.8).
_GROUPED_MM = tuple(f for f in (getattr(F, "grouped_mm", None), getattr(torch, "_grouped_mm", None)) if f is not None)


@register(*_GROUPED_MM, "transformers::grouped_mm_fallback")
def grouped_mm(cv: Converter, a: Tensor, b: Tensor, offs: Any = None, bias: Any = None, out_dtype: Any = None
               ) -> Tensor:
    if bias is not None:
        raise NotConvertible("grouped_mm with a bias (torch does not support one either)")
    if a.dtype is not b.dtype:
        raise NotConvertible(f"grouped_mm of {a.dtype.name} by {b.dtype.name}")
    if a.ndim == 3 and b.ndim == 3 and offs is None:
        if a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
            raise NotConvertible(f"grouped_mm of {list(a.shape)} by {list(b.shape)}")
        out = cv.op(OpKind.MATMUL, [a, b])
    elif a.ndim == 2 and b.ndim == 3 and isinstance(offs, Tensor):
        if offs.ndim != 1 or offs.shape[0] != b.shape[0] or a.shape[1] != b.shape[1] or offs.dtype.is_float:
            raise NotConvertible(f"grouped_mm of {list(a.shape)} by {list(b.shape)} in groups "
                                 f"{offs.dtype.name}{list(offs.shape)} (wants (S, K) by (E, K, N), offs of E ints)")
        out = grouped_rows(cv, a, b, offs)
    else:
        raise NotConvertible(f"grouped_mm of {a.ndim}-d by {b.ndim}-d operands"
                             f"{' with' if isinstance(offs, Tensor) else ' without'} offs (converted: 2-d by 3-d "
                             f"with offs, 3-d by 3-d without)")
    return cv.cast(out, from_torch_dtype(out_dtype)) if out_dtype is not None else out


# ----------------------------------------------------------------------------- histc


def _linspace_edges(cv: Converter, lo: Tensor, hi: Tensor, bins: int) -> Tensor:
    """The inner edges ``1 .. bins-1`` of ``linspace(lo, hi, bins + 1)`` as torch computes them
    (from the nearer end: ``lo + j*step`` below the middle, ``hi - (bins-j)*step`` above)."""
    step = cv.binary(BinaryFn.DIV, cv.binary(BinaryFn.SUB, hi, lo), float(bins))
    j = np.arange(1, bins)
    low = j < (bins + 1) // 2
    dtype = lo.dtype.numpy_dtype
    from_lo = cv.binary(BinaryFn.ADD, lo, cv.binary(BinaryFn.MUL, step, cv.const(j.astype(dtype))))
    from_hi = cv.binary(BinaryFn.SUB, hi, cv.binary(BinaryFn.MUL, step, cv.const((bins - j).astype(dtype))))
    return cv.op(OpKind.WHERE, [cv.const(low), from_lo, from_hi])


@register(torch.histc, "histc")
def histc(cv: Converter, x: Tensor, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:
    bins = int(bins)
    if bins <= 0:
        raise NotConvertible(f"histc with {bins} bins")
    if not x.dtype.is_float or x.dtype.name == "bfloat16":
        raise NotConvertible(f"histc of a {x.dtype.name} tensor (converted: float16, float32, float64)")
    if x.numel == 0:
        raise NotConvertible("histc of an empty tensor")
    flat = cv.reshape(x, (x.numel,))
    if float(min) == float(max):    # the data's extremes (moved apart by 1 when equal), as torch
        lo, hi = (cv.reshape(_reduce(cv, fn, flat, (0,), False), (1,)) for fn in (ReduceFn.MIN, ReduceFn.MAX))
        same = cv.binary(BinaryFn.EQ, lo, hi)
        lo = cv.op(OpKind.WHERE, [same, cv.binary(BinaryFn.SUB, lo, 1.0), lo])
        hi = cv.op(OpKind.WHERE, [same, cv.binary(BinaryFn.ADD, hi, 1.0), hi])
        edges = _linspace_edges(cv, lo, hi, bins) if bins > 1 else None
    else:
        lo_v, hi_v = float(min), float(max)
        if lo_v > hi_v or not (np.isfinite(lo_v) and np.isfinite(hi_v)):
            raise NotConvertible(f"histc between {min} and {max}")
        grid = torch.linspace(lo_v, hi_v, bins + 1, dtype=getattr(torch, x.dtype.name))
        lo, hi = (cv.const(grid[i:i + 1].numpy()) for i in (0, bins))
        edges = cv.const(grid[1:bins].numpy()) if bins > 1 else None
    inside = cv.binary(BinaryFn.BITWISE_AND, cv.cast(cv.binary(BinaryFn.GE, flat, lo), i64),
                       cv.cast(cv.binary(BinaryFn.LE, flat, hi), i64))
    where = _count_below(cv, edges, flat, True, False) if edges is not None else cv.binary(BinaryFn.MUL, inside, 0)
    hit = cv.binary(BinaryFn.EQ, cv.reshape(where, (x.numel, 1)), cv.const(np.arange(bins, dtype=np.int64)))
    hit = cv.binary(BinaryFn.MUL, cv.cast(hit, i64), cv.reshape(inside, (x.numel, 1)))
    return cv.cast(_reduce(cv, ReduceFn.SUM, hit, (0,), False), x.dtype)
