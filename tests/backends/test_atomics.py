"""Atomics (``atomic_add/max/min/exch/cas``) on global and shared memory: histograms and sums on
the CPU emulation (blocks run in parallel on the cores, so these are real atomics) and in CPU
kernels, built for CUDA and HIP, and launched on an NVIDIA GPU under the ``cuda`` marker."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, built_for_hip, run_on

import taskmap
from taskmap import spatial
from taskmap.lang import (atomic_add, atomic_cas, atomic_exch, atomic_max, atomic_min, attrs, blockIdx, f32, f64,
                          i32, i64, shared_tensor, syncthreads, threadIdx, u32, u64)
from taskmap.testing import assert_close

FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(11)
BINS = 16


@taskmap.kernel
def histogram(x: i32["n"], hist: i32[BINS], local_first: u32[BINS]):
    """Each block counts its 256 values in a shared histogram, then adds it to the global one."""
    attrs.grid_dim = (x.shape[0] + 255) // 256
    attrs.block_dim = 256
    counts = shared_tensor(u32, [BINS])
    if threadIdx.x < BINS:
        counts[threadIdx.x] = 0
    syncthreads()
    i = blockIdx.x * 256 + threadIdx.x
    if i < x.shape[0]:
        atomic_add(counts[x[i] % BINS], 1)
    syncthreads()
    if threadIdx.x < BINS:
        atomic_add(hist[threadIdx.x], i32(counts[threadIdx.x]))
        if blockIdx.x == 0:
            local_first[threadIdx.x] = counts[threadIdx.x]


@given(n=st.integers(1, 3000))
@FEW
def test_histogram_with_shared_and_global_atomics(n):
    x = RNG.integers(0, 1000, n).astype(np.int32)
    hist, first = np.zeros(BINS, np.int32), np.zeros(BINS, np.uint32)
    histogram(x, hist, first)
    assert np.array_equal(hist, np.bincount(x % BINS, minlength=BINS))
    assert np.array_equal(first, np.bincount(x[:256] % BINS, minlength=BINS))


@pytest.mark.parametrize("device", DEVICES)
def test_histogram_on_each_device(device):
    x = RNG.integers(0, 1000, 5000).astype(np.int32)
    hist = run_on(device, histogram, x, np.zeros(BINS, np.int32), np.zeros(BINS, np.uint32))[1]
    assert np.array_equal(hist, np.bincount(x % BINS, minlength=BINS))


@taskmap.kernel
def float_sums(x: f32["n"], total: f32[1], total64: f64[1], olds: f32["n"]):
    attrs.grid_dim = (x.shape[0] + 127) // 128
    attrs.block_dim = 128
    i = blockIdx.x * 128 + threadIdx.x
    if i < x.shape[0]:
        olds[i] = atomic_add(total[0], x[i])     # the old value: some partial sum
        atomic_add(total64[0], f64(x[i]))


@pytest.mark.parametrize("device", DEVICES)
def test_float_atomic_sum(device):
    x = RNG.uniform(0, 1, 20000).astype(np.float32)
    _, total, total64, olds = run_on(device, float_sums, x, np.zeros(1, np.float32), np.zeros(1, np.float64),
                                     np.zeros_like(x))
    assert_close(total, [x.astype(np.float64).sum()], rtol=1e-4, atol=0)
    assert_close(total64, [x.astype(np.float64).sum()], rtol=1e-12, atol=1e-9)
    # Every old value is a distinct partial sum below the total, one of them 0.
    assert olds.min() == 0 and np.all(olds < total[0]) and len(np.unique(olds)) > len(x) // 2


@taskmap.kernel
def extremes(x: i64["n"], y: u32["n"], out: i64[2], uout: u32[2], claim: i32[4], winner: i32[4],
             last: f32[1]):
    attrs.grid_dim = (x.shape[0] + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < x.shape[0]:
        atomic_max(out[0], x[i])
        atomic_min(out[1], x[i])
        atomic_max(uout[0], y[i])
        atomic_min(uout[1], y[i])
        slot = i % 4
        if atomic_cas(claim[slot], 0, i + 1) == 0:   # exactly one thread claims each slot
            winner[slot] = i + 1
        atomic_exch(last[0], f32(i))


@pytest.mark.parametrize("device", DEVICES)
def test_max_min_cas_exch(device):
    n = 777
    x = RNG.integers(-2**40, 2**40, n)
    y = RNG.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    arrays = (x, y, np.array([-2**62, 2**62]), np.array([0, 2**32 - 1], np.uint32), np.zeros(4, np.int32),
              np.zeros(4, np.int32), np.full(1, -1, np.float32))
    _, _, out, uout, claim, winner, last = run_on(device, extremes, *arrays)
    assert list(out) == [x.max(), x.min()] and list(uout) == [y.max(), y.min()]
    assert np.array_equal(claim, winner) and all(c % 4 == k for k, c in enumerate(claim - 1))
    assert 0 <= last[0] < n and last[0] == int(last[0])


def test_atomics_build_for_cuda_and_hip():
    for kern in (histogram, float_sums, extremes):
        built_for_cuda(kern, "sm_80", ["atom."])
        built_for_hip(kern, "gfx90a", ["atomic"])
    ptx = built_for_cuda(extremes, "sm_90").artifact.extra.ptx
    for op in ("atom.global.max.s64", "atom.global.min.u32", "atom.global.cas.b32", "atom.global.exch.b32"):
        assert op in ptx, op
    assert "atom.global.add.f64" in built_for_cuda(float_sums, "sm_90").artifact.extra.ptx
    assert "atom.shared.add.u32" in built_for_cuda(histogram, "sm_90").artifact.extra.ptx


@taskmap.kernel
def cpu_histogram(x: i32[200_000], hist: u64[BINS]):
    for i in spatial(200_000).parallel():              # a CPU kernel: iterations on all cores
        atomic_add(hist[x[i] % BINS], 1)


def test_atomics_in_a_parallel_cpu_kernel():
    x = RNG.integers(0, 1 << 20, 200_000).astype(np.int32)
    hist = np.zeros(BINS, np.uint64)
    cpu_histogram(x, hist)
    assert np.array_equal(hist, np.bincount(x % BINS, minlength=BINS))
    assert "__atomic_fetch_add" in cpu_histogram.build("cpu").source
