"""The index-arithmetic simplifier (taskmap.ir.simplify): soundness on random expressions, and the
simplifications lowered task mappings rely on."""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.dtypes import f32, i8, i64, u32
from taskmap.ir.expr import (BinOp, Binary, CmpOp, Compare, Const, Expr, SizeVar, Special, blockDim,
                             compare, const, logical_and, logical_not, logical_or, maximum, minimum, select,
                             threadIdx, var)
from taskmap.ir.func import FuncKind, Function, LaunchConfig, Module
from taskmap.ir.functor import collect
from taskmap.ir.mapping import MappingLoopKind, spatial
from taskmap.ir.simplify import Simplifier, bound_of, simplify_expr, simplify_function, simplify_module
from taskmap.ir.types import tensor_type

# ----------------------------------------------------------------------------- a reference evaluator

_OPS: dict[BinOp, Callable[[Any, Any], Any]] = {
    BinOp.ADD: operator.add, BinOp.SUB: operator.sub, BinOp.MUL: operator.mul,
    BinOp.FLOORDIV: operator.floordiv, BinOp.MOD: operator.mod, BinOp.MIN: min, BinOp.MAX: max,
    BinOp.AND: lambda a, b: bool(a) and bool(b), BinOp.OR: lambda a, b: bool(a) or bool(b),
}
_CMPS: dict[CmpOp, Callable[[Any, Any], bool]] = {
    CmpOp.EQ: operator.eq, CmpOp.NE: operator.ne, CmpOp.LT: operator.lt,
    CmpOp.LE: operator.le, CmpOp.GT: operator.gt, CmpOp.GE: operator.ge,
}


def evaluate(e: Expr, env: dict[Expr, int]) -> Any:
    """Python (floor) semantics of integer expressions; ``env`` binds vars, specials, sizes."""
    if isinstance(e, Const):
        return e.value
    if isinstance(e, (E.Var, Special, SizeVar)):
        return env[e]
    if isinstance(e, Binary):
        return _OPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, Compare):
        return _CMPS[e.op](evaluate(e.a, env), evaluate(e.b, env))
    if isinstance(e, E.Unary):
        v = evaluate(e.a, env)
        return -v if e.op is E.UnOp.NEG else (not v) if e.op is E.UnOp.NOT else ~v
    if isinstance(e, E.Select):
        return evaluate(e.a, env) if evaluate(e.cond, env) else evaluate(e.b, env)
    if isinstance(e, E.Cast):
        return evaluate(e.a, env)
    raise TypeError(e)


# ----------------------------------------------------------------------------- random expressions

IV, J, K, U = var("i"), var("j"), var("k"), var("u")
TX, N = threadIdx.x, SizeVar("n")
BOUNDS: dict[Expr, tuple[int, int]] = {IV: (0, 7), J: (0, 127), K: (-8, 8), TX: (0, 255), N: (1, 64)}
FREE: dict[Expr, tuple[int, int]] = {U: (-50, 50)}  # a variable the simplifier knows nothing about

leaves = st.one_of(st.sampled_from([IV, J, K, U, TX, N]), st.integers(-10, 20).map(const))
divisors = st.integers(1, 16)


def _extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
    arith = st.tuples(st.sampled_from([BinOp.ADD, BinOp.SUB, BinOp.MUL, BinOp.MIN, BinOp.MAX]), children, children)
    divmod_ = st.tuples(st.sampled_from([BinOp.FLOORDIV, BinOp.MOD]), children, divisors)
    cmp = st.tuples(st.sampled_from(list(CmpOp)), children, children, children, children)
    return st.one_of(
        arith.map(lambda t: Binary(t[0], t[1], t[2])),
        divmod_.map(lambda t: Binary(t[0], t[1], const(t[2]))),
        # the shapes that lowering task mappings produces
        st.tuples(children, divisors).map(lambda t: t[0] // t[1] * t[1] + t[0] % t[1]),
        children.map(lambda c: c // N * N + c % N),          # ... and by a size: a flat index in rows
        children.map(lambda c: N * (c // N) * 3 + c % N * 3),
        st.tuples(children, children, divisors).map(lambda t: (t[0] * t[2] + t[1]) // t[2]),
        st.tuples(children, children, divisors).map(lambda t: (t[0] * t[2] + t[1]) % t[2]),
        st.tuples(children, divisors, divisors).map(lambda t: t[0] // t[1] % t[2] + t[0] // (t[1] * t[2]) * t[2]),
        cmp.map(lambda t: select(Compare(t[0], t[1], t[2]), t[3], t[4])),
        children.map(lambda c: -c),
    )


exprs = st.recursive(leaves, _extend, max_leaves=14)


def _envs(rng: random.Random, count: int) -> list[dict[Expr, int]]:
    ranges: dict[Expr, tuple[int, int]] = {**BOUNDS, **FREE}
    out: list[dict[Expr, int]] = [{v: lo for v, (lo, _) in ranges.items()}, {v: hi for v, (_, hi) in ranges.items()}]
    out += [{v: rng.randint(lo, hi) for v, (lo, hi) in ranges.items()} for _ in range(count)]
    return out


@settings(max_examples=400, deadline=None)
@given(exprs, st.randoms(use_true_random=False))
def test_simplification_preserves_values(e: Expr, rng: random.Random) -> None:
    s = simplify_expr(e, BOUNDS)
    assert s.dtype is e.dtype
    _same_values(e, s, rng)


def _same_values(e: Expr, s: Expr, rng: random.Random) -> None:
    """``s`` evaluates as ``e`` at the ends of the ranges and at random points."""
    for env in _envs(rng, 25):
        try:
            want = evaluate(e, env)
        except ZeroDivisionError:
            continue
        assert evaluate(s, env) == want, f"{e!r} -> {s!r} at {env}"


@settings(max_examples=200, deadline=None)
@given(exprs, exprs, st.sampled_from(list(CmpOp)), st.randoms(use_true_random=False))
def test_comparisons_and_ranges_are_sound(a: Expr, b: Expr, op: CmpOp, rng: random.Random) -> None:
    c = Compare(op, a, b)
    s = simplify_expr(c, BOUNDS)
    r = bound_of(a, BOUNDS)
    for env in _envs(rng, 25):
        assert evaluate(s, env) == evaluate(c, env), f"{c!r} -> {s!r} at {env}"
        if r is not None:
            assert r[0] <= evaluate(a, env) <= r[1], f"bound_of({a!r}) = {r}"


@settings(max_examples=100, deadline=None)
@given(exprs)
def test_simplification_is_idempotent(e: Expr) -> None:
    once = simplify_expr(e, BOUNDS)
    assert simplify_expr(once, BOUNDS) == once


# ----------------------------------------------------------------------------- expected results

TB = {TX: (0, 127), IV: (0, 3), J: (0, 7)}


def _s(e: Expr, bounds: dict[Expr, tuple[int, int]] | None = None) -> Expr:
    return simplify_expr(e, TB if bounds is None else bounds)


@pytest.mark.parametrize("e, want", [
    (TX // 8 * 8 + TX % 8, TX),
    ((IV * 8 + J) // 8, IV),
    ((IV * 8 + J) % 8, J),
    (TX // 8 // 4, TX // 32),
    (TX // 8 % 4 + TX // 32 * 4, TX // 8),
    (TX % 64 % 8, TX % 8),
    (TX * 4 // 8, TX // 2),
    (IV * 4 + J + IV * 4, IV * 8 + J),
    ((TX * 64 + IV * 16 + J) // 16, TX * 4 + IV),
    ((TX * 64 + IV * 16 + J) % 64, IV * 16 + J),
    ((IV * 8 + J + 8) // 8, IV + 1),
    ((IV * 8 + J + 9) // 8, IV + (J + 9) // 8),
    ((IV * 8 + J - 8) // 8, IV - 1),
    ((IV * 8 + J - 1) % 8, (J + 7) % 8),
    (TX * 6 % 3, const(0)),
    (TX * 6 // 3, TX * 2),
    (J % 8, J),
    (J // 8, const(0)),
    (TX + 0, TX),
    (TX * 1, TX),
    (TX * 0, const(0)),
    (TX // 1, TX),
    (TX % 1, const(0)),
    (TX - TX, const(0)),
    (TX + 3 + 4, TX + 7),
    (TX * 2 * 3, TX * 6),
    (1 + TX, TX + 1),
    ((TX // 8 * 4 + IV) * 64 + TX % 8, TX // 8 * 256 + IV * 64 + TX % 8),
    (minimum(IV, J + 4), IV),
    (maximum(IV, 3), const(3)),
    (maximum(J, 0), J),                       # decided with equality allowed: j >= 0
    (minimum(IV, 0), const(0)),
    (minimum(const(7), J), J),
    (minimum(const(3), const(5)), const(3)),
    (maximum(TX, TX), TX),
])
def test_index_rules(e: Expr, want: Expr) -> None:
    assert _s(e) == want, f"{e!r} -> {_s(e)!r}, want {want!r}"


def test_division_rules_need_a_non_negative_rest() -> None:
    k = var("k")
    e = (IV * 8 + k) // 8  # k unbounded: i + k // 8 is exact in floor semantics, but not kept
    assert _s(e) == e
    assert _s((IV * 8 + k) % 8) == (IV * 8 + k) % 8


@pytest.mark.parametrize("e, want", [
    (TX < 128, True), (TX >= 0, True), (TX < 127, None), (TX > 127, False),
    (IV < 4, True), (IV <= 2, None), (compare(CmpOp.EQ, TX - TX, 0), True), (compare(CmpOp.NE, J, 8), True),
    (TX + 1 > TX, True), (SizeVar("m") >= 1, True),
])
def test_comparisons_decided_by_ranges(e: Expr, want: bool | None) -> None:
    out = _s(e)
    assert out == (e if want is None else const(want))


def test_logic_folding() -> None:
    b = IV < J
    assert _s(logical_and(True, b)) == b
    assert _s(logical_and(b, False)) == const(False)
    assert _s(logical_or(b, True)) == const(True)
    assert _s(logical_or(False, b)) == b
    assert _s(logical_not(True)) == const(False)
    assert _s(logical_not(logical_not(b))) == b
    assert _s(logical_not(b)) == (IV >= J)
    assert _s(select(True, TX, J)) == TX
    assert _s(select(b, TX, TX)) == TX


def test_constant_folding() -> None:
    assert simplify_expr((const(1000) + 127) // 128) == const(8)
    assert simplify_expr(const(-7) // 2) == const(-4)
    assert simplify_expr(const(-7) % 2) == const(1)
    assert simplify_expr(E.cast(var("q"), f32) * 1.0).dtype is f32
    assert simplify_expr(E.Cast(const(3), f32)) == Const(3.0, f32)
    assert simplify_expr(E.Cast(const(100), i8)) == Const(100, i8)
    assert simplify_expr(E.Cast(const(300), i8)) == E.Cast(const(300), i8)  # does not fit: left alone
    big = const(2**31 - 1) + 1
    assert simplify_expr(big) == big  # would overflow i32: left alone
    assert simplify_expr(Const(3, u32) - Const(5, u32)) == Const(3, u32) - Const(5, u32)
    assert simplify_expr(const(1.5) + const(2.25)) == Const(3.75, f32)


def test_float_rules_stay_exact() -> None:
    x = var("x", f32)
    for e in (x * 0.0, x - x, x + 0.0):
        assert simplify_expr(e) is e
    assert simplify_expr(x * 1.0) is x
    assert simplify_expr(x / 1.0) is x


def test_mixed_int_types_keep_their_type() -> None:
    a = var("a", i64)
    for e in (a + const(0), TX * Const(1, i64), (IV + Const(3, i64)) - Const(3, i64), a * 4 // 2):
        out = simplify_expr(e, TB)
        assert out.dtype is e.dtype


def test_same_object_when_nothing_changes() -> None:
    e = TX // 8 * 256 + IV * 64 + TX % 8
    assert _s(e) is e
    x = var("x", f32)
    f = x * 2.0 + 1.0
    assert simplify_expr(f) is f


def test_bound_of() -> None:
    assert bound_of(TX * 4 + IV, TB) == (0, 511)
    assert bound_of(TX % 8) == (0, 7)
    assert bound_of(TX // 8, TB) == (0, 15)
    assert bound_of(TX) is None  # only >= 0 is known
    assert bound_of(minimum(TX, 10), {TX: (0, 127)}) == (0, 10)


# ----------------------------------------------------------------------------- statements

A = var("a", tensor_type(f32, (128,)))


def _kernel(body: S.Stmt, block: int = 128, params: tuple[E.Var, ...] = (A,)) -> Function:
    launch = LaunchConfig((const(4), const(1), const(1)), (const(block), const(1), const(1)))
    return Function("k", FuncKind.GPU_KERNEL, params, body, launch=launch)


def test_one_iteration_loop_is_inlined() -> None:
    i = var("i")
    f = _kernel(S.For(i, const(3), const(4), 1, S.Store(A, (i * 2,), const(1.0))))
    out = simplify_function(f).body
    assert isinstance(out, S.Store) and out.indices == (const(6),)


def test_empty_loops_are_removed_but_parallel_single_iterations_stay() -> None:
    i = var("i")
    store = S.Store(A, (i,), const(1.0))
    empty = simplify_function(_kernel(S.For(i, const(4), const(4), 1, store))).body
    assert isinstance(empty, S.Seq) and empty.stmts == ()
    backwards = S.For(i, const(3), const(-1), -2, store)  # i = 3, 1
    out = simplify_function(_kernel(backwards)).body
    assert isinstance(out, S.For) and out.body is store
    par = S.For(i, const(0), const(1), 1, store, S.ForKind.PARALLEL)
    kept = simplify_function(_kernel(par)).body
    assert isinstance(kept, S.For) and kept.kind is S.ForKind.PARALLEL
    assert kept.body.indices == (const(0),)  # type: ignore[attr-defined]  # i in [0, 0]


def test_loop_ranges_simplify_the_body() -> None:
    i = var("i")
    body = S.If(i < 64, S.Store(A, (i % 64 + i // 64,), const(0.0)))
    out = simplify_function(_kernel(S.For(i, const(0), const(64), 1, body))).body
    assert isinstance(out, S.For)
    assert isinstance(out.body, S.Store) and out.body.indices == (i,)


def test_launch_dimensions_bound_thread_indices() -> None:
    tx, ty = threadIdx.x, threadIdx.y
    body = S.seq(
        S.If(tx < 128, S.Store(A, (tx + ty,), const(1.0))),
        S.Store(A, (blockDim.x - 1,), const(2.0)),
        S.Barrier(),
    )
    out = simplify_function(_kernel(body)).body
    assert isinstance(out, S.Seq) and len(out.stmts) == 3
    first, second, barrier = out.stmts
    assert isinstance(first, S.Store) and first.indices == (tx,)
    assert isinstance(second, S.Store) and second.indices == (const(127),)
    assert isinstance(barrier, S.Barrier)


def test_if_conditions_refine_ranges() -> None:
    i = var("i")
    then = S.Store(A, (i % 64,), const(1.0))
    else_ = S.Store(A, (i // 64,), const(2.0))
    loop = S.For(i, const(0), const(128), 1, S.If(i < 64, then, else_))
    out = simplify_function(_kernel(loop)).body
    assert isinstance(out, S.For) and isinstance(out.body, S.If)
    assert out.body.then.indices == (i,)  # type: ignore[attr-defined]
    assert out.body.else_.indices == (const(1),)  # type: ignore[union-attr]
    # the refinement ends with the branch
    after = S.For(i, const(0), const(128), 1, S.seq(S.If(i < 64, then), S.Store(A, (i % 64,), const(3.0))))
    out2 = simplify_function(_kernel(after)).body
    assert out2.body.stmts[1].indices == (i % 64,)  # type: ignore[attr-defined]


@settings(max_examples=200, deadline=None)
@given(exprs, exprs, st.sampled_from([IV, J, K, U, N]), st.sampled_from(list(CmpOp)), st.integers(-3, 10),
       st.randoms(use_true_random=False))
def test_select_branches_simplified_under_their_condition_keep_values(a: Expr, b: Expr, x: Expr, op: CmpOp, c: int,
                                                                      rng: random.Random) -> None:
    e = select(Compare(op, x, const(c)), a, b)
    _same_values(e, Simplifier(BOUNDS).visit(e), rng)


def test_a_concatenations_select_loses_its_clamps_in_a_vector_loop() -> None:
    """rotate_half fused into a reader: ``cat(-x[32:], x[:32])[j]`` as a select whose loads clamp
    their indices into each part (both are evaluated under vectorization's blends) — under the
    select's condition and the vector loop's task range, each load is contiguous in ``j``."""
    x = var("x", tensor_type(f32, (64,)))
    j = var("j")
    value = select(j < 32, E.Unary(E.UnOp.NEG, E.Load(x, (minimum(maximum(j, 0), 31) + 32,))),
                   E.Load(x, (maximum(j - 32, 0),)))
    loop = S.MappingFor((j,), spatial(64), None, MappingLoopKind.VECTORIZE, S.Store(A, (j,), value))
    out = simplify_function(_kernel(loop, params=(A, x))).body
    got = out.body.value  # type: ignore[attr-defined]
    assert got.a.a.indices == (j + 32,) and got.b.indices == (j - 32,)
    # a guard against a constant (zero padding) keeps its clamp: a GPU cp_async with zero fill
    # takes the load's address whatever the guard
    guarded = select(j < 32, E.Load(x, (minimum(j, 31),)), const(0.0))
    loop = S.MappingFor((j,), spatial(64), None, MappingLoopKind.VECTORIZE, S.Store(A, (j,), guarded))
    kept = simplify_function(_kernel(loop, params=(A, x))).body.body.value  # type: ignore[attr-defined]
    assert kept.a.indices == (minimum(j, 31),)


def test_constant_conditions_and_empty_sequences() -> None:
    s1 = S.Store(A, (const(0),), const(1.0))
    s2 = S.Store(A, (const(1),), const(2.0))
    body = S.seq(S.If(const(False), s1), S.If(const(True), s2, s1), S.If(threadIdx.x >= 128, s1),
                 S.While(const(False), s1))
    assert simplify_function(_kernel(body)).body is s2
    gone = simplify_function(_kernel(S.If(threadIdx.x < 5, S.Seq(())))).body
    assert isinstance(gone, S.Seq) and gone.stmts == ()
    flipped = simplify_function(_kernel(S.If(threadIdx.x < 5, S.Seq(()), s1))).body
    assert isinstance(flipped, S.If) and flipped.cond == (threadIdx.x >= 5) and flipped.then is s1


def test_unchanged_functions_and_modules_are_returned_as_is() -> None:
    i = var("i")
    loop = S.For(i, const(0), const(8), 1, S.Store(A, (threadIdx.x // 8 * 8 + i,), const(1.0)))
    f = _kernel(S.seq(loop, S.Barrier()))
    assert simplify_function(f) is f
    m = Module((f,), "k")
    assert simplify_module(m) is m
    g = _kernel(S.Store(A, (threadIdx.x + 0,), const(1.0)))
    m2 = Module((g,), "k")
    out = simplify_module(m2)
    assert out is not m2 and out.entry_function.body.indices == (threadIdx.x,)  # type: ignore[attr-defined]


def test_symbolic_loop_bounds() -> None:
    i, n = var("i"), SizeVar("n")
    body = S.Store(A, (i % 1 + i,), const(1.0))
    loop = S.For(i, const(0), n, 1, body)
    out = simplify_function(_kernel(loop)).body
    assert isinstance(out, S.For) and out.body.indices == (i,)  # type: ignore[attr-defined]
    assert Simplifier().range_of(n - 1) == (0, None)


def test_simplifier_instances_keep_user_bounds() -> None:
    s = Simplifier({IV: (0, 3)})
    assert s.visit(IV * 8 // 32) == const(0)
    assert s.range_of(IV * 2 + 1) == (1, 7)


def test_a_flat_position_split_by_a_size_recombines():
    """``(q // ow) * ow + q % ow`` is ``q`` for a symbolic ``ow`` too (floor semantics; ``ow`` is a
    divisor of the original): the channel kernel's plane stores index ``c[b, s, q // ow, q % ow]``,
    which flattened left a division and a modulo per element and kept gcc from vectorizing the
    store loop of a kernel with symbolic sizes (the tuner's, ``ops.conv2d``'s)."""
    q, b = var("q"), var("b")
    assert simplify_expr(b * 100 + q // N * N + q % N) == simplify_expr(b * 100 + q)
    assert simplify_expr(N * (q // N) * 2 + q % N * 2 + 1) == simplify_expr(q * 2 + 1)
    kept = simplify_expr(q // N * N + q % N * 2)             # unequal coefficients: not the identity
    assert any(isinstance(x, Binary) and x.op is BinOp.MOD for x in collect(kept, Binary))
