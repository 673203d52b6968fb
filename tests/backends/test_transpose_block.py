"""``transpose_block(dst[..], src[..], n, ld_dst, ld_src)``: an n x n f32 block transposed between
two strided views (for a, b < n: ``dst[b * ld_dst + a] = src[a * ld_src + b]``, flat offsets
from the references).  In CPU kernels (in-register AVX-512 / AVX transposes for n = 16 / 8,
written with gcc's vector extensions; the scalar loop otherwise — each compiled here on its own
with AVX-512, AVX2 and neither), in GPU kernels run with GPU semantics, built for CUDA and HIP; the DSL's argument errors; fusion
expanding it into element copies when a definition is spliced into its operands."""
from __future__ import annotations

import ctypes
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import c_harness, needs_gcc, DEVICES, built_for_cuda, built_for_hip, expect_dsl_error, run_on

import taskmap
from taskmap.compute import compute, tensor_input
from taskmap.fusion import fuse
from taskmap.ir import Var, const, f16, f32, i32, tensor_type
from taskmap.ir.primitives import Prim, PrimCall, problem
from taskmap.lang import attrs, register_tensor, threadIdx, transpose_block
from taskmap.lang import f16 as lf16
from taskmap.lang import f32 as lf32
from taskmap.lang import i32 as li32

FEW = settings(max_examples=12, deadline=None)


def reference(dst, src, n, od, os_, ldd, lds):
    out = dst.copy().reshape(-1)
    flat = src.reshape(-1)
    for a in range(n):
        for b in range(n):
            out[od + b * ldd + a] = flat[os_ + a * lds + b]
    return out.reshape(dst.shape)


# ----------------------------------------------------------------------------- CPU kernels


@taskmap.kernel
def strided(dst: lf32["m"], src: lf32["k"], od: li32, os_: li32, ldd: li32, lds: li32):
    """Blocks of 16, 8 and 4 (the scalar loop) one after another, at run-time offsets and strides."""
    transpose_block(dst[od], src[os_], 16, ldd, lds)
    transpose_block(dst[od + 16 * ldd], src[os_ + 16 * lds], 8, ldd, lds)
    transpose_block(dst[od + 24 * ldd], src[os_ + 24 * lds], 4, ldd, lds)


@given(od=st.integers(0, 40), os_=st.integers(0, 40), ldd=st.integers(16, 41), lds=st.integers(16, 37),
       seed=st.integers(0, 2 ** 16))
@FEW
def test_cpu_blocks_at_any_offset_and_stride(od, os_, ldd, lds, seed):
    rng = np.random.default_rng(seed)
    src = rng.standard_normal(os_ + 28 * lds + 16).astype(np.float32)
    dst = rng.standard_normal(od + 28 * ldd + 16).astype(np.float32)
    out = dst.copy()
    strided(out, src, od, os_, ldd, lds)
    ref = reference(dst, src, 16, od, os_, ldd, lds)
    ref = reference(ref, src, 8, od + 16 * ldd, os_ + 16 * lds, ldd, lds)
    ref = reference(ref, src, 4, od + 24 * ldd, os_ + 24 * lds, ldd, lds)
    assert np.array_equal(out, ref)


@taskmap.kernel
def tiles(x: lf32[40, 24], y: lf32[24, 40]):
    """y = x.T in blocks of 16 and 8: 2-D element references, non-square strides (24 and 40),
    a register tile in between."""
    t = register_tensor(lf32, [16, 16])
    transpose_block(y[0, 0], x[0, 0], 16, 40, 24)
    for j in range(0, 16, 8):
        transpose_block(t[j, 0], x[16, j], 8, 16, 24)
        transpose_block(t[j, 8], x[24, j], 8, 16, 24)
    for j in range(16):
        for i in range(16):
            y[j, 16 + i] = t[j, i]
    transpose_block(y[0, 32], x[32, 0], 8, 40, 24)
    transpose_block(y[8, 32], x[32, 8], 8, 40, 24)
    for i in range(0, 40, 8):
        transpose_block(y[16, i], x[i, 16], 8, 40, 24)


def test_cpu_two_dimensional_references_and_register_tiles():
    x = np.random.default_rng(1).standard_normal((40, 24)).astype(np.float32)
    y = np.full((24, 40), np.nan, np.float32)
    tiles(x, y)
    assert np.array_equal(y, x.T)
    source = tiles.build("cpu").source
    assert "tm_transpose_block_f32(" in source and "tm_transpose16_f32" in source


HARNESS = r"""
void run(float *dst, const float *src, int n, long ldd, long lds) {
  switch (n) {
    case 16: tm_transpose_block_f32(dst, src, 16, ldd, lds); break;
    case 8: tm_transpose_block_f32(dst, src, 8, ldd, lds); break;
    default: tm_transpose_block_f32(dst, src, 4, ldd, lds); break;
  }
}
"""


@needs_gcc
@pytest.mark.parametrize("flags", [["-march=native"], ["-march=x86-64-v3"], ["-march=x86-64"]],
                         ids=["native", "avx2", "sse2"])
def test_c_helper_with_and_without_vector_extensions(tmp_path: pathlib.Path, flags):
    """The C helper as AVX-512, AVX (8 x 8) and scalar code: the same results."""
    lib = c_harness(tmp_path, HARNESS, flags)
    ptr = ctypes.POINTER(ctypes.c_float)
    lib.run.argtypes = [ptr, ptr, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    rng = np.random.default_rng(7)
    for n, ldd, lds in ((16, 19, 33), (8, 8, 21), (4, 5, 4), (16, 16, 16)):
        src = rng.standard_normal(3 + n * lds).astype(np.float32)
        dst = rng.standard_normal(2 + n * ldd).astype(np.float32)
        out = dst.copy()
        lib.run(out[2:].ctypes.data_as(ptr), src[3:].ctypes.data_as(ptr), n, ldd, lds)
        assert np.array_equal(out, reference(dst, src, n, 2, 3, ldd, lds)), (flags, n)


# ----------------------------------------------------------------------------- GPU kernels


@taskmap.kernel
def per_thread(x: lf32["n"], y: lf32["n"]):
    """Each thread transposes its own 8 x 8 block of a row of blocks (64 floats apart)."""
    attrs.block_dim = 4
    t = threadIdx.x
    transpose_block(y[t * 8], x[t * 8], 8, 32, 32)


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_kernel_per_thread_blocks(device):
    x = np.random.default_rng(2).standard_normal(8 * 32).astype(np.float32)
    (_, y) = run_on(device, per_thread, x, np.zeros_like(x))
    assert np.array_equal(y.reshape(8, 4, 8), x.reshape(8, 4, 8).transpose(2, 1, 0))


def test_built_for_cuda_and_hip():
    built_for_cuda(per_thread, "sm_80")
    built = built_for_hip(per_thread, "gfx90a", ["tm_transpose_block_f32("])
    assert "tm_transpose_block_f32(" in per_thread.build("cuda", arch="sm_80").source and built


# ----------------------------------------------------------------------------- errors



def n_not_constant(a: lf32[64], b: lf32[64], n: li32):
    transpose_block(a[0], b[0], n, 8, 8)


def n_not_allowed(a: lf32[64], b: lf32[64]):
    transpose_block(a[0], b[0], 3, 8, 8)


def not_f32(a: lf16[64], b: lf16[64]):
    transpose_block(a[0], b[0], 8, 8, 8)


def not_a_reference(a: lf32[64], b: lf32[64]):
    transpose_block(1.0, b[0], 8, 8, 8)


def float_stride(a: lf32[64], b: lf32[64]):
    transpose_block(a[0], b[0], 8, 8.5, 8)


def past_the_end(a: lf32[64], b: lf32[64]):
    transpose_block(a[8], b[0], 8, 8, 8)


def test_dsl_errors():
    expect_dsl_error(n_not_constant, "the block size n of transpose_block() must be a compile-time")
    expect_dsl_error(n_not_allowed, "the block size n of transpose_block() must be a compile-time 1 or 2 or 4 or 8 "
                                    "or 16 or 32, got 3")
    expect_dsl_error(not_f32, "transpose_block() moves f32 elements, got f16 ('a')")
    expect_dsl_error(not_a_reference, "argument 1 of transpose_block() must be a tensor element such as t[i, j]")
    expect_dsl_error(float_stride, "ld_dst of transpose_block() must be an integer")
    expect_dsl_error(past_the_end, "transpose_block() accesses 64 elements from element 8 of 'a', which has 64")


def test_ir_checks():
    a, h = Var("a", tensor_type(f32, (64,))), Var("h", tensor_type(f16, (64,)))
    ok = PrimCall(Prim.TRANSPOSE, (a[0], a[32], const(4), const(8), const(8)))
    assert problem(ok) is None
    assert problem(PrimCall(Prim.TRANSPOSE, (a[0], h[0], const(4), const(8), const(8))))[0] == 1
    assert problem(PrimCall(Prim.TRANSPOSE, (a[0], a[32], const(5), const(8), const(8))))[0] == 2
    assert "compile-time" in problem(PrimCall(Prim.TRANSPOSE, (a[0], a[32], Var("n", i32), const(8), const(8))))[1]
    assert problem(PrimCall(Prim.TRANSPOSE, (a[0], a[32], const(4), const(8.0, f32), const(8))))[0] == 3


# ----------------------------------------------------------------------------- fusion


@taskmap.kernel
def transposer(a: lf32[16, 16], c: lf32[16, 16]):
    transpose_block(c[0, 0], a[0, 0], 16, 16, 16)


@taskmap.kernel
def transposer_at(a: lf32[3, 20, 24], c: lf32[2, 17, 16]):
    transpose_block(c[1, 1, 0], a[2, 3, 5], 16, 16, 24)


RNG = np.random.default_rng(11)


def test_fusion_expands_it_into_element_copies():
    """A prologue into the source or an epilogue on the destination of ``transpose_block``: the
    block becomes a loop of element copies (offsets flat from the references, row-major), so the
    definition applies to each element; the result equals numpy's."""
    x = RNG.standard_normal((16, 16)).astype(np.float32)
    a0 = tensor_input("a0", "float32", [16, 16])
    k = fuse(transposer, prologues={"a": compute("a", [16, 16], lambda i, j: a0[i, j] * 2.0)})
    c = np.zeros((16, 16), np.float32)
    k(x, c)
    np.testing.assert_array_equal(c, (x * 2.0).T)
    cin = tensor_input("c", "float32", [16, 16])
    k = fuse(transposer, epilogues={"c": compute("y", [16, 16], lambda i, j: cin[i, j] + 1.0)})
    y = np.zeros((16, 16), np.float32)
    k(x, y)
    np.testing.assert_array_equal(y, x.T + 1.0)
    # references inside 3-D tensors: offsets carry across rows and planes
    xa = RNG.standard_normal((3, 20, 24)).astype(np.float32)
    a3 = tensor_input("a3", "float32", [3, 20, 24])
    k = fuse(transposer_at, prologues={"a": compute("a", [3, 20, 24], lambda p, i, j: a3[p, i, j] - 1.0)})
    out = np.zeros((2, 17, 16), np.float32)
    k(xa, out)
    src = (xa - 1.0).reshape(-1)[(2 * 20 + 3) * 24 + 5:]
    want = np.zeros(2 * 17 * 16, np.float32)
    base = (1 * 17 + 1) * 16
    for ai in range(16):
        for bi in range(16):
            want[base + bi * 16 + ai] = src[ai * 24 + bi]
    np.testing.assert_array_equal(out.reshape(-1), want)
