"""Registry: shapes and layout — view / reshape / flatten / permute / transpose / squeeze /
unsqueeze / expand, sizes, indexing and slicing, cat / split / chunk / stack, pad."""
from __future__ import annotations

import builtins
import operator
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, PadAttrs, PadMode, Tensor, WhereAttrs
from .registry import Converter, NotConvertible, as_index, norm_axis, register

nn = torch.nn


def _sizes(args: Sequence[Any]) -> tuple[int, ...]:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        args = tuple(args[0])
    args = tuple(map(as_index, args))                   # x.view(b, n, -1) with n a 0-d constant
    if any(isinstance(a, Tensor) for a in args):
        raise NotConvertible("sizes given as tensors")
    return tuple(int(a) for a in args)


@register("view", "reshape", torch.reshape)
def reshape(cv: Converter, x: Tensor, *shape: Any) -> Tensor:
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NotConvertible("view(dtype)")
    return cv.reshape(x, _sizes(shape))


@register("flatten", torch.flatten, nn.Flatten)
def flatten(cv: Converter, x: Any, start_dim: Any = 0, end_dim: Any = -1) -> Tensor:
    if isinstance(x, nn.Module):
        x, start_dim, end_dim = start_dim, x.start_dim, x.end_dim
    if x.ndim == 0:
        return cv.reshape(x, (1,))
    a, b = norm_axis(start_dim, x.ndim), norm_axis(end_dim, x.ndim)
    n = 1
    for s in x.shape[a:b + 1]:
        n *= s
    return cv.reshape(x, (*x.shape[:a], n, *x.shape[b + 1:]))


@register("permute", torch.permute)
def permute(cv: Converter, x: Tensor, *dims: Any, **kw: Any) -> Tensor:
    dims = _sizes(dims or (kw["dims"],))
    return cv.permute(x, dims)


@register("transpose", torch.transpose, "swapaxes", torch.swapaxes, "swapdims", torch.swapdims)
def transpose(cv: Converter, x: Tensor, dim0: int, dim1: int) -> Tensor:
    dims = list(range(x.ndim))
    a, b = norm_axis(dim0, x.ndim), norm_axis(dim1, x.ndim)
    dims[a], dims[b] = dims[b], dims[a]
    return cv.permute(x, dims)


@register("t", torch.t)
def t(cv: Converter, x: Tensor) -> Tensor:
    return x if x.ndim < 2 else cv.permute(x, (1, 0))


@register("unsqueeze", torch.unsqueeze)
def unsqueeze(cv: Converter, x: Tensor, dim: int) -> Tensor:
    d = norm_axis(dim, x.ndim + 1)
    return cv.reshape(x, (*x.shape[:d], 1, *x.shape[d:]))


@register("squeeze", torch.squeeze)
def squeeze(cv: Converter, x: Tensor, dim: Any = None) -> Tensor:
    if dim is None:
        drop = {d for d, s in enumerate(x.shape) if s == 1}
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        drop = {norm_axis(d, x.ndim) for d in dims}
        drop = {d for d in drop if x.shape[d] == 1}
    return cv.reshape(x, tuple(s for d, s in enumerate(x.shape) if d not in drop))


@register("expand")
def expand(cv: Converter, x: Tensor, *sizes: Any) -> Tensor:
    sizes = _sizes(sizes)
    lead = len(sizes) - x.ndim
    if lead < 0:
        raise NotConvertible(f"expand to fewer dimensions {sizes}")
    shape = tuple(x.shape[d - lead] if s == -1 else s for d, s in enumerate(sizes))
    return cv.expand(x, shape)


@register("expand_as")
def expand_as(cv: Converter, x: Tensor, other: Tensor) -> Tensor:
    return cv.expand(x, other.shape)


@register("broadcast_to", torch.broadcast_to)
def broadcast_to(cv: Converter, x: Tensor, size: Any) -> Tensor:
    return expand(cv, x, *_sizes((size,)))


@register("view_as", "reshape_as")
def reshape_as(cv: Converter, x: Tensor, other: Tensor) -> Tensor:
    return cv.reshape(x, other.shape)


@register("repeat")
def repeat(cv: Converter, x: Tensor, *reps: Any) -> Tensor:
    reps = _sizes(reps)
    if builtins.all(r == 1 for r in reps) and len(reps) == x.ndim:
        return x
    lead = len(reps) - x.ndim
    shape = (1,) * lead + x.shape
    y = cv.reshape(x, tuple(v for s in shape for v in (1, s)))
    y = cv.expand(y, tuple(v for s, r in zip(shape, reps) for v in (r, s)))
    return cv.reshape(y, tuple(s * r for s, r in zip(shape, reps)))


# ----------------------------------------------------------------------------- sizes


@register("size")
def size(cv: Converter, x: Tensor, dim: Any = None) -> Any:
    return torch.Size(x.shape) if dim is None else x.shape[norm_axis(dim, x.ndim)]


@register("dim")
def dim(cv: Converter, x: Tensor) -> int:
    return x.ndim


@register("numel", torch.numel)
def numel(cv: Converter, x: Tensor) -> int:
    return x.numel


@register(builtins.getattr)
def getattr_(cv: Converter, x: Any, name: str) -> Any:
    if isinstance(x, tuple) and not hasattr(x, name) and name in ("values", "indices"):
        return x[("values", "indices").index(name)]  # a fallback op's (values, indices) result
    if not isinstance(x, Tensor):
        return getattr(x, name)
    if name == "shape":
        return torch.Size(x.shape)
    if name == "dtype":
        return getattr(torch, x.dtype.name)
    if name == "device":
        return torch.device(x.device)
    if name == "ndim":
        return x.ndim
    if name == "T":
        return cv.permute(x, tuple(reversed(range(x.ndim))))
    raise NotConvertible(f"tensor attribute {name!r}")


@register(torch.ops.aten.sym_size.int, torch.ops.aten.sym_size)
def sym_size(cv: Converter, x: Tensor, dim: int = 0) -> int:
    return x.shape[norm_axis(dim, x.ndim)]


# ----------------------------------------------------------------------------- creation (constants)


def _like(value: Any) -> Any:
    def handler(cv: Converter, x: Tensor, *args: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
        fill = args[0] if value is None else value
        if isinstance(fill, Tensor):
            raise NotConvertible("a fill value computed by the model")
        dt = dtype or getattr(torch, x.dtype.name)
        return cv.const(torch.full(x.shape, fill, dtype=dt))
    return handler


def _new(value: Any) -> Any:
    def handler(cv: Converter, x: Tensor, size: Any, *args: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
        fill = (args[0] if args else kwargs["fill_value"]) if value is None else value
        if isinstance(fill, Tensor):
            raise NotConvertible("a fill value computed by the model")
        shape = _sizes((size,) if value is None else (size, *args))     # new_ones(2, 3) or new_ones((2, 3))
        return cv.const(torch.full(shape, fill, dtype=dtype or getattr(torch, x.dtype.name)))
    return handler


register(torch.zeros_like, torch.empty_like)(_like(0))
register(torch.ones_like)(_like(1))
register(torch.full_like)(_like(None))
register("new_zeros", "new_empty")(_new(0))
register("new_ones")(_new(1))
register("new_full")(_new(None))


# ----------------------------------------------------------------------------- indexing


@register(operator.getitem)
def getitem(cv: Converter, x: Any, idx: Any) -> Any:
    if not isinstance(x, Tensor):
        return x[idx]
    items = idx if isinstance(idx, tuple) else (idx,)
    if builtins.any(isinstance(i, (Tensor, list)) for i in items):
        picked = [k for k, i in enumerate(items) if isinstance(i, (Tensor, list))]
        basic = builtins.all(isinstance(i, builtins.slice) or i is None or i is Ellipsis
                             for k, i in enumerate(items) if k != picked[0])
        if len(picked) == 1 and basic and (isinstance(items[picked[0]], list) or items[picked[0]].ndim == 1):
            # x[..., [0, 2], 1:]: one list or 1-d index among slices / None / ... is the basic
            # indexing with a full slice in its place, then an index_select on that axis
            k = picked[0]
            y = getitem(cv, x, items[:k] + (builtins.slice(None),) + items[k + 1:])
            before = items[:k]
            axis = len(before) + (y.ndim - len(items) if Ellipsis in before else 0)   # ... stands for the rest
            i = items[k]
            if isinstance(i, list):
                if not builtins.all(isinstance(v, int) and not isinstance(v, bool) for v in i):
                    raise NotConvertible("indexing with a list of non-integers")
                i = cv.const(torch.tensor(i, dtype=torch.int64))
            if i.dtype.name in ("int32", "int64"):
                return index_select(cv, y, axis, _wrapped(cv, i, y.shape[axis]))
        if builtins.sum(i is Ellipsis for i in items) == 1 and None not in items:     # ... as full slices
            k = items.index(Ellipsis)
            items = items[:k] + (builtins.slice(None),) * (x.ndim - len(items) + 1) + items[k + 1:]
        return _advanced(cv, x, items)
    n_real = builtins.sum(1 for i in items if i is not None and i is not Ellipsis)
    if n_real > x.ndim:
        raise NotConvertible(f"too many indices for a {x.ndim}-d tensor")
    expanded: list[Any] = []
    for i in items:
        if i is Ellipsis:
            expanded += [builtins.slice(None)] * (x.ndim - n_real)
        else:
            expanded.append(i)
    if Ellipsis not in items:
        expanded += [builtins.slice(None)] * (x.ndim - n_real)
    y, axis, shape = x, 0, []
    for i in expanded:
        if i is None:
            shape.append(1)
        elif isinstance(i, builtins.slice):
            y = cv.slice(y, axis, i.start, i.stop, i.step)
            shape.append(y.shape[axis])
            axis += 1
        elif isinstance(i, int) and not isinstance(i, bool):
            n = y.shape[axis]
            k = i + n if i < 0 else i
            if not 0 <= k < n:
                raise NotConvertible(f"index {i} out of range for a dimension of size {n}")
            y = cv.slice(y, axis, k, k + 1, 1)
            axis += 1
        else:
            raise NotConvertible(f"index of type {type(i).__name__}")
    return cv.reshape(y, tuple(shape))


def setitem_basic(cv: Converter, x: Any, idx: Any, value: Any) -> Tensor:
    """``x[idx] = value`` for basic indices (ints, slices, ``...``): a new tensor — ``value``
    broadcast to the region, spread out along the slices with a step (each element followed by
    ``step - 1`` zeros), padded out to ``x``'s shape, chosen where a constant mask marks the
    region — that later uses of ``x`` read (the importer rebinds it)."""
    if not isinstance(x, Tensor):
        raise NotConvertible("item assignment into a non-tensor")
    items = idx if isinstance(idx, tuple) else (idx,)
    if builtins.any(i is None or isinstance(i, (Tensor, list)) for i in items) or \
            builtins.sum(i is Ellipsis for i in items) > 1:
        raise NotConvertible("item assignment other than with ints, slices and one '...'")
    n_real = builtins.sum(1 for i in items if i is not Ellipsis)
    if n_real > x.ndim:
        raise NotConvertible(f"too many indices for a {x.ndim}-d tensor")
    full: list[Any] = []
    for i in items:
        full += [builtins.slice(None)] * (x.ndim - n_real) if i is Ellipsis else [i]
    full += [builtins.slice(None)] * (x.ndim - len(full))
    bounds, region, keep, steps = [], [], [], []
    for n, i in zip(x.shape, full):
        if isinstance(i, int) and not isinstance(i, bool):
            k = i + n if i < 0 else i
            if not 0 <= k < n:
                raise NotConvertible(f"index {i} out of range for a dimension of size {n}")
            bounds.append((k, k + 1))
            keep.append(False)
            steps.append(1)
            region.append(1)
        elif isinstance(i, builtins.slice):
            b, e, step = i.indices(n)
            if step < 1:
                raise NotConvertible("item assignment into a slice with a negative step")
            count = len(range(b, e, step))
            bounds.append((b, b + (count - 1) * step + 1 if count else b))     # the span the elements cover
            keep.append(True)
            steps.append(step)
            region.append(count)
        else:
            raise NotConvertible(f"index of type {type(i).__name__}")
    if 0 in region:                 # nothing assigned
        return x
    if isinstance(value, Tensor):
        v = cv.cast(value, x.dtype)
        view = [r for r, k in zip(region, keep) if k]          # the shape of x[idx]: value broadcasts to it
        lead = builtins.max(0, v.ndim - len(view))
        dims = (1,) * (len(view) - v.ndim + lead) + v.shape[lead:]
        if builtins.any(s != 1 for s in v.shape[:lead]) or builtins.any(d not in (1, t) for d, t in zip(dims, view)):
            raise NotConvertible(f"cannot assign a {list(v.shape)} tensor to a region of {region}")
        kept = iter(dims)
        shaped = [next(kept) if k else 1 for k in keep]
        v = cv.expand(cv.reshape(v, tuple(shaped)), tuple(region))
    else:
        v = cv.expand(cv.const(np.full((1,) * x.ndim, value, dtype=x.dtype.numpy_dtype)), tuple(region))
    for a, (step, count) in enumerate(zip(steps, region)):
        if step > 1 and count > 1:  # (.., c, ..) -> (.., c, step, ..) with zeros after each -> its span
            shape = v.shape
            spread = cv.op(OpKind.PAD, [cv.reshape(v, (*shape[:a + 1], 1, *shape[a + 1:]))],
                           PadAttrs(tuple((0, step - 1) if d == a + 1 else (0, 0) for d in range(v.ndim + 1))))
            v = cv.slice(cv.reshape(spread, (*shape[:a], count * step, *shape[a + 1:])), a, 0, (count - 1) * step + 1)
    widths = tuple((b, n - e) for (b, e), n in zip(bounds, x.shape))
    padded = cv.op(OpKind.PAD, [v], PadAttrs(widths)) if builtins.any(w != (0, 0) for w in widths) else v
    cut = [(b, e) != (0, n) or step > 1 for (b, e), n, step in zip(bounds, x.shape, steps)]   # axes restricted
    mask = np.zeros(tuple(n if c else 1 for n, c in zip(x.shape, cut)), dtype=bool)
    mask[tuple(builtins.slice(b, e, step) if c else builtins.slice(None)
               for (b, e), c, step in zip(bounds, cut, steps))] = True
    return cv.op(OpKind.WHERE, [cv.const(mask), padded, x], WhereAttrs())


def _wrapped(cv: Converter, i: Tensor, n: int) -> Tensor:
    """Index tensor ``i`` into a dimension of size ``n`` with negative indices wrapped, as torch's
    indexing does (``index_select`` and the EMBEDDING op take ``0 <= i < n``)."""
    if i.is_constant:
        return cv.const(torch.remainder(torch.from_numpy(i.data.copy()), n))
    return cv.op(OpKind.WHERE, [cv.binary(BinaryFn.LT, i, 0), cv.binary(BinaryFn.ADD, i, n), i], WhereAttrs())


def _full(i: Any) -> bool:
    return isinstance(i, builtins.slice) and i == builtins.slice(None)


def _advanced(cv: Converter, x: Tensor, items: tuple[Any, ...]) -> Tensor:
    """``x[i0, .., ik]`` with integer index tensors (broadcast together) on the leading
    dimensions, then full slices: rows of ``x`` seen as a ``(d0*..*dk, rest)`` table, picked by
    the flat index ``sum(i_d * stride_d)`` (an EMBEDDING op).  After full slices (``z[:, i, j]``:
    adjacent index tensors, whose broadcast dimensions take their place, as in torch) the indexed
    dimensions are moved to the front first, and the result's back after."""
    p = next((n for n, i in enumerate(items) if not _full(i)), len(items))
    if 0 < p < x.ndim and builtins.any(isinstance(i, Tensor) for i in items[p:]):
        k = next((n for n, i in enumerate(items[p:]) if _full(i)), len(items) - p)
        if builtins.all(_full(i) for i in items[p + k:]) and k <= x.ndim - p:
            front = (*range(p, p + k), *range(p), *range(p + k, x.ndim))
            y = _advanced(cv, cv.permute(x, front), items[p:p + k])
            m = y.ndim - (x.ndim - k)                       # the broadcast index dimensions
            return cv.permute(y, (*range(m, m + p), *range(m), *range(m + p, y.ndim)))
    picked = [d for d, i in enumerate(items) if not _full(i)]
    if len(items) <= x.ndim and picked and picked != list(range(len(picked))) and \
            builtins.all(isinstance(items[d], (int, Tensor)) for d in picked):
        ints = [d for d in picked if isinstance(items[d], int)]
        if ints:                   # torch selects at integers first (x[1, :, j] is x[1][:, j])
            for d in reversed(ints):
                x = select(cv, x, d, items[d])
            return _advanced(cv, x, tuple(i for d, i in enumerate(items) if d not in ints))
        # index tensors apart (x[i, :, j]): the broadcast dimensions come first, then the others in
        # order (torch's rule): the indexed dimensions moved to the front
        rest = [d for d in range(x.ndim) if d not in picked]
        return _advanced(cv, cv.permute(x, (*picked, *rest)), tuple(items[d] for d in picked))
    shapes = [() if isinstance(i, int) else i.shape for i in items if isinstance(i, (int, Tensor))]
    bshape = tuple(torch.broadcast_shapes(*shapes))
    items = tuple(cv.const(torch.tensor([i])) if isinstance(i, int) and not isinstance(i, bool) else i
                  for i in items)  # ints as 1-element indices (the result is reshaped at the end)
    idx = [i for i in items if not (isinstance(i, builtins.slice) and i == builtins.slice(None))]
    k = len(idx)
    if not idx or k > x.ndim or any(not isinstance(i, Tensor) for i in idx) or \
            any(not (isinstance(i, builtins.slice) and i == builtins.slice(None)) for i in items[k:]):
        raise NotConvertible("advanced indexing other than integer tensors on the leading dimensions")
    if any(i.dtype.name not in ("int32", "int64") for i in idx):
        raise NotConvertible("indexing with bool masks (data-dependent shapes)")
    lead, rest = x.shape[:k], x.shape[k:]
    flat = None
    stride = 1
    for d in range(k - 1, -1, -1):
        i = _wrapped(cv, idx[d], lead[d])
        term = i if stride == 1 else cv.binary(BinaryFn.MUL, i, stride)
        flat = term if flat is None else cv.binary(BinaryFn.ADD, flat, term)
        stride *= lead[d]
    assert flat is not None
    if flat.ndim == 0:
        flat = cv.reshape(flat, (1,))
    return cv.reshape(cv.op(OpKind.EMBEDDING, [cv.reshape(x, (stride, *rest)), flat]), (*bshape, *rest))


@register(torch.index_select, "index_select")
def index_select(cv: Converter, x: Tensor, dim: int, index: Tensor) -> Tensor:
    d = norm_axis(dim, x.ndim)
    perm = (d, *[k for k in range(x.ndim) if k != d])
    y = cv.op(OpKind.EMBEDDING, [cv.permute(x, perm), index])
    inv = [0] * x.ndim
    for k, p in enumerate(perm):
        inv[p] = k
    return cv.permute(y, inv)


@register("unfold")
def unfold(cv: Converter, x: Tensor, dimension: int, size: int, step: int) -> Tensor:
    """``x.unfold(d, size, step)``: the windows of ``size`` along ``d`` every ``step`` (PatchTST's
    patches), in a new last axis — a slice and a reshape where they do not overlap, else a gather."""
    d = norm_axis(dimension, x.ndim)
    size, step = int(size), int(step)
    if size < 0 or step <= 0 or size > builtins.max(x.shape[d] if x.ndim else 1, 0):
        raise NotConvertible(f"unfold(size={size}, step={step}) of a dimension of {x.shape[d] if x.ndim else 1}")
    if x.ndim == 0:
        return cv.reshape(x, (1,))
    count = (x.shape[d] - size) // step + 1
    if step == size:
        windows = cv.reshape(cv.slice(x, d, 0, count * size), (*x.shape[:d], count, size, *x.shape[d + 1:]))
    else:
        index = (np.arange(count)[:, None] * step + np.arange(size)[None, :]).reshape(-1)
        picked = index_select(cv, x, d, cv.const(torch.from_numpy(index)))
        windows = cv.reshape(picked, (*x.shape[:d], count, size, *x.shape[d + 1:]))
    order = [*range(d + 1), *range(d + 2, x.ndim + 1), d + 1]          # the window's axis last
    return cv.permute(windows, order)


@register(torch.gather, "gather")
def gather(cv: Converter, x: Tensor, dim: int, index: Tensor, sparse_grad: bool = False) -> Tensor:
    return cv.op(OpKind.GATHER, [x, index], AxisAttrs(norm_axis(dim, x.ndim)))


@register("select", torch.select)
def select(cv: Converter, x: Tensor, dim: int, index: int) -> Tensor:
    d = norm_axis(dim, x.ndim)
    return getitem(cv, x, (builtins.slice(None),) * d + (int(index),))


@register("narrow", torch.narrow)
def narrow(cv: Converter, x: Tensor, dim: int, start: int, length: int) -> Tensor:
    d = norm_axis(dim, x.ndim)
    s = start + x.shape[d] if start < 0 else start
    return cv.slice(x, d, s, s + length, 1)


# ----------------------------------------------------------------------------- joining, splitting


@register(torch.cat, torch.concat, torch.concatenate)
def cat(cv: Converter, tensors: Sequence[Any], dim: int = 0, axis: Any = None) -> Tensor:
    dim = axis if axis is not None else dim
    parts = [t for t in tensors if not (isinstance(t, Tensor) and t.numel == 0 and t.ndim == 1)]
    if len(parts) == 1:
        return parts[0]
    d = norm_axis(dim, parts[0].ndim)
    return cv.op(OpKind.CONCAT, parts, AxisAttrs(d))


@register(torch.stack)
def stack(cv: Converter, tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    d = norm_axis(dim, tensors[0].ndim + 1)
    return cat(cv, [unsqueeze(cv, t, d) for t in tensors], d)


@register(torch.hstack)
def hstack(cv: Converter, tensors: Sequence[Tensor]) -> Tensor:
    return cat(cv, list(tensors), 0 if tensors[0].ndim == 1 else 1)


@register(torch.vstack, torch.row_stack)
def vstack(cv: Converter, tensors: Sequence[Tensor]) -> Tensor:
    return cat(cv, [cv.reshape(t, (1, t.numel)) if t.ndim < 2 else t for t in tensors], 0)


@register(torch.split, "split", torch.split_with_sizes, "split_with_sizes")
def split(cv: Converter, x: Tensor, split_size_or_sections: Any, dim: int = 0) -> tuple[Tensor, ...]:
    d = norm_axis(dim, x.ndim)
    n = x.shape[d]
    if isinstance(split_size_or_sections, int):
        k = split_size_or_sections
        sizes = [builtins.min(k, n - s) for s in range(0, n, k)] or [0]
    else:
        sizes = list(split_size_or_sections)
    out, start = [], 0
    for s in sizes:
        out.append(cv.slice(x, d, start, start + s, 1))
        start += s
    return tuple(out)


@register(torch.chunk, "chunk")
def chunk(cv: Converter, x: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    d = norm_axis(dim, x.ndim)
    step = -(-x.shape[d] // chunks)
    return split(cv, x, step, d)


@register(torch.unbind, "unbind")
def unbind(cv: Converter, x: Tensor, dim: int = 0) -> tuple[Tensor, ...]:
    d = norm_axis(dim, x.ndim)
    return tuple(getitem(cv, x, (builtins.slice(None),) * d + (k,)) for k in range(x.shape[d]))


@register(F.pad, torch._C._nn.pad)
def pad(cv: Converter, x: Tensor, pad: Sequence[int], mode: str = "constant", value: Any = None) -> Tensor:
    pad = _sizes(tuple(pad)) if builtins.all(isinstance(p, Tensor) and p.is_constant for p in pad) else pad
    if builtins.any(isinstance(p, Tensor) for p in pad):
        raise NotConvertible("padding by amounts computed from tensor data as the model runs")
    if mode not in ("constant", "reflect", "replicate", "circular") or len(pad) % 2 or len(pad) > 2 * x.ndim:
        raise NotConvertible(f"pad(mode={mode!r}, pad={tuple(pad)})")
    if builtins.any(p < 0 for p in pad):
        if mode != "constant":
            raise NotConvertible(f"negative padding in mode {mode!r}")
        for k in range(len(pad) // 2):        # a negative width crops (RWKV's time shift: ZeroPad2d((0, 0, 1, -1)))
            d, lo, hi = x.ndim - 1 - k, builtins.max(-int(pad[2 * k]), 0), builtins.max(-int(pad[2 * k + 1]), 0)
            if lo or hi:
                x = cv.slice(x, d, lo, x.shape[d] - hi, 1)
        pad = [builtins.max(int(p), 0) for p in pad]
    widths = [(0, 0)] * x.ndim
    for k in range(len(pad) // 2):
        widths[x.ndim - 1 - k] = (int(pad[2 * k]), int(pad[2 * k + 1]))
    if mode == "circular":       # the far end's slices wrapped around: concatenations
        for d, (lo, hi) in enumerate(widths):
            if lo > x.shape[d] or hi > x.shape[d]:
                raise NotConvertible(f"circular padding of {lo, hi} on a dimension of size {x.shape[d]}")
            parts = ([cv.slice(x, d, x.shape[d] - lo, x.shape[d])] if lo else []) + [x] + \
                ([cv.slice(x, d, 0, hi)] if hi else [])
            x = cat(cv, parts, d) if len(parts) > 1 else x
        return x
    return cv.op(OpKind.PAD, [x], PadAttrs(tuple(widths), PadMode(mode), float(value or 0.0)))


__all__: list[str] = []
