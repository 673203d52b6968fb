"""Reductions and normalisations: sum, mean, max, min (amax / amin), prod, var, softmax,
log_softmax, layer_norm, rms_norm — each one kernel of :mod:`taskmap.templates.reduce`.

Reduced axes that are adjacent make the input a ``(outer, extent, inner)`` view, handled in
place; other sets of axes are first moved to the end (a permute kernel).  When there are too
few long rows to occupy the machine (a full reduction), each row is cut into equal chunks
reduced in parallel, then the partial results are reduced (sum, mean, prod, max, min).  Like torch: integer
and bool sums and products give int64, ``mean`` / ``var`` / softmax / norms need floating-point
input, ``max`` / ``min`` with an axis return the values only (torch.amax / amin), reducing an
empty axis gives 0 (sum), 1 (prod), NaN (mean, var) or an error (max, min).
"""
from __future__ import annotations

import builtins
import math
from typing import Any, Sequence

from ..errors import OpError
from ..templates.reduce import RowProblem, accumulate_type, template_for, view
from ._dispatch import (FLOATS, SUPPORTED, Args, filled, host_plan, new_output, normalize_axis, prepare, run_template,
                        target_for)
from .transform import permute


def _axes(op: str, axis: Any, dim: Any, ndim: int) -> tuple[int, ...]:
    if axis is not None and dim is not None:
        raise OpError(f"{op}(): pass axis or dim, not both")
    axis = dim if axis is None else axis
    if axis is None:
        return tuple(range(ndim))
    if not isinstance(axis, (int, tuple, list)):
        raise OpError(f"{op}(): axis must be an int, a tuple of ints or None, got {axis!r}")
    items = (axis,) if isinstance(axis, int) else tuple(axis)
    axes = tuple(normalize_axis(op, a, ndim) for a in items)
    if len(set(axes)) != len(axes):
        raise OpError(f"{op}(): repeated axis in {axis}")
    return tuple(sorted(axes)) if ndim else ()


def _rows(args: Args, axes: tuple[int, ...], op: str) -> tuple[Any, int, int, int]:
    """The input and its (outer, extent, inner) view with ``axes`` in the middle (permuted first
    when they are not adjacent)."""
    x, shape = args.arrays[0], args.shapes[0]
    if axes and list(axes) != list(range(axes[0], axes[-1] + 1)):
        keep = [d for d in range(len(shape)) if d not in axes]
        x = permute(x, keep + list(axes))
        shape = tuple(shape[d] for d in keep + list(axes))
        axes = tuple(range(len(keep), len(shape)))
    if not axes:
        return x, math.prod(shape), 1, 1
    outer = math.prod(shape[:axes[0]])
    return x, outer, math.prod(shape[axes[0]:axes[-1] + 1]), math.prod(shape[axes[-1] + 1:])


def _reduce(op: str, x: Any, axis: Any, keepdim: bool, dim: Any = None, correction: int = 0,
            allowed: Sequence[str] = SUPPORTED) -> Any:
    plan, key = host_plan((op, axis, keepdim, dim, correction), x)
    if plan is not None:
        return plan(x)
    args = prepare(op, x, allowed=allowed)
    shape, dtype = args.shapes[0], args.dtypes[0]
    axes = _axes(op, axis, dim, len(shape))
    out_shape = tuple(1 if d in axes else s for d, s in enumerate(shape)) if keepdim else \
        tuple(s for d, s in enumerate(shape) if d not in axes)
    out_dtype = "int64" if op in ("sum", "prod") and dtype not in FLOATS else dtype
    data, outer, extent, inner = _rows(args, axes, op)
    if outer * inner == 0:
        return new_output(args.kind, out_shape, out_dtype)
    if extent == 0:
        if op in ("max", "min"):
            raise OpError(f"{op}(): cannot reduce over an empty axis (no identity)")
        return filled(args.kind, out_shape, out_dtype, {"sum": 0, "prod": 1}.get(op, math.nan))
    out = new_output(args.kind, out_shape, out_dtype)
    chunks = _chunks(op, outer, extent, inner, target_for(args.kind).num_cores)
    if chunks > 1:  # few long rows: reduce chunks of each row in parallel, then the partial results
        first = RowProblem(op, outer * chunks, extent // chunks, 1, dtype, accumulate_type(op, dtype).name)
        partial = new_output(args.kind, (outer, chunks), first.out_dtype)
        run_template(template_for(op), first, args, [data], partial)
        second = RowProblem(op, outer, chunks, 1, first.out_dtype, out_dtype)
        return run_template(template_for(op), second, args, [partial], out)
    problem = RowProblem(op, outer, extent, inner, dtype, out_dtype, correction=correction)
    return run_template(template_for(op), problem, args, [data], out, plan=key)


#: Rows at least this long are split into chunks when there are too few rows for the machine.
SPLIT_MIN_EXTENT = 1 << 15


def _chunks(op: str, outer: int, extent: int, inner: int, units: int) -> int:
    """How many equal chunks to cut each row into (1: none).  Sums, means (of equal chunks),
    products, maxima and minima compose; var does not."""
    if op == "var" or inner != 1 or extent < SPLIT_MIN_EXTENT or outer >= 2 * units:
        return 1
    want = -(-4 * units // outer)
    for c in range(builtins.min(want, extent // 1024), 1, -1):
        if extent % c == 0:
            return c
    return 1


def sum(x: Any, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:  # noqa: A001
    """Sum over ``axis`` (an int, a tuple, or None for all); ints and bools sum to int64."""
    return _reduce("sum", x, axis, keepdim, dim)


def prod(x: Any, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:
    return _reduce("prod", x, axis, keepdim, dim)


def mean(x: Any, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:
    return _reduce("mean", x, axis, keepdim, dim, allowed=FLOATS)


def max(x: Any, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:  # noqa: A001
    """Maximum over ``axis`` (values only, like torch.amax); NaN wins."""
    return _reduce("max", x, axis, keepdim, dim)


def min(x: Any, axis: Any = None, keepdim: bool = False, *, dim: Any = None) -> Any:  # noqa: A001
    """Minimum over ``axis`` (values only, like torch.amin); NaN wins."""
    return _reduce("min", x, axis, keepdim, dim)


amax, amin = max, min


def var(x: Any, axis: Any = None, unbiased: bool = True, keepdim: bool = False, *, correction: int | None = None,
        dim: Any = None) -> Any:
    """Variance over ``axis``: divided by ``n - correction`` (``correction`` defaults to 1 when
    ``unbiased``, else 0), computed in two passes over the row (mean, then squared deviations)."""
    corr = correction if correction is not None else (1 if unbiased else 0)
    if isinstance(corr, bool) or not isinstance(corr, int) or corr < 0:
        raise OpError(f"var(): correction must be a non-negative int, got {correction!r}")
    return _reduce("var", x, axis, keepdim, dim, correction=corr, allowed=FLOATS)


def _softmax(op: str, x: Any, axis: Any, dim: Any) -> Any:
    plan, key = host_plan((op, axis, dim), x)
    if plan is not None:
        return plan(x)
    args = prepare(op, x, allowed=FLOATS)
    shape, dtype = args.shapes[0], args.dtypes[0]
    if axis is not None and dim is not None:
        raise OpError(f"{op}(): pass axis or dim, not both")
    ax = normalize_axis(op, -1 if axis is None and dim is None else axis if axis is not None else dim, len(shape))
    out = new_output(args.kind, shape, dtype)
    problem = softmax_problem(op, shape, dtype, ax)
    if problem is None:
        return out
    return run_template(template_for(op), problem, args, [args.arrays[0]], out, plan=key)


def softmax_problem(op: str, shape: Sequence[int], dtype: str, axis: int) -> RowProblem | None:
    """The row problem of softmax / log_softmax (``op``) along ``axis`` (normalised) of an input
    of ``shape`` (None: no element)."""
    kshape = tuple(shape) or (1,)
    outer, extent, inner = math.prod(kshape[:axis]), kshape[axis], math.prod(kshape[axis + 1:])
    if outer * extent * inner == 0:
        return None
    return RowProblem(op, outer, extent, inner, dtype, dtype)


def norm_problem(op: str, shape: Sequence[int], dtype: str, normalized_shape: Sequence[int], weight: bool,
                 bias: bool, eps: float) -> RowProblem | None:
    """The row problem of layer_norm / rms_norm (``op``) over the trailing ``normalized_shape``
    (checked by the caller) of an input of ``shape`` (None: no element)."""
    extent = math.prod(normalized_shape)
    outer = math.prod(shape[:len(shape) - len(normalized_shape)])
    if outer * extent == 0:
        return None
    return RowProblem(op, outer, extent, 1, dtype, dtype, eps=float(eps), weight=weight, bias=bias)


def softmax(x: Any, axis: int | None = None, *, dim: int | None = None) -> Any:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (default: the last)."""
    return _softmax("softmax", x, axis, dim)


def log_softmax(x: Any, axis: int | None = None, *, dim: int | None = None) -> Any:
    """``x - max - log(sum(exp(x - max)))`` along ``axis`` (default: the last)."""
    return _softmax("log_softmax", x, axis, dim)


def _norm(op: str, x: Any, normalized_shape: Any, weight: Any, bias: Any, eps: float,
          head: tuple[Any, ...] | None = None) -> Any:
    """``head``: the call's parameters as given, when some were defaults computed by the caller."""
    params = [p for p in (weight, bias) if p is not None]
    plan, key = host_plan(head or (op, normalized_shape, weight is None, bias is None, eps), x, *params)
    if plan is not None:
        return plan(x, *params)
    args = prepare(op, x, *params, allowed=FLOATS)
    shape, dtype = args.shapes[0], args.dtypes[0]
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not ns or len(ns) > len(shape) or tuple(shape[len(shape) - len(ns):]) != ns:
        raise OpError(f"{op}(): normalized_shape {ns} must be the trailing dimensions of the input, whose shape "
                      f"is {tuple(shape)}")
    for name, s, d in zip(("weight", "bias") if weight is not None else ("bias",), args.shapes[1:], args.dtypes[1:]):
        if tuple(s) != ns:
            raise OpError(f"{op}(): {name} must have shape {ns}, got {tuple(s)}")
        if d != dtype:
            raise OpError(f"{op}(): {name} must have the input's dtype {dtype}, got {d}")
    if not isinstance(eps, (int, float)) or eps < 0:
        raise OpError(f"{op}(): eps must be a non-negative number, got {eps!r}")
    out = new_output(args.kind, shape, dtype)
    problem = norm_problem(op, shape, dtype, ns, weight is not None, bias is not None, eps)
    if problem is None:
        return out
    flat = [_flat(a) for a in args.arrays[1:]]
    return run_template(template_for(op), problem, args, [args.arrays[0], *flat], out, plan=key)


def _flat(a: Any) -> Any:
    return view(a, (math.prod(a.shape),))


def layer_norm(x: Any, normalized_shape: Any, weight: Any = None, bias: Any = None, eps: float = 1e-5) -> Any:
    """torch.nn.functional.layer_norm: normalise over the trailing ``normalized_shape`` dims."""
    return _norm("layer_norm", x, normalized_shape, weight, bias, eps)


def rms_norm(x: Any, normalized_shape: Any = None, weight: Any = None, eps: float | None = None) -> Any:
    """torch.nn.functional.rms_norm: ``x / sqrt(mean(x^2) + eps) * weight`` over the trailing
    ``normalized_shape`` dims (default: the weight's shape, else the last dim); ``eps`` defaults
    to the machine epsilon of the dtype, as in torch."""
    head = ("rms_norm", normalized_shape, weight is None, eps)
    plan, _ = host_plan(head, x, *([] if weight is None else [weight]))
    if plan is not None:
        return plan(x, *([] if weight is None else [weight]))
    if normalized_shape is None:
        normalized_shape = tuple(weight.shape) if weight is not None else None
    if normalized_shape is None:
        shape = prepare("rms_norm", x, allowed=FLOATS).shapes[0]
        if not shape:
            raise OpError("rms_norm(): a 0-d input has no dimension to normalise")
        normalized_shape = (shape[-1],)
    if eps is None:
        args = prepare("rms_norm", x, allowed=FLOATS)
        eps = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7, "float32": 2.0 ** -23, "float64": 2.0 ** -52}[args.dtypes[0]]
    return _norm("rms_norm", x, normalized_shape, weight, None, eps, head)


__all__ = ["amax", "amin", "layer_norm", "log_softmax", "max", "mean", "min", "norm_problem", "prod", "rms_norm",
           "softmax", "softmax_problem", "sum", "var"]
