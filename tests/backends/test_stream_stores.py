"""Streaming stores (``vectorize(stream=True)``, ``Store.stream``): the C backend writes a
vectorized loop's whole, consecutive vectors past the caches (``tm_stream_f32``: non-temporal
where the address is aligned, plain stores where it is not) and fences them at the end of each
parallel iteration and of the kernel; stores it cannot stream (a stride, a partial vector) are
written plainly.  CUDA stores them evict-first (``__stcs``), HIP non-temporally.  Results never
change; the flag survives the passes and post-scheduling fusion."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from prim_checks import DEVICES, built_for_cuda, built_for_hip, run_on
from taskmap import repeat, spatial
from taskmap.backends.base import host_cpu_target
from taskmap.compute import compute, tensor_input
from taskmap.fusion import fuse
from taskmap.ir import stmt as S
from taskmap.ir.expr import maximum
from taskmap.ir.functor import collect
from taskmap.errors import DSLError
from taskmap.lang import attrs, f32, f64, i32, threadIdx, unroll, vectorize
from taskmap.templates.matmul_cpu import MATMUL_CPU, streams_c
from taskmap.templates.matmul_problem import MatmulProblem
from taskmap.testing import assert_close

CPU = host_cpu_target()
V = max(4, CPU.vector_bytes // 4)
STREAMS = V >= 8            # AVX / AVX-512 hosts stream; others store plainly (same results)
rows = spatial(4).parallel()
lanes = repeat(8) * spatial(V)               # 8 vectors a row


@taskmap.kernel
def relu_add(a: f32[4, "n"], b: f32[4, "n"], c: f32[4, "n"], off: i32):
    """c[i, off + j] = relu(a + b) over 8 whole vectors of row i, streamed."""
    for i in rows:
        for j in lanes.vectorize(stream=True):
            c[i, off + j] = max(a[i, off + j] + b[i, off + j], 0.0)


@taskmap.kernel
def transposed(a: f32[4, 8 * V], c: f32[8 * V, 4]):
    """A strided store (down c's columns), marked streaming: written plainly."""
    for i in rows:
        for j in lanes.vectorize(stream=True):
            c[j, i] = a[i, j] * 2.0


@given(off=st.integers(0, 2 * V), seed=st.integers(0, 1 << 16))
@settings(max_examples=8, deadline=None)
def test_streamed_results_at_any_alignment(off, seed):
    """Offsets that put the vectors on and off 64-byte lines: the same results."""
    _check_relu_add(off, seed)


@given(n=st.integers(1, 100), seed=st.integers(0, 1 << 16))
@settings(max_examples=8, deadline=None)
def test_any_length_streams_its_whole_vectors_and_stores_the_rest(n, seed):
    a = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    c = np.full(n, np.nan, np.float32)
    scaled(a, c)
    np.testing.assert_array_equal(c, a * np.float32(3.0))


def _check_relu_add(off, seed):
    rng = np.random.default_rng(seed)
    n = 8 * V + 2 * V
    a, b = (rng.standard_normal((4, n)).astype(np.float32) for _ in range(2))
    c = np.full((4, n), np.nan, np.float32)
    relu_add(a, b, c, off)
    want = np.full((4, n), np.nan, np.float32)
    want[:, off:off + 8 * V] = np.maximum(a + b, 0.0)[:, off:off + 8 * V]
    np.testing.assert_array_equal(c, want)


def test_cpu_source_streams_and_fences():
    source = relu_add.build("cpu").source
    entry = source[source.index("int tm_entry_relu_add"):]
    if STREAMS:
        assert entry.count("tm_stream_f32(") == 1
        assert entry.count("tm_stream_fence();") == 2          # each parallel iteration, and the kernel's end
    else:
        assert "tm_stream_f32(" not in entry


@taskmap.kernel
def scaled(a: f32["n"], c: f32["n"]):
    """A range loop: vectorize(n, stream=True)."""
    for i in vectorize(a.shape[0], stream=True):
        c[i] = a[i] * 3.0


def test_a_vectorized_range_loop_streams_too():
    a = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    c = np.full(1000, np.nan, np.float32)
    scaled(a, c)
    np.testing.assert_array_equal(c, a * np.float32(3.0))
    assert all(s.stream for s in collect(scaled.lower().entry_function.body, S.Store))
    source = scaled.build("cpu").source
    assert ("tm_stream_f32(" in source[source.index("int tm_entry_scaled"):]) == STREAMS


def test_stream_must_be_a_compile_time_bool():
    def bad(a: f32[16], c: f32[16]):
        for i in vectorize(16, stream=a[0] > 0.0):
            c[i] = a[i]
    with pytest.raises(DSLError, match="stream= must be a compile-time bool"):
        taskmap.kernel(bad).lower()

    def other(a: f32[16], c: f32[16]):
        for i in unroll(16, stream=True):
            c[i] = a[i]
    with pytest.raises(DSLError, match="takes no keyword arguments"):
        taskmap.kernel(other).lower()


def test_a_strided_store_is_written_plainly():
    a = np.random.default_rng(1).standard_normal((4, 8 * V)).astype(np.float32)
    c = np.full((8 * V, 4), np.nan, np.float32)
    transposed(a, c)
    np.testing.assert_array_equal(c, 2.0 * a.T)
    source = transposed.build("cpu").source
    assert "tm_stream_f32(" not in source[source.index("int tm_entry_transposed"):]


def test_the_printer_and_the_passes_keep_the_flag():
    stores = collect(relu_add.lower().entry_function.body, S.Store)
    assert stores and all(s.stream for s in stores)
    assert "# stream" in repr(relu_add.func)


def test_matmul_streams_c_only_past_the_last_level_cache():
    big = MatmulProblem(8, 256, 3136, 64, "float32", "float32", b_batched=True, const_a=True)
    small = MatmulProblem(1, 256, 3136, 64, "float32", "float32", b_batched=True, const_a=True)
    llc = CPU.llc_bytes
    assert llc > 0
    assert streams_c(big, CPU) == (4 * 8 * 256 * 3136 > llc / 2)
    assert not streams_c(small, CPU) or 4 * 256 * 3136 > llc / 2
    transposed_c = MatmulProblem(8, 256, 3136, 64, "float32", "float32", b_batched=True, trans_c=True)
    assert not streams_c(transposed_c, CPU)


@pytest.mark.parametrize("m, n", [(40, 3 * 48 * 2), (37, 131)], ids=["whole-tiles", "edges"])
def test_a_fused_epilogue_is_streamed_with_the_tile(m, n):
    """The matmul template's whole tiles of C, streamed, with a bias + ReLU epilogue spliced into
    the stores: the spliced stores keep the flag, edge tiles are stored plainly, and C is right."""
    p = MatmulProblem(2, m, n, 24, "float32", "float32", a_batched=False, b_batched=True)
    sched = MATMUL_CPU.space(p, CPU)[0]
    cfg = MATMUL_CPU.config(p, CPU, sched)
    from dataclasses import replace

    from taskmap.templates.matmul_cpu_kernel import build_kernel
    kernel = build_kernel(replace(cfg, stream=True))
    c = tensor_input("c", "float32", [2, m, n])
    bias = tensor_input("eb", "float32", [m])
    y = compute("y", [2, m, n], lambda b, i, j: maximum(c[b, i, j] + bias[i], 0.0))
    fused = fuse(kernel, {}, {"c": y}, {"batch": 2, "m": m, "n": n, "k": 24})
    assert any(s.stream and s.tensor.name == "y" for f in fused.module.functions for s in collect(f.body, S.Store))
    assert ("tm_stream_f32(&y[" in fused.build("cpu").source) == STREAMS
    rng = np.random.default_rng(7)
    a = rng.standard_normal((1, m, 24)).astype(np.float32)
    b = rng.standard_normal((2, 24, n)).astype(np.float32)
    eb = rng.standard_normal(m).astype(np.float32)
    out = np.full((2, m, n), np.nan, np.float32)
    wa, wb = MATMUL_CPU.workspace_sizes(p, sched, CPU)
    avail = {"a": a, "b": b, "bias": np.zeros(1, np.float32), "bidx": np.zeros(1, np.int64), "eb": eb, "y": out, "cw": np.zeros((2, m, n), np.float32),
             "wa": np.zeros(wa, np.float32), "wb": np.zeros(wb, np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    assert_close(out, np.maximum(np.einsum("mk,bkn->bmn", a[0].astype(np.float64), b) + eb[:, None], 0.0),
                 rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(V < 16, reason="needs an AVX-512 host")
def test_eight_lane_vectors_on_an_avx512_host():
    """Source rendered for an 8-lane target (AVX2) and built on an AVX-512 host: each
    ``tm_stream_f32`` call holds 8 floats and writes exactly those (32-byte streaming stores, or
    plain ones off a 32-byte boundary), never a 64-byte vector past them."""
    import ctypes
    import dataclasses

    from taskmap.backends.cpu import build_c, load_library

    avx2 = dataclasses.replace(CPU, vector_bytes=32)
    source = relu_add.render(avx2)
    assert "tm_stream_f32(" in source and "tm_st, 8);" in source
    entry = getattr(load_library(build_c(source, avx2, "relu_add").binary), "tm_entry_relu_add")
    n = 8 * V + 2 * V
    rng = np.random.default_rng(6)
    a, b = (rng.standard_normal((4, n)).astype(np.float32) for _ in range(2))
    for off in (0, 4, 8, 16):
        c = np.full((4, n), np.nan, np.float32)
        ptr = ctypes.c_void_p
        assert entry(ptr(a.ctypes.data), ptr(b.ctypes.data), ptr(c.ctypes.data), ctypes.c_int32(off),
                     ctypes.c_int32(n)) == 0
        want = np.full((4, n), np.nan, np.float32)
        want[:, off:off + 8 * V] = np.maximum(a + b, 0.0)[:, off:off + 8 * V]
        np.testing.assert_array_equal(c, want)


# ---------------------------------------------------------------- GPU backends

@taskmap.kernel
def stream_copy(a: f32[1024], c: f32[1024], d: f64[1024], e: i32[1024]):
    """Each of 256 threads stores 4 elements of each output, streaming."""
    attrs.block_dim = 256
    t = threadIdx.x
    for q in vectorize(4, stream=True):
        c[t * 4 + q] = a[t * 4 + q] * 2.0
    for q in vectorize(4, stream=True):
        d[t * 4 + q] = f64(a[t * 4 + q])
    for q in vectorize(4, stream=True):
        e[t * 4 + q] = i32(a[t * 4 + q] * 100.0)


@pytest.mark.parametrize("device", DEVICES)
def test_gpu_kernels_stream_results_unchanged(device):
    a = np.random.default_rng(8).standard_normal(1024).astype(np.float32)
    c, d, e = np.zeros(1024, np.float32), np.zeros(1024, np.float64), np.zeros(1024, np.int32)
    _, c, d, e = run_on(device, stream_copy, a, c, d, e)
    np.testing.assert_array_equal(c, a * 2)
    np.testing.assert_array_equal(d, a.astype(np.float64))
    np.testing.assert_array_equal(e, (a * 100).astype(np.int32))


def test_cuda_streaming_stores_are_evict_first():
    """CUDA: ``__stcs`` (st.global.cs), for f32, f64 and i32."""
    built = built_for_cuda(stream_copy, "sm_80", ["st.global.cs.f32", "st.global.cs.f64", "st.global.cs.s32"])
    assert built.source.count("__stcs(") == 3


def test_hip_streaming_stores_are_non_temporal():
    built_for_hip(stream_copy, expect_source=["__builtin_nontemporal_store("])
