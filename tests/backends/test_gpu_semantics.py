"""GPU-style kernels run on the CPU with the GPU's semantics: threads, blocks, shared memory and
barriers (every thread a fiber; ``syncthreads()`` switches fibers), compared with numpy."""
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import attrs, blockDim, blockIdx, f32, i32, register_tensor, shared_tensor, syncthreads, threadIdx
from taskmap.testing import arrays, assert_close, shapes

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(99)


def rand(*shape):
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(EXAMPLES))
    try:
        import cooperative_load
        import matmul_gpu
        import vec_add
        yield cooperative_load, matmul_gpu, vec_add
    finally:
        sys.path.remove(str(EXAMPLES))


@taskmap.kernel
def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i] + b[i]


def test_vec_add_design_section_1(examples):
    a, b = rand(1024), rand(1024)
    for kern in (vec_add, examples[2].vec_add):
        c = np.full_like(a, np.nan)
        kern(a, b, c)
        assert_close(c, a + b)


LOAD = repeat(4, 1) * spatial(16, 8)      # the paper's Figure 8: 128 threads load a 64x8 tile
STORE = repeat(1, 4) * spatial(8, 16)     # the transposed 8x64 tile


@taskmap.kernel
def load_tiles(a: f32["t", 64, 8], out: f32["t", 8, 64]):
    attrs.grid_dim = a.shape[0]
    attrs.block_dim = 128
    tile = shared_tensor(f32, [64, 8])
    for i, k in LOAD.on(threadIdx.x):
        tile[i, k] = a[blockIdx.x, i, k]
    syncthreads()
    for k, i in STORE.on(threadIdx.x):
        out[blockIdx.x, k, i] = tile[i, k]


@given(tiles=st.integers(1, 9))
@FEW
def test_cooperative_load_through_shared_memory_transposed(tiles, examples):
    a = rand(tiles, 64, 8)
    out = np.full((tiles, 8, 64), np.nan, np.float32)
    load_tiles(a, out)
    assert np.array_equal(out, a.transpose(0, 2, 1))
    assert LOAD.worker2task(9) == [(1, 1), (17, 1), (33, 1), (49, 1)]
    single = np.full((8, 64), np.nan, np.float32)
    examples[0].load_tile(a[0], single)
    assert np.array_equal(single, a[0].T)


THREADS = 128


@taskmap.kernel
def row_sum_while(a: f32["rows", "w"], out: f32["rows"]):
    attrs.grid_dim = a.shape[0]
    attrs.block_dim = THREADS
    buf = shared_tensor(f32, [THREADS])
    t = threadIdx.x
    part = 0.0
    j = t
    while j < a.shape[1]:   # threads past the width add nothing
        part += a[blockIdx.x, j]
        j += THREADS
    buf[t] = part
    syncthreads()
    stride = THREADS // 2
    while stride > 0:
        if t < stride:
            buf[t] = buf[t] + buf[t + stride]
        syncthreads()
        stride = stride // 2
    if t == 0:
        out[blockIdx.x] = buf[0]


@taskmap.kernel
def row_max_for(a: f32["rows", "w"], out: f32["rows"]):
    attrs.grid_dim = a.shape[0]
    attrs.block_dim = THREADS
    buf = shared_tensor(f32, [THREADS])
    t = threadIdx.x
    buf[t] = a[blockIdx.x, t] if t < a.shape[1] else -1e30
    for j in range(THREADS + t, a.shape[1], THREADS):
        buf[t] = max(buf[t], a[blockIdx.x, j])
    syncthreads()
    for level in range(7):                # 64, 32, ..., 1
        stride = 64 >> level
        if t < stride:
            buf[t] = max(buf[t], buf[t + stride])
        syncthreads()
    out[blockIdx.x] = buf[0]              # every thread reads the result after the last barrier


@given(arrays(np.float32, st.tuples(st.integers(1, 12), st.integers(0, 200).map(lambda k: 2 * k + 1))))
@FEW
def test_block_tree_reduction_in_shared_memory(a):
    rows = a.shape[0]
    sums, maxs = np.full(rows, np.nan, np.float32), np.full(rows, np.nan, np.float32)
    row_sum_while(a, sums)
    row_max_for(a, maxs)
    assert_close(sums, a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert np.array_equal(maxs, a.max(axis=1))


@taskmap.kernel
def rotate_after_divergence(a: f32[96], out: f32[96], extra: i32[96]):
    attrs.block_dim = 96
    buf = shared_tensor(f32, [96])
    t = threadIdx.x
    v = a[t]
    if t % 3 == 0:                      # a third of the threads do much more work first
        steps = 0
        for k in range(50 + t):
            v = v * 0.5 + 1.0
            steps += 1
        extra[t] = steps
    elif t % 3 == 1:
        extra[t] = -1
    else:
        extra[t] = -2
    buf[t] = v
    syncthreads()
    out[t] = buf[(t + 1) % 96]          # right only if every thread wrote before anyone read


def test_barrier_after_divergent_code():
    a = rand(96)
    out, extra = np.full(96, np.nan, np.float32), np.zeros(96, np.int32)
    rotate_after_divergence(a, out, extra)
    v = a.copy()
    for t in range(0, 96, 3):
        for _ in range(50 + t):
            v[t] = v[t] * np.float32(0.5) + np.float32(1.0)
    assert_close(out, np.roll(v, -1))
    assert extra.tolist() == [50 + t if t % 3 == 0 else -1 - (t % 3 == 2) for t in range(96)]


@taskmap.kernel
def grid_2d(a: f32["h", "w"], out: f32["h", "w"], who: i32["h", "w"]):
    attrs.grid_dim = ((a.shape[1] + 7) // 8, (a.shape[0] + 3) // 4)
    attrs.block_dim = (8, 4)
    r = blockIdx.y * 4 + threadIdx.y
    c = blockIdx.x * 8 + threadIdx.x
    if r < a.shape[0] and c < a.shape[1]:
        out[r, c] = a[r, c] * 2.0 + 1.0
        who[r, c] = ((blockIdx.y * 1000 + blockIdx.x) * 100 + threadIdx.y) * 10 + threadIdx.x


@taskmap.kernel
def block_3d_with_barrier(out: i32[2, 3, 4], nxt: i32[2, 3, 4]):
    attrs.block_dim = (4, 3, 2)
    buf = shared_tensor(i32, [24])
    lin = (threadIdx.z * 3 + threadIdx.y) * 4 + threadIdx.x
    out[threadIdx.z, threadIdx.y, threadIdx.x] = lin
    buf[lin] = lin * 7
    syncthreads()
    nxt[threadIdx.z, threadIdx.y, threadIdx.x] = buf[(lin + 5) % 24]


@given(shapes(2, 2, max_side=45))
@FEW
def test_multi_block_2d_grid(shape):
    a = rand(*shape)
    out, who = np.full_like(a, np.nan), np.full(shape, -1, np.int32)
    grid_2d(a, out, who)
    assert_close(out, a * 2 + 1)
    r, c = np.indices(shape)
    assert (who == (((r // 4) * 1000 + c // 8) * 100 + r % 4) * 10 + c % 8).all()


@taskmap.kernel
def grid_3d_no_barrier(out: i32[3, 2, 2, 2, 3, 4]):
    attrs.grid_dim = (2, 2, 3)
    attrs.block_dim = (4, 3, 2)
    out[blockIdx.z, blockIdx.y, blockIdx.x, threadIdx.z, threadIdx.y, threadIdx.x] = \
        ((blockIdx.z * 2 + blockIdx.y) * 2 + blockIdx.x) * 24 + (threadIdx.z * 3 + threadIdx.y) * 4 + threadIdx.x


def test_3d_block_and_grid_indices_with_and_without_fibers():
    out, nxt = np.full((2, 3, 4), -1, np.int32), np.full((2, 3, 4), -1, np.int32)
    block_3d_with_barrier(out, nxt)
    assert out.ravel().tolist() == list(range(24))
    assert nxt.ravel().tolist() == [((t + 5) % 24) * 7 for t in range(24)]
    big = np.full((3, 2, 2, 2, 3, 4), -1, np.int32)
    grid_3d_no_barrier(big)
    assert big.ravel().tolist() == list(range(big.size))


@taskmap.kernel
def reverse_in_one_block(a: f32["n"], out: f32["n"]):
    attrs.block_dim = a.shape[0]             # as many threads as elements, known at launch
    buf = shared_tensor(f32, [1024])
    buf[threadIdx.x] = a[threadIdx.x]
    syncthreads()
    out[threadIdx.x] = buf[a.shape[0] - 1 - threadIdx.x]


@given(arrays(np.float32, shapes(1, 1, max_side=1024)))
@FEW
def test_block_dim_from_a_symbolic_size(a):
    out = np.full_like(a, np.nan)
    reverse_in_one_block(a, out)
    assert np.array_equal(out, a[::-1])


FEW_WORKERS = spatial(4, 8) * repeat(2, 2)   # 32 workers cover an 8x16 tile; the block has 100 threads


@taskmap.kernel
def fewer_workers(a: f32[8, 16], out: f32[12, 20], owner: i32[12, 20]):
    attrs.block_dim = 100
    for i, j in FEW_WORKERS.on(threadIdx.x):
        out[i, j] = a[i, j] + 1.0
        owner[i, j] = threadIdx.x


@taskmap.kernel
def fewer_workers_sync(a: f32[8, 16], out: f32[12, 20]):
    attrs.block_dim = 100
    tile = shared_tensor(f32, [8, 16])
    for i, j in FEW_WORKERS.on(threadIdx.x):
        tile[i, j] = a[i, j]
    syncthreads()
    for i, j in FEW_WORKERS.on(threadIdx.x):
        out[i, j] = tile[7 - i, 15 - j]


def test_mapping_with_fewer_workers_than_threads():
    a = rand(8, 16)
    out, owner = np.full((12, 20), np.nan, np.float32), np.full((12, 20), -1, np.int32)
    fewer_workers(a, out, owner)
    assert_close(out[:8, :16], a + 1)
    assert np.isnan(out[8:]).all() and np.isnan(out[:, 16:]).all()       # sentinels untouched
    want = np.full((12, 20), -1, np.int32)
    for w in range(FEW_WORKERS.num_workers):
        for t in FEW_WORKERS.worker2task(w):
            want[t] = w
    assert (owner == want).all()                                       # threads >= 32 wrote nothing
    out2 = np.full((12, 20), np.nan, np.float32)
    fewer_workers_sync(a, out2)
    assert_close(out2[:8, :16], a[::-1, ::-1])
    assert np.isnan(out2[8:]).all() and np.isnan(out2[:, 16:]).all()


@taskmap.kernel
def early_return(a: f32[64], out: f32[64], live: i32):
    attrs.block_dim = 64
    buf = shared_tensor(f32, [64])
    t = threadIdx.x
    if t >= live:
        return                           # exited threads do not hold the barrier up
    buf[t] = a[t] * 3.0
    syncthreads()
    out[t] = buf[(t + 1) % live]
    syncthreads()
    buf[t] = out[t] + 1.0
    syncthreads()
    out[t] = buf[(t + live - 1) % live]


@given(st.integers(1, 64))
@FEW
def test_threads_returning_early_before_barriers(live):
    a = rand(64)
    out = np.full(64, np.nan, np.float32)
    early_return(a, out, live)
    first = np.roll(a[:live] * 3, -1)
    assert_close(out[:live], np.roll(first + 1, 1))
    assert np.isnan(out[live:]).all()


@pytest.mark.parametrize("mnk", [(1, 1, 1), (7, 3, 5), (130, 129, 17), (200, 257, 77)])
def test_double_buffered_simt_matmul_odd_sizes(mnk, examples):
    m, n, k = mnk
    a, b = rand(m, k), rand(k, n)
    c = np.full((m, n), np.nan, np.float32)
    examples[1].matmul(a, b, c)
    assert_close(c, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4 * np.sqrt(k))


@taskmap.func
def big_local_sum(a: f32[8], i: i32) -> f32:
    r = register_tensor(f32, [40000])     # 160 KB: more than a fiber's base stack
    for j in range(40000):
        r[j] = a[i] + f32(j % 7)
    s = 0.0
    for j in range(0, 40000, 997):
        s += r[j]
    return s


@taskmap.kernel
def helper_registers_across_barrier(a: f32[8], out: f32[8]):
    attrs.block_dim = 8
    buf = shared_tensor(f32, [8])
    buf[threadIdx.x] = big_local_sum(a, threadIdx.x)
    syncthreads()
    out[threadIdx.x] = buf[(threadIdx.x + 3) % 8]


def test_helper_register_tensors_fit_on_fiber_stacks():
    a = rand(8)
    out = np.full(8, np.nan, np.float32)
    helper_registers_across_barrier(a, out)
    js = np.arange(0, 40000, 997)
    sums = np.array([np.float32(0) + np.sum(a[i] + (js % 7).astype(np.float32)) for i in range(8)])
    assert_close(out, np.roll(sums, -3), rtol=1e-5, atol=1e-4)


def test_launches_from_several_python_threads(examples):
    def job(seed):
        rng = np.random.default_rng(seed)
        m, n, k = (int(x) for x in rng.integers(1, 140, 3))
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        c = np.full((m, n), np.nan, np.float32)
        examples[1].matmul(a, b, c)
        return float(np.abs(c - a @ b).max() / np.sqrt(k))

    with ThreadPoolExecutor(4) as pool:
        errors = list(pool.map(job, range(12)))
    assert max(errors) < 1e-4


@taskmap.func
def global_id() -> i32:
    return blockIdx.x * blockDim.x + threadIdx.x


@taskmap.func
def put(t: f32[64], i: i32, v: f32):
    t[i] = v


@taskmap.func
def sync_then_read(s: f32[32], i: i32) -> f32:
    syncthreads()                          # a barrier inside a helper: the kernel runs threads as fibers
    return s[i]


@taskmap.kernel
def helper_reads_indices(out: f32[64]):
    attrs.grid_dim = 2
    attrs.block_dim = 32
    put(out, global_id(), f32(global_id() * 2 + blockIdx.x))


@taskmap.kernel
def helper_barrier(a: f32[64], out: f32[64]):
    attrs.grid_dim = 2
    attrs.block_dim = 32
    s = shared_tensor(f32, [32])
    s[threadIdx.x] = a[global_id()]
    out[global_id()] = sync_then_read(s, 31 - threadIdx.x)


def test_helpers_reading_thread_indices_and_holding_barriers():
    out = np.full(64, np.nan, np.float32)
    helper_reads_indices(out)
    assert out.tolist() == [2 * t + t // 32 for t in range(64)]
    a = rand(64)
    out = np.full(64, np.nan, np.float32)
    helper_barrier(a, out)
    assert np.array_equal(out, a.reshape(2, 32)[:, ::-1].ravel())
