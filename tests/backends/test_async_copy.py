"""16-byte vector copies (``copy16``) and asynchronous copies (``cp_async`` with commit/wait
groups and zero-fill predication): a 3-stage pipelined copy global -> shared -> global on sizes
that are not multiples of the tile, alignment faults, and the emulator's deferred copies."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, built_for_hip, run_on

import taskmap
from taskmap.errors import TaskmapError
from taskmap.lang import (attrs, blockIdx, copy16, cp_async, cp_async_commit, cp_async_wait, f16, f32, i32,
                          register_tensor, shared_tensor, syncthreads, threadIdx)

FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(3)


# ----------------------------------------------------------------------------- copy16


@taskmap.kernel
def vec_roundtrip(x: f32["n"], h: f16["m"], y: f32["n"], g: f16["m"]):
    """Each thread moves 4 f32 and 8 f16 global -> shared -> registers -> global, 16 bytes at a time."""
    attrs.grid_dim = x.shape[0] // 256
    attrs.block_dim = 64
    sx = shared_tensor(f32, [256])
    sh = shared_tensor(f16, [512])
    rx = register_tensor(f32, [4])
    rh = register_tensor(f16, [8])
    t = threadIdx.x
    copy16(sx[t * 4], x[blockIdx.x * 256 + t * 4])
    copy16(sh[t * 8], h[blockIdx.x * 512 + t * 8])
    syncthreads()
    copy16(rx, sx[(63 - t) * 4])                  # another thread's 16 bytes (a whole register tensor)
    copy16(rh, sh[(63 - t) * 8])
    copy16(y[blockIdx.x * 256 + t * 4], rx[0])
    copy16(g[blockIdx.x * 512 + t * 8], rh[0])


@pytest.mark.parametrize("device", DEVICES)
def test_copy16_f32x4_and_f16x8(device):
    blocks = 3
    x = RNG.standard_normal(256 * blocks).astype(np.float32)
    h = RNG.standard_normal(512 * blocks).astype(np.float16)
    y, g = run_on(device, vec_roundtrip, x, h, np.zeros_like(x), np.zeros_like(h))[2:]
    assert np.array_equal(y, x.reshape(blocks, 64, 4)[:, ::-1].reshape(-1))
    assert np.array_equal(g, h.reshape(blocks, 64, 8)[:, ::-1].reshape(-1))


def test_copy16_renders_vector_moves():
    built = built_for_cuda(vec_roundtrip, "sm_80", ["ld.global.v4.u32", "st.shared.v4.u32"])
    assert "*(int4 *)dst = *(const int4 *)src" in built.source
    built_for_hip(vec_roundtrip, "gfx90a", ["int4"])
    assert "tm_copy16(" in vec_roundtrip.build("cpu").source


@taskmap.kernel
def shifted_copy(x: f32["n"], y: f32["n"], shift: i32):
    attrs.block_dim = 4
    copy16(y[threadIdx.x * 4 + shift], x[threadIdx.x * 4])


def test_misaligned_copy16_is_reported_as_the_gpu_would_fault():
    x = RNG.standard_normal(24).astype(np.float32)
    y = np.zeros(24, np.float32)
    shifted_copy(x, y, 0)
    assert np.array_equal(y[:16], x[:16])
    with pytest.raises(TaskmapError, match="misaligned address: copy16"):
        shifted_copy(x, y, 1)


# ----------------------------------------------------------------------------- cp.async pipeline

TILE, STAGES, THREADS = 256, 3, 64   # one 16-byte chunk (4 f32) per thread per tile


@taskmap.kernel
def pipelined_copy(x: f32["n"], out: f32["m"]):
    """Tiles of x stream through a 3-stage shared ring: tile t is requested while tile t-2 is
    consumed (each thread writes another thread's chunk, so the barrier matters).  Chunks past
    the end of x are zero-filled; out (padded to whole tiles) receives the zeros too."""
    attrs.block_dim = THREADS
    ring = shared_tensor(f32, [STAGES, TILE])
    tiles = (x.shape[0] + TILE - 1) // TILE
    t0 = threadIdx.x * 4
    for t in range(tiles + STAGES - 1):
        if t < tiles:
            i = t * TILE + t0
            left = (x.shape[0] - i) * 4                      # bytes of x left from element i
            nbytes = 16 if left >= 16 else (left if left > 0 else 0)
            cp_async(ring[t % STAGES, t0], x[i if left > 0 else 0], 16, src_bytes=nbytes)
        cp_async_commit()
        c = t - (STAGES - 1)
        if c >= 0:
            cp_async_wait(STAGES - 1)                        # tile c's group is the third newest
            syncthreads()
            for e in range(4):
                j = TILE - 4 - t0 + e                        # the mirrored chunk of the tile
                out[c * TILE + j] = ring[c % STAGES, j]
            syncthreads()


@given(n=st.integers(1, 1500))
@FEW
def test_pipelined_copy_with_zero_fill(n):
    x = RNG.standard_normal(n).astype(np.float32)
    m = -(-n // TILE) * TILE
    out = np.full(m, np.nan, np.float32)
    pipelined_copy(x, out)
    want = np.zeros(m, np.float32)
    want[:n] = x
    assert np.array_equal(out, want)


@pytest.mark.parametrize("device", DEVICES)
def test_pipelined_copy_on_each_device(device):
    x = RNG.standard_normal(1001).astype(np.float32)
    out = run_on(device, pipelined_copy, x, np.full(1024, np.nan, np.float32))[1]
    assert np.array_equal(out[:1001], x) and not out[1001:].any()


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_pipelined_copy_builds_with_cp_async(arch):
    built = built_for_cuda(pipelined_copy, arch, ["cp.async.cg.shared.global", "cp.async.commit_group",
                                                  "cp.async.wait_group 2"])
    assert "__cvta_generic_to_shared" in built.source


def test_cp_async_falls_back_to_copies_before_sm_80_and_on_hip():
    built = built_for_cuda(pipelined_copy, "sm_75")
    assert "cp.async" not in built.artifact.extra.ptx and "tm_cp_sync(" in built.source
    assert "tm_cp_sync(" in built_for_hip(pipelined_copy, "gfx90a").source


@taskmap.kernel
def small_async(x: f32[64], h: f16[128], y: f32[64], g: f16[128], z: f32[32]):
    attrs.block_dim = 32
    sx = shared_tensor(f32, [64])
    sh = shared_tensor(f16, [128])
    sz = shared_tensor(f32, [32])
    t = threadIdx.x
    sz[t] = -1.0
    cp_async(sx[t * 2], x[t * 2], 8)                 # 8 bytes: .ca
    cp_async(sh[t * 4], h[t * 4], 8)
    cp_async(sz[t], x[t], 4, 0)                      # 4 bytes, all zero-filled: x is not read
    cp_async_commit()
    cp_async_wait(0)
    syncthreads()
    y[t * 2] = sx[63 - t * 2]
    y[t * 2 + 1] = sx[62 - t * 2]
    for e in range(4):
        g[t * 4 + e] = sh[127 - t * 4 - e]
    z[t] = sz[31 - t]


@pytest.mark.parametrize("device", DEVICES)
def test_cp_async_4_and_8_bytes(device):
    x = RNG.standard_normal(64).astype(np.float32)
    h = RNG.standard_normal(128).astype(np.float16)
    y, g, z = run_on(device, small_async, x, h, np.zeros_like(x), np.zeros_like(h), np.ones(32, np.float32))[2:]
    assert np.array_equal(y, x[::-1]) and np.array_equal(g, h[::-1]) and not z.any()
    if device == "cpu":
        built_for_cuda(small_async, "sm_80", ["cp.async.ca.shared.global", "cp.async.wait_group 0"])


@taskmap.kernel
def forgot_to_wait(x: f32[32], y: f32[32], wait: i32):
    attrs.block_dim = 32
    s = shared_tensor(f32, [32])
    s[threadIdx.x] = -1.0
    syncthreads()
    cp_async(s[threadIdx.x], x[threadIdx.x], 4)
    cp_async_commit()
    if wait != 0:
        cp_async_wait(0)
    syncthreads()
    y[threadIdx.x] = s[31 - threadIdx.x]


def test_the_emulator_defers_async_copies_until_waited_for():
    x = RNG.standard_normal(32).astype(np.float32)
    y = np.zeros(32, np.float32)
    forgot_to_wait(x, y, 1)
    assert np.array_equal(y, x[::-1])
    forgot_to_wait(x, y, 0)            # reading before cp_async_wait: the copies have not landed
    assert np.all(y == -1.0)
