"""Depthwise convolution: ``torch.nn.functional.conv2d`` with ``groups == in_channels``.

``depthwise_conv2d(x, weight, bias, stride, padding, dilation)`` takes torch's layouts: ``x``
NCHW (or CHW), ``weight`` ``(C * mult, 1, kh, kw)`` (``mult``: the channel multiplier, output
channel ``c`` reads input channel ``c // mult``), ``bias`` ``(C * mult,)``.  ``padding`` is an
int, a pair, ``"valid"`` or ``"same"`` (stride 1; the extra pad of an even window goes to the
bottom / right, as in torch).  ``taskmap.ops.conv2d`` sends ``groups == in_channels`` here.

One kernel of the sliding-window template (:mod:`taskmap.templates.window`): on the CPU,
workers over the cores each stage the padded input rows of a chunk of output rows (split into
``stride`` phases, so every tap reads contiguous lanes), then compute the outputs in SIMD lanes
along the row, one vector FMA per tap with the weight broadcast; on GPUs a thread per output.
16-bit floats accumulate in f32.  A host call like one seen before (C-contiguous arrays of the
same shapes, dtypes and parameters) goes straight to its kernel (:func:`._dispatch.host_plan`).
"""
from __future__ import annotations

from typing import Any

from ..errors import OpError
from ..templates.window import WINDOW, WindowProblem, output_size
from ._dispatch import FLOATS, host_plan, new_output, prepare, run_template
from .pool import memoized, pair, planes

OP = "depthwise_conv2d"


def _padding(padding: Any, k: tuple[int, int], d: tuple[int, int], s: tuple[int, int]) -> tuple[tuple[int, int], ...]:
    """((top, bottom), (left, right))."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding == "same":
            if s != (1, 1):
                raise OpError(f"{OP}(): padding='same' is not supported for strided convolutions (stride {s})")
            total = [dd * (kk - 1) for kk, dd in zip(k, d)]
            return tuple((t // 2, t - t // 2) for t in total)  # type: ignore[return-value]
        raise OpError(f"{OP}(): padding must be an int, a pair of ints, 'valid' or 'same', got {padding!r}")
    ph, pw = pair(OP, "padding", padding, minimum=0)
    return (ph, ph), (pw, pw)


def depthwise_conv2d(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
                     dilation: Any = 1) -> Any:
    """``conv2d(x, weight, bias, stride, padding, dilation, groups=C)`` for ``x`` of C channels."""
    arrays = [x, weight] + ([bias] if bias is not None else [])
    planned, key = host_plan((OP, stride, padding, dilation), *arrays)
    if planned is not None:  # a call like one seen before: straight to its kernel
        return planned(*arrays)
    args = prepare(OP, *arrays, allowed=FLOATS)
    problem, out_shape = plan_depthwise(args.shapes, args.dtypes, stride, padding, dilation)
    out = new_output(args.kind, out_shape, args.dtypes[0])
    if problem.n == 0:
        return out
    return run_template(WINDOW, problem, args, list(args.arrays), out, plan=key)


@memoized
def plan_depthwise(shapes: tuple[tuple[int, ...], ...], dtypes: tuple[str, ...], stride: Any, padding: Any,
          dilation: Any) -> tuple[WindowProblem, tuple[int, ...]]:
    """The problem and output shape (checked)."""
    n, c, h, w = planes(OP, shapes[0])
    wshape = shapes[1]
    if len(wshape) != 4 or wshape[1] != 1 or wshape[0] == 0 or wshape[0] % c:
        raise OpError(f"{OP}(): weight must have shape (C * multiplier, 1, kh, kw) for an input of C={c} channels, "
                      f"got {tuple(wshape)}")
    c_out, _, kh, kw = wshape
    if kh == 0 or kw == 0:
        raise OpError(f"{OP}(): the kernel must be non-empty, got weight shape {tuple(wshape)}")
    if len(shapes) > 2 and tuple(shapes[2]) != (c_out,):
        raise OpError(f"{OP}(): bias must have shape ({c_out},), got {tuple(shapes[2])}")
    if len(set(dtypes)) != 1:
        raise OpError(f"{OP}(): input, weight and bias must have one dtype, got {', '.join(dtypes)}")
    s = pair(OP, "stride", stride, minimum=1)
    d = pair(OP, "dilation", dilation, minimum=1)
    (pt, pb), (pl, pr) = _padding(padding, (kh, kw), d, s)
    oh = output_size(h, kh, s[0], pt, pb, d[0])
    ow = output_size(w, kw, s[1], pl, pr, d[1])
    if oh < 1 or ow < 1:
        raise OpError(f"{OP}(): the padded input ({h + pt + pb}, {w + pl + pr}) is smaller than the dilated kernel "
                      f"({d[0] * (kh - 1) + 1}, {d[1] * (kw - 1) + 1})")
    problem = WindowProblem("conv", n, c, h, w, oh, ow, kh, kw, s[0], s[1], pt, pl, d[0], d[1], mult=c_out // c,
                            dtype=dtypes[0], bias=len(shapes) > 2)
    return problem, (*shapes[0][:-3], c_out, oh, ow)


__all__ = ["depthwise_conv2d", "plan_depthwise"]
