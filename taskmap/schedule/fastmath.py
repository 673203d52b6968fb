"""Math written in plain IR arithmetic, so that CPU vector loops stay vectorized.

gcc turns ``expf`` inside an ``omp simd`` loop into one scalar libm call per lane (glibc's vector
variants need ``-ffast-math``); at 16 lanes that costs more than the memory traffic of a softmax.
:func:`fast_exp` is ``exp(x)`` in f32 from multiplies, adds, two integer operations and bit-casts
(Cephes / Sleef style; 15 vector operations with FMA contraction)::

    x = n * ln2 + r,   |r| <= ln2 / 2,   n = round(x / ln2)     (two-constant Cody-Waite)
    exp(x) = 2^(n-1) * q(r),   q(r) = 2 * p(r)

``n`` is rounded by adding 1.5 * 2^23, which leaves ``n`` in the low bits of the float's bits:
``2^(n-1)`` is those bits plus 126 shifted into the exponent field, bit-cast back to f32 (no
float -> int conversion).  ``p`` is a degree-6 polynomial fitted to ``exp`` on ``[-ln2/2, ln2/2]``
(relative error 2e-9; its coefficients are doubled in ``q``, which is exact).  The result is
within 1 ulp of ``exp`` (measured max: see ``tests/schedule/test_fastmath.py``) wherever it is a
normal f32 not below ``2^-125.5`` (x >= -86.99).

Limits (what torch's vectorized ``exp_u20``, used by its CPU softmax, does too):

* below ``x = -125.5 ln2 ≈ -86.99`` the result is 0, although ``exp`` would still be a normal
  number down to ``-87.34`` (up to 1.8e-38, the absolute error) and a subnormal down to ``-103.3``:
  subnormal outputs are flushed to 0; ``-inf`` gives 0;
* from ``ln(FLT_MAX) ≈ 88.72`` up (``+inf`` too) the result is ``+inf``, by overflow;
* NaN gives NaN (the clamps let it through, ``NaN * 2^k`` is NaN).

The input is clamped to ``[-87.5, 88.8]``, which keeps ``n - 1 + 127`` in ``[0, 255]``: 0 gives
the scale 0 (the flush), 255 gives ``inf``.  Other dtypes use the ``exp`` intrinsic.  The f32
version is a helper function of the module (its steps bound to local variables; gcc inlines it).
"""
from __future__ import annotations

from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import f32, u32
from ..ir.exp_poly import EXP_POLY, LN2_HI, LN2_LO, LOG2E, SHIFTER
from ..ir.expr import Expr, Var
from ..ir.func import FuncKind, Function
from ..ir.functor import collect

LOWEST = -87.5                       # clamps: n - 1 + 127 stays in [0, 255]
HIGHEST = 88.8

#: The helper function's name in a module (the C backend calls it ``tm_fn_<name>``).
FAST_EXP = "fast_exp_f32"
EXP_NONPOSITIVE = FAST_EXP  # the former name (the helper once handled x <= 0 only)


def fast_exp(x: Expr) -> Expr:
    """``exp(x)`` for f32 ``x`` as a call of the helper :func:`fast_exp_function` (which a module
    calling it must contain: see :func:`helpers_for`); other dtypes: the ``exp`` intrinsic."""
    if x.dtype is not f32:
        return E.call(E.Intrinsic.EXP, x)
    return E.CallFunc(FAST_EXP, (x,), f32)


#: Callers that evaluate ``exp`` of ``x - max`` (softmax): any ``x`` works now.
exp_nonpositive = fast_exp


def fast_exp_function() -> Function:
    """The helper ``fast_exp_f32(x: f32) -> f32`` (a DEVICE function)."""
    x = Var("x", f32)
    body: list[S.Stmt] = []

    def let(name: str, value: Expr) -> Var:
        v = Var(name, value.dtype)
        body.append(S.DeclScalar(v, value))
        return v

    # Clamps written so that a NaN x passes (the comparison is false): x86's max/min do exactly this.
    lo = E.select(E.compare(E.CmpOp.LT, x, LOWEST), E.const(LOWEST, f32), x)
    xc = let("xc", E.select(E.compare(E.CmpOp.GT, lo, HIGHEST), E.const(HIGHEST, f32), lo))
    t = let("t", xc * E.const(LOG2E, f32) + E.const(SHIFTER, f32))
    n = let("n", t - E.const(SHIFTER, f32))
    r = let("r", (xc - n * E.const(LN2_HI, f32)) - n * E.const(LN2_LO, f32))
    q: Expr = E.const(EXP_POLY[-1], f32)
    for c in EXP_POLY[-2::-1]:
        q = q * r + E.const(c, f32)
    q = let("q", q)
    # 2^(n-1): t's bits are those of 1.5 * 2^23 plus n; the shift drops all but n + 126 (mod 2^9).
    scale = let("scale", E.bitcast((E.bitcast(t, u32) + 126) << 23, f32))
    body.append(S.Return(q * scale))
    return Function(FAST_EXP, FuncKind.DEVICE, (x,), S.seq(*body), ret=f32)


def exp_nonpositive_function() -> Function:
    """The former name of :func:`fast_exp_function`."""
    return fast_exp_function()


def helpers_for(*bodies: S.Stmt) -> tuple[Function, ...]:
    """The helper functions of this module that ``bodies`` call."""
    called = {c.name for b in bodies for c in collect(b, E.CallFunc)}
    return (fast_exp_function(),) if FAST_EXP in called else ()


__all__ = ["EXP_NONPOSITIVE", "EXP_POLY", "FAST_EXP", "exp_nonpositive", "exp_nonpositive_function", "fast_exp",
           "fast_exp_function", "helpers_for"]
