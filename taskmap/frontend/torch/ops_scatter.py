"""Scatter-style writes: ``scatter`` / ``scatter_add`` / ``scatter_reduce``, ``index_copy`` /
``index_add``, ``index_put`` and item assignment through index tensors (``x[idx] = v``,
``x[mask] = v``), in place or not.

All become the SCATTER op (:func:`taskmap.ops.scatter`, CPU only, torch's shape rules: an
``index`` smaller than ``x`` outside the axis writes into that corner); ``index_copy`` /
``index_add`` expand their 1-d index over the slices; integer index tensors on adjacent
dimensions (``x[i, j] = v``, broadcast together, negative entries counted from the end) become
one flat index into those dimensions; a
boolean mask with values that do not depend on how many elements it selects (a number, or one
value per element of the trailing dimensions) becomes a ``where``.
"""
from __future__ import annotations

import builtins
import math
import operator
from typing import Any

import numpy as np
import torch

from ...graph import BinaryFn, OpKind, ScatterAttrs, Tensor, WhereAttrs
from ...ir.dtypes import i64
from .ops_tensor import _wrapped, setitem_basic
from .registry import Converter, NotConvertible, norm_axis, register

#: ``scatter(..., reduce=)``'s names (deprecated in torch) as ``scatter_reduce``'s.
_OLD_REDUCE = {"add": "sum", "multiply": "prod"}


def _cpu_only(x: Tensor, what: str) -> None:
    if not str(x.device).startswith("cpu"):
        raise NotConvertible(f"{what} on {x.device} (taskmap's scatter runs on the CPU only)")


def scatter_op(cv: Converter, x: Tensor, dim: int, index: Tensor, src: Any, reduce: str | None = None,
               include_self: bool = True) -> Tensor:
    """``x.scatter(dim, index, src)`` (``src`` a tensor or a number) with torch's shape rules."""
    _cpu_only(x, "scatter")
    if not isinstance(index, Tensor) or index.dtype.name not in ("int32", "int64"):
        raise NotConvertible("scatter with an index that is not an int32 / int64 tensor")
    ndim = builtins.max(x.ndim, 1)
    if builtins.max(index.ndim, 1) != ndim:
        raise NotConvertible(f"scatter: index has {index.ndim} dimensions, x {x.ndim}")
    axis = norm_axis(dim, ndim)
    xshape, ishape = x.shape or (1,), index.shape or (1,)
    if isinstance(src, Tensor):
        src = cv.reshape(cv.cast(src, x.dtype), src.shape or (1,))
    else:
        src = cv.expand(cv.const(np.full((1,) * ndim, src, dtype=x.dtype.numpy_dtype)), ishape)
    if len(src.shape or (1,)) != ndim or builtins.any(i > n for i, n in zip(ishape, src.shape)) or \
            builtins.any(i > n for d, (i, n) in enumerate(zip(ishape, xshape)) if d != axis):
        raise NotConvertible(f"scatter: index {list(ishape)} larger than src {list(src.shape)}, or than x "
                             f"{list(xshape)} outside dim {axis}")
    y = cv.op(OpKind.SCATTER, [cv.reshape(x, xshape), cv.reshape(index, ishape), src],
              ScatterAttrs(axis, reduce, bool(include_self)))
    return cv.reshape(y, x.shape)


@register(torch.scatter, "scatter", "scatter_")
def scatter(cv: Converter, x: Tensor, dim: int, index: Tensor, src: Any = None, value: Any = None,
            reduce: str | None = None) -> Tensor:
    if reduce is not None and reduce not in _OLD_REDUCE:
        raise NotConvertible(f"scatter with reduce={reduce!r}")
    return scatter_op(cv, x, dim, index, value if src is None else src, _OLD_REDUCE.get(reduce))


@register(torch.scatter_add, "scatter_add", "scatter_add_")
def scatter_add(cv: Converter, x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return scatter_op(cv, x, dim, index, src, "sum")


@register(torch.scatter_reduce, "scatter_reduce", "scatter_reduce_")
def scatter_reduce(cv: Converter, x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str,
                   include_self: bool = True) -> Tensor:
    if reduce not in ("sum", "prod", "amax", "amin", "mean"):
        raise NotConvertible(f"scatter_reduce with reduce={reduce!r}")
    if reduce == "mean" and x.dtype.is_bool:
        raise NotConvertible("scatter_reduce(reduce='mean') of a bool tensor")
    return scatter_op(cv, x, dim, index, src, reduce, include_self)


def _slices(cv: Converter, x: Tensor, dim: int, index: Tensor, source: Tensor, reduce: str | None) -> Tensor:
    """``index_copy`` / ``index_add``: slice ``i`` of ``source`` along ``dim`` into slice ``index[i]``."""
    if not isinstance(index, Tensor) or index.ndim > 1:
        raise NotConvertible("index_copy / index_add with an index that is not a 0-d or 1-d tensor")
    ndim = builtins.max(x.ndim, 1)
    axis = norm_axis(dim, ndim)
    source = cv.reshape(source, source.shape or (1,))
    shape = [1] * ndim
    shape[axis] = index.numel
    full = cv.expand(cv.reshape(index, tuple(shape)), source.shape)
    return scatter_op(cv, x, axis, full, source, reduce)


@register(torch.index_copy, "index_copy", "index_copy_")
def index_copy(cv: Converter, x: Tensor, dim: int, index: Tensor, source: Tensor) -> Tensor:
    return _slices(cv, x, dim, index, source, None)


@register(torch.index_add, "index_add", "index_add_")
def index_add(cv: Converter, x: Tensor, dim: int, index: Tensor, source: Tensor, alpha: Any = 1) -> Tensor:
    source = cv.cast(source, x.dtype)
    return _slices(cv, x, dim, index, source if alpha == 1 else cv.binary(BinaryFn.MUL, source, alpha), "sum")


@register(operator.setitem)
def setitem(cv: Converter, x: Any, idx: Any, value: Any) -> Tensor:
    """``x[idx] = value``: through index tensors (lists, masks) here, else :func:`setitem_basic`."""
    items = idx if isinstance(idx, tuple) else (idx,)
    if isinstance(x, Tensor) and builtins.any(isinstance(i, (Tensor, list)) for i in items):
        return put(cv, x, items, value, False)
    return setitem_basic(cv, x, idx, value)


@register(torch.index_put, "index_put", "index_put_")
def index_put(cv: Converter, x: Tensor, indices: Any, values: Any, accumulate: bool = False) -> Tensor:
    return put(cv, x, tuple(indices), values, bool(accumulate))


def put(cv: Converter, x: Tensor, items: tuple[Any, ...], values: Any, accumulate: bool) -> Tensor:
    """``x[items] = values`` (``+=`` with ``accumulate``) where ``items`` holds index tensors:
    ``None`` / full slices / one ``...`` elsewhere."""
    _cpu_only(x, "item assignment through index tensors")
    if builtins.sum(i is Ellipsis for i in items) > 1:
        raise NotConvertible("an index with more than one '...'")
    if Ellipsis in items:
        k = items.index(Ellipsis)
        rest = builtins.sum(1 for i in items if i is not Ellipsis)
        items = items[:k] + (None,) * (x.ndim - rest) + items[k + 1:]
    items = tuple(None if isinstance(i, builtins.slice) and i == builtins.slice(None) else i for i in items)
    items = tuple(cv.const(torch.tensor(i)) if isinstance(i, (list, int)) and not isinstance(i, bool) else i
                  for i in items)
    picked = [k for k, i in enumerate(items) if i is not None]
    if not picked or builtins.any(not isinstance(items[k], Tensor) for k in picked) or \
            picked != list(range(picked[0], picked[-1] + 1)):
        raise NotConvertible("item assignment through index tensors mixed with slices, or on dimensions that are "
                             "not adjacent")
    if isinstance(values, Tensor):
        values = cv.cast(values, x.dtype)
    first = items[picked[0]]
    if first.dtype.is_bool:
        if len(picked) > 1 or picked[0] != 0:
            raise NotConvertible("item assignment through a boolean mask with other indices")
        return _masked(cv, x, first, values, accumulate)
    if builtins.any(items[k].dtype.name not in ("int32", "int64") for k in picked):
        raise NotConvertible("item assignment through index tensors of other types than integers and bool")
    p, m = picked[0], len(picked)
    dims = x.shape[p:p + m]
    bshape = tuple(torch.broadcast_shapes(*(items[k].shape for k in picked)))
    flat = None
    for k, n in zip(picked, dims):            # the flat index into the indexed dimensions
        i = cv.expand(cv.reshape(items[k], (1,) * (len(bshape) - items[k].ndim) + items[k].shape), bshape)
        i = _wrapped(cv, cv.cast(i, i64), n)
        flat = i if flat is None else cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, flat, n), i)
    a, d, r, lanes = math.prod(x.shape[:p]), math.prod(dims), math.prod(x.shape[p + m:]), math.prod(bshape)
    target = x.shape[:p] + bshape + x.shape[p + m:]
    if isinstance(values, Tensor):
        if not _broadcasts(values.shape, target):
            raise NotConvertible(f"cannot assign a {list(values.shape)} tensor to a selection of {list(target)}")
        v = cv.expand(cv.reshape(values, (1,) * (len(target) - values.ndim) + values.shape), target)
    else:
        v = cv.expand(cv.const(np.full((1,) * len(target), values, dtype=x.dtype.numpy_dtype)), target)
    index = cv.expand(cv.reshape(flat, (1, lanes, 1)), (a, lanes, r))
    y = scatter_op(cv, cv.reshape(x, (a, d, r)), 1, index, cv.reshape(v, (a, lanes, r)),
                   "sum" if accumulate else None)
    return cv.reshape(y, x.shape)


def _broadcasts(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` (without growing it)."""
    lead = len(shape) - len(target)
    if lead > 0:
        return builtins.all(s == 1 for s in shape[:lead]) and _broadcasts(shape[lead:], target)
    return builtins.all(s in (1, t) for s, t in zip(shape, target[len(target) - len(shape):]))


def _masked(cv: Converter, x: Tensor, mask: Tensor, values: Any, accumulate: bool) -> Tensor:
    """``x[mask] = values``: a ``where`` when ``values`` does not depend on how many elements the
    mask selects (a number, or a tensor broadcast over the dimensions after the mask's)."""
    if tuple(mask.shape) != tuple(x.shape[:mask.ndim]):
        raise NotConvertible(f"a boolean mask of shape {list(mask.shape)} for a tensor of {list(x.shape)}")
    rest = x.shape[mask.ndim:]
    if isinstance(values, Tensor):
        if not _broadcasts(values.shape, rest):
            raise NotConvertible(f"assigning a {list(values.shape)} tensor through a boolean mask (values that "
                                 "depend on how many elements it selects)")
        v = cv.reshape(values, (1,) * (len(rest) - values.ndim) + values.shape) if values.ndim <= len(rest) else \
            cv.reshape(values, values.shape[values.ndim - len(rest):])
        v = cv.expand(cv.reshape(v, (1,) * mask.ndim + v.shape), x.shape)
    else:
        v = cv.expand(cv.const(np.full((1,) * x.ndim, values, dtype=x.dtype.numpy_dtype)), x.shape)
    if accumulate:
        v = cv.binary(BinaryFn.ADD, x, v)
    cond = cv.reshape(mask, mask.shape + (1,) * len(rest))
    return cv.op(OpKind.WHERE, [cond, v, x], WhereAttrs())
