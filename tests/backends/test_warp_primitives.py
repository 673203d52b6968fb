"""Warp primitives: shuffles, votes, ``syncwarp``, ``lane_id()`` — on the CPU emulation (every GPU
thread a fiber, warps exchanging through a rendezvous) against numpy models of CUDA's semantics,
built for CUDA and HIP without a GPU, and launched on an NVIDIA GPU under the ``cuda`` marker."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prim_checks import DEVICES, built_for_cuda, built_for_hip, run_on

import taskmap
from taskmap.errors import TaskmapError, UnsupportedError
from taskmap.lang import (FULL_MASK, all_sync, any_sync, attrs, ballot_sync, blockIdx, bool_, f16, f32, f64, func, i8,
                          i32, i64, lane_id, shared_tensor, shfl_down_sync, shfl_sync, shfl_up_sync, shfl_xor_sync,
                          syncthreads, syncwarp, threadIdx, u8, u32, u64, warp_id, warp_size)
from taskmap.testing import assert_close

FEW = settings(max_examples=10, deadline=None)
RNG = np.random.default_rng(5)
THREADS = 128


# ----------------------------------------------------------------------------- block reduction


@taskmap.kernel
def row_reduce(a: f32["rows", "w"], sums: f32["rows"], maxes: f32["rows"]):
    """Per row: sum with a shfl_down tree and max with a shfl_xor butterfly within each warp,
    then across warps through shared memory (written for any warp size)."""
    attrs.grid_dim = a.shape[0]
    attrs.block_dim = THREADS
    part_s = shared_tensor(f32, [THREADS // 32])
    part_m = shared_tensor(f32, [THREADS // 32])
    s = 0.0
    mx = -3.0e38
    j = threadIdx.x
    while j < a.shape[1]:
        s += a[blockIdx.x, j]
        mx = max(mx, a[blockIdx.x, j])
        j += THREADS
    off = warp_size() // 2
    while off > 0:
        s += shfl_down_sync(FULL_MASK, s, off)
        mx = max(mx, shfl_xor_sync(FULL_MASK, mx, off))
        off = off // 2
    if lane_id() == 0:
        part_s[warp_id()] = s
        part_m[warp_id()] = mx
    syncthreads()
    if warp_id() == 0:
        warps = THREADS // warp_size()
        s = part_s[lane_id()] if lane_id() < warps else 0.0
        mx = part_m[lane_id()] if lane_id() < warps else -3.0e38
        off = warp_size() // 2
        while off > 0:
            s += shfl_xor_sync(FULL_MASK, s, off)
            mx = max(mx, shfl_xor_sync(FULL_MASK, mx, off))
            off = off // 2
        if lane_id() == 0:
            sums[blockIdx.x] = s
            maxes[blockIdx.x] = mx


@given(rows=st.integers(1, 9), width=st.integers(0, 150).map(lambda k: 2 * k + 1))
@FEW
def test_block_reduction_with_warp_shuffles(rows, width):
    a = RNG.uniform(-2, 2, (rows, width)).astype(np.float32)
    sums, maxes = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
    row_reduce(a, sums, maxes)
    assert_close(sums, a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert np.array_equal(maxes, a.max(axis=1))


@pytest.mark.parametrize("device", DEVICES)
def test_block_reduction_on_each_device(device):
    a = RNG.uniform(-2, 2, (7, 301)).astype(np.float32)
    _, sums, maxes = run_on(device, row_reduce, a, np.zeros(7, np.float32), np.zeros(7, np.float32))
    assert_close(sums, a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert np.array_equal(maxes, a.max(axis=1))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_block_reduction_builds_for_cuda(arch):
    built = built_for_cuda(row_reduce, arch, ["shfl.sync.down.b32", "shfl.sync.bfly.b32"])
    assert "__shfl_down_sync" in built.source and "& 31" in built.source  # lane_id() with warp size 32


def test_block_reduction_builds_for_hip_wave64_and_wave32():
    built = built_for_hip(row_reduce, "gfx90a", ["__shfl_down(", "__shfl_xor(", "& 63"])
    assert "_sync(" not in built.source.split("extern \"C\"")[1].replace("__syncthreads(", "")  # no *_sync on ROCm 5.2
    built_for_hip(row_reduce, "gfx1030", ["& 31"])


# ----------------------------------------------------------------------------- shuffle semantics


@taskmap.kernel
def shuffles(x: i32["n"], src: i32["n"], delta: i32["n"], out: i32[4, "n"]):
    attrs.block_dim = x.shape[0]
    t = threadIdx.x
    out[0, t] = shfl_sync(FULL_MASK, x[t], src[t])
    out[1, t] = shfl_down_sync(FULL_MASK, x[t], delta[t])
    out[2, t] = shfl_up_sync(FULL_MASK, x[t], delta[t])
    out[3, t] = shfl_xor_sync(FULL_MASK, x[t], delta[t])


def shuffle_model(x, src, delta, alive):
    """CUDA's shuffles over warps of 32; a source lane that does not exist or does not take part
    gives the caller its own value (the emulator's choice where CUDA leaves it undefined)."""
    n = len(x)
    out = np.empty((4, n), np.int64)
    for t in range(n):
        base, lane = t - t % 32, t % 32
        cands = [src[t] % 32, lane + delta[t], lane - delta[t], lane ^ delta[t]]
        for r, s in enumerate(cands):
            ok = 0 <= s < 32 and base + s < n and alive[base + s]
            out[r, t] = x[base + s] if ok else x[t]
    return out


@pytest.mark.parametrize("n", [32, 64, 48, 7])
def test_shuffle_semantics_full_and_partial_warps(n):
    x = RNG.integers(-1000, 1000, n).astype(np.int32)
    src = RNG.integers(-40, 80, n).astype(np.int32)
    delta = RNG.integers(0, 40, n).astype(np.int32)
    out = np.zeros((4, n), np.int32)
    shuffles(x, src, delta, out)
    assert np.array_equal(out, shuffle_model(x, src, delta, np.ones(n, bool)))


@pytest.mark.parametrize("device", DEVICES)
def test_shuffles_on_each_device(device):
    n = 64
    x = RNG.integers(-1000, 1000, n).astype(np.int32)
    src = RNG.integers(0, 200, n).astype(np.int32)
    delta = RNG.integers(0, 32, n).astype(np.int32)
    out = run_on(device, shuffles, x, src, delta, np.zeros((4, n), np.int32))[3]
    assert np.array_equal(out, shuffle_model(x, src, delta, np.ones(n, bool)))


@taskmap.kernel
def early_exit(x: i32[64], live: i32[64], out: i32[64]):
    attrs.block_dim = 64
    t = threadIdx.x
    if live[t] == 0:
        return                      # an exited lane takes part in nothing
    v = shfl_down_sync(FULL_MASK, x[t], 1)
    syncthreads()                   # block barriers and warp rendezvous interleave
    out[t] = shfl_up_sync(FULL_MASK, v, 2)


def test_exited_lanes_do_not_block_their_warp():
    x = RNG.integers(-1000, 1000, 64).astype(np.int32)
    live = (RNG.random(64) < 0.6).astype(np.int32)
    live[40:] = 0                   # most of the second warp exits
    out = np.full(64, -7, np.int32)
    early_exit(x, live, out)
    ones = np.ones(64, np.int32)
    v = shuffle_model(x, ones, ones, live.astype(bool))[1]
    want = shuffle_model(v, ones, 2 * ones, live.astype(bool))[2]
    assert np.array_equal(out[live == 1], want[live == 1])
    assert np.all(out[live == 0] == -7)


@taskmap.kernel
def divergent_masks(x: i32[32], out: i32[32]):
    attrs.block_dim = 32
    t = threadIdx.x
    if t < 16:
        out[t] = shfl_xor_sync(0x0000FFFF, x[t], 1)
    else:
        out[t] = shfl_xor_sync(0xFFFF0000, x[t], 2)


@pytest.mark.parametrize("device", DEVICES)
def test_divergent_shuffles_with_disjoint_masks(device):
    x = RNG.integers(-1000, 1000, 32).astype(np.int32)
    out = run_on(device, divergent_masks, x, np.zeros(32, np.int32))[1]
    lanes = np.arange(32)
    assert np.array_equal(out, x[np.where(lanes < 16, lanes ^ 1, lanes ^ 2)])


@taskmap.kernel
def loop_of_barriers(x: f32[4, 96], out: f32[4, 96]):
    """Warp rendezvous and block barriers in one loop: a value rotates within warps, then across
    them through shared memory, four times."""
    attrs.block_dim = 96
    buf = shared_tensor(f32, [96])
    t = threadIdx.x
    v = x[0, t]
    for r in range(4):
        v = shfl_sync(FULL_MASK, v, lane_id() + 1) + x[r, t]
        buf[t] = v
        syncthreads()
        v = buf[(t + 32) % 96]
        syncwarp()
        out[r, t] = v
        syncthreads()


@pytest.mark.parametrize("device", DEVICES)
def test_warp_rendezvous_and_block_barriers_interleave(device):
    x = RNG.uniform(-1, 1, (4, 96)).astype(np.float32)
    out = run_on(device, loop_of_barriers, x, np.zeros((4, 96), np.float32))[1]
    t = np.arange(96)
    v, want = x[0].copy(), np.zeros((4, 96), np.float32)
    for r in range(4):
        v = v[(t // 32) * 32 + (t % 32 + 1) % 32] + x[r]
        v = v[(t + 32) % 96]
        want[r] = v
    assert_close(out, want)


@taskmap.kernel
def divergent_warp_code(x: f32[64], out: f32[64], case: i32):
    """Three ways to break CUDA's rule for *_sync primitives (each undefined on a GPU)."""
    attrs.block_dim = 64
    t = threadIdx.x
    v = x[t]
    if case == 0:
        if t < 20:                                        # lanes 20-31 named by the mask skip it
            v = shfl_down_sync(FULL_MASK, v, 1)
        syncthreads()
    elif case == 1:
        if t % 2 == 0:                                    # two different primitives at once
            v = shfl_xor_sync(FULL_MASK, v, 2)
        else:
            v = shfl_down_sync(FULL_MASK, v, 2)
    elif case == 2:
        v = shfl_xor_sync(0x0000FFFF, v, 1)               # lanes 16-31 are not in their own mask
    else:
        if t < 20:                                        # correct: the mask names the lanes that run
            v = shfl_xor_sync(0x0000FFFF, v, 1) if t < 16 else v
        syncthreads()
    out[t] = v


@pytest.mark.parametrize("case", [0, 1, 2])
def test_divergent_warp_primitives_fail_the_launch(case):
    x = RNG.standard_normal(64).astype(np.float32)
    with pytest.raises(TaskmapError, match="divergent warp primitive"):
        divergent_warp_code(x, np.zeros(64, np.float32), case)
    out = np.zeros(64, np.float32)
    divergent_warp_code(x, out, 3)
    t = np.arange(64)
    assert np.array_equal(out, np.where(t < 16, x[t ^ 1], x))


@taskmap.kernel
def typed_shuffles(a: f64[64], b: f16[64], c: i64[64], d: u8[64], e: bool_[64], f: i8[64]):
    attrs.block_dim = 64
    t = threadIdx.x
    a[t] = shfl_xor_sync(FULL_MASK, a[t], 5)
    b[t] = shfl_xor_sync(FULL_MASK, b[t], 5)
    c[t] = shfl_xor_sync(FULL_MASK, c[t], 5)
    d[t] = shfl_xor_sync(FULL_MASK, d[t], 5)
    e[t] = shfl_xor_sync(FULL_MASK, e[t], 5)
    f[t] = shfl_xor_sync(FULL_MASK, f[t], 5)


@pytest.mark.parametrize("device", DEVICES)
def test_shuffles_of_every_width(device):
    arrays = [RNG.standard_normal(64), RNG.standard_normal(64).astype(np.float16),
              RNG.integers(-2**62, 2**62, 64), RNG.integers(0, 255, 64).astype(np.uint8),
              RNG.random(64) < 0.5, RNG.integers(-128, 127, 64).astype(np.int8)]
    outs = run_on(device, typed_shuffles, *arrays)
    perm = np.arange(64) ^ 5
    for got, x in zip(outs, arrays):
        assert np.array_equal(got, x[perm]), x.dtype


def test_typed_shuffles_build_everywhere():
    built_for_cuda(typed_shuffles, "sm_80", ["shfl.sync.bfly.b32"])
    built_for_hip(typed_shuffles, "gfx90a", ["__shfl_xor("])


# ----------------------------------------------------------------------------- votes and lanes


@taskmap.kernel
def votes(p: i32["n"], masks: u32["n"], out: u32[3, "n"], wide: u64["n"]):
    attrs.block_dim = p.shape[0]
    t = threadIdx.x
    out[0, t] = u32(all_sync(masks[t], p[t] != 0))
    out[1, t] = u32(any_sync(masks[t], p[t] != 0))
    out[2, t] = ballot_sync(masks[t], p[t] != 0)
    wide[t] = ballot_sync(FULL_MASK, p[t] > 0, dtype=u64)


def vote_model(p, masks):
    n = len(p)
    out = np.zeros((3, n), np.uint32)
    for t in range(n):
        base = t - t % 32
        lanes = [s for s in range(32) if masks[t] >> s & 1 and base + s < n]
        bits = sum(1 << s for s in lanes if p[base + s])
        out[:, t] = [bits == sum(1 << s for s in lanes), bits != 0, bits]
    return out


@pytest.mark.parametrize("n", [64, 40])
def test_ballot_any_all(n):
    p = (RNG.random(n) < 0.5).astype(np.int32)
    p[:32][RNG.random(32) < 0.5] = 1           # make "all" true in some groups
    # Each warp splits into two groups of lanes, each voting with its own mask (CUDA: lanes named
    # in a mask execute the vote with that same mask); the second warp may be partial.
    split = [int(RNG.integers(1, 2**32 - 1)), 0x0F0F0F0F]
    group = np.array([split[t // 32] >> (t % 32) & 1 for t in range(n)], bool)
    masks = np.where(group, [split[t // 32] for t in range(n)], [~split[t // 32] & 0xFFFFFFFF for t in range(n)])
    masks = masks.astype(np.uint32)
    out, wide = np.zeros((3, n), np.uint32), np.zeros(n, np.uint64)
    votes(p, masks, out, wide)
    assert np.array_equal(out, vote_model(p, masks))
    assert np.array_equal(wide, vote_model(p, np.full(n, 0xFFFFFFFF, np.uint32))[2].astype(np.uint64))


@pytest.mark.parametrize("device", DEVICES)
def test_votes_full_warps_on_each_device(device):
    p = (RNG.random(64) < 0.5).astype(np.int32)
    p[32:] = 1
    masks = np.full(64, 0xFFFFFFFF, np.uint32)
    out, wide = run_on(device, votes, p, masks, np.zeros((3, 64), np.uint32), np.zeros(64, np.uint64))[2:]
    assert np.array_equal(out, vote_model(p, masks))
    assert out[0, 40] == 1 and out[0, 0] == int(p[:32].all())


def test_votes_build_for_cuda_and_wave32_hip_but_u32_ballots_need_wave32():
    built_for_cuda(votes, "sm_90", ["vote.sync.ballot.b32", "vote.sync.all.pred", "vote.sync.any.pred"])
    built_for_hip(votes, "gfx1030", ["__ballot(", "__all(", "__any("])
    with pytest.raises(UnsupportedError, match=r"ballot_sync\(\) returns u32.*64-lane.*dtype=u64"):
        votes.build("hip", arch="gfx90a")


@taskmap.kernel
def lanes_2d(out: i32[3, 6, 16]):
    attrs.block_dim = 16, 6
    out[0, threadIdx.y, threadIdx.x] = lane_id()
    out[1, threadIdx.y, threadIdx.x] = warp_id()
    out[2, threadIdx.y, threadIdx.x] = warp_size()


@pytest.mark.parametrize("device", DEVICES)
def test_lane_and_warp_of_a_2d_block(device):
    out = run_on(device, lanes_2d, np.zeros((3, 6, 16), np.int32))[0]
    linear = np.arange(96).reshape(6, 16)
    assert np.array_equal(out[0], linear % 32) and np.array_equal(out[1], linear // 32)
    assert np.all(out[2] == 32)


def test_lanes_build_with_the_targets_warp_size():
    assert "& 63" in built_for_hip(lanes_2d, "gfx90a").source
    assert ">> 5" in built_for_cuda(lanes_2d, "sm_80").source


# ----------------------------------------------------------------------------- in helper functions


@func
def warp_sum(x: f32) -> f32:
    off = warp_size() // 2
    while off > 0:
        x += shfl_xor_sync(FULL_MASK, x, off)
        off = off // 2
    return x


@func
def first_lane_writes(out: f32[4], v: f32):
    if lane_id() == 0:
        out[warp_id()] = v


@taskmap.kernel
def warp_sums(a: f32[128], out: f32[4]):
    attrs.block_dim = 128
    first_lane_writes(out, warp_sum(a[threadIdx.x]))


@pytest.mark.parametrize("device", DEVICES)
def test_warp_primitives_in_device_functions(device):
    a = RNG.uniform(-1, 1, 128).astype(np.float32)
    out = run_on(device, warp_sums, a, np.zeros(4, np.float32))[1]
    assert_close(out, a.reshape(4, 32).astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_device_functions_with_warp_primitives_build():
    built_for_cuda(warp_sums, "sm_90", ["shfl.sync.bfly.b32"])
    built_for_hip(warp_sums, "gfx1030", ["__shfl_xor("])
