"""Math written in plain IR arithmetic, so that CPU vector loops stay vectorized.

gcc turns ``expf`` inside an ``omp simd`` loop into one scalar libm call per lane (glibc's vector
variants need ``-ffast-math``); at 16 lanes that costs more than the memory traffic of a softmax.
:func:`exp_nonpositive` is ``exp(x)`` for ``x <= 0`` (what softmax and friends evaluate after
subtracting the row maximum) from multiplies, adds, integer bit tests and selects only:

    x = -n * ln2 + r,   |r| <= ln2 / 2,   n = round(-x / ln2) in 0..126
    exp(x) = 2^-n * p(r)

with ``p`` a degree-7 Taylor polynomial (relative error < 2e-8 on the interval) and ``2^-n``
the product of the exact powers ``2^-(2^b)`` selected by the binary digits of ``n`` (found by
comparisons, in floating point: a float -> int conversion next to a select stops gcc's
vectorizer), so the result is
within a few ulp of ``expf``.  Inputs below -87.3 give 0 (the f32 result would be subnormal),
NaN gives NaN.  Other dtypes use the ``exp`` intrinsic.  It is a helper function of the module
(the steps bound to local variables; an expression tree would repeat them exponentially).
"""
from __future__ import annotations

import math

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import f32
from ..ir.expr import Expr, Var
from ..ir.func import FuncKind, Function
from ..ir.functor import collect

_LN2_HI = 0.693145751953125          # ln 2 split so that n * _LN2_HI is exact for n < 2^9
_LN2_LO = 1.4286068203094172321e-06
_UNDERFLOW = -87.3
_ROUND = 12582912.0                  # 1.5 * 2^23


#: The helper function's name in a module (the C backend calls it ``tm_fn_<name>``).
EXP_NONPOSITIVE = "exp_nonpositive_f32"


def exp_nonpositive(x: Expr) -> Expr:
    """``exp(x)`` for ``x <= 0`` (positive ``x`` is not supported: the result would be wrong).

    For f32, a call of the helper :func:`exp_nonpositive_function` (which a module calling it
    must contain: see :func:`helpers_for`); gcc inlines it into vector loops."""
    if x.dtype is not f32:
        return E.call(E.Intrinsic.EXP, x)
    return E.CallFunc(EXP_NONPOSITIVE, (x,), f32)


#: exp(x) = exp(x / 2^h)^(2^h): each halving saves a binary digit of n (5 vector operations)
#: for one squaring, and doubles the relative error.
HALVINGS = 0


def exp_nonpositive_function(halvings: int | None = None) -> Function:
    """The helper ``exp_nonpositive_f32(x: f32) -> f32`` (a DEVICE function)."""
    h = HALVINGS if halvings is None else halvings
    x = Var("x", f32)
    body: list[S.Stmt] = []

    def let(name: str, value: Expr) -> Var:
        v = Var(name, value.dtype)
        body.append(S.DeclScalar(v, value))
        return v

    xc = let("xc", E.select(E.compare(E.CmpOp.GT, x, _UNDERFLOW), x, E.const(_UNDERFLOW, f32)))
    # n = round(-x / ln2) as a float: adding and removing 1.5 * 2^23 rounds to an integer (exact
    # in f32 and never folded without -ffast-math); no float -> int conversion, which would stop
    # gcc from vectorizing the selects around it.
    scale = 2.0 ** -h
    nf = let("n", (xc * E.const(-scale / math.log(2.0), f32) + E.const(_ROUND, f32)) - E.const(_ROUND, f32))
    r = let("r", ((xc * scale if h else xc) + nf * E.const(_LN2_HI, f32)) + nf * E.const(_LN2_LO, f32))
    p: Expr = E.const(1.0 / math.factorial(7), f32)
    for k in range(6, -1, -1):
        p = p * r + E.const(1.0 / math.factorial(k), f32)
    y = let("p", p)
    rest = nf
    top = math.ceil(-_UNDERFLOW * scale / math.log(2.0) + 0.5).bit_length()
    for bit in range(top - 1, -1, -1):  # 2^-n from the binary digits of n, highest first
        on = let(f"on{bit}", E.compare(E.CmpOp.GE, rest, float(2 ** bit)))
        y = let(f"y{bit}", y * E.select(on, E.const(2.0 ** -(2 ** bit), f32), E.const(1.0, f32)))
        if bit:
            rest = let(f"rest{bit}", rest - E.select(on, E.const(float(2 ** bit), f32), E.const(0.0, f32)))
    for k in range(h):
        y = let(f"sq{k}", y * y)
    out = E.select(E.compare(E.CmpOp.LT, x, _UNDERFLOW), E.const(0.0, f32), y)
    body.append(S.Return(E.select(E.compare(E.CmpOp.NE, x, x), x, out)))
    return Function(EXP_NONPOSITIVE, FuncKind.DEVICE, (x,), S.seq(*body), ret=f32)


def helpers_for(*bodies: S.Stmt) -> tuple[Function, ...]:
    """The helper functions of this module that ``bodies`` call."""
    called = {c.name for b in bodies for c in collect(b, E.CallFunc)}
    return (exp_nonpositive_function(),) if EXP_NONPOSITIVE in called else ()


__all__ = ["EXP_NONPOSITIVE", "exp_nonpositive", "exp_nonpositive_function", "helpers_for"]
