"""``opaque(i)``: the integer ``i``, whose value the C compiler may not see.  It changes no result;
on the CPU it renders as an empty asm statement that takes the value in a register (so gcc cannot
propagate a constant through it), on GPUs as the value itself; the DSL's argument errors; and the
plane depthwise kernel, whose single-core form gcc slowed 3x with its core index a constant,
keeps the index opaque."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, built_for_hip, expect_dsl_error, run_on

import taskmap
from taskmap.ir import Var, const, i32
from taskmap.ir.primitives import Prim, PrimCall
from taskmap.lang import attrs, opaque, threadIdx
from taskmap.lang import f32 as lf32
from taskmap.lang import i32 as li32
from taskmap.templates.window_plane import PlaneConfig, build_kernel


@taskmap.kernel
def shifted_sum(x: lf32["n"], y: lf32["n"], shift: li32):
    """y[i] = x[i] + x[(i + shift) % n], the shift and the bound passed through opaque()."""
    n = x.shape[0]
    s = opaque(shift)
    for i in range(opaque(n)):
        y[i] = x[i] + x[(i + s) % n]


@given(n=st.integers(1, 500), shift=st.integers(0, 1000), seed=st.integers(0, 2 ** 16))
@settings(max_examples=10, deadline=None)
def test_cpu_results_do_not_change(n, shift, seed):
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    shifted_sum(x, y, shift)
    np.testing.assert_array_equal(y, x + np.roll(x, -(shift % n)))


def test_cpu_source_hides_the_value_in_a_register():
    source = shifted_sum.build("cpu").source
    assert source.count('__asm__("" : "+r"(tm_o))') == 2


@taskmap.kernel
def per_thread(x: lf32["n"], y: lf32["n"]):
    """Each of 64 threads doubles the element an opaque index names (its own)."""
    attrs.block_dim = 64
    t = opaque(threadIdx.x)
    y[t] = x[t] * 2.0


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_kernel(device):
    x = np.random.default_rng(3).standard_normal(64).astype(np.float32)
    (_, y) = run_on(device, per_thread, x, np.zeros_like(x))
    np.testing.assert_array_equal(y, 2.0 * x)


def test_built_for_cuda_and_hip_as_the_value():
    for built in (built_for_cuda(per_thread, "sm_80"), built_for_hip(per_thread, "gfx90a")):
        assert "__asm__" not in built.source.split("per_thread", 1)[-1]


def not_an_integer(a: lf32[64]):
    a[0] = opaque(1.5)


def two_values(a: lf32[64]):
    a[0] = opaque(1, 2)


def test_dsl_errors():
    expect_dsl_error(not_an_integer, "the value of opaque() must be an integer")
    expect_dsl_error(two_values, "opaque() takes 1 argument")


def test_ir_call_has_the_value_type():
    assert PrimCall(Prim.OPAQUE, (Var("k", i32),), i32).dtype is i32
    assert PrimCall(Prim.OPAQUE, (const(3),), i32).dtype is i32


@pytest.mark.parametrize("cores", [1, 2])
def test_plane_kernel_keeps_its_core_index_opaque(cores):
    """960 channels 3x3 at 7x7 (MobileNetV2's last depthwise convs): one core's kernel passes its
    core index through opaque() (gcc's constant index had made it 3x slower), results as numpy's."""
    cfg = PlaneConfig(1, 40, 7, 7, 3, 3, 1, 1, 1, 1, True, 8, cores)
    kernel = build_kernel(cfg)
    assert '"+r"(tm_o)' in kernel.build("cpu").source
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, 40, 7, 7)).astype(np.float32)
    w = rng.standard_normal((40, 9)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    y = np.full_like(x, np.nan)
    kernel(x, w, b, y)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = sum(xp[:, :, i:i + 7, j:j + 7] * w[:, i * 3 + j][None, :, None, None] for i in range(3) for j in range(3))
    np.testing.assert_allclose(y, ref + b[None, :, None, None], rtol=1e-5, atol=1e-5)
