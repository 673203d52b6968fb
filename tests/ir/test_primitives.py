"""GPU primitives in the IR: the PrimCall node (element references are Load children), printing,
rewriting, lowering (references flattened like loads), the verifier's rules, and a simplifier
that never drops or merges a primitive."""
import pytest

from taskmap.errors import IRError
from taskmap.ir import (Evaluate, FuncKind, Function, LaunchConfig, Load, Module, Special, SpecialReg, Var, collect,
                        const, f16, f32, i32, tensor_type, u32)
from taskmap.ir import stmt as S
from taskmap.ir.functor import IRRewriter, written_tensors
from taskmap.ir.primitives import Prim, PrimCall, PrimKind, problem, ref_args
from taskmap.ir.simplify import simplify_expr
from taskmap.ir.types import MemScope
from taskmap.ir.verify import verify
from taskmap.passes import lower

LANE = Special(SpecialReg.LANE_ID, 0)
TID = Special(SpecialReg.THREAD_IDX, 0)


def gpu_module(body, params, kind=FuncKind.GPU_KERNEL):
    launch = LaunchConfig(block_dim=(const(64), const(1), const(1))) if kind is FuncKind.GPU_KERNEL else None
    return Module((Function("k", kind, tuple(params), body, launch=launch),), "k")


def tensors():
    g = Var("g", tensor_type(f32, (8, 16)))
    h = Var("h", tensor_type(i32, (16,)))
    s = Var("s", tensor_type(f32, (8, 16), MemScope.SHARED))
    r = Var("r", tensor_type(f32, (4,), MemScope.REGISTER))
    return g, h, s, r


def test_primitives_are_one_node_class_with_an_operator_enum():
    g, h, s, r = tensors()
    shfl = PrimCall(Prim.SHFL_DOWN, (const(0xFFFFFFFF, u32), g[0, 1], const(4)), f32)
    assert shfl.dtype is f32 and shfl.op.spec.kind is PrimKind.WARP and shfl.op.spec.refs == ()
    add = PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32)
    assert ref_args(add) == (h[TID],) and add.op.spec.writes == (0,)
    cp = PrimCall(Prim.CP_ASYNC, (s[0, 4], g[1, 4], const(16), const(16)))
    with pytest.raises(TypeError, match="cp_async.. has no value"):
        cp.dtype
    assert PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32) == add  # structural, like other nodes
    assert {p.spec.name for p in Prim} >= {"shfl_sync", "ballot_sync", "atomic_cas", "copy16", "cp_async",
                                            "mma_sync_m16n8k16", "ldmatrix"}


def test_printer_marks_element_references():
    g, h, s, r = tensors()
    assert repr(PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32)) == "atomic_add(&h[threadIdx.x], 1)"
    body = Evaluate(PrimCall(Prim.CP_ASYNC, (s[0, 4], g[1, 4], const(16), const(8))))
    assert repr(body) == "cp_async(&s[0, 4], &g[1, 4], 16, 8)"
    assert repr(LANE + 1) == "lane_id() + 1"


def test_rewriters_rebuild_primitives_only_when_a_child_changes():
    g, h, s, r = tensors()
    call = PrimCall(Prim.ATOMIC_MAX, (h[TID], const(1)), i32)
    assert IRRewriter().visit(call) is call

    class Bump(IRRewriter):
        def visit_Const(self, c):
            return const(c.value + 1) if c.dtype is i32 else c

    new = Bump().visit(call)
    assert new is not call and new.op is Prim.ATOMIC_MAX and new.args[1] == const(2) and new.type is i32


def test_lowering_flattens_references_like_loads():
    g, h, s, r = tensors()
    i = Var("i", i32)
    body = S.For(i, const(0), const(2), 1, S.seq(
        S.DeclTensor(s),
        Evaluate(PrimCall(Prim.CP_ASYNC, (s[i, 4], g[i + 1, 4], const(16), const(16)))),
        Evaluate(PrimCall(Prim.CP_ASYNC_COMMIT, ())),
        Evaluate(PrimCall(Prim.CP_ASYNC_WAIT, (const(0),))),
    ))
    lowered = lower(gpu_module(body, [g]))
    (cp,) = [c for c in collect(lowered.entry_function.body, PrimCall) if c.op is Prim.CP_ASYNC]
    assert all(len(ref.indices) == 1 for ref in ref_args(cp))
    assert repr(cp.args[1].indices[0]) in ("i * 16 + 20", "(i + 1) * 16 + 4")
    assert written_tensors(lowered.entry_function.body) == [s]


def test_written_tensors_include_atomic_targets_and_copy_destinations():
    g, h, s, r = tensors()
    body = S.seq(Evaluate(PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32)),
                 Evaluate(PrimCall(Prim.COPY16, (g[0, 0], g[1, 0]))), S.Store(g, (const(0), const(0)), const(1.0)))
    assert written_tensors(body) == [h, g, g]


def test_simplifier_never_drops_or_merges_primitives():
    g, h, s, r = tensors()
    old = PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32)
    diff = old - old                                  # two atomics: 1 apart, not 0
    assert simplify_expr(diff) == diff
    assert simplify_expr(old * 0) == old * 0
    assert simplify_expr(PrimCall(Prim.ATOMIC_ADD, (h[TID + 0], const(1) + 1), i32)).args[1] == const(2)
    assert simplify_expr(LANE // 64) == const(0)      # lane ids are below 64 on every target
    assert simplify_expr(LANE % 64) == LANE


# ----------------------------------------------------------------------------- verifier rules


def test_verifier_accepts_well_formed_primitives():
    g, h, s, r = tensors()
    body = S.seq(S.DeclTensor(s), S.DeclTensor(r),
                 Evaluate(PrimCall(Prim.ATOMIC_ADD, (h[TID], const(1)), i32)),
                 Evaluate(PrimCall(Prim.COPY16, (r[0], s[0, 4]))),
                 Evaluate(PrimCall(Prim.SYNCWARP, (const(0xFFFFFFFF, u32),))))
    verify(gpu_module(body, [g, h]))


@pytest.mark.parametrize("case, message", [
    ("warp_in_cpu", r"shfl_sync\(\) in a cpu_kernel function"),
    ("cp_async_in_cpu", r"cp_async_commit\(\) in a cpu_kernel function"),
    ("value_of_void", r"the value of syncwarp\(\), which has none, is used"),
    ("ref_not_load", r"argument 1 of atomic_add\(\) must be a tensor element"),
    ("register_atomic", r"atomic_add\(\) needs an element of a global or shared tensor; 'r' is a register"),
    ("f16_atomic", r"atomic_max\(\) on f16 elements is not supported"),
    ("cp_size", r"cp_async\(\) copies 4, 8 or 16 bytes, got 12"),
    ("cp_dst", r"the destination of cp_async\(\) must be a shared tensor element, 'g' is global"),
    ("mma_types", r"the accumulator of mma_sync_m16n8k16\(\) must be f32"),
    ("bad_ref_index", r"tensor 'h' has 1 dimension\(s\) but is indexed with 2 indices"),
    ("undefined_ref", r"variable 'q' is used but not defined"),
])
def test_verifier_rejects(case, message):
    g, h, s, r = tensors()
    hf = Var("hf", tensor_type(f16, (16,)))
    q = Var("q", tensor_type(i32, (4,)))
    rh = Var("rh", tensor_type(f16, (8,), MemScope.REGISTER))
    mask = const(0xFFFFFFFF, u32)
    kind = FuncKind.GPU_KERNEL
    body = {
        "warp_in_cpu": Evaluate(PrimCall(Prim.SHFL_IDX, (mask, const(1.0), const(0)), f32)),
        "cp_async_in_cpu": Evaluate(PrimCall(Prim.CP_ASYNC_COMMIT, ())),
        "value_of_void": S.Store(h, (const(0),), PrimCall(Prim.SYNCWARP, (mask,))),
        "ref_not_load": Evaluate(PrimCall(Prim.ATOMIC_ADD, (const(0), const(1)), i32)),
        "register_atomic": S.seq(S.DeclTensor(r), Evaluate(PrimCall(Prim.ATOMIC_ADD, (r[0], const(1.0)), f32))),
        "f16_atomic": Evaluate(PrimCall(Prim.ATOMIC_MAX, (hf[0], const(1.0, f16)), f16)),
        "cp_size": S.seq(S.DeclTensor(s), Evaluate(PrimCall(Prim.CP_ASYNC, (s[0, 0], g[0, 0], const(12), const(12))))),
        "cp_dst": Evaluate(PrimCall(Prim.CP_ASYNC, (g[0, 0], g[0, 4], const(16), const(16)))),
        "mma_types": S.seq(S.DeclTensor(rh), Evaluate(PrimCall(Prim.MMA_M16N8K16, (rh[0], rh[0], rh[0])))),
        "bad_ref_index": Evaluate(PrimCall(Prim.ATOMIC_ADD, (Load(h, (const(0), const(1))), const(1)), i32)),
        "undefined_ref": Evaluate(PrimCall(Prim.ATOMIC_ADD, (q[0], const(1)), i32)),
    }[case]
    if case.endswith("_in_cpu"):
        kind = FuncKind.CPU_KERNEL
    with pytest.raises(IRError, match=message):
        verify(gpu_module(body, [g, h, hf], kind))


def test_problem_points_at_the_faulty_argument():
    g, h, s, r = tensors()
    assert problem(PrimCall(Prim.ATOMIC_ADD, (h[0], const(1)), i32)) is None
    at, msg = problem(PrimCall(Prim.ATOMIC_ADD, (h[0], const(1.0)), i32))
    assert at == 1 and "must have the element type i32" in msg
    at, _ = problem(PrimCall(Prim.CP_ASYNC_WAIT, (Var("n", i32),)))
    assert at == 0
