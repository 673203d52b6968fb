"""Transform operators: reshape, transpose / permute, slice / narrow, concat, pad, gather,
flatten, expand / broadcast_to, squeeze / unsqueeze.

Each is a compute definition of index arithmetic only (``*_compute``, reused by fusion) run by
the rule-based scheduler; every operator returns a new array (never a view).  Reshape,
transpose and permute are bijective, broadcast is injective — see
:func:`taskmap.compute.is_bijective`.
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

import numpy as np

from ..compute.indexmap import flat_index, unflat_index
from ..compute.nodes import TensorInput, TensorNode, compute
from ..errors import OpError
from ..ir import expr as E
from ..ir.dtypes import ScalarType, promote, scalar_type
from ..ir.expr import Expr
from ._dispatch import Args, filled, kernel_shape, normalize_axis, prepare, run_compute


def _run(op: str, key: tuple[Any, ...], args: Args, out_shape: Sequence[int], define: Any,
         dtype: str | None = None) -> Any:
    return run_compute(op, key, args, tuple(out_shape), dtype or args.dtypes[0], define)


# ----------------------------------------------------------------------------- reshape family


def reshape_compute(x: TensorNode, shape: Sequence[int]) -> TensorNode:
    return compute("reshape", shape, lambda *i: x[tuple(unflat_index(flat_index(i, shape), x.shape))])


def _infer_shape(op: str, numel: int, shape: Sequence[int]) -> tuple[int, ...]:
    shape = tuple(int(s) for s in shape)
    if builtins.sum(s == -1 for s in shape) > 1 or any(s < -1 for s in shape):
        raise OpError(f"{op}(): invalid shape {shape}: sizes must be >= 0, with at most one -1")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if known == 0 or numel % known:
            raise OpError(f"{op}(): cannot reshape {numel} elements into {shape}")
        shape = tuple(numel // known if s == -1 else s for s in shape)
    if math.prod(shape) != numel:
        raise OpError(f"{op}(): cannot reshape {numel} elements into {shape}")
    return shape


def reshape(x: Any, shape: Sequence[int] | int, *more: int) -> Any:
    """``x`` with a new shape of the same size (one entry may be -1); a copy."""
    shape = (shape, *more) if isinstance(shape, int) else tuple(shape) + more
    args = prepare("reshape", x)
    out = _infer_shape("reshape", math.prod(args.shapes[0]), shape)
    ks = kernel_shape(out)
    return _run("reshape", (ks,), args, out, lambda xs: reshape_compute(xs[0], ks))


def flatten(x: Any, start_dim: int = 0, end_dim: int = -1) -> Any:
    args = prepare("flatten", x)
    shape = args.shapes[0]
    if not shape:
        return reshape(args.arrays[0], (1,))
    a, b = normalize_axis("flatten", start_dim, len(shape)), normalize_axis("flatten", end_dim, len(shape))
    if a > b:
        raise OpError(f"flatten(): start_dim {start_dim} comes after end_dim {end_dim}")
    return reshape(args.arrays[0], (*shape[:a], math.prod(shape[a:b + 1]), *shape[b + 1:]))


def squeeze(x: Any, dim: int | Sequence[int] | None = None) -> Any:
    """``x`` without its size-1 dimensions (all, or those in ``dim`` that have size 1)."""
    args = prepare("squeeze", x)
    shape = args.shapes[0]
    if dim is None:
        drop = {d for d, s in enumerate(shape) if s == 1}
    else:
        dims = (dim,) if isinstance(dim, int) else tuple(dim)
        drop = {d for d in (normalize_axis("squeeze", k, len(shape)) for k in dims) if shape and shape[d] == 1}
    return reshape(args.arrays[0], tuple(s for d, s in enumerate(shape) if d not in drop))


def unsqueeze(x: Any, dim: int) -> Any:
    """``x`` with a new size-1 dimension at ``dim`` (``-1``: last)."""
    args = prepare("unsqueeze", x)
    shape = args.shapes[0]
    d = normalize_axis("unsqueeze", dim, len(shape) + 1)
    return reshape(args.arrays[0], (*shape[:d], 1, *shape[d:]))


# ----------------------------------------------------------------------------- permutations


def permute_compute(x: TensorNode, dims: Sequence[int]) -> TensorNode:
    shape = tuple(x.shape[d] for d in dims)

    def fn(*i: Expr) -> Expr:
        idx: list[Expr] = [E.const(0)] * len(dims)
        for out_d, in_d in enumerate(dims):
            idx[in_d] = i[out_d]
        return x[tuple(idx)]
    return compute("permute", shape, fn)


def permute(x: Any, dims: Sequence[int], *more: int) -> Any:
    """``x`` with its dimensions reordered: output dimension k is input dimension ``dims[k]``."""
    dims = (dims, *more) if isinstance(dims, int) else tuple(dims) + more
    args = prepare("permute", x)
    shape = args.shapes[0]
    nd = [normalize_axis("permute", d, len(shape)) for d in dims]
    if sorted(nd) != list(range(len(shape))):
        raise OpError(f"permute(): dims {tuple(dims)} are not a permutation of the {len(shape)} dimensions")
    if not shape:
        return reshape(args.arrays[0], ())
    out = tuple(shape[d] for d in nd)
    return _run("permute", (tuple(nd),), args, out, lambda xs: permute_compute(xs[0], nd))


def transpose(x: Any, dim0: int, dim1: int) -> Any:
    """``x`` with dimensions ``dim0`` and ``dim1`` swapped."""
    args = prepare("transpose", x)
    n = len(args.shapes[0])
    a, b = normalize_axis("transpose", dim0, n), normalize_axis("transpose", dim1, n)
    dims = list(range(n))
    if n:
        dims[a], dims[b] = dims[b], dims[a]
    return permute(args.arrays[0], dims)


# ----------------------------------------------------------------------------- slicing


def slice_compute(x: TensorNode, axis: int, start: int, step: int, length: int) -> TensorNode:
    shape = tuple(length if d == axis else s for d, s in enumerate(x.shape))
    return compute("slice", shape, lambda *i: x[tuple(start + step * v if d == axis else v for d, v in enumerate(i))])


def slice(x: Any, axis: int, start: int | None = None, stop: int | None = None, step: int = 1) -> Any:  # noqa: A001
    """``x[..., start:stop:step, ...]`` along ``axis`` (Python's rules: negative and out-of-range
    bounds; ``step`` must be positive); a copy."""
    args = prepare("slice", x)
    shape = args.shapes[0]
    ax = normalize_axis("slice", axis, len(shape))
    if not isinstance(step, int) or step <= 0:
        raise OpError(f"slice(): step must be a positive int, got {step!r}")
    n = shape[ax] if shape else 1
    begin, end, _ = builtins.slice(start, stop, step).indices(n)
    length = max(0, -(-(end - begin) // step))
    out = tuple(length if d == ax else s for d, s in enumerate(shape))
    return _run("slice", (ax, begin, step, length), args, out,
                lambda xs: slice_compute(xs[0], ax, begin, step, length))


def narrow(x: Any, dim: int, start: int, length: int) -> Any:
    """torch.narrow: ``length`` elements of ``dim`` from ``start`` (negative ``start`` counts from
    the end); a copy."""
    args = prepare("narrow", x)
    shape = args.shapes[0]
    ax = normalize_axis("narrow", dim, len(shape))
    n = shape[ax] if shape else 1
    s = start + n if start < 0 else start
    if not (0 <= s <= n and length >= 0 and s + length <= n):
        raise OpError(f"narrow(): start {start} and length {length} are out of range for dimension {dim} "
                      f"of size {n}")
    return slice(args.arrays[0], ax, s, s + length, 1)


# ----------------------------------------------------------------------------- concat, pad


def concat_compute(xs: Sequence[TensorNode], axis: int, dtype: ScalarType | None = None) -> TensorNode:
    """The parts joined along ``axis``, in ``dtype`` (default: the parts' promoted type)."""
    offsets = np.cumsum([0] + [x.shape[axis] for x in xs]).tolist()
    shape = tuple(offsets[-1] if d == axis else s for d, s in enumerate(xs[0].shape))
    t = xs[0].dtype
    for x in xs[1:]:
        t = promote(t, x.dtype)
    t = dtype or t

    def fn(*i: Expr) -> Expr:
        value: Expr | None = None
        for k in range(len(xs) - 1, -1, -1):  # the last part needs no test
            local = E.minimum(E.maximum(i[axis] - offsets[k], 0), xs[k].shape[axis] - 1)
            v = E.cast(xs[k][tuple(local if d == axis else a for d, a in enumerate(i))], t)
            value = v if value is None else E.Select(E.compare(E.CmpOp.LT, i[axis], offsets[k + 1]), v, value)
        assert value is not None
        return value
    return compute("concat", shape, fn)


def concat(tensors: Sequence[Any], axis: int = 0) -> Any:
    """The arrays joined along ``axis`` (same shape elsewhere; dtypes promoted)."""
    if not isinstance(tensors, (list, tuple)) or not tensors:
        raise OpError("concat(): needs a non-empty list of arrays")
    args = prepare("concat", *tensors)
    nd = len(args.shapes[0])
    if nd == 0 or any(len(s) != nd for s in args.shapes):
        raise OpError(f"concat(): arrays must have the same number of dimensions (at least 1), got shapes "
                      f"{[tuple(s) for s in args.shapes]}")
    ax = normalize_axis("concat", axis, nd)
    for s in args.shapes[1:]:
        if any(a != b for d, (a, b) in enumerate(zip(s, args.shapes[0])) if d != ax):
            raise OpError(f"concat(): shapes {[tuple(s) for s in args.shapes]} differ outside axis {ax}")
    keep = [k for k, s in enumerate(args.shapes) if s[ax] > 0]
    out = tuple(builtins.sum(s[ax] for s in args.shapes) if d == ax else v for d, v in enumerate(args.shapes[0]))
    t = scalar_type(args.dtypes[0])
    for d in args.dtypes[1:]:
        t = promote(t, scalar_type(d))
    if not keep:
        return filled(args.kind, out, t.name, 0)
    sub = Args(args.kind, tuple(args.arrays[k] for k in keep), tuple(args.shapes[k] for k in keep),
               tuple(args.dtypes[k] for k in keep))
    return _run("concat", (ax, t.name), sub, out, lambda xs: concat_compute(xs, ax, t), t.name)


cat = concat

PAD_MODES = ("constant", "reflect", "replicate")


def pad_compute(x: TensorNode, widths: Sequence[tuple[int, int]], mode: str, value: float) -> TensorNode:
    shape = tuple(s + lo + hi for s, (lo, hi) in zip(x.shape, widths))

    def fn(*i: Expr) -> Expr:
        idx, inside = [], []
        for v, n, (lo, hi) in zip(i, x.shape, widths):
            j = v - lo if lo else v
            if mode == "reflect":
                j = E.Select(E.compare(E.CmpOp.LT, j, 0), -j, j)
                j = E.Select(E.compare(E.CmpOp.GE, j, n), 2 * (n - 1) - j, j)
            elif mode == "replicate":
                j = E.minimum(E.maximum(j, 0), n - 1)
            elif lo or hi:  # constant: test, and clamp so that the unused load stays in bounds
                inside += [E.compare(E.CmpOp.GE, j, 0), E.compare(E.CmpOp.LT, j, n)]
                j = E.minimum(E.maximum(j, 0), n - 1)
            idx.append(j)
        v = x[tuple(idx)]
        if inside:
            return E.Select(E.logical_and(*inside), v, E.cast(E.const(value, E.f64), x.dtype))
        return v
    return compute("pad", shape, fn)


def pad(x: Any, pads: Sequence[int], mode: str = "constant", value: float = 0.0) -> Any:
    """torch.nn.functional.pad: ``pads = (last_lo, last_hi, 2nd_last_lo, 2nd_last_hi, ...)``;
    negative pads crop.  ``mode``: constant (with ``value``), reflect or replicate."""
    args = prepare("pad", x)
    shape = args.shapes[0]
    pads = tuple(pads)
    if mode not in PAD_MODES:
        raise OpError(f"pad(): mode must be one of {PAD_MODES}, got {mode!r}")
    if len(pads) % 2 or len(pads) > 2 * len(shape) or not all(isinstance(p, int) for p in pads):
        raise OpError(f"pad(): pads must be an even number (at most {2 * len(shape)}) of ints, got {pads}")
    if not isinstance(value, (int, float)):
        raise OpError(f"pad(): value must be a number, got {value!r}")
    widths = [(0, 0)] * len(shape)
    for k in range(len(pads) // 2):
        widths[len(shape) - 1 - k] = (pads[2 * k], pads[2 * k + 1])
    out = tuple(s + lo + hi for s, (lo, hi) in zip(shape, widths))
    if any(o < 0 for o in out):
        raise OpError(f"pad(): pads {pads} make a dimension of {tuple(shape)} negative")
    if mode != "constant":
        for s, (lo, hi) in zip(shape, widths):
            limit = s - 1 if mode == "reflect" else s if s else 0
            if (lo or hi) and (s == 0 or max(lo, hi) > limit or min(lo, hi) < 0):
                raise OpError(f"pad(): {mode} padding {(lo, hi)} needs non-negative pads "
                              f"{'smaller than' if mode == 'reflect' else 'of'} a dimension of size {s}")
    if math.prod(shape) == 0 and math.prod(out) > 0:
        return filled(args.kind, out, args.dtypes[0], value)
    return _run("pad", (tuple(widths), mode, float(value)), args, out,
                lambda xs: pad_compute(xs[0], widths, mode, float(value)))


# ----------------------------------------------------------------------------- gather, expand


def gather_compute(x: TensorNode, axis: int, index: TensorNode) -> TensorNode:
    n = x.shape[axis]

    def fn(*i: Expr) -> Expr:
        j = E.minimum(E.maximum(E.cast(index[i], E.i32), 0), n - 1)  # out-of-range: clamped (checked on the host)
        return x[tuple(j if d == axis else v for d, v in enumerate(i))]
    return compute("gather", index.shape, fn)


def gather(x: Any, axis: int, index: Any) -> Any:
    """torch.gather: ``out[i][j][k] = x[index[i][j][k]][j][k]`` for ``axis == 0`` (and so on)."""
    args = prepare("gather", x, index)
    xs, ix = args.shapes
    if args.dtypes[1] not in ("int32", "int64"):
        raise OpError(f"gather(): index must be int32 or int64, got {args.dtypes[1]}")
    if len(xs) != len(ix):
        raise OpError(f"gather(): index must have as many dimensions as x ({len(xs)}), got {len(ix)}")
    ax = normalize_axis("gather", axis, len(xs))
    if any(b > a for d, (a, b) in enumerate(zip(xs, ix)) if d != ax):
        raise OpError(f"gather(): index shape {tuple(ix)} exceeds x shape {tuple(xs)} outside axis {ax}")
    n = xs[ax] if xs else 1
    if args.kind.target == "cpu" and math.prod(ix):
        host = np.asarray(args.arrays[1].cpu() if hasattr(args.arrays[1], "cpu") else args.arrays[1])
        if host.size and (host.min() < 0 or host.max() >= n):
            raise OpError(f"gather(): index values must be in [0, {n}) along axis {ax}, got "
                          f"[{host.min()}, {host.max()}]")
    if math.prod(ix) and not math.prod(xs):
        raise OpError(f"gather(): cannot gather from an empty array along axis {ax}")
    return _run("gather", (ax,), args, ix, lambda t: gather_compute(t[0], ax, t[1]), args.dtypes[0])


def broadcast_compute(x: TensorNode, shape: Sequence[int]) -> TensorNode:
    lead = len(shape) - x.ndim
    return compute("expand", shape, lambda *i: x[tuple(E.const(0) if s == 1 else i[lead + d]
                                                       for d, s in enumerate(x.shape))])


def broadcast_to(x: Any, shape: Sequence[int]) -> Any:
    """numpy.broadcast_to, as a copy."""
    args = prepare("broadcast_to", x)
    src, shape = args.shapes[0], tuple(int(s) for s in shape)
    lead = len(shape) - len(src)
    if lead < 0 or any(s not in (1, shape[lead + d]) for d, s in enumerate(src)) or any(s < 0 for s in shape):
        raise OpError(f"broadcast_to(): cannot broadcast shape {tuple(src)} to {shape}")
    ks = kernel_shape(shape)
    return _run("expand", (ks,), args, shape, lambda xs: broadcast_compute(xs[0], ks))


def expand(x: Any, *sizes: Any) -> Any:
    """torch.Tensor.expand: ``-1`` keeps a dimension; new dimensions go in front.  A copy."""
    sizes = tuple(sizes[0]) if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)) else sizes
    args = prepare("expand", x)
    src = args.shapes[0]
    lead = len(sizes) - len(src)
    if lead < 0:
        raise OpError(f"expand(): {len(sizes)} sizes for a {len(src)}-d array")
    shape = tuple(src[d - lead] if s == -1 and d >= lead else s for d, s in enumerate(sizes))
    if any(s == -1 for s in shape[:lead]):
        raise OpError(f"expand(): -1 is not allowed for the new leading dimensions, got {sizes}")
    return broadcast_to(args.arrays[0], shape)


__all__ = ["PAD_MODES", "broadcast_compute", "broadcast_to", "cat", "concat", "concat_compute", "expand", "flatten",
           "gather", "gather_compute", "narrow", "pad", "pad_compute", "permute", "permute_compute", "reshape",
           "reshape_compute", "slice", "slice_compute", "squeeze", "transpose", "unsqueeze"]
