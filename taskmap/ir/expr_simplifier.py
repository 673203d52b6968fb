"""Simplification of expressions (index arithmetic), with a small range analysis.

Lowering task mappings and flattening indices produce expressions such as
``(threadIdx.x // 8 * 4 + i) * 64 + threadIdx.x % 8``.  This module folds constants, rewrites
sums of signed integers into a canonical form (like terms collected, terms in order of first
appearance, the constant last), and simplifies ``//`` and ``%`` by positive constants using the
ranges of the variables: loop bounds, launch dimensions, ``If`` conditions, or ranges the caller
gives.

All integer rules are exact under the IR's floor semantics of ``//`` and ``%``; the rules that
split a sum additionally require the part left under the division to be non-negative, so index
arithmetic stays non-negative where it was.  They apply to signed integer types only; unsigned
and float expressions get constant folding and a few exact identities (``x * 1.0``, never
``x * 0.0`` or ``x - x``); a bit-cast is never folded as a conversion (only a constant operand
folds, as numpy's ``view``).  An expression holding a call (a helper function, a GPU primitive:
atomics have effects, shuffles are warp-wide) is only rebuilt from its simplified parts: no rule
drops, duplicates or merges it.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from .arith import (CMP_FOLD, NEGATE, R_BINARY, UNKNOWN, Key, Lin, Range, fits, fold_binary, fold_cast,
                    fold_bitcast, int_const, is_sint, r_add, r_scale, r_union)
from .dtypes import ScalarType, TypeKind, bool_
from .expr import (BinOp, Binary, BitCast, CallFunc, Cast, CmpOp, Compare, Const, Expr, Select, SizeVar, Special,
                   SpecialReg, UnOp, Unary, Var, cast)
from .functor import IRRewriter, collect
from .primitives import PrimCall
# ----------------------------------------------------------------------------- helpers


def is_pure(*nodes: Any) -> bool:
    """Free of calls: helper functions and GPU primitives (effects, warp-wide exchanges) must be
    neither dropped nor merged."""
    return not any(collect(n, (CallFunc, PrimCall)) for n in nodes if n is not None)


#: Ranges of launch registers (dimensions are >= 1); warp sizes are 32 or 64 on every target.
_SPECIAL_RANGE: dict[SpecialReg, Range] = {SpecialReg.THREAD_IDX: (0, None), SpecialReg.BLOCK_IDX: (0, None),
                                           SpecialReg.WARP_ID: (0, None), SpecialReg.LANE_ID: (0, 63),
                                           SpecialReg.WARP_SIZE: (32, 64)}


# ----------------------------------------------------------------------------- the simplifier


class ExprSimplifier(IRRewriter):
    """Simplifies expressions, given integer ranges of the variables in scope.

    ``bounds`` maps variables (by identity), ``Special`` registers and ``SizeVar``s to inclusive
    ranges.  Loop variables, launch dimensions and ``If`` conditions add ranges while walking.
    """

    def __init__(self, bounds: Mapping[Expr, tuple[int, int]] | None = None) -> None:
        super().__init__()
        self._bounds: dict[Expr, Range] = dict(bounds or {})
        self._fixed: set[Expr] = {k for k in self._bounds if isinstance(k, Var)}  # immutable vars
        self._rmemo: dict[int, tuple[Expr, Range]] = {}
        self._lmemo: dict[tuple[int, ScalarType], tuple[Expr, Lin]] = {}  # Lin values are never mutated
        self._has_prims = True  # per function: whether expressions may hold primitives
        self._prim_memo: dict[int, tuple[Expr, bool]] = {}

    def _keep(self, e: Expr) -> bool:
        """Whether ``e`` holds a GPU primitive, whose terms algebra must neither drop nor merge."""
        hit = self._prim_memo.get(id(e)) if self._has_prims else (e, False)
        if hit is None or hit[0] is not e:
            hit = self._prim_memo[id(e)] = (e, bool(collect(e, PrimCall)))
        return hit[1]

    # ------------------------------------------------------------------ ranges
    def _invalidate(self) -> None:
        self._memo.clear()
        self._rmemo.clear()
        self._lmemo.clear()

    @contextmanager
    def _scope(self, updates: Mapping[Expr, Range]) -> Iterator[None]:
        if not updates:
            yield
            return
        saved = {k: self._bounds.get(k) for k in updates}
        self._bounds.update(updates)
        self._invalidate()
        try:
            yield
        finally:
            for k, r in saved.items():
                if r is None:
                    self._bounds.pop(k, None)
                else:
                    self._bounds[k] = r
            self._invalidate()

    def range_of(self, e: Expr) -> Range:
        """The inclusive range of a (signed integer) expression; ``None`` ends are unknown."""
        hit = self._rmemo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        r = self._range(e)
        self._rmemo[id(e)] = (e, r)
        return r

    def _range(self, e: Expr) -> Range:
        if isinstance(e, Const):
            return (int(e.value), int(e.value)) if not e.dtype.is_float else UNKNOWN
        if isinstance(e, (Var, Special, SizeVar)) and e in self._bounds:
            return self._bounds[e]
        if isinstance(e, Special):
            return _SPECIAL_RANGE.get(e.reg, (1, None))
        if isinstance(e, SizeVar):
            return (1, None)
        if isinstance(e, Compare):
            return (0, 1)
        if not is_sint(e.dtype):
            return UNKNOWN
        if isinstance(e, Binary) and e.op in R_BINARY:
            return R_BINARY[e.op](self.range_of(e.a), self.range_of(e.b))
        if isinstance(e, Unary) and e.op is UnOp.NEG:
            return r_scale(self.range_of(e.a), -1)
        if isinstance(e, Select):
            return r_union(self.range_of(e.a), self.range_of(e.b))
        if isinstance(e, Cast) and (e.a.dtype.is_integer or e.a.dtype.is_bool):
            r = self.range_of(e.a)
            if r[0] is not None and r[1] is not None and fits(r[0], e.type) and fits(r[1], e.type):
                return r
        return UNKNOWN

    def _lin_range(self, lin: Lin) -> Range:
        r: Range = (lin.const, lin.const)
        for t, k in lin.terms.items():
            r = r_add(r, r_scale(self.range_of(t.e), k))
        return r

    # ------------------------------------------------------------------ linear forms
    def _lin(self, e: Expr, dt: ScalarType) -> Lin:
        hit = self._lmemo.get((id(e), dt))
        if hit is not None and hit[0] is e:
            return hit[1]
        lin = self._lin_uncached(e, dt)
        self._lmemo[(id(e), dt)] = (e, lin)
        return lin

    def _lin_uncached(self, e: Expr, dt: ScalarType) -> Lin:
        v = int_const(e)
        if v is not None:
            return Lin({}, v)
        if isinstance(e, Binary) and e.dtype is dt and e.op in (BinOp.ADD, BinOp.SUB, BinOp.MUL):
            la, lb = self._lin(e.a, dt), self._lin(e.b, dt)
            if e.op is not BinOp.MUL:
                return la.add(lb, 1 if e.op is BinOp.ADD else -1)
            if not la.terms:
                return lb.scale(la.const)
            if not lb.terms:
                return la.scale(lb.const)
            if len(la.terms) == len(lb.terms) == 1 and la.const == lb.const == 0:
                (ta, ka), (tb, kb) = *la.terms.items(), *lb.terms.items()
                if (ka, kb) != (1, 1) and ta.e.dtype is dt and tb.e.dtype is dt:
                    return Lin({Key(Binary(BinOp.MUL, ta.e, tb.e)): ka * kb})
        if isinstance(e, Unary) and e.op is UnOp.NEG and e.dtype is dt:
            return self._lin(e.a, dt).scale(-1)
        return Lin({Key(e): 1})

    def _build(self, lin: Lin, dt: ScalarType) -> Expr | None:
        """The expression of ``lin`` (positive terms, then negative ones, then the constant)."""
        if not fits(lin.const, dt) or not all(fits(k, dt) for k in lin.terms.values()):
            return None

        def term(t: Expr, k: int) -> Expr:
            return t if k == 1 else Binary(BinOp.MUL, t, Const(k, dt))

        acc: Expr | None = None
        for key, k in lin.terms.items():
            if k > 0:
                acc = term(key.e, k) if acc is None else Binary(BinOp.ADD, acc, term(key.e, k))
        const = lin.const
        if acc is None and const != 0 and lin.terms:
            acc, const = Const(const, dt), 0
        for key, k in lin.terms.items():
            if k < 0:
                t = term(key.e, -k)
                acc = Unary(UnOp.NEG, t) if acc is None else Binary(BinOp.SUB, acc, t)
        if acc is None:
            return Const(const, dt)
        if const != 0:
            acc = Binary(BinOp.ADD if const > 0 else BinOp.SUB, acc, Const(abs(const), dt))
        self._lmemo[(id(acc), dt)] = (acc, lin)  # what _lin(acc, dt) would compute
        return acc

    def _merge_divmod(self, lin: Lin, dt: ScalarType) -> Lin:
        """``(x // c) * c * k + (x % c) * k -> x * k``, repeatedly; also for a divisor ``y`` that is
        not a constant (a size): ``(x // y) * y * k + (x % y) * k -> x * k`` (a row-major index
        of a flat position ``x`` in rows of ``y``)."""
        changed = True
        while changed:
            changed = False
            for key, k in lin.terms.items():
                t = key.e
                if not isinstance(t, Binary) or t.op is not BinOp.MOD or t.dtype is not dt or t.a.dtype is not dt:
                    continue
                c = int_const(t.b)
                if c is None:
                    merged = self._merge_symbolic_divmod(lin, key, k)
                    if merged is not None:
                        lin, changed = merged, True
                        break
                    continue
                if c <= 0:
                    continue
                x = t.a  # type: ignore[attr-defined]
                q = self._lin(self._floordiv(x, c, dt), dt)
                if q.terms and all(lin.terms.get(qt) == qk * k * c for qt, qk in q.terms.items()):
                    lin = lin.add(q, -k * c).add(Lin({key: 1}), -k).add(self._lin(x, dt), k)
                    changed = True
                    break
        return lin

    def _merge_symbolic_divmod(self, lin: Lin, key: Key, k: int) -> Lin | None:
        """``lin`` with ``(x // y) * y * k + key * k`` as ``x * k`` (``key``: ``x % y``, ``y`` not a
        constant), or None when it holds no such product."""
        t = key.e
        x, y = t.a, t.b  # type: ignore[attr-defined]
        if not is_pure(x, y):
            return None
        q = Binary(BinOp.FLOORDIV, x, y)
        for prod in (Key(Binary(BinOp.MUL, q, y)), Key(Binary(BinOp.MUL, y, q))):
            if lin.terms.get(prod) == k:
                return lin.add(Lin({prod: 1, key: 1}), -k).add(self._lin(x, t.dtype), k)
        return None

    def _norm(self, e: Expr, dt: ScalarType) -> Expr:
        out = self._build(self._merge_divmod(self._lin(e, dt), dt), dt)
        return e if out is None or out.dtype is not dt else out

    # ------------------------------------------------------------------ // and % by constants
    def _factors(self, lin: Lin, c: int) -> list[int]:
        """Candidate k, 1 < k < c, k | c: common factors of c and a term's coefficient."""
        return sorted({math.gcd(c, abs(k)) for k in lin.terms.values()} - {1, c}, reverse=True)

    def _split(self, lin: Lin, k: int) -> tuple[Lin, Lin]:
        """``lin == k * s + t``: ``s`` has the terms divisible by k, ``t`` the rest and ``const % k``."""
        s = {t: v // k for t, v in lin.terms.items() if v % k == 0}
        rest = {t: v for t, v in lin.terms.items() if v % k != 0}
        return Lin(s, lin.const // k), Lin(rest, lin.const % k)

    def _in(self, lin: Lin, lo: int, hi: int) -> bool:
        r = self._lin_range(lin)
        return r[0] is not None and r[1] is not None and lo <= r[0] and r[1] <= hi

    def _nonneg(self, lin: Lin) -> bool:
        lo = self._lin_range(lin)[0]
        return lo is not None and lo >= 0

    def _floordiv(self, a: Expr, c: int, dt: ScalarType) -> Expr:
        """``a // c`` for a simplified ``a`` of type ``dt`` and a constant ``c > 0``."""
        if c == 1:
            return a
        lo, hi = self.range_of(a)
        if lo is not None and hi is not None and lo // c == hi // c:
            return Const(lo // c, dt)
        if isinstance(a, Binary) and a.op is BinOp.FLOORDIV and a.dtype is dt:
            inner = int_const(a.b)
            if inner is not None and inner > 0:  # (x // inner) // c == x // (inner * c)
                return self._floordiv(a.a, inner * c, dt)
        lin = self._lin(a, dt)
        q = {t: k // c for t, k in lin.terms.items() if k % c == 0}
        if q:  # (q * c + r) // c == q + r // c, with r >= 0
            rterms = {t: k for t, k in lin.terms.items() if k % c != 0}
            for rconst, qconst in ((lin.const, 0), (lin.const % c, lin.const // c)):
                r = Lin(rterms, rconst)
                rb = self._build(r, dt) if self._nonneg(r) else None
                if rb is not None and rb.dtype is dt:
                    total = Lin(q, qconst).add(self._lin(self._floordiv(rb, c, dt), dt))
                    out = self._build(self._merge_divmod(total, dt), dt)
                    if out is not None and out.dtype is dt:
                        return out
        for k in self._factors(lin, c):  # (k * s + t) // c == s // (c / k), with 0 <= t < k
            s, t = self._split(lin, k)
            sb = self._build(s, dt) if s.terms and self._in(t, 0, k - 1) else None
            if sb is not None and sb.dtype is dt:
                return self._floordiv(sb, c // k, dt)
        return Binary(BinOp.FLOORDIV, a, Const(c, dt))

    def _mod(self, a: Expr, c: int, dt: ScalarType) -> Expr:
        """``a % c`` for a simplified ``a`` of type ``dt`` and a constant ``c > 0``."""
        if c == 1:
            return Const(0, dt)
        lo, hi = self.range_of(a)
        if lo is not None and hi is not None and lo // c == hi // c:
            if lo // c == 0:
                return a
            out = self._build(self._lin(a, dt).add(Lin({}, -(lo // c) * c)), dt)
            if out is not None and out.dtype is dt:
                return out
        if isinstance(a, Binary) and a.op is BinOp.MOD and a.dtype is dt:
            inner = int_const(a.b)
            if inner is not None and inner > 0 and inner % c == 0:  # (x % (c * m)) % c == x % c
                return self._mod(a.a, c, dt)
        lin = self._lin(a, dt)
        rterms = {t: k for t, k in lin.terms.items() if k % c != 0}
        for rconst in (lin.const % c, lin.const):  # (q * c + r) % c == r % c, with r >= 0
            if len(rterms) == len(lin.terms) and rconst == lin.const:
                continue
            r = Lin(rterms, rconst)
            rb = self._build(r, dt) if self._nonneg(r) else None
            if rb is not None and rb.dtype is dt:
                return self._mod(rb, c, dt)
        for k in self._factors(lin, c):  # (k*s + t) % c == (s % (c/k)) * k + t, 0 <= t < k, if s % (c/k) folds
            s, t = self._split(lin, k)
            sb = self._build(s, dt) if s.terms and self._in(t, 0, k - 1) else None
            inner_mod = self._mod(sb, c // k, dt) if sb is not None and sb.dtype is dt else None
            if inner_mod is not None and not (isinstance(inner_mod, Binary) and inner_mod.op is BinOp.MOD):
                out = self._build(self._lin(inner_mod, dt).scale(k).add(t), dt)
                if out is not None and out.dtype is dt:
                    return out
        return Binary(BinOp.MOD, a, Const(c, dt))

    # ------------------------------------------------------------------ expression rules
    def _decide(self, op: CmpOp, a: Expr, b: Expr) -> bool | None:
        """The value of ``a op b`` for signed integers when their ranges decide it."""
        lo, hi = self._lin_range(self._lin(a, a.dtype).add(self._lin(b, b.dtype), -1))
        facts = {
            CmpOp.LT: (hi is not None and hi < 0, lo is not None and lo >= 0),
            CmpOp.LE: (hi is not None and hi <= 0, lo is not None and lo > 0),
            CmpOp.GT: (lo is not None and lo > 0, hi is not None and hi <= 0),
            CmpOp.GE: (lo is not None and lo >= 0, hi is not None and hi < 0),
            CmpOp.EQ: (lo == hi == 0, (hi is not None and hi < 0) or (lo is not None and lo > 0)),
        }
        if op is CmpOp.NE:
            yes, no = facts[CmpOp.EQ]
            return False if yes else True if no else None
        yes, no = facts[op]
        return True if yes else False if no else None

    def _binary(self, e: Binary) -> Expr:
        op, a, b, dt = e.op, e.a, e.b, e.dtype
        folded = fold_binary(op, a, b, dt)
        if folded is not None:
            return folded
        if op in (BinOp.AND, BinOp.OR):
            for x, y in ((a, b), (b, a)):
                if isinstance(x, Const):
                    absorbing = bool(x.value) is (op is BinOp.OR)
                    if absorbing:
                        return Const(op is BinOp.OR, bool_)
                    if y.dtype.is_bool:
                        return y
            return a if a == b and a.dtype.is_bool else e
        c = int_const(b)
        if is_sint(dt) and a.dtype is dt and (b.dtype is dt or c is not None):
            if op in (BinOp.ADD, BinOp.SUB, BinOp.MUL):
                return self._norm(e, dt)
            if op is BinOp.FLOORDIV and c is not None and c > 0:
                return self._floordiv(a, c, dt)
            if op is BinOp.MOD and c is not None and c > 0:
                return self._mod(a, c, dt)
            if op in (BinOp.MIN, BinOp.MAX):
                if a == b:
                    return a
                if self._decide(CmpOp.LE, a, b):          # a <= b: min is a, max is b
                    return a if op is BinOp.MIN else b
                if self._decide(CmpOp.GE, a, b):          # a >= b (equal allowed): max(j, 0) is j
                    return b if op is BinOp.MIN else a
            return e
        return self._identities(e)

    def _identities(self, e: Binary) -> Expr:
        """Exact identities for unsigned and float operands."""
        op, a, b = e.op, e.a, e.b
        one = lambda x: isinstance(x, Const) and x.value == 1  # noqa: E731
        zero = lambda x: isinstance(x, Const) and x.value == 0  # noqa: E731
        if op is BinOp.MUL and one(b) or op in (BinOp.DIV, BinOp.FLOORDIV) and one(b) and e.dtype.is_integer:
            return a
        if op is BinOp.DIV and one(b) and e.dtype.is_float:
            return a
        if op is BinOp.MUL and one(a):
            return b
        if op is BinOp.SUB and zero(b):
            return a
        if e.dtype.is_integer:
            if op is BinOp.ADD and zero(b):
                return a
            if op is BinOp.ADD and zero(a):
                return b
            if op is BinOp.MUL and (zero(a) or zero(b)) or op is BinOp.MOD and one(b):
                return Const(0, e.dtype)
        return e

    def _unary(self, e: Unary) -> Expr:
        a, dt = e.a, e.dtype
        if e.op is UnOp.NOT:
            if isinstance(a, Const):
                return Const(not a.value, bool_)
            if isinstance(a, Unary) and a.op is UnOp.NOT and a.a.dtype.is_bool:
                return a.a
            if isinstance(a, Compare) and a.a.dtype.is_integer and a.b.dtype.is_integer:
                return self._compare(Compare(NEGATE[a.op], a.a, a.b))
            return e
        if isinstance(a, Const) and not a.dtype.is_bool:
            if e.op is UnOp.NEG:
                v: Any = -a.value
            elif a.dtype.is_integer:
                v = ~int(a.value) if a.dtype.kind is TypeKind.INT else int(a.value) ^ (2 ** (8 * dt.nbytes) - 1)
            else:
                return e
            return Const(v, dt) if not dt.is_integer or fits(v, dt) else e
        if e.op is UnOp.NEG and isinstance(a, Unary) and a.op is UnOp.NEG:
            return a.a
        if e.op is UnOp.NEG and is_sint(dt):
            return self._norm(e, dt)
        return e

    def _compare(self, e: Compare) -> Expr:
        a, b = e.a, e.b
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(CMP_FOLD[e.op](a.value, b.value), bool_)
        if is_sint(a.dtype) and is_sint(b.dtype):
            v = self._decide(e.op, a, b)
            if v is not None:
                return Const(v, bool_)
        return e

    # ------------------------------------------------------------------ expression visitors
    def _done(self, node: Expr, out: Expr, fallback: Expr) -> Expr:
        if out.dtype is not node.dtype:
            out = fallback
        return node if out == node else out

    def visit_Binary(self, node: Binary) -> Expr:
        a, b = self.visit(node.a), self.visit(node.b)
        e = node if a is node.a and b is node.b else Binary(node.op, a, b)
        return self._done(node, e if self._keep(e) else self._binary(e), e)

    def visit_Unary(self, node: Unary) -> Expr:
        a = self.visit(node.a)
        e = node if a is node.a else Unary(node.op, a)
        return self._done(node, e if self._keep(e) else self._unary(e), e)

    def visit_Compare(self, node: Compare) -> Expr:
        a, b = self.visit(node.a), self.visit(node.b)
        e = node if a is node.a and b is node.b else Compare(node.op, a, b)
        return self._done(node, e if self._keep(e) else self._compare(e), e)

    def visit_Select(self, node: Select) -> Expr:
        return self._select(node, self.visit(node.cond), self.visit(node.a), self.visit(node.b))

    def _select(self, node: Select, c: Expr, a: Expr, b: Expr) -> Expr:
        """``node`` with its condition and branches simplified as ``c``, ``a`` and ``b``."""
        e = node if c is node.cond and a is node.a and b is node.b else Select(c, a, b)
        out: Expr = e
        if isinstance(c, Const):
            out = cast(a if c.value else b, node.dtype)
        elif a == b and not self._keep(a):
            out = a
        return self._done(node, out, e)

    def visit_Cast(self, node: Cast) -> Expr:
        a = self.visit(node.a)
        e = node if a is node.a else Cast(a, node.type)
        out: Expr | None = a if a.dtype is node.type else None
        if out is None and isinstance(a, Const):
            out = fold_cast(a, node.type)
        return self._done(node, out if out is not None else e, e)

    def visit_BitCast(self, node: BitCast) -> Expr:
        """Reinterprets bits, never converts: only constants fold (through numpy's ``view``)."""
        a = self.visit(node.a)
        e = node if a is node.a else BitCast(a, node.type)
        out = fold_bitcast(a, node.type) if isinstance(a, Const) else None
        if isinstance(a, BitCast):  # bits of bits: one reinterpretation, or none
            out = a.a if a.a.dtype is node.type else BitCast(a.a, node.type)
        return self._done(node, out if out is not None else e, e)

    def _point(self, node: Expr) -> Expr:
        r = self.range_of(node)
        return Const(r[0], node.dtype) if r[0] is not None and r[0] == r[1] and fits(r[0], node.dtype) else node

    def visit_Var(self, node: Var) -> Expr:
        return node if node.is_tensor or not is_sint(node.dtype) else self._point(node)

    def visit_Special(self, node: Special) -> Expr:
        return self._point(node)

    def visit_SizeVar(self, node: SizeVar) -> Expr:
        return self._point(node)

    # ------------------------------------------------------------------ statements


# ----------------------------------------------------------------------------- entry points


def simplify_expr(e: Expr, bounds: Mapping[Expr, tuple[int, int]] | None = None) -> Expr:
    """``e`` simplified, given inclusive ranges of variables, ``Special``s and ``SizeVar``s."""
    return ExprSimplifier(bounds).visit(e)


def bound_of(e: Expr, bounds: Mapping[Expr, tuple[int, int]] | None = None) -> tuple[int, int] | None:
    """The inclusive range of the signed integer expression ``e``, or None if unbounded."""
    lo, hi = ExprSimplifier(bounds).range_of(e)
    return None if lo is None or hi is None else (lo, hi)
