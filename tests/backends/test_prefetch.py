"""``prefetch(t[i], level=1, write=False, beside=False)``: a cache hint.  It changes no result, may point past the
end of its tensor (a prefetch never faults), and renders as the CPU's prefetch instructions (gcc's
``__builtin_prefetch``, for reading or writing), CUDA's ``prefetch.L1`` / ``prefetch.L2`` and nothing on HIP; the DSL's
argument errors; fusion dropping the hint on a tensor a prologue replaces and turning one on an epilogue's output into
hints on what the epilogue touches there (the output's hint keeping its write intent, the
inputs' read; a ``beside`` hint only the inputs', and nothing without an epilogue)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, built_for_hip, expect_dsl_error, run_on

import taskmap
from taskmap.compute import compute, tensor_input
from taskmap.errors import DSLError
from taskmap.fusion import fuse
from taskmap.ir import Var, const, f32, i32, tensor_type
from taskmap.ir.primitives import Prim, PrimCall, problem
from taskmap.lang import attrs, prefetch, register_tensor, threadIdx, transpile
from taskmap.lang import f32 as lf32
from taskmap.lang import i32 as li32


@taskmap.kernel
def scaled_sum(x: lf32["n"], y: lf32["n"], ahead: li32):
    """y[i] = 2 x[i] + x[n - 1 - i], prefetching ``ahead`` elements on (past the end near the
    last elements) into L1 and L2, and y's line ``ahead`` on for writing."""
    n = x.shape[0]
    for i in range(n):
        prefetch(x[i + ahead])
        prefetch(x[n - 1 - i - ahead], level=2)
        prefetch(y[i + ahead], write=True)
        y[i] = 2.0 * x[i] + x[n - 1 - i]


@given(n=st.integers(1, 3000), ahead=st.sampled_from([0, 16, 256, 4096, 1 << 20]), seed=st.integers(0, 2 ** 16))
@settings(max_examples=10, deadline=None)
def test_cpu_results_do_not_change_even_past_the_end(n, ahead, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    scaled_sum(x, y, ahead)
    np.testing.assert_array_equal(y, 2.0 * x + x[::-1])


def test_cpu_source_prefetches_into_each_level():
    source = scaled_sum.build("cpu").source
    assert "__builtin_prefetch((&x[" in source
    assert ", 0, 3)" in source and ", 0, 2)" in source      # L1 (prefetcht0) and L2 (prefetcht1)
    assert "__builtin_prefetch((&y[" in source and ", 1, 3)" in source   # for writing (prefetchw)


@taskmap.kernel
def per_thread(x: lf32["n"], y: lf32["n"]):
    """Each of 64 threads prefetches its next element (the last one past the end), then doubles its own."""
    attrs.block_dim = 64
    t = threadIdx.x
    prefetch(x[t + 1])
    prefetch(x[t + 1], level=2)
    y[t] = x[t] * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_kernel(device):
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    (_, y) = run_on(device, per_thread, x, np.zeros_like(x))
    np.testing.assert_array_equal(y, 2.0 * x)


def test_built_for_cuda_and_hip():
    built_for_cuda(per_thread, "sm_80", ["prefetch.L1", "prefetch.L2"])
    built_for_cuda(per_thread, "sm_90", ["prefetch.L1", "prefetch.L2"])
    built = built_for_hip(per_thread, "gfx90a")
    assert "prefetch" not in built.source.split("tm_kernel_per_thread", 1)[-1].split("{", 1)[1].split("}")[0]


# ----------------------------------------------------------------------------- errors



def level_three(a: lf32[64]):
    prefetch(a[0], level=3)


def level_not_constant(a: lf32[64], k: li32):
    prefetch(a[0], k)


def not_a_reference(a: lf32[64]):
    prefetch(1.0)


def write_not_a_bool(a: lf32[64]):
    prefetch(a[0], write=2)


def a_register(a: lf32[64]):
    r = register_tensor(lf32, [4])
    prefetch(r[0])


def test_dsl_errors():
    expect_dsl_error(level_three, "the cache level of prefetch() must be a compile-time 1 or 2, got 3")
    expect_dsl_error(level_not_constant, "the cache level of prefetch() must be a compile-time 1 or 2")
    expect_dsl_error(write_not_a_bool, "prefetch()'s write must be a compile-time 0 or 1, got 2")
    expect_dsl_error(not_a_reference, "argument 1 of prefetch() must be a tensor element such as t[i, j]")


def test_register_tensors_have_nothing_to_fetch():
    with pytest.raises(DSLError) as info:
        transpile(a_register)
    assert "prefetch() needs an element of a global or shared tensor; 'r' is a register tensor" in info.value.msg
    assert info.value.lineno == a_register.__code__.co_firstlineno + 2


def test_ir_checks():
    a = Var("a", tensor_type(f32, (64,)))
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(1), const(0), const(0)))) is None
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(2), const(1), const(1)))) is None
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(3), const(0), const(0))))[0] == 1
    assert problem(PrimCall(Prim.PREFETCH, (a[0], Var("k", i32), const(0), const(0))))[0] == 1
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(1), const(2), const(0))))[0] == 2
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(1), const(0), const(2))))[0] == 3
    assert problem(PrimCall(Prim.PREFETCH, (a[0], const(1), const(0))))[0] is None


# ----------------------------------------------------------------------------- fusion


@taskmap.kernel
def copier(a: lf32[64], c: lf32[64]):
    for i in range(64):
        prefetch(a[i + 8])
        c[i] = a[i]


def test_fusion_drops_the_hint_on_a_fused_input():
    """A prologue on the prefetched input: the fused kernel computes it per element and no longer
    reads ``a``; its prefetch goes with it."""
    x = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    a0 = tensor_input("a0", "float32", [64])
    k = fuse(copier, prologues={"a": compute("a", [64], lambda i: a0[i] * 3.0)})
    c = np.zeros(64, np.float32)
    k(x, c)
    np.testing.assert_array_equal(c, x * 3.0)
    assert "__builtin_prefetch" not in k.build("cpu").source


@taskmap.kernel
def filler(a: lf32[8, 64], c: lf32[8, 64]):
    """c = 2 a, each row's first line of c prefetched before the row is computed."""
    for r in range(8):
        prefetch(c[r, 0], write=True)
        for s in range(64):
            c[r, s] = a[r, s] * 2.0


def test_fusion_prefetches_what_an_epilogue_touches():
    """An epilogue on the prefetched output (a transpose into ``out``, plus a residual the size of
    the output and a bias per row): the hint becomes one on ``out`` at the element the store
    writes, one on the residual there, none on the small bias; results unchanged."""
    rng = np.random.default_rng(6)
    x, res, bias = (rng.standard_normal(s).astype(np.float32) for s in ((8, 64), (64, 8), (8,)))
    c = tensor_input("c", "float32", [8, 64])
    r_in, b_in = tensor_input("res", "float32", [64, 8]), tensor_input("bias", "float32", [8])
    out = compute("out", [64, 8], lambda i, j: c[j, i] + r_in[i, j] + b_in[j])
    k = fuse(filler, epilogues={"c": out})
    source = k.build("cpu").source
    body = source.split("tm_kernel_filler", 1)[-1] if "tm_kernel_filler" in source else source
    hints = [line.strip() for line in body.splitlines() if "__builtin_prefetch" in line]
    assert len(hints) == 2, hints
    assert [h for h in hints if "&out[" in h][0].endswith(", 1, 3);")      # written: for writing
    assert [h for h in hints if "&res[" in h][0].endswith(", 0, 3);")      # read
    y = np.full((64, 8), np.nan, np.float32)
    k(x, res, bias, y)
    np.testing.assert_allclose(y, 2.0 * x.T + res + bias, rtol=1e-6)


@taskmap.kernel
def streamer(a: lf32[8, 64], c: lf32[8, 64]):
    """c = 2 a; before each row, a hint for what an epilogue reads beside the row's first element
    (a kernel whose stores to c would bypass the caches)."""
    for r in range(8):
        prefetch(c[r, 0], write=True, beside=True)
        for s in range(64):
            c[r, s] = a[r, s] * 2.0


def test_a_beside_hint_fetches_only_what_an_epilogue_reads():
    """``beside=True``: alone, no prefetch at all; with an epilogue (a residual the size of the
    output, a bias per row) one read hint on the residual where the store writes, none on the
    output or the bias; results unchanged."""
    rng = np.random.default_rng(7)
    x, res, bias = (rng.standard_normal(s).astype(np.float32) for s in ((8, 64), (8, 64), (8,)))
    assert "__builtin_prefetch" not in streamer.build("cpu").source
    c = tensor_input("c", "float32", [8, 64])
    r_in, b_in = tensor_input("res", "float32", [8, 64]), tensor_input("bias", "float32", [8])
    out = compute("out", [8, 64], lambda i, j: c[i, j] + r_in[i, j] + b_in[i])
    k = fuse(streamer, epilogues={"c": out})
    source = k.build("cpu").source
    hints = [line.strip() for line in source.splitlines() if "__builtin_prefetch" in line]
    assert len(hints) == 1 and "&res[" in hints[0] and hints[0].endswith(", 0, 3);"), hints
    y = np.full((8, 64), np.nan, np.float32)
    k(x, res, bias, y)
    np.testing.assert_allclose(y, 2.0 * x + res + bias[:, None], rtol=1e-6)
