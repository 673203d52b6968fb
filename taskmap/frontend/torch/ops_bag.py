"""``nn.EmbeddingBag`` / ``F.embedding_bag``: the rows of each bag of indices gathered and reduced
(``sum``, ``mean``, ``max``).

* **Bags of one size** (a 2-d input, no offsets): the embedding's rows ``(B, L, D)`` reduced over
  ``L``; ``per_sample_weights`` scale the rows (``sum``); ``padding_idx`` rows count for nothing.
* **Bags by offsets** (a 1-d input): each index's bag is the number of bag starts up to it, less
  one (a scatter of ones at the starts, then a running sum); the rows then go to their bags by a
  scatter-add (``sum``; ``mean`` divides by the bag's size) or a scatter-amax that leaves an empty
  bag at zero, as torch does (taskmap's scatter and scan kernels: CPU).  The indices equal to
  ``padding_idx`` go to one bag past the last, dropped.

An empty bag gives zeros in every mode, as in torch.  ``max_norm`` (which renormalizes the table's
rows in place) is not converted, nor are weights per sample outside ``sum`` (torch refuses them).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn.functional as F
from torch import nn

from ...graph import AxisAttrs, BinaryFn, OpKind, ReduceAttrs, ReduceFn, Tensor, WhereAttrs
from ...ir.dtypes import i64
from .ops_scatter import scatter_op
from .registry import Converter, NotConvertible, register

MODES = ("sum", "mean", "max")


def _zeros(cv: Converter, shape: tuple[int, ...], dtype: Any) -> Tensor:
    return cv.const(np.zeros(shape, dtype=dtype.numpy_dtype))


def _reduce(cv: Converter, fn: ReduceFn, x: Tensor, axis: int) -> Tensor:
    return cv.op(OpKind.REDUCE, [x], ReduceAttrs(fn, (axis,), False))


def _per_row(cv: Converter, rows: Tensor, factor: Tensor) -> Tensor:
    """``rows`` (..., D) times ``factor`` (...), one number per row."""
    return cv.binary(BinaryFn.MUL, rows, cv.reshape(cv.cast(factor, rows.dtype), (*factor.shape, 1)))


def _mean(cv: Converter, total: Tensor, count: Tensor) -> Tensor:
    """``total`` (B, D) over ``count`` (B) rows a bag, an empty bag's zeros kept."""
    return cv.binary(BinaryFn.DIV, total, cv.reshape(cv.binary(BinaryFn.MAXIMUM, count, 1.0), (count.shape[0], 1)))


def _equal_bags(cv: Converter, idx: Tensor, weight: Tensor, mode: str, psw: Any, padding_idx: Any) -> Tensor:
    rows = cv.op(OpKind.EMBEDDING, [weight, idx])                      # (B, L, D)
    keep = cv.binary(BinaryFn.NE, idx, padding_idx) if padding_idx is not None else None
    if mode == "max":
        if keep is None:
            return _reduce(cv, ReduceFn.MAX, rows, 1)
        masked = cv.op(OpKind.WHERE, [cv.reshape(keep, (*keep.shape, 1)), rows], WhereAttrs(b_scalar=float("-inf")))
        kept = _reduce(cv, ReduceFn.SUM, cv.cast(keep, rows.dtype), 1)
        return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.GT, cv.reshape(kept, (kept.shape[0], 1)), 0.0),
                                    _reduce(cv, ReduceFn.MAX, masked, 1)], WhereAttrs(b_scalar=0.0))
    if psw is not None:
        rows = _per_row(cv, rows, psw)
    if keep is not None:
        rows = _per_row(cv, rows, keep)
    total = _reduce(cv, ReduceFn.SUM, rows, 1)
    if mode == "sum":
        return total
    if keep is None:
        return cv.binary(BinaryFn.DIV, total, float(idx.shape[1]))
    return _mean(cv, total, _reduce(cv, ReduceFn.SUM, cv.cast(keep, rows.dtype), 1))


def _offset_bags(cv: Converter, idx: Tensor, weight: Tensor, offsets: Tensor, mode: str, psw: Any,
                 padding_idx: Any, include_last_offset: bool) -> Tensor:
    if not isinstance(offsets, Tensor) or offsets.ndim != 1:
        raise NotConvertible("embedding_bag of a 1-d input takes 1-d offsets")
    n, bags = idx.shape[0], offsets.shape[0] - int(bool(include_last_offset))
    starts = cv.cast(cv.slice(offsets, 0, 0, bags), i64)
    marks = scatter_op(cv, _zeros(cv, (n + 1,), starts.dtype), 0, starts, 1, "sum")
    running = cv.op(OpKind.CUMSUM, [cv.slice(marks, 0, 0, n)], AxisAttrs(0))
    bag = cv.binary(BinaryFn.SUB, running, 1)                         # (N): each index's bag
    if padding_idx is not None:                                        # to a bag past the last
        bag = cv.op(OpKind.WHERE, [cv.binary(BinaryFn.EQ, idx, padding_idx), bag], WhereAttrs(a_scalar=bags))
    rows = cv.op(OpKind.EMBEDDING, [weight, idx])                      # (N, D)
    if psw is not None:
        rows = _per_row(cv, rows, psw)
    dim = rows.shape[1]
    into = cv.expand(cv.reshape(bag, (n, 1)), (n, dim))
    out = scatter_op(cv, _zeros(cv, (bags + 1, dim), rows.dtype), 0, into, rows, "amax" if mode == "max" else "sum",
                     include_self=mode != "max")
    out = cv.slice(out, 0, 0, bags)
    if mode != "mean":
        return out
    count = scatter_op(cv, _zeros(cv, (bags + 1,), rows.dtype), 0, bag, 1.0, "sum")
    return _mean(cv, out, cv.slice(count, 0, 0, bags))


def embedding_bag_op(cv: Converter, idx: Tensor, weight: Tensor, offsets: Any = None, max_norm: Any = None,
                     mode: str = "mean", per_sample_weights: Any = None, include_last_offset: bool = False,
                     padding_idx: Any = None) -> Tensor:
    if max_norm is not None:
        raise NotConvertible("embedding_bag with max_norm")
    if mode not in MODES:
        raise NotConvertible(f"embedding_bag with mode={mode!r}")
    if per_sample_weights is not None and mode != "sum":
        raise NotConvertible(f"embedding_bag with per_sample_weights in mode {mode!r} (torch takes them in 'sum')")
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    if idx.ndim == 2 and offsets is None:
        return _equal_bags(cv, idx, weight, mode, per_sample_weights, padding_idx)
    if idx.ndim == 1 and offsets is not None:
        return _offset_bags(cv, idx, weight, offsets, mode, per_sample_weights, padding_idx, include_last_offset)
    raise NotConvertible(f"embedding_bag of a {idx.ndim}-d input {'with' if offsets is not None else 'without'} "
                         "offsets")


@register(F.embedding_bag, nn.EmbeddingBag)
def embedding_bag(cv: Converter, idx: Any, weight: Any = None, offsets: Any = None, max_norm: Any = None,
                  norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                  per_sample_weights: Any = None, include_last_offset: bool = False, padding_idx: Any = None) -> Tensor:
    if isinstance(idx, nn.Module):      # the module: (m, input, offsets=None, per_sample_weights=None)
        m, idx, psw = idx, weight, max_norm if max_norm is not None else per_sample_weights
        return embedding_bag_op(cv, idx, cv.param(m.weight, "weight"), offsets, m.max_norm, m.mode, psw,
                                m.include_last_offset, m.padding_idx)
    return embedding_bag_op(cv, idx, weight, offsets, max_norm, mode, per_sample_weights, include_last_offset,
                            padding_idx)
