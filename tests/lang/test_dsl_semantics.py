"""Expressions, compile-time evaluation, and the local-variable rule of the DSL."""
from __future__ import annotations

import math

from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.expr import BinOp, CmpOp, Intrinsic, UnOp
from taskmap.ir.mapping import MappingLoopKind
from taskmap.ir.verify import verify
from taskmap.lang import (attrs, blockDim, bool_, cast, exp, f16, f32, fma, gridDim, i32, i64, repeat, select, spatial,
                          sqrt, threadIdx, transpile)


def stmts(node: S.Stmt) -> list[S.Stmt]:
    return list(node.stmts) if isinstance(node, S.Seq) else [node]


def entry(fn, kind=None):
    mod = transpile(fn, kind)
    verify(mod)  # what the front end builds satisfies the IR's invariants
    return mod.entry_function


def stored_values(fn) -> list[E.Expr]:
    """The values stored by the top-level ``out[k] = ...`` statements of ``fn``."""
    f = entry(fn)
    return [s.value for s in stmts(f.body) if isinstance(s, S.Store)]


# ----------------------------------------------------------------------------- expressions


def test_arithmetic_and_power():
    def k(x: f32[1], n: i32, out: f32[8]):
        v = x[0]
        out[0] = v ** 2
        out[1] = v ** 3
        out[2] = v ** 0.5
        out[3] = n // 3 + n % 3
        out[4] = -v
        out[5] = n / 2
        out[6] = (n << 2) | (n & 1) ^ ~n

    f = entry(k)
    v = stmts(f.body)[0].var
    n = f.params[1]
    a, b, c, d, e, g, h = [s.value for s in stmts(f.body)[1:]]
    assert a == v * v and b == v * v * v
    assert c == E.Call(Intrinsic.POW, (v, E.const(0.5)))
    assert d == E.Cast(E.binary(BinOp.FLOORDIV, n, 3) + E.binary(BinOp.MOD, n, 3), f32)
    assert e == E.Unary(UnOp.NEG, v)
    assert g == E.binary(BinOp.DIV, n, 2) and g.dtype is f32
    assert h == E.Cast(E.binary(BinOp.BITOR, E.binary(BinOp.SHL, n, 2),
                                E.binary(BinOp.BITXOR, E.binary(BinOp.BITAND, n, 1), E.Unary(UnOp.BITNOT, n))), f32)


def test_comparisons_and_logic():
    def k(x: f32[4], n: i32, out: bool_[6]):
        out[0] = 0 <= n < 10
        out[1] = n > 1 and x[0] < 2.0 or not n == 3
        out[2] = n != 0 and True
        out[3] = n == 0 and False
        out[4] = not n
        out[5] = 1 < 2 < 3

    f = entry(k)
    n, x = f.params[1], f.params[0]
    a, b, c, d, e, g = [s.value for s in stmts(f.body)]
    assert a == E.logical_and(E.compare(CmpOp.LE, 0, n), E.compare(CmpOp.LT, n, 10))
    lhs = E.logical_and(E.compare(CmpOp.GT, n, 1), E.compare(CmpOp.LT, E.Load(x, (E.const(0),)), 2.0))
    assert b == E.logical_or(lhs, E.logical_not(E.compare(CmpOp.EQ, n, 3)))
    assert c == E.compare(CmpOp.NE, n, 0)
    assert d == E.const(False)
    assert e == E.logical_not(E.compare(CmpOp.NE, n, 0))
    assert g == E.const(True)


def test_ternary_select_and_compile_time_branches():
    BIG = 100

    def k(x: f32[1], n: i32, out: f32[4]):
        out[0] = x[0] if n > 0 else 0.0
        out[1] = x[0] if BIG > 10 else undefined_name  # noqa: F821 - never evaluated
        out[2] = select(n > 0, 1.0, x[0])
        out[3] = cast(n, f16)

    f = entry(k)
    x0 = E.Load(f.params[0], (E.const(0),))
    a, b, c, d = [s.value for s in stmts(f.body)]
    assert a == E.Select(E.compare(CmpOp.GT, f.params[1], 0), x0, E.const(0.0))
    assert b == x0
    assert c == E.Select(E.compare(CmpOp.GT, f.params[1], 0), E.const(1.0), x0)
    assert d == E.Cast(E.Cast(f.params[1], f16), f32)


def test_math_casts_min_max_abs():
    def k(x: f32[2], n: i32, out: f32[10]):
        attrs.block_dim = 32
        v = x[0]
        out[0] = math.exp(v) + exp(v)
        out[1] = sqrt(v) + math.sqrt(4.0)
        out[2] = abs(v) + abs(-3)
        out[3] = min(v, x[1], 0.5) + max(n, 1, 2)
        out[4] = float(n) + int(v)
        out[5] = f16(v)
        out[6] = i64(n)
        out[7] = fma(v, 2.0, 1.0)
        out[8] = blockDim.x + gridDim.z
        out[9] = True

    f = entry(k)
    v = stmts(f.body)[0].var
    assert f.launch is not None
    n, x1 = f.params[1], E.Load(f.params[0], (E.const(1),))
    vals = [s.value for s in stmts(f.body)[1:]]
    assert vals[0] == E.call(Intrinsic.EXP, v) + E.call(Intrinsic.EXP, v)
    assert vals[1] == E.call(Intrinsic.SQRT, v) + 2.0
    assert vals[2] == E.call(Intrinsic.ABS, v) + 3
    assert vals[3] == E.minimum(E.minimum(v, x1), 0.5) + E.maximum(n, 2)
    assert vals[4] == E.Cast(n, f32) + E.Cast(v, i32)
    assert vals[5] == E.Cast(E.Cast(v, f16), f32) and vals[6] == E.Cast(E.Cast(n, i64), f32)
    assert vals[7] == E.call(Intrinsic.FMA, v, E.const(2.0), E.const(1.0))
    assert vals[8].dtype is f32 and vals[9] == E.const(1.0)


def test_chained_indexing_equals_tuple_indexing():
    def k(a: f32[4, 4], out: f32[4, 4]):
        for i in range(4):
            out[i][3] = a[i][0] + a[i, 1]

    (loop,) = stmts(entry(k).body)
    st = loop.body
    assert st.indices == (loop.var, E.const(3))
    assert st.value.a.indices == (loop.var, E.const(0)) and st.value.b.indices == (loop.var, E.const(1))


def test_tensor_attributes_and_python_containers():
    TILES = (8, 16)
    CFG = {"n": 4}

    def k(a: f32[8, "K"], out: f32[8]):
        for i in range(a.shape[0]):
            out[i] = a[i, TILES[0] - 1] * CFG["n"] + a.ndim

    (loop,) = stmts(entry(k).body)
    assert loop.stop == E.const(8)
    assert loop.body.value.a.a.indices == (loop.var, E.const(7))


# ----------------------------------------------------------------------------- locals


def test_compile_time_locals_stay_python():
    def k(a: f32[64]):
        BM = 64
        half = BM // 2
        m = spatial(4, 8)
        tiles = (BM, half)
        for i in range(tiles[1]):
            a[i] = half
        for t, _u in m:
            a[t] = 0.0

    f = entry(k)
    loop, mloop = stmts(f.body)  # no declarations: every local above is a compile-time value
    assert loop.stop == E.const(32) and loop.body.value == E.const(32.0)
    assert mloop.mapping == spatial(4, 8) and mloop.kind is MappingLoopKind.SEQUENTIAL


def test_reassigned_number_becomes_runtime_variable():
    def k(a: f32[4], n: i32):
        x = 0
        if n > 2:
            x = 1.5
        a[0] = x
        n = n + 1
        a[1] = n

    decl, branch, store, reassign, _ = stmts(entry(k).body)
    assert isinstance(decl, S.DeclScalar) and decl.var.dtype is i32 and decl.init == E.const(0)
    (assign,) = stmts(branch.then)
    assert isinstance(assign, S.Assign) and assign.var is decl.var and assign.value == E.Cast(E.const(1.5), i32)
    assert isinstance(store, S.Store) and store.value == E.Cast(decl.var, f32)
    assert isinstance(reassign, S.Assign) and reassign.var.name == "n" and reassign.value.op is BinOp.ADD


def test_hoisting_out_of_if_else():
    def k(a: f32[4], c: i32):
        if c > 0:
            y = 1.0
        elif c < -5:
            y = 3
        else:
            y = 2.0
        a[0] = y

    f = entry(k)
    decl, branch, store = stmts(f.body)
    assert isinstance(decl, S.DeclScalar) and decl.init is None and decl.var.dtype is f32
    assert isinstance(branch.then, S.Assign) and branch.then.var is decl.var
    inner = branch.else_
    assert inner.then.var is decl.var and inner.then.value == E.const(3.0)
    assert inner.else_.var is decl.var
    assert store.value is decl.var
    assert "    y: f32\n    if c > 0:\n        y = 1.0" in repr(f)


def test_hoisting_out_of_nested_loops_and_loop_locals():
    def k(a: f32[4, 4], out: f32[4]):
        for i in range(4):
            t = a[i, 0]
            for j in range(4):
                if a[i, j] > t:
                    best = a[i, j]
            out[i] = t
        out[0] = best

    f = entry(k)
    decl, loop, store = stmts(f.body)
    assert isinstance(decl, S.DeclScalar) and decl.var.name == "best" and decl.init is None
    t_decl = stmts(loop.body)[0]
    assert isinstance(t_decl, S.DeclScalar) and t_decl.var.name == "t"  # stays local to the loop
    assert store.value is decl.var


def test_tuple_assignment_swaps():
    def k(out: f32[2]):
        a, b = 1.0, 2.0
        a, b = b, a
        out[0] = a
        out[1] = b

    da, db, ta, tb, aa, ab, _, _ = stmts(entry(k).body)
    assert da.var.name == "a" and db.var.name == "b" and da.init == E.const(1.0)
    assert ta.init is db.var and tb.init is da.var
    assert aa.var is da.var and aa.value is ta.var and ab.var is db.var and ab.value is tb.var


def test_augmented_assignments():
    def k(t: f32[4, 4], n: i32):
        x = n
        x *= 3
        x -= 1
        x //= 2
        x %= 7
        x <<= 1
        t[1, 2] += x
        t[0, 0] /= 2

    f = entry(k)
    decl, *assigns, s1, s2 = stmts(f.body)
    ops = [a.value.op for a in assigns]
    assert ops == [BinOp.MUL, BinOp.SUB, BinOp.FLOORDIV, BinOp.MOD, BinOp.SHL]
    assert s1.indices == (E.const(1), E.const(2))
    assert s1.value == E.Load(f.params[0], s1.indices) + decl.var
    assert s2.value == E.binary(BinOp.DIV, E.Load(f.params[0], s2.indices), 2)


def test_annotated_locals_and_while_break_continue():
    def k(a: f32[16]):
        acc: f32 = 0
        k: i32
        k = 0
        while True:
            k += 1
            if k > 10:
                break
            if k % 2 == 0:
                continue
            acc += a[k]
        a[0] = acc

    f = entry(k)
    acc, kd, k0, loop, _ = stmts(f.body)
    assert acc.var.dtype is f32 and acc.init == E.const(0.0)
    assert kd.init is None and isinstance(k0, S.Assign)
    assert isinstance(loop, S.While) and loop.cond == E.const(True)
    body = stmts(loop.body)
    assert isinstance(body[1].then, S.Break) and isinstance(body[2].then, S.Continue)


def test_device_function_returns_are_cast():
    from taskmap.lang import func

    @func
    def half(x: i32) -> f32:
        if x > 0:
            return x / 2
        return 0

    f = transpile(half).entry_function
    branch, ret = stmts(f.body)
    assert branch.then.value.dtype is f32 and ret.value == E.const(0.0)


def test_docstrings_and_pass_are_ignored():
    def k(a: f32[1]):
        """A docstring."""
        pass
        a[0] = 1.0

    assert isinstance(entry(k).body, S.Store)


def pick_mapping(n, threads):
    """A user's Python helper: called at transpile time, it returns a task mapping."""
    return spatial(threads) * repeat(n // threads) if n > threads else spatial(n)


def test_python_helpers_are_evaluated_at_compile_time():
    N = 256

    def k(a: f32[N]):
        attrs.block_dim = 64
        for i in pick_mapping(N, 64).on(threadIdx.x):
            a[i] = len(pick_mapping(8, 64).task_shape)

    f = entry(k)
    (loop,) = stmts(f.body)
    assert loop.mapping == spatial(64) * repeat(4) and loop.body.value == E.const(1.0)
