"""Hopper's copy engine (``tma_load``) and mbarriers: boxes copied with zero-filled edges, the
128-byte swizzle wgmma reads, batches, a producer / consumer ring over many phases — on the CPU
emulation against numpy, built for sm_90a (PTX checked), refused before sm_90 and on HIP, and on an
NVIDIA GPU under the ``cuda`` marker; the emulation's faults (deadlock, extra arrivals, misaligned
tiles, reading before waiting) and the launcher's tensor maps."""
import numpy as np
import pytest
from prim_checks import DEVICES, built_for_cuda, run_on

import taskmap
from taskmap.backends.cuda.tensor_map import box_geometry
from taskmap.backends.tma import TensorMapSpec, tensor_maps
from taskmap.errors import LaunchError, TaskmapError, UnsupportedError
from taskmap.lang import (attrs, bar_sync, blockIdx, f16, f32, gridDim, i32, mbarrier_arrive, mbarrier_init, mbarrier_wait,
                          register_tensor, shared_tensor, symbol, syncthreads, threadIdx, tma_load, u64, wgmma_sw128,
                          wgmma_sw128_b16)

RNG = np.random.default_rng(23)
m, k, nb = symbol("m"), symbol("k"), symbol("nb")


def box_copy(rows, cols, swizzle=0, dtype=f32):
    """Each block copies the rows x cols box at (bx * rows, by * cols) of ``a`` through shared
    memory into ``out[block]``: out holds whole boxes, so the zero-filled edges show."""
    size = dtype.nbytes
    unswizzle = wgmma_sw128 if size == 4 else wgmma_sw128_b16

    @taskmap.kernel
    def tma_box(a: dtype[m, k], out: dtype[nb, rows, cols]):
        attrs.grid_dim = ((m + rows - 1) // rows, (k + cols - 1) // cols)
        attrs.block_dim = 64
        tile = shared_tensor(dtype, [rows, cols])
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
        syncthreads()
        if threadIdx.x == 0:
            mbarrier_arrive(bar[0], rows * cols * size)
            tma_load(tile[0, 0], a[blockIdx.x * rows, blockIdx.y * cols], bar[0], rows, cols, swizzle)
        mbarrier_wait(bar[0], 0)
        b = blockIdx.x * gridDim.y + blockIdx.y
        for e in range(threadIdx.x, rows * cols, 64):
            r = e // cols
            c = e % cols
            if swizzle:
                out[b, r, c] = tile[r, unswizzle(r, c)]
            else:
                out[b, r, c] = tile[r, c]
    return tma_box


def boxes(a, rows, cols):
    """numpy: a's boxes, zero-padded, in block order (x over rows, then y over columns)."""
    gm, gk = -(-a.shape[0] // rows), -(-a.shape[1] // cols)
    padded = np.zeros((gm * rows, gk * cols), a.dtype)
    padded[:a.shape[0], :a.shape[1]] = a
    return padded.reshape(gm, rows, gk, cols).transpose(0, 2, 1, 3).reshape(gm * gk, rows, cols)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,rows,cols,swizzle,dtype", [
    ((37, 68), 16, 32, 0, np.float32),         # edges in both dimensions
    ((64, 96), 64, 32, 128, np.float32),       # wgmma's f32 tiles
    ((50, 136), 24, 64, 128, np.float16),      # wgmma's 16-bit tiles, ragged
    ((9, 12), 8, 4, 0, np.float32),            # 16-byte rows
    ((20, 36), 8, 8, 0, np.int32),             # integers: copied as they are
], ids=["edges", "sw128-f32", "sw128-f16", "narrow", "i32"])
def test_tma_box_copy(device, shape, rows, cols, swizzle, dtype):
    a = (RNG.standard_normal(shape) * 1000).astype(dtype)
    want = boxes(a, rows, cols)
    out = np.full(want.shape, -1, dtype)
    kernel = box_copy(rows, cols, swizzle, {np.float32: f32, np.float16: f16, np.int32: i32}[dtype])
    got = run_on(device, kernel, a, out)[1]
    np.testing.assert_array_equal(got, want)


def test_swizzle_moves_chunks():
    """Read back without undoing the swizzle, rows 1..7 of a box differ from the source: the copy
    really permutes 16-byte chunks as wgmma expects (checked against the formula, not itself)."""
    a = RNG.standard_normal((8, 32)).astype(np.float32)
    out = np.zeros((1, 8, 32), np.float32)

    @taskmap.kernel
    def raw(a: f32[8, 32], out: f32[1, 8, 32]):
        attrs.block_dim = 32
        tile = shared_tensor(f32, [8, 32])
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
        syncthreads()
        if threadIdx.x == 0:
            mbarrier_arrive(bar[0], 8 * 32 * 4)
            tma_load(tile[0, 0], a[0, 0], bar[0], 8, 32, 128)
        mbarrier_wait(bar[0], 0)
        for r in range(8):
            out[0, r, threadIdx.x] = tile[r, threadIdx.x]

    raw(a, out)
    for r in range(8):
        for c in range(32):
            stored = ((c // 4) ^ r) * 4 + c % 4
            assert out[0, r, stored] == a[r, c]
    assert not np.array_equal(out[0, 1:], a[1:])


def batched_copy(rows, cols):
    @taskmap.kernel
    def tma_batch(a: f32[nb, m, k], out: f32[nb, rows, cols]):
        attrs.grid_dim = nb
        attrs.block_dim = 32
        tile = shared_tensor(f32, [rows, cols])
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
        syncthreads()
        if threadIdx.x == 0:
            mbarrier_arrive(bar[0], rows * cols * 4)
            tma_load(tile[0, 0], a[blockIdx.x, 3, 0], bar[0], rows, cols)     # rows 3.. of batch bx
        mbarrier_wait(bar[0], 0)
        for e in range(threadIdx.x, rows * cols, 32):
            out[blockIdx.x, e // cols, e % cols] = tile[e // cols, e % cols]
    return tma_batch


@pytest.mark.parametrize("device", DEVICES)
def test_tma_batched_source(device):
    a = RNG.standard_normal((3, 10, 8)).astype(np.float32)
    want = np.zeros((3, 8, 8), np.float32)
    want[:, :7] = a[:, 3:]                               # rows past the batch's end: zeros, not the next batch
    got = run_on(device, batched_copy(8, 8), a, np.full((3, 8, 8), np.nan, np.float32))[1]
    np.testing.assert_array_equal(got, want)


STAGES, TILE = 2, 16


@taskmap.kernel
def ring_sum(a: f32[m, 32], out: f32[32]):
    """One producer thread streams a's rows through a 2-stage ring of 16 x 32 tiles (full / empty
    barriers, parity per round); 32 consumer threads (warp 1) sum each column: many phases of each
    barrier, and the producer's first pass through the empty barriers (parity 1) goes straight on."""
    attrs.block_dim = 64
    ring = shared_tensor(f32, [STAGES, TILE, 32])
    full = shared_tensor(u64, [STAGES])
    empty = shared_tensor(u64, [STAGES])
    acc = register_tensor(f32, [1])
    tiles = (m + TILE - 1) // TILE
    if threadIdx.x == 0:
        for s in range(STAGES):
            mbarrier_init(full[s], 1)
            mbarrier_init(empty[s], 32)
    syncthreads()
    if threadIdx.x == 0:
        for t in range(tiles):
            s = t % STAGES
            mbarrier_wait(empty[s], (t // STAGES + 1) % 2)
            mbarrier_arrive(full[s], TILE * 32 * 4)
            tma_load(ring[s, 0, 0], a[t * TILE, 0], full[s], TILE, 32)
    if threadIdx.x >= 32:
        acc[0] = 0.0
        for t in range(tiles):
            s = t % STAGES
            mbarrier_wait(full[s], t // STAGES % 2)
            for r in range(TILE):
                acc[0] = acc[0] + ring[s, r, threadIdx.x - 32]
            mbarrier_arrive(empty[s])
        out[threadIdx.x - 32] = acc[0]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("rows", [16, 100, 161])
def test_producer_consumer_ring(device, rows):
    a = RNG.standard_normal((rows, 32)).astype(np.float32)
    got = run_on(device, ring_sum, a, np.zeros(32, np.float32))[1]
    np.testing.assert_allclose(got, a.sum(0), rtol=1e-5, atol=1e-5)


def test_ring_builds_for_sm_90a():
    built_for_cuda(ring_sum, "sm_90a", [
        "mbarrier.init.shared::cta.b64", "fence.mbarrier_init.release.cluster",
        "mbarrier.arrive.expect_tx.shared::cta.b64", "mbarrier.arrive.shared::cta.b64",
        "mbarrier.try_wait.parity.shared::cta.b64", "trap;",                 # a deadlock fails, not hangs
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes",
        ".param .align 64 .b8 ring_sum_param_3[128]"])   # a, out, m, then the tensor map
    built = built_for_cuda(box_copy(64, 32, 128), "sm_90a")
    assert "__align__(1024) unsigned char tm_smem[]" in built.source


def test_tma_needs_sm_90_and_cuda():
    with pytest.raises(UnsupportedError, match=r"tma_load\(\) needs sm_90 or newer, not cuda:sm_80|"
                                               r"mbarrier_init\(\) needs sm_90 or newer, not cuda:sm_80"):
        ring_sum.build("cuda", arch="sm_80")
    with pytest.raises(UnsupportedError, match=r"belongs to NVIDIA Hopper's copy engine \(TMA\) and its barriers, "
                                               r"with no HIP equivalent on hip:gfx90a"):
        ring_sum.build("hip", arch="gfx90a")


def test_tensor_maps_one_per_tensor_and_box():
    @taskmap.kernel
    def two_maps(a: f32[m, k], b: f32[m, k], out: f32[m, k]):
        attrs.block_dim = 32
        sa = shared_tensor(f32, [2, 8, 32])
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
            mbarrier_arrive(bar[0], 3 * 8 * 32 * 4)
            tma_load(sa[0, 0, 0], b[0, 0], bar[0], 8, 32)
            tma_load(sa[1, 0, 0], b[8, 0], bar[0], 8, 32)      # the same map
            tma_load(sa[1, 0, 0], a[0, 0], bar[0], 8, 32)      # another tensor: a second
        mbarrier_wait(bar[0], 0)
        out[0, threadIdx.x] = sa[0, 0, threadIdx.x] + sa[1, 0, threadIdx.x]

    func = two_maps.lower().entry_function
    assert tensor_maps(func) == (TensorMapSpec(1, 8, 32, 0), TensorMapSpec(0, 8, 32, 0))
    source = two_maps.build("cuda", arch="sm_90a").source
    assert "int32_t k, const __grid_constant__ tm_tensor_map tm_map0, const __grid_constant__ tm_tensor_map " \
           "tm_map1)" in source


def test_tensor_map_geometry_and_refusals():
    func = box_copy(16, 32).lower().entry_function
    spec = tensor_maps(func)[0]
    # values: a, out (addresses), then the sizes m, k, nb in the kernel's order
    sizes = {sv.name: v for sv, v in zip(func.size_vars, (0, 0, 0))}
    order = [sv.name for sv in func.size_vars]
    values = [0x10000, 0x20000] + [{"m": 37, "k": 68, "nb": 6}[n] for n in order]
    assert sizes and box_geometry(func, spec, values) == (0x10000, (68, 37, 1), (272, 272 * 37), 4)
    values[order.index("k") + 2] = 67
    with pytest.raises(LaunchError, match=r"tma_load\(\) reads 'a' \(37x67 f32 at 0x10000\) through a tensor map, "
                                          r"which needs a 16-byte aligned address and rows of a multiple of 16 bytes"):
        box_geometry(func, spec, values)
    values[order.index("k") + 2] = 68
    values[0] = 0x10004
    with pytest.raises(LaunchError, match="16-byte aligned address"):
        box_geometry(func, spec, values)


def test_unaligned_rows_fault_in_emulation():
    a = RNG.standard_normal((16, 33)).astype(np.float32)     # rows of 132 bytes: no tensor map
    with pytest.raises(TaskmapError, match="misaligned address"):
        box_copy(16, 32)(a, np.zeros((2, 16, 32), np.float32))


def test_deadlock_is_reported():
    @taskmap.kernel
    def never(out: f32[32]):
        attrs.block_dim = 32
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 2)
        syncthreads()
        if threadIdx.x == 0:
            mbarrier_arrive(bar[0])            # one of the two arrivals the phase needs
        mbarrier_wait(bar[0], 0)
        out[threadIdx.x] = 1.0

    with pytest.raises(TaskmapError, match=r"deadlock: every live thread of a block waits on an mbarrier phase"):
        never(np.zeros(32, np.float32))


def test_extra_arrival_is_reported():
    @taskmap.kernel
    def extra(out: f32[32]):
        attrs.block_dim = 32
        bar = shared_tensor(u64, [1])
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
        syncthreads()
        if threadIdx.x < 2:
            mbarrier_arrive(bar[0], 64)      # the second arrival finds none pending (bytes outstanding)
        out[threadIdx.x] = 1.0

    with pytest.raises(TaskmapError, match=r"mbarrier_arrive\(\) on a barrier with no arrival pending"):
        extra(np.zeros(32, np.float32))


def test_reading_before_the_wait_reads_stale_data():
    """The emulation lands a copy when its barrier is waited for: a tile read before that holds what
    it held (here: what the kernel wrote first), as it might on a GPU."""
    @taskmap.kernel
    def early(a: f32[8, 32], out: f32[32]):
        attrs.block_dim = 32
        tile = shared_tensor(f32, [8, 32])
        bar = shared_tensor(u64, [1])
        tile[0, threadIdx.x] = -1.0
        if threadIdx.x == 0:
            mbarrier_init(bar[0], 1)
        syncthreads()
        if threadIdx.x == 0:
            mbarrier_arrive(bar[0], 8 * 32 * 4)
            tma_load(tile[0, 0], a[0, 0], bar[0], 8, 32)
            for c in range(32):
                out[c] = tile[0, c]                        # wrong: before mbarrier_wait
        mbarrier_wait(bar[0], 0)

    out = np.zeros(32, np.float32)
    early(RNG.standard_normal((8, 32)).astype(np.float32), out)
    np.testing.assert_array_equal(out, -1.0)


def test_tma_misuse_is_a_clear_error():
    def into_registers(a: f32[8, 32]):
        regs = register_tensor(f32, [8, 32])
        bar = shared_tensor(u64, [1])
        tma_load(regs[0, 0], a[0, 0], bar[0], 8, 32)

    def wide_swizzle(a: f32[8, 64]):
        tile = shared_tensor(f32, [8, 64])
        bar = shared_tensor(u64, [1])
        tma_load(tile[0, 0], a[0, 0], bar[0], 8, 64, 128)

    def big_box(a: f32[300, 32]):
        tile = shared_tensor(f32, [300, 32])
        bar = shared_tensor(u64, [1])
        tma_load(tile[0, 0], a[0, 0], bar[0], 300, 32)

    def f32_barrier(a: f32[8, 32]):
        tile = shared_tensor(f32, [8, 32])
        bar = shared_tensor(f32, [2])
        tma_load(tile[0, 0], a[0, 0], bar[0], 8, 32)

    def misaligned_tile(a: f32[8, 32]):
        tile = shared_tensor(f32, [10, 32])
        bar = shared_tensor(u64, [1])
        tma_load(tile[1, 4], a[0, 0], bar[0], 8, 32)

    def expect(fn, message):        # the error points at the tma_load call, three lines into fn
        from taskmap.errors import DSLError
        from taskmap.lang import transpile
        with pytest.raises(DSLError) as info:
            transpile(fn)
        assert message in info.value.msg, info.value.msg
        assert info.value.lineno == fn.__code__.co_firstlineno + 3

    expect(into_registers, "the destination of tma_load() must be a shared tensor element, 'regs' is "
                                     "register")
    expect(wide_swizzle, "the swizzle of tma_load() is 0 or 128 (rows of exactly 128 bytes), got 128 with "
                                   "rows of 256 bytes")
    expect(big_box, "a tma_load() box is rows x cols with both at most 256")
    expect(f32_barrier, "the barrier of tma_load() is a u64 shared tensor element; 'bar' is shared f32")
    expect(misaligned_tile, "tma_load() needs a 128-byte aligned address, but element 36 of 'tile'")


@taskmap.kernel
def named_exchange(a: f32[64], out: f32[96]):
    """Warps 0 and 1 swap halves of a through shared memory behind a named barrier of 64 threads;
    warp 2 waits for them on an mbarrier (no syncthreads after the start: it is not held)."""
    attrs.block_dim = 96
    buf = shared_tensor(f32, [64])
    done = shared_tensor(u64, [1])
    if threadIdx.x == 0:
        mbarrier_init(done[0], 2)
    syncthreads()
    if threadIdx.x < 64:
        buf[threadIdx.x] = a[threadIdx.x] * 2.0
        bar_sync(1, 64)
        out[threadIdx.x] = buf[63 - threadIdx.x]
        bar_sync(1, 64)
        if threadIdx.x % 32 == 0:
            mbarrier_arrive(done[0])
    else:
        mbarrier_wait(done[0], 0)
        out[threadIdx.x] = out[threadIdx.x - 64] + 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_named_barrier_holds_only_its_warps(device):
    a = RNG.standard_normal(64).astype(np.float32)
    got = run_on(device, named_exchange, a, np.zeros(96, np.float32))[1]
    want = np.concatenate([2 * a[::-1], 2 * a[::-1][:32] + 1])
    np.testing.assert_array_equal(got, want)


def half_block(count):
    @taskmap.kernel
    def halves(out: f32[64]):
        attrs.block_dim = 64
        if threadIdx.x < 32:
            out[threadIdx.x] = 1.0
            bar_sync(2, count)
    return halves


def test_named_barrier_builds_for_cuda_only():
    built = built_for_cuda(half_block(32), "sm_80", ["bar.sync"])
    assert 'asm volatile("bar.sync %0, %1;\\n" :: "r"(2), "r"((int)(32)) : "memory")' in built.source
    with pytest.raises(UnsupportedError, match=r"bar_sync\(\) \(a named barrier among some warps\) has no "
                                               r"equivalent on hip:gfx90a"):
        half_block(32).build("hip", arch="gfx90a")


def test_named_barrier_faults():
    out = np.zeros(64, np.float32)
    half_block(32)(out)                                       # one warp: complete
    np.testing.assert_array_equal(out[:32], 1.0)
    with pytest.raises(TaskmapError, match="deadlock"):      # waits for a second warp that never comes
        half_block(64)(out)
    with pytest.raises(TaskmapError, match=r"bar_sync\(\) with a thread count that is not a positive multiple of the "
                                           r"warp size"):
        half_block(48)(out)
    with pytest.raises(taskmap.errors.DSLError, match=r"bar_sync\(\) names barrier 1 to 15 \(0 is syncthreads\(\)\)"):
        @taskmap.kernel
        def zero(out: f32[64]):
            bar_sync(0, 64)


def test_tma_source_must_be_a_global_tensor():
    from taskmap.errors import DSLError
    from taskmap.lang import transpile

    def from_shared(a: f32[8, 32]):
        src = shared_tensor(f32, [8, 32])
        tile = shared_tensor(f32, [8, 32])
        bar = shared_tensor(u64, [1])
        tma_load(tile[0, 0], src[0, 0], bar[0], 8, 32)

    with pytest.raises(DSLError, match=r"the source of tma_load\(\) is an element of a global tensor of rank 2 or 3; "
                                       r"'src' is shared"):
        transpile(from_shared)


def test_launcher_appends_the_tensor_maps(monkeypatch):
    """The CUDA launch path without a GPU: the launcher packs the parameters and sizes, then one
    tensor map per spec (encoded once per address and sizes), in the kernel's order."""
    import ctypes

    from taskmap.backends.cuda import tensor_map
    from taskmap.backends.cuda.tensor_map import TensorMaps
    from taskmap.backends.gpu_launch import GpuLauncher

    encoded = []

    def fake_encode(dtype, address, dims, strides, box, swizzle):
        encoded.append((dtype, address, dims, strides, box, swizzle))
        return (ctypes.c_ubyte * 128)(*([len(encoded)] * 128))

    monkeypatch.setattr(tensor_map, "encode_tiled", fake_encode)
    func = ring_sum.lower().entry_function
    launched = []
    launcher = GpuLauncher(func, lambda device: "fn", lambda fn, grid, block, smem, stream, args: launched.append(args),
                           extra_args=TensorMaps(func))
    values = [0x1000, 0x2000, 100]                 # a, out, m
    for _ in range(2):
        launcher(values, (1, 1, 1), (64, 1, 1), 0, None)
    assert encoded == [("float32", 0x1000, (32, 100, 1), (128, 12800), (32, 16, 1), 0)]   # once: cached
    args = launched[-1]
    assert [a.value for a in args[:3]] == [0x1000, 0x2000, 100] and bytes(args[3])[:2] == b"\x01\x01"
    launcher([0x1000, 0x2000, 120], (1, 1, 1), (64, 1, 1), 0, None)       # new sizes: a new map
    assert len(encoded) == 2 and encoded[1][2] == (32, 120, 1)
