"""Pooling, named and shaped like ``torch.nn.functional``: ``max_pool2d``, ``avg_pool2d``,
``adaptive_avg_pool2d``, ``adaptive_max_pool2d`` over NCHW (or CHW) arrays.

Every call is one kernel of the sliding-window template (:mod:`taskmap.templates.window`): on
the CPU, workers over the cores each stage a few padded input rows of a plane and compute rows
of outputs in SIMD lanes (one vector max / add per tap); on GPUs, a thread per output.  Global
pooling (one window over the whole plane, e.g. ``adaptive_avg_pool2d(x, 1)``) is a plane
reduction: blocks of 16 planes folded in SIMD lanes on the CPU, the reduction templates' row
kernels (a warp per plane) on GPUs.  Adaptive pooling whose output divides the input is a
fixed-window pooling; other adaptive windows run one output at a time.

Semantics are torch's: ``ceil_mode``'s last window (kept only when it starts inside the input
or the left padding), padding at most half the kernel, average divisors with and without the
padding (``count_include_pad``) or ``divisor_override``; NaN wins a max.  16-bit floats are
computed in f32.  Indices (``return_indices``) are not supported.  A host call like one seen
before (C-contiguous arrays of the same shape, dtype and parameters) goes straight to its kernel
(:func:`._dispatch.host_plan`).
"""
from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from ..backends import TargetKind
from ..errors import OpError
from ..templates.window import WINDOW, WindowProblem, output_size
from ._dispatch import FLOATS, Args, host_plan, new_output, prepare, run_template, target_for
from .reduction import amax, mean

T = TypeVar("T")


def pair(op: str, name: str, value: Any, *, minimum: int) -> tuple[int, int]:
    """An int or a sequence of one or two ints -> (h, w), each at least ``minimum``."""
    items = (value,) if isinstance(value, int) else tuple(value) if isinstance(value, (tuple, list)) else None
    if items is None or not 1 <= len(items) <= 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in items):
        raise OpError(f"{op}(): {name} must be an int or a tuple of one or two ints, got {value!r}")
    h, w = items if len(items) == 2 else items * 2
    if h < minimum or w < minimum:
        what = "positive" if minimum == 1 else "non-negative"
        raise OpError(f"{op}(): {name} must be {what}, got {value!r}")
    return h, w


def planes(op: str, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of an NCHW or CHW input (N = 1 for CHW), with non-empty C, H, W."""
    if len(shape) not in (3, 4):
        raise OpError(f"{op}(): expected a 3-d (C, H, W) or 4-d (N, C, H, W) input, got shape {tuple(shape)}")
    n, c, h, w = (1, *shape) if len(shape) == 3 else shape
    if c == 0 or h == 0 or w == 0:
        raise OpError(f"{op}(): the input's channel and spatial dimensions must be non-empty, got shape "
                      f"{tuple(shape)}")
    return n, c, h, w


def memoized(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (a pure function of the shapes and parameters of a call) with its results kept:
    repeated calls skip the checks and the problem's construction.  Lists are keyed as tuples;
    unhashable arguments skip the memo; errors are not kept."""
    cached = functools.lru_cache(maxsize=2048)(fn)

    def call(*args: Any) -> T:
        key = tuple(tuple(a) if isinstance(a, list) else a for a in args)
        try:
            hash(key)
        except TypeError:
            return fn(*args)
        return cached(*key)
    return call


def _out_shape(shape: tuple[int, ...], oh: int, ow: int) -> tuple[int, ...]:
    return (*shape[:-2], oh, ow)


@memoized
def plan_pool(op: str, kind: str, shape: tuple[int, ...], dtype: str, kernel_size: Any, stride: Any, padding: Any,
          dilation: Any, ceil_mode: bool, count_include_pad: bool = True,
          divisor: int | None = None) -> tuple[WindowProblem, tuple[int, ...]]:
    """The problem and output shape of a fixed-window pooling (checked)."""
    n, c, h, w = planes(op, shape)
    kh, kw = pair(op, "kernel_size", kernel_size, minimum=1)
    sh, sw = (kh, kw) if stride is None or (isinstance(stride, tuple) and len(stride) == 0) else \
        pair(op, "stride", stride, minimum=1)
    ph, pw = pair(op, "padding", padding, minimum=0)
    dh, dw = pair(op, "dilation", dilation, minimum=1)
    if ph > kh // 2 or pw > kw // 2:
        raise OpError(f"{op}(): padding should be at most half of the kernel size, got padding ({ph}, {pw}) "
                      f"for kernel_size ({kh}, {kw})")
    oh = output_size(h, kh, sh, ph, ph, dh, bool(ceil_mode))
    ow = output_size(w, kw, sw, pw, pw, dw, bool(ceil_mode))
    if oh < 1 or ow < 1:
        raise OpError(f"{op}(): input of spatial size ({h}, {w}) is too small for kernel_size ({kh}, {kw}), "
                      f"dilation ({dh}, {dw}) and padding ({ph}, {pw}): the output would be ({oh}, {ow})")
    problem = WindowProblem(kind, n, c, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, dtype=dtype,
                            count_include_pad=bool(count_include_pad), divisor=divisor)
    return problem, _out_shape(shape, oh, ow)


def _run(args: Args, problem: WindowProblem, out_shape: tuple[int, ...], key: tuple[Any, ...] | None) -> Any:
    """The pooling into a new output; ``key``: the call's :func:`host_plan` key (its launch is
    remembered under it)."""
    out = new_output(args.kind, out_shape, problem.dtype)
    if problem.n == 0:
        return out
    if problem.is_global and target_for(args.kind).kind is not TargetKind.CPU and problem.divisor is None:
        x = args.arrays[0]  # GPUs: the reduction templates' warp-per-row kernels
        return mean(x, (-2, -1), keepdim=True) if problem.op == "avg" else amax(x, (-2, -1), keepdim=True)
    return run_template(WINDOW, problem, args, [args.arrays[0]], out, plan=key)


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """torch.nn.functional.max_pool2d (without indices)."""
    op = "max_pool2d"
    if return_indices:
        raise OpError(f"{op}(): return_indices=True is not supported")
    planned, key = host_plan((op, kernel_size, stride, padding, dilation, ceil_mode), x)
    if planned is not None:  # a call like one seen before: straight to its kernel
        return planned(x)
    args = prepare(op, x, allowed=FLOATS)
    problem, out_shape = plan_pool(op, "max", args.shapes[0], args.dtypes[0], kernel_size, stride, padding, dilation,
                               ceil_mode)
    return _run(args, problem, out_shape, key)


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Any:
    """torch.nn.functional.avg_pool2d."""
    op = "avg_pool2d"
    if divisor_override is not None and (isinstance(divisor_override, bool) or not isinstance(divisor_override, int)
                                         or divisor_override == 0):
        raise OpError(f"{op}(): divisor_override must be a non-zero int or None, got {divisor_override!r}")
    planned, key = host_plan((op, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override), x)
    if planned is not None:
        return planned(x)
    args = prepare(op, x, allowed=FLOATS)
    problem, out_shape = plan_pool(op, "avg", args.shapes[0], args.dtypes[0], kernel_size, stride, padding, 1, ceil_mode,
                               count_include_pad, divisor_override)
    return _run(args, problem, out_shape, key)


@memoized
def plan_adaptive(op: str, kind: str, shape: tuple[int, ...], dtype: str,
                   output_size: Any) -> tuple[WindowProblem | None, tuple[int, ...]]:
    """The problem (None: an empty output) and output shape of an adaptive pooling (checked)."""
    n, c, h, w = planes(op, shape)
    items = (output_size,) if isinstance(output_size, int) or output_size is None else \
        tuple(output_size) if isinstance(output_size, tuple) else None
    if items is None or not 1 <= len(items) <= 2 or \
            any(v is not None and (isinstance(v, bool) or not isinstance(v, int)) for v in items):
        raise OpError(f"{op}(): output_size must be an int or a tuple of one or two ints (or None), got "
                      f"{output_size!r}")
    if len(items) == 1:
        items = items * 2
    oh, ow = (h if items[0] is None else items[0]), (w if items[1] is None else items[1])
    if oh < 0 or ow < 0:
        raise OpError(f"{op}(): output_size must be non-negative, got {output_size!r}")
    out_shape = _out_shape(shape, oh, ow)
    if oh == 0 or ow == 0:
        return None, out_shape
    if h % oh == 0 and w % ow == 0:  # equal windows, no overlap: a fixed-window pooling
        kh, kw = h // oh, w // ow
        return WindowProblem(kind, n, c, h, w, oh, ow, kh, kw, kh, kw, dtype=dtype), out_shape
    return WindowProblem(kind, n, c, h, w, oh, ow, dtype=dtype, adaptive=True), out_shape


def _adaptive(op: str, kind: str, x: Any, output_size: Any) -> Any:
    planned, key = host_plan((op, output_size), x)
    if planned is not None:
        return planned(x)
    args = prepare(op, x, allowed=FLOATS)
    problem, out_shape = plan_adaptive(op, kind, args.shapes[0], args.dtypes[0], output_size)
    if problem is None:
        return new_output(args.kind, out_shape, args.dtypes[0])
    return _run(args, problem, out_shape, key)


def adaptive_avg_pool2d(x: Any, output_size: Any) -> Any:
    """torch.nn.functional.adaptive_avg_pool2d: output cell ``o`` averages input rows
    ``[floor(o*H/OH), ceil((o+1)*H/OH))`` (and likewise the columns)."""
    return _adaptive("adaptive_avg_pool2d", "avg", x, output_size)


def adaptive_max_pool2d(x: Any, output_size: Any, return_indices: bool = False) -> Any:
    """torch.nn.functional.adaptive_max_pool2d (without indices)."""
    if return_indices:
        raise OpError("adaptive_max_pool2d(): return_indices=True is not supported")
    return _adaptive("adaptive_max_pool2d", "max", x, output_size)


__all__ = ["adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool2d", "max_pool2d", "memoized", "pair", "plan_adaptive",
           "plan_pool", "planes"]
