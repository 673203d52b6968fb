"""``dot2_bf16(c[..], a[..], b[..], n)``: for l < n, ``c[l] += a[0] * b[2l] + a[1] * b[2l + 1]`` — a
pair of bf16 along K times n interleaved pairs, summed into f32 (odd products first, as AVX-512
BF16's ``vdpbf16ps``).  In CPU kernels (``vdpbf16ps`` for n = 16 where the CPU has it, else the
loop — the C helper compiled here with and without AVX-512 BF16), in GPU kernels run with GPU
semantics, built for CUDA and HIP; the DSL's argument errors."""
from __future__ import annotations

import ctypes
import pathlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import c_harness, needs_gcc, built_for_cuda, built_for_hip, expect_dsl_error

import taskmap
from taskmap.ir import Var, const, f32, tensor_type
from taskmap.ir.dtypes import bf16
from taskmap.ir.primitives import Prim, PrimCall, problem
from taskmap.lang import attrs, dot2_bf16, register_tensor, threadIdx
from taskmap.lang import bf16 as lbf16
from taskmap.lang import f32 as lf32
from taskmap.lang import i32 as li32

FEW = settings(max_examples=15, deadline=None)


def reference(c, a, b):
    """Per lane, in f32: ``(c + a1 * b1) + a0 * b0`` (each bf16 product exact in f32)."""
    a, b = a.float().numpy(), b.float().numpy().reshape(-1, 2)
    out = c.numpy().astype(np.float32).copy()
    out += a[1] * b[:, 1]
    out += a[0] * b[:, 0]
    return out


def bf16_values(rng, shape, scale=1.0):
    return torch.from_numpy((rng.standard_normal(shape) * scale).astype(np.float32)).bfloat16()


# ----------------------------------------------------------------------------- CPU kernels


@taskmap.kernel
def rows(c: lf32[4, 35], a: lbf16[4, 2], b: lbf16[70]):
    """Per row: 16 lanes (the vector path), then 16 more from a register tile, then 3 (the loop)."""
    for r in range(4):
        acc = register_tensor(lf32, [16])
        for i in range(16):
            acc[i] = c[r, 16 + i]
        dot2_bf16(c[r, 0], a[r, 0], b[0], 16)
        dot2_bf16(acc[0], a[r, 0], b[32], 16)
        dot2_bf16(c[r, 32], a[r, 0], b[64], 3)
        for i in range(16):
            c[r, 16 + i] = acc[i]


@given(seed=st.integers(0, 2 ** 16), scale=st.sampled_from([1.0, 1e-3, 1e3]))
@FEW
def test_cpu_lanes_from_memory_and_registers(seed, scale):
    rng = np.random.default_rng(seed)
    c = torch.from_numpy(rng.standard_normal((4, 35)).astype(np.float32))
    a, b = bf16_values(rng, (4, 2), scale), bf16_values(rng, 70)
    out = c.clone()
    rows(out, a, b)
    for r in range(4):
        want = np.concatenate([reference(c[r, :16], a[r], b[:32]), reference(c[r, 16:32], a[r], b[32:64]),
                               reference(c[r, 32:], a[r], b[64:])])
        np.testing.assert_allclose(out[r].numpy(), want, rtol=2 ** -23, atol=0)


def test_cpu_kernels_use_the_dot_product_instruction_where_the_cpu_has_it():
    source = rows.build("cpu").source
    assert "tm_dot2_bf16(" in source and "__builtin_ia32_dpbf16ps_v16sf" in source


HARNESS = r"""
void run(float *c, const uint16_t *a, const uint16_t *b, int n) {
  if (n == 16) tm_dot2_bf16(c, a, b, 16); else tm_dot2_bf16(c, a, b, 5);
}
"""


@needs_gcc
@pytest.mark.parametrize("flags", [["-march=native"], ["-march=x86-64-v3"]], ids=["native", "avx2"])
def test_c_helper_with_and_without_avx512_bf16(tmp_path: pathlib.Path, flags):
    """The helper as ``vdpbf16ps`` (where this CPU has it) and as the loop: the same sums."""
    lib = c_harness(tmp_path, HARNESS, flags)
    lib.run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    rng = np.random.default_rng(3)
    for n in (16, 5):
        c = torch.from_numpy(rng.standard_normal(n).astype(np.float32))
        a, b = bf16_values(rng, 2), bf16_values(rng, 2 * n)
        out = c.clone()
        lib.run(out.data_ptr(), a.data_ptr(), b.data_ptr(), n)
        np.testing.assert_allclose(out.numpy(), reference(c, a, b), rtol=2 ** -23, atol=0)


# ----------------------------------------------------------------------------- GPU kernels


@taskmap.kernel
def per_thread(c: lf32[64], a: lbf16[8], b: lbf16[128]):
    """Thread t: 16 lanes of c from its pair of a and its 16 pairs of b."""
    attrs.block_dim = 4
    t = threadIdx.x
    dot2_bf16(c[t * 16], a[t * 2], b[t * 32], 16)


def test_gpu_kernel_in_emulation_and_built_for_cuda_and_hip():
    rng = np.random.default_rng(4)
    c = torch.from_numpy(rng.standard_normal(64).astype(np.float32))
    a, b = bf16_values(rng, 8), bf16_values(rng, 128)
    out = c.clone()
    per_thread(out, a, b)
    for t in range(4):
        np.testing.assert_allclose(out[t * 16:(t + 1) * 16].numpy(),
                                   reference(c[t * 16:(t + 1) * 16], a[2 * t:2 * t + 2], b[32 * t:32 * (t + 1)]),
                                   rtol=2 ** -23, atol=0)
    built_for_cuda(per_thread, "sm_80")
    built_for_hip(per_thread, "gfx90a", ["tm_dot2_bf16("])


@pytest.mark.cuda
def test_gpu_kernel_on_a_gpu():
    rng = np.random.default_rng(5)
    c = torch.from_numpy(rng.standard_normal(64).astype(np.float32))
    a, b = bf16_values(rng, 8), bf16_values(rng, 128)
    out = c.cuda()
    per_thread(out, a.cuda(), b.cuda())
    want = np.concatenate([reference(c[t * 16:(t + 1) * 16], a[2 * t:2 * t + 2], b[32 * t:32 * (t + 1)])
                           for t in range(4)])
    np.testing.assert_allclose(out.cpu().numpy(), want, rtol=2 ** -23, atol=0)


# ----------------------------------------------------------------------------- errors


def c_not_f32(c: lbf16[64], a: lbf16[2], b: lbf16[32]):
    dot2_bf16(c[0], a[0], b[0], 16)


def b_not_bf16(c: lf32[64], a: lbf16[2], b: lf32[32]):
    dot2_bf16(c[0], a[0], b[0], 16)


def n_not_constant(c: lf32[64], a: lbf16[2], b: lbf16[32], n: li32):
    dot2_bf16(c[0], a[0], b[0], n)


def b_past_the_end(c: lf32[64], a: lbf16[2], b: lbf16[32]):
    dot2_bf16(c[0], a[0], b[2], 16)


def test_dsl_errors():
    expect_dsl_error(c_not_f32, "argument 1 of dot2_bf16() must be a f32 element, got bf16")
    expect_dsl_error(b_not_bf16, "argument 3 of dot2_bf16() must be a bf16 element, got f32")
    expect_dsl_error(n_not_constant, "the pair count n of dot2_bf16() must be a compile-time integer >= 1")
    expect_dsl_error(b_past_the_end, "dot2_bf16() accesses 32 elements from element 2 of 'b', which has 32")


def test_ir_checks():
    c, a = Var("c", tensor_type(f32, (64,))), Var("a", tensor_type(bf16, (64,)))
    assert problem(PrimCall(Prim.DOT2_BF16, (c[0], a[0], a[2], const(16)))) is None
    assert problem(PrimCall(Prim.DOT2_BF16, (a[0], a[0], a[2], const(16))))[0] == 0
    assert problem(PrimCall(Prim.DOT2_BF16, (c[0], a[0], a[2], const(0))))[0] == 3
