"""``attrs.min_blocks``: a kernel's request for resident blocks per multiprocessor, rendered as
``__launch_bounds__``'s second argument (CUDA: blocks; HIP: waves per SIMD), ignored on the CPU."""
import numpy as np
import pytest
from prim_checks import built_for_cuda, built_for_hip

import taskmap
from taskmap.backends.gpu_codegen import CUDA, HIP
from taskmap.backends.hip import hiprtc_available
from taskmap.lang import attrs, blockIdx, f32, threadIdx


@taskmap.kernel
def scale_rows(x: f32[64, 256], y: f32[64, 256]):
    attrs.grid_dim = 64
    attrs.block_dim = 256
    attrs.min_blocks = 3
    y[blockIdx.x, threadIdx.x] = x[blockIdx.x, threadIdx.x] * 2.0 + 1.0


def test_runs_on_the_cpu():
    x = np.random.default_rng(0).uniform(-1, 1, (64, 256)).astype(np.float32)
    y = np.zeros_like(x)
    scale_rows(x, y)
    np.testing.assert_allclose(y, x * 2.0 + 1.0, rtol=1e-6)


def test_cuda_asks_ptxas_for_three_blocks():
    built = built_for_cuda(scale_rows, "sm_90", [".maxntid 256", ".minnctapersm 3"])
    assert "__launch_bounds__(256, 3)" in built.source


@pytest.mark.skipif(not hiprtc_available(), reason="hipRTC (libamdhip64) not installed")
def test_hip_asks_for_the_waves_per_simd_of_three_blocks():
    built_for_hip(scale_rows, expect_source=["__launch_bounds__(256, 3)"])   # 3 blocks x 4 waves / 4 SIMDs


@pytest.mark.parametrize("dialect, threads, blocks, warp, expected", [
    (CUDA, 256, 0, 32, "__launch_bounds__(256) "),
    (CUDA, 128, 4, 32, "__launch_bounds__(128, 4) "),
    (CUDA, None, 2, 32, ""),                       # a block size known only at launch: no bounds
    (HIP, 256, 2, 64, "__launch_bounds__(256, 2) "),
    (HIP, 64, 3, 64, "__launch_bounds__(64, 1) "),  # 3 one-wave blocks: at least one wave per SIMD
    (HIP, 512, 1, 64, "__launch_bounds__(512, 2) "),
])
def test_launch_bounds(dialect, threads, blocks, warp, expected):
    assert dialect.launch_bounds(threads, blocks, warp) == expected
