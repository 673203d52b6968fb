"""The IR verifier (taskmap.ir.verify): one test per error, and well-formed IR that passes."""

from __future__ import annotations

import re

import pytest

from taskmap.errors import IRError
from taskmap.ir import expr as E
from taskmap.ir import stmt as S
from taskmap.ir.dtypes import f32, i32
from taskmap.ir.expr import CallFunc, Load, SizeVar, blockIdx, const, threadIdx, var
from taskmap.ir.func import FuncKind, Function, LaunchConfig, Module
from taskmap.ir.mapping import MappingLoopKind, repeat, spatial
from taskmap.ir.types import MemScope, tensor_type
from taskmap.ir.verify import verify

N = SizeVar("n")
A = var("a", tensor_type(f32, (64, 64)))
B = var("b", tensor_type(f32, (N,)))
SEQ = MappingLoopKind.SEQUENTIAL
LAUNCH = LaunchConfig((const(4), const(1), const(1)), (const(128), const(1), const(1)))


def kernel(body: S.Stmt, *, params: tuple[E.Var, ...] = (A, B), kind: FuncKind = FuncKind.GPU_KERNEL,
           name: str = "k", ret: E.ScalarType | None = None) -> Function:
    launch = LAUNCH if kind is FuncKind.GPU_KERNEL else None
    return Function(name, kind, params, body, ret=ret, launch=launch, size_vars=(N,))


def module(*funcs: Function) -> Module:
    return Module(funcs, funcs[0].name)


def check(body: S.Stmt, **kw: object) -> None:
    verify(module(kernel(body, **kw)))  # type: ignore[arg-type]


def fails(body: S.Stmt, *needles: str, lowered: bool = False, **kw: object) -> str:
    with pytest.raises(IRError) as info:
        verify(module(kernel(body, **kw)), lowered=lowered)  # type: ignore[arg-type]
    text = str(info.value)
    assert text.startswith("in function 'k': ")
    for needle in needles:
        assert needle in text, text
    return text


# ----------------------------------------------------------------------------- well-formed IR


def test_a_correct_module_passes() -> None:
    i, j, k, acc = var("i"), var("j"), var("k"), var("acc", f32)
    tile = var("tile", tensor_type(f32, (16, 16), MemScope.SHARED))
    x = var("x", f32)
    helper = Function("twice", FuncKind.DEVICE, (x,), S.Return(x * 2.0), ret=f32)
    tx = threadIdx.x
    body = S.seq(
        S.DeclTensor(tile),
        S.MappingFor((i, j), spatial(8, 16), tx, SEQ, S.Store(tile, (i, j), Load(A, (i, j)))),
        S.Barrier(),
        S.DeclScalar(acc, const(0.0)),
        S.For(k, const(0), N, 1, S.seq(
            S.Assign(acc, acc + CallFunc("twice", (Load(B, (k,)),), f32)),
            S.If(k > 10, S.Break()),
        )),
        S.If(tx < 64, S.Store(A, (tx, blockIdx.x), acc), S.Store(B, (tx,), acc)),
    )
    verify(Module((kernel(body), helper), "k"))


def test_lowered_ir_passes_with_flat_indices() -> None:
    i = var("i")
    body = S.For(i, const(0), const(64), 1, S.Store(A, (i * 64 + threadIdx.x % 64,), Load(B, (i,))))
    verify(module(kernel(body)), lowered=True)


def test_scalar_params_are_assignable() -> None:
    p = var("p")
    check(S.Assign(p, p + 1), params=(A, p))


# ----------------------------------------------------------------------------- each error


def test_undefined_variable() -> None:
    y = var("y")
    text = fails(S.Store(B, (y,), const(1.0)), "variable 'y' is used but not defined")
    assert "    b[y] = 1.0" in text  # the printed statement


def test_variables_are_scoped_to_their_block() -> None:
    t, i = var("t"), var("i")
    body = S.seq(S.If(threadIdx.x < 5, S.DeclScalar(t, const(1))), S.Store(B, (t,), const(1.0)))
    fails(body, "variable 't' is used but not defined")
    loop = S.seq(S.For(i, const(0), const(4), 1, S.Store(B, (i,), const(1.0))), S.Store(B, (i,), const(2.0)))
    fails(loop, "variable 'i' is used but not defined")
    fails(S.For(i, const(0), i + 1, 1, S.Seq(())), "variable 'i' is used but not defined")


def test_variable_declared_twice() -> None:
    t, i = var("t"), var("i")
    fails(S.seq(S.DeclScalar(t), S.DeclScalar(t)), "variable 't' is declared twice")
    fails(S.seq(S.For(i, const(0), const(2), 1, S.Seq(())), S.For(i, const(0), const(2), 1, S.Seq(()))),
          "variable 'i' is declared twice")
    fails(S.DeclScalar(t), "variable 'a' is declared twice", params=(A, A))


def test_index_count() -> None:
    fails(S.Store(A, (const(0),), const(1.0)), "tensor 'a' has 2 dimension(s) but is indexed with 1 index")
    fails(S.Evaluate(Load(B, (const(0), const(1)))), "tensor 'b' has 1 dimension(s) but is indexed with 2 indices")


def test_lowered_ir_needs_flat_indices() -> None:
    fails(S.Store(A, (const(0), const(1)), const(1.0)), "indexed with 2 indices in lowered IR", lowered=True)
    fails(S.Evaluate(Load(A, (const(0), const(1)))), "expected one flat index", lowered=True)


def test_only_tensors_are_indexed_or_passed_as_tensors() -> None:
    s = var("s")
    fails(S.seq(S.DeclScalar(s, const(0)), S.Evaluate(Load(s, (const(0),)))), "is indexed but is not a tensor")
    fails(S.Store(s, (const(0),), const(1.0)), "is indexed but is not a tensor", params=(A, B, s))
    fails(S.Evaluate(E.Binary(E.BinOp.ADD, B, const(1))), "tensor 'b' is used as a scalar value")


def test_assignments() -> None:
    i, t = var("i"), var("t")
    fails(S.For(i, const(0), const(4), 1, S.Assign(i, i + 1)), "assignment to variable 'i'", "read-only")
    fails(S.Assign(t, const(1)), "assignment to variable 't', which is not defined here")
    fails(S.Assign(A, const(1.0)), "assignment to a, which is not a scalar variable")


def test_gpu_only_constructs_in_cpu_functions() -> None:
    smem = var("smem", tensor_type(f32, (32,), MemScope.SHARED))
    cpu = FuncKind.CPU_KERNEL
    fails(S.Store(B, (threadIdx.x,), const(1.0)), "threadIdx.x used in a cpu_kernel function", kind=cpu)
    fails(S.Barrier(), "barrier in a cpu_kernel function", kind=cpu)
    fails(S.DeclTensor(smem), "shared-memory tensor 'smem' in a host function", kind=FuncKind.HOST)
    check(S.seq(S.DeclTensor(smem), S.Barrier()), kind=FuncKind.DEVICE)


def test_mapping_for_in_lowered_ir() -> None:
    i = var("i")
    loop = S.MappingFor((i,), repeat(4), threadIdx.x, SEQ, S.Store(B, (i,), const(1.0)))
    check(loop)
    fails(loop, "MappingFor left in lowered IR", lowered=True)
    bad = S.MappingFor((i,), spatial(4, 4), threadIdx.x, SEQ, S.Seq(()))
    fails(bad, "1 loop variable(s) for the 2-D tasks of spatial(4, 4)")


def test_for_step_zero() -> None:
    i = var("i")
    fails(S.For(i, const(0), const(4), 0, S.Seq(())), "for loop with step 0", "for i in range(0, 4, 0):")


def test_conditions_need_a_scalar_type() -> None:
    void = Function("f", FuncKind.DEVICE, (), S.Seq(()))
    body = S.If(CallFunc("f", (), None), S.Seq(()))
    with pytest.raises(IRError, match="returns nothing, is used"):
        verify(Module((kernel(body), void), "k"))


def test_calls() -> None:
    x = var("x", f32)
    helper = Function("h", FuncKind.DEVICE, (x,), S.Return(x), ret=f32)
    for call, needle in [
        (CallFunc("nope", (), f32), "call of 'nope', which is not a function of the module"),
        (CallFunc("h", (const(1.0), const(2.0)), f32), "call of 'h' with 2 argument(s); it takes 1"),
        (CallFunc("h", (const(1.0),), i32), "expects a result of type i32, the function returns f32"),
    ]:
        with pytest.raises(IRError, match=re.escape(needle)):
            verify(Module((kernel(S.Store(B, (const(0),), call)), helper), "k"))
    ok = S.seq(S.Evaluate(CallFunc("h", (const(1.0),), None)), S.Store(B, (const(0),), CallFunc("h", (x,), f32)))
    with pytest.raises(IRError, match="variable 'x' is used but not defined"):
        verify(Module((kernel(ok), helper), "k"))


def test_returns() -> None:
    fails(S.Return(const(1)), "return with a value in a function that returns nothing")
    fails(S.Return(), "return without a value in a function returning i32", ret=i32, kind=FuncKind.DEVICE)
    check(S.Return(const(1)), ret=i32, kind=FuncKind.DEVICE)


def test_break_and_continue_outside_loops() -> None:
    fails(S.Break(), "break outside a loop")
    fails(S.If(threadIdx.x < 3, S.Continue()), "continue outside a loop")
    fails(S.seq(S.While(const(True), S.Break()), S.Break()), "break outside a loop")


def test_long_statements_are_shortened_in_messages() -> None:
    i = var("i")
    body = S.For(i, const(0), const(4), 0, S.seq(*(S.Store(B, (i,), const(float(k))) for k in range(20))))
    text = fails(body, "step 0")
    assert text.count("\n") <= 10 and text.rstrip().endswith("...")
