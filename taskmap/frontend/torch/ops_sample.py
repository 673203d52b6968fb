"""Sampling at computed positions: ``F.affine_grid`` (2-d) and ``F.grid_sample`` (4-d input;
bilinear or nearest; zeros, border or reflection padding; with or without ``align_corners``).

``affine_grid`` is three multiply-adds per point (the base grid is a constant).  ``grid_sample``
maps each grid point to source coordinates by torch's rules (unnormalized, then clipped or
reflected for the padding mode), then gathers its corners from the input flattened over its pixels
— two by two for bilinear, one for nearest (rounded half to even, as torch) — each weighted and
zeroed where it falls outside (``zeros`` padding, or the edge corner of a clipped coordinate).  All
injective: it fuses into the kernel that reads it.  Bicubic sampling and 5-d inputs are not
converted.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch.nn.functional as F

from ...graph import AxisAttrs, BinaryFn, OpKind, Tensor, UnaryFn, WhereAttrs
from ...ir.dtypes import i64
from .registry import Converter, NotConvertible, register


def _base(n: int, align_corners: bool) -> np.ndarray:
    """The normalized coordinates of ``n`` pixels along an axis (torch's ``linspace`` rule)."""
    if n <= 1:
        return np.zeros(max(n, 1), dtype=np.float32)
    pos = np.linspace(-1.0, 1.0, n, dtype=np.float64)
    return (pos if align_corners else pos * (n - 1) / n).astype(np.float32)


def _last(cv: Converter, x: Tensor, k: int) -> Tensor:
    """``x[..., k]`` of a tensor whose last axis is 2 or 3."""
    return cv.reshape(cv.slice(x, x.ndim - 1, k, k + 1), x.shape[:-1])


def _stack_last(cv: Converter, parts: list[Tensor]) -> Tensor:
    return cv.op(OpKind.CONCAT, [cv.reshape(p, (*p.shape, 1)) for p in parts], AxisAttrs(parts[0].ndim))


@register(F.affine_grid)
def affine_grid(cv: Converter, theta: Tensor, size: Any, align_corners: Any = None) -> Tensor:
    size = [int(s) for s in size]
    if len(size) != 4 or not isinstance(theta, Tensor) or theta.shape != (size[0], 2, 3):
        raise NotConvertible(f"affine_grid of size {size} (taskmap takes 2-d grids, theta of N x 2 x 3)")
    n, _, h, w = size
    xs = cv.const(_base(w, bool(align_corners)).reshape(1, 1, w))
    ys = cv.const(_base(h, bool(align_corners)).reshape(1, h, 1))

    def row(r: int) -> Tensor:      # theta[:, r, 0] * x + theta[:, r, 1] * y + theta[:, r, 2]
        t = [cv.reshape(cv.slice(cv.slice(theta, 1, r, r + 1), 2, c, c + 1), (n, 1, 1)) for c in range(3)]
        return cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, t[0], xs),
                                                 cv.binary(BinaryFn.MUL, t[1], ys)), t[2])
    return _stack_last(cv, [cv.expand(row(0), (n, h, w)), cv.expand(row(1), (n, h, w))])


def _reflect(cv: Converter, x: Tensor, twice_low: int, twice_high: int) -> Tensor:
    """torch's ``reflect_coordinates``: ``x`` folded back and forth into [low, high]."""
    if twice_low == twice_high:
        return cv.binary(BinaryFn.MUL, x, 0.0)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    d = cv.unary(UnaryFn.ABS, cv.binary(BinaryFn.SUB, x, low))
    flips = cv.unary(UnaryFn.FLOOR, cv.binary(BinaryFn.DIV, d, span))
    extra = cv.binary(BinaryFn.SUB, d, cv.binary(BinaryFn.MUL, flips, span))
    even = cv.binary(BinaryFn.EQ, cv.binary(BinaryFn.REMAINDER, flips, 2.0), 0.0)
    return cv.op(OpKind.WHERE, [even, cv.binary(BinaryFn.ADD, extra, low),
                                cv.binary(BinaryFn.SUB, span + low, extra)], WhereAttrs())


def _source(cv: Converter, g: Tensor, size: int, padding: str, align: bool) -> Tensor:
    """Grid coordinates (-1 .. 1) as source pixel coordinates, by the padding mode's rule."""
    x = cv.binary(BinaryFn.MUL, cv.binary(BinaryFn.ADD, g, 1.0), (size - 1) / 2) if align else \
        cv.binary(BinaryFn.DIV, cv.binary(BinaryFn.SUB, cv.binary(BinaryFn.MUL, cv.binary(BinaryFn.ADD, g, 1.0),
                                                                    float(size)), 1.0), 2.0)
    if padding == "reflection":
        x = _reflect(cv, x, 0, 2 * (size - 1)) if align else _reflect(cv, x, -1, 2 * size - 1)
    if padding in ("border", "reflection"):
        x = cv.binary(BinaryFn.MINIMUM, cv.binary(BinaryFn.MAXIMUM, x, 0.0), float(size - 1))
    return x


def _inside(cv: Converter, i: Tensor, size: int) -> Tensor:
    return cv.binary(BinaryFn.BITWISE_AND, cv.binary(BinaryFn.GE, i, 0.0), cv.binary(BinaryFn.LE, i, float(size - 1)))


def _clamped_index(cv: Converter, i: Tensor, size: int) -> Tensor:
    return cv.cast(cv.binary(BinaryFn.MINIMUM, cv.binary(BinaryFn.MAXIMUM, i, 0.0), float(size - 1)), i64)


def _corner(cv: Converter, flat: Tensor, ix: Tensor, iy: Tensor, h: int, w: int, weight: Tensor | None) -> Tensor:
    """``flat`` (N, C, H*W) at the pixels (``iy``, ``ix``) (N, P; whole numbers as floats) times
    ``weight`` (N, P; None: 1), zero where outside the input."""
    n, c, p = flat.shape[0], flat.shape[1], ix.shape[1]
    where = cv.binary(BinaryFn.ADD, cv.binary(BinaryFn.MUL, _clamped_index(cv, iy, h), w), _clamped_index(cv, ix, w))
    got = cv.op(OpKind.GATHER, [flat, cv.expand(cv.reshape(where, (n, 1, p)), (n, c, p))], AxisAttrs(2))
    ok = cv.cast(cv.binary(BinaryFn.BITWISE_AND, _inside(cv, ix, w), _inside(cv, iy, h)), ix.dtype)
    return cv.binary(BinaryFn.MUL, got, cv.reshape(ok if weight is None else cv.binary(BinaryFn.MUL, weight, ok),
                                                   (n, 1, p)))


@register(F.grid_sample)
def grid_sample(cv: Converter, x: Tensor, grid: Tensor, mode: str = "bilinear", padding_mode: str = "zeros",
                align_corners: Any = None) -> Tensor:
    if x.ndim != 4 or grid.ndim != 4 or grid.shape[3] != 2 or grid.shape[0] != x.shape[0]:
        raise NotConvertible(f"grid_sample of a {x.ndim}-d input (taskmap takes N x C x H x W with an "
                             "N x H' x W' x 2 grid)")
    if mode not in ("bilinear", "nearest") or padding_mode not in ("zeros", "border", "reflection"):
        raise NotConvertible(f"grid_sample with mode={mode!r}, padding_mode={padding_mode!r}")
    n, c, h, w = x.shape
    ho, wo = grid.shape[1], grid.shape[2]
    g = cv.reshape(cv.cast(grid, x.dtype), (n, ho * wo, 2))
    ix = _source(cv, _last(cv, g, 0), w, padding_mode, bool(align_corners))
    iy = _source(cv, _last(cv, g, 1), h, padding_mode, bool(align_corners))
    flat = cv.reshape(x, (n, c, h * w))
    if mode == "nearest":
        out = _corner(cv, flat, cv.unary(UnaryFn.ROUND, ix), cv.unary(UnaryFn.ROUND, iy), h, w, None)
    else:
        x0, y0 = cv.unary(UnaryFn.FLOOR, ix), cv.unary(UnaryFn.FLOOR, iy)
        x1, y1 = cv.binary(BinaryFn.ADD, x0, 1.0), cv.binary(BinaryFn.ADD, y0, 1.0)
        wx1, wy1 = cv.binary(BinaryFn.SUB, ix, x0), cv.binary(BinaryFn.SUB, iy, y0)
        wx0, wy0 = cv.binary(BinaryFn.SUB, 1.0, wx1), cv.binary(BinaryFn.SUB, 1.0, wy1)
        out = None
        for cx, cy, wx, wy in ((x0, y0, wx0, wy0), (x1, y0, wx1, wy0), (x0, y1, wx0, wy1), (x1, y1, wx1, wy1)):
            term = _corner(cv, flat, cx, cy, h, w, cv.binary(BinaryFn.MUL, wx, wy))
            out = term if out is None else cv.binary(BinaryFn.ADD, out, term)
    return cv.reshape(out, (n, c, ho, wo))
