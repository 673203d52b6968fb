"""Exact inversion of index maps: when is a read ``x[f(i)]`` a bijection, and what is ``f⁻¹``?

Static shapes: every index expression is rewritten as a sum of *digits* of the output axes,
``coef * ((i_k // div) % ext)``, splitting digits where a ``//`` or ``%`` by a constant needs it
(the rewrite is exact or refused: no digit may straddle a division).  The read is a bijection
iff the input's row-major flat index, ``sum_d idx_d * stride_d``, is a *dense mixed-radix
number* in those digits — sorted by coefficient, each coefficient is the previous one times the
previous digit's extent, starting at 1 and ending at the input's size — each axis is covered
exactly once by its digits, and every index stays within its dimension.  Transpose, reshape and
any composition of them pass; broadcast, slice, pad and concat do not.  Reversals (``x[n-1-i]``,
bijective) and reshapes that regroup a transposed tensor across its dimension boundaries
(``(3, 2) -> (2, 3)`` after a transpose: a digit would straddle a division) are not recognised:
the answer errs on the safe side (no fusion), never the other.
The inverse reads every output axis back from its digits of the input index.

Symbolic shapes: only plain permutations of the axes (an index that is one axis, or 0 for a
dimension of size 1) are recognised.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..ir import expr as E
from ..ir.expr import BinOp, Expr, Var
from ..ir.functor import substitute
from ..ir.simplify import simplify_expr


@dataclass(frozen=True)
class IndexMap:
    """``src index -> dst index``: ``dst = indices`` with ``vars`` bound to a source index."""

    vars: tuple[Var, ...]
    indices: tuple[Expr, ...]

    def __call__(self, *index: Any) -> tuple[Expr, ...]:
        """The destination index of ``index`` (IR expressions; ints give constants)."""
        if len(index) != len(self.vars):
            raise ValueError(f"this index map takes {len(self.vars)} indices, got {len(index)}")
        env = {v: E.as_expr(i) for v, i in zip(self.vars, index)}
        return tuple(simplify_expr(substitute(e, env)) for e in self.indices)

    def evaluate(self, *index: int) -> tuple[int, ...]:
        """The destination index of an integer index, as ints."""
        out = []
        for e in self(*index):
            if not isinstance(e, E.Const):
                raise ValueError(f"index {e!r} is not constant (symbolic sizes?)")
            out.append(int(e.value))
        return tuple(out)

    def __repr__(self) -> str:
        src = ", ".join(v.name for v in self.vars)
        return f"IndexMap(({src}) -> ({', '.join(repr(e) for e in self.indices)}))"


def flat_index(index: Sequence[Any], shape: Sequence[int]) -> Expr:
    """The row-major offset of ``index`` in ``shape``."""
    out: Expr = E.const(0)
    for i, s in zip(index, shape):
        out = out * s + i
    return out


def unflat_index(flat: Any, shape: Sequence[int]) -> list[Expr]:
    """The row-major index of offset ``flat`` in ``shape`` (no ``//`` or ``%`` where not needed)."""
    flat = E.as_expr(flat)
    out: list[Expr] = []
    stride = math.prod(shape)
    for k, s in enumerate(shape):
        stride //= s
        if s == 1:
            out.append(E.const(0))
            continue
        q = flat // stride if stride != 1 else flat
        out.append(q if k == 0 or all(d == 1 for d in shape[:k]) else q % s)
    return out


@dataclass(frozen=True)
class Digit:
    """``(axis_value // div) % ext``; the last digit of an axis has ``div * ext == extent``."""

    axis: int
    div: int
    ext: int


Terms = dict[Digit, int]  # digit -> coefficient


@dataclass
class _Sum:
    terms: Terms
    const: int

    def scaled(self, c: int) -> "_Sum":
        return _Sum({d: k * c for d, k in self.terms.items() if k * c}, self.const * c)

    def plus(self, o: "_Sum", sign: int = 1) -> "_Sum":
        t = dict(self.terms)
        for d, k in o.terms.items():
            t[d] = t.get(d, 0) + sign * k
            if t[d] == 0:
                del t[d]
        return _Sum(t, self.const + sign * o.const)

    def max(self) -> int:
        return self.const + sum(k * (d.ext - 1) for d, k in self.terms.items())


class _Analyzer:
    def __init__(self, axes: Sequence[Var], extents: Sequence[int]) -> None:
        self.index = {id(v): k for k, v in enumerate(axes)}
        self.extents = list(extents)

    def digit(self, axis: int, div: int, ext: int) -> Digit | None:
        return None if ext == 1 else Digit(axis, div, ext)

    def of(self, e: Expr) -> _Sum | None:  # noqa: C901 - one dispatch over node kinds
        if isinstance(e, E.Const) and e.dtype.is_integer:
            return _Sum({}, int(e.value))
        if isinstance(e, Var) and id(e) in self.index:
            k = self.index[id(e)]
            d = self.digit(k, 1, self.extents[k])
            return _Sum({d: 1} if d else {}, 0)
        if isinstance(e, E.Cast) and e.type.is_integer and e.a.dtype.is_integer:
            return self.of(e.a)
        if not isinstance(e, E.Binary):
            return None
        if e.op in (BinOp.ADD, BinOp.SUB):
            a, b = self.of(e.a), self.of(e.b)
            return None if a is None or b is None else a.plus(b, 1 if e.op is BinOp.ADD else -1)
        if e.op is BinOp.MUL:
            for x, y in ((e.a, e.b), (e.b, e.a)):
                if isinstance(y, E.Const) and y.dtype.is_integer:
                    s = self.of(x)
                    return None if s is None else s.scaled(int(y.value))
            return None
        if e.op in (BinOp.FLOORDIV, BinOp.MOD) and isinstance(e.b, E.Const) and e.b.dtype.is_integer \
                and int(e.b.value) > 0:
            s = self.of(e.a)
            parts = None if s is None else self.split(s, int(e.b.value))
            if parts is None:
                return None
            return parts[0] if e.op is BinOp.FLOORDIV else parts[1]
        return None

    def split(self, s: _Sum, c: int) -> tuple[_Sum, _Sum] | None:
        """``s = c * high + low`` with ``0 <= low < c`` exactly, or None."""
        if s.const < 0 or any(k < 0 for k in s.terms.values()):
            return None
        q, r = divmod(s.const, c)
        high, low = _Sum({}, q), _Sum({}, r)
        for d, k in s.terms.items():
            if k % c == 0:
                high = high.plus(_Sum({d: k // c}, 0))
            elif c % k == 0:
                f = c // k
                if d.ext <= f:
                    low = low.plus(_Sum({d: k}, 0))
                    continue
                if d.ext % f:
                    return None  # the digit straddles the division
                hi, lo = self.digit(d.axis, d.div * f, d.ext // f), self.digit(d.axis, d.div, f)
                if hi:
                    high = high.plus(_Sum({hi: 1}, 0))
                if lo:
                    low = low.plus(_Sum({lo: k}, 0))
            else:
                return None
        return (high, low) if low.max() < c else None


def _merge(terms: Terms) -> list[tuple[int, Digit]]:
    """Adjacent digits of one axis with matching coefficients fused: ``(coef, digit)`` pairs."""
    items = sorted(((k, d) for d, k in terms.items()), key=lambda t: (t[1].axis, t[1].div))
    out: list[tuple[int, Digit]] = []
    for k, d in items:
        if out:
            pk, pd = out[-1]
            if pd.axis == d.axis and d.div == pd.div * pd.ext and k == pk * pd.ext:
                out[-1] = (pk, Digit(d.axis, pd.div, pd.ext * d.ext))
                continue
        out.append((k, d))
    return out


def _row_major_strides(shape: Sequence[int]) -> list[int]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return strides[::-1]


def _invert_static(axes: Sequence[Var], out_shape: Sequence[int], indices: Sequence[Expr],
                   in_shape: Sequence[int]) -> tuple[tuple[Var, ...], tuple[Expr, ...]] | None:
    if math.prod(out_shape) != math.prod(in_shape):
        return None
    an = _Analyzer(axes, out_shape)
    sums = [an.of(e) for e in indices]
    if any(s is None for s in sums):
        return None
    for s, dim in zip(sums, in_shape):
        if s.const != 0 or any(k <= 0 for k in s.terms.values()) or s.max() >= dim:  # type: ignore[union-attr]
            return None
    strides = _row_major_strides(in_shape)
    flat = _Sum({}, 0)
    for s, st in zip(sums, strides):
        flat = flat.plus(s.scaled(st))  # type: ignore[union-attr]
    digits = _merge(flat.terms)
    # Each axis exactly covered by its digits.
    for k, extent in enumerate(out_shape):
        mine = sorted((d for _, d in digits if d.axis == k), key=lambda d: d.div)
        div = 1
        for d in mine:
            if d.div != div:
                return None
            div *= d.ext
        if div != extent and extent != 1:
            return None
    # A dense mixed-radix number.
    expect = 1
    for coef, d in sorted(digits, key=lambda t: t[0]):
        if coef != expect:
            return None
        expect *= d.ext
    if expect != math.prod(in_shape):
        return None
    src = tuple(Var(f"j{d}", E.i32) for d in range(len(in_shape)))
    out: list[Expr] = [E.const(0) for _ in out_shape]
    for coef, d in digits:
        out[d.axis] = out[d.axis] + _digit_of(src, in_shape, strides, coef, d.ext) * d.div
    bounds = {v: (0, s - 1) for v, s in zip(src, in_shape)}
    return src, tuple(simplify_expr(e, bounds) for e in out)


def _digit_of(src: Sequence[Var], shape: Sequence[int], strides: Sequence[int], coef: int, ext: int) -> Expr:
    """``(flat // coef) % ext`` of the input index ``src``, read from one dimension when it lies in one."""
    for v, dim, st in zip(src, shape, strides):
        if st <= coef and coef * ext <= st * dim and coef % st == 0:
            q = v // (coef // st) if coef // st != 1 else v
            return q if (coef // st) * ext == dim else q % ext
    flat: Expr = E.const(0)
    for v, st in zip(src, strides):
        flat = flat + v * st
    return (flat // coef) % ext


def _invert_symbolic(axes: Sequence[Var], out_shape: Sequence[Any], indices: Sequence[Expr],
                     in_shape: Sequence[Any]) -> tuple[tuple[Var, ...], tuple[Expr, ...]] | None:
    """Plain permutations: each index one distinct axis of equal extent, or 0 for a size-1 dim."""
    src = tuple(Var(f"j{d}", E.i32) for d in range(len(in_shape)))
    out: list[Expr | None] = [None] * len(axes)
    for e, dim, v in zip(indices, in_shape, src):
        if isinstance(e, E.Const) and e.value == 0 and dim == 1:
            continue
        k = next((k for k, a in enumerate(axes) if a is e), None)
        if k is None or out[k] is not None or not _same_dim(out_shape[k], dim):
            return None
        out[k] = v
    for k, o in enumerate(out):
        if o is None:
            if out_shape[k] != 1:
                return None
            out[k] = E.const(0)
    return src, tuple(out)  # type: ignore[arg-type]


def _same_dim(a: Any, b: Any) -> bool:
    return (a == b) if isinstance(a, int) == isinstance(b, int) else False


def invert_read(axes: Sequence[Var], out_shape: Sequence[Any], indices: Sequence[Expr],
                in_shape: Sequence[Any]) -> Any:
    """The inverse (input index -> output index) of the read ``x[indices]`` over ``out_shape``, as
    an :class:`IndexMap`, or None when the read is not a bijection."""
    static = all(isinstance(s, int) for s in (*out_shape, *in_shape))
    found = _invert_symbolic(axes, out_shape, indices, in_shape)
    if found is None and static:
        found = _invert_static(axes, out_shape, indices, in_shape)
    return None if found is None else IndexMap(*found)
