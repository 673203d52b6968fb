"""One test per DSL construct, run through the CPU backend and compared with numpy on random data.

Scalar types (math builtins, casts, // and %, integer widths, f16/bf16) are in test_cpu_types.py.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import (attrs, blockDim, blockIdx, bool_, erf, f32, f64, gridDim, i32, i64, parallel,
                          register_tensor, shared_tensor, syncthreads, threadIdx, unroll, vectorize)
from taskmap.testing import arrays, assert_close, shapes

FEW = settings(max_examples=12, deadline=None)
SOME = settings(max_examples=20, deadline=None)
RNG = np.random.default_rng(1234)


def rand(*shape, dtype=np.float32, lo=-2.0, hi=2.0):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# ----------------------------------------------------------------------------- loops


@taskmap.kernel
def range_orders(start: i32, stop: i32, up: i32[64], down: i32[64], counts: i32[2]):
    n = 0
    for i in range(start, stop, 3):
        up[n] = i
        n += 1
    counts[0] = n
    m = 0
    for i in range(stop, start, -2):
        down[m] = i
        m += 1
    counts[1] = m


@given(st.integers(-40, 40), st.integers(-40, 40))
@SOME
def test_range_start_stop_step_incl_negative(start, stop):
    up, down = np.full(64, -999, np.int32), np.full(64, -999, np.int32)
    counts = np.zeros(2, np.int32)
    range_orders(start, stop, up, down, counts)
    want_up, want_down = list(range(start, stop, 3)), list(range(stop, start, -2))
    assert counts.tolist() == [len(want_up), len(want_down)]
    assert up[: len(want_up)].tolist() == want_up and (up[len(want_up):] == -999).all()
    assert down[: len(want_down)].tolist() == want_down and (down[len(want_down):] == -999).all()


@taskmap.kernel
def lower_triangle(a: f32["n", "n"], out: f32["n", "n"]):
    for i in range(a.shape[0]):
        for j in range(a.shape[1]):
            out[i, j] = 0.0
        for j in range(i + 1):
            out[i, j] = a[i, j] * 2.0 + a[j, i]


@given(st.integers(1, 40))
@FEW
def test_nested_loops_triangular(n):
    a = rand(n, n)
    out = np.full((n, n), np.nan, np.float32)
    lower_triangle(a, out)
    assert_close(out, np.tril(a * 2 + a.T))


MAP2 = spatial(2, 3) * repeat(2, 2) * spatial(1, 2)
MAP_COL = spatial(3, 2, ranks=[1, 0]) * repeat(2, 3, ranks=[1, 0])


@taskmap.kernel
def mapping_on_worker(out2: i32[MAP2.task_shape], outc: i32[MAP_COL.task_shape], out1: i32[12]):
    for w in range(MAP2.num_workers):
        for i, j in MAP2.on(w):
            out2[i, j] = w
    for w in range(MAP_COL.num_workers):
        for i, j in MAP_COL.on(w):
            outc[i, j] = w
    for w in range(4):
        for i in (spatial(4) * repeat(3)).on(w):
            out1[i] = w * 100 + i


def owner_grid(m):
    want = np.full(m.task_shape, -1, np.int32)
    for w in range(m.num_workers):
        for t in m.worker2task(w):
            want[t] = w
    return want


def test_mapping_on_worker_one_and_several_loop_vars():
    out2, outc = np.full(MAP2.task_shape, -1, np.int32), np.full(MAP_COL.task_shape, -1, np.int32)
    out1 = np.full(12, -1, np.int32)
    mapping_on_worker(out2, outc, out1)
    assert (out2 == owner_grid(MAP2)).all()
    assert (outc == owner_grid(MAP_COL)).all()
    assert out1.tolist() == [(i // 3) * 100 + i for i in range(12)]


SEQ_MAP = spatial(2, 2) * repeat(2, 3, ranks=[1, 0])
PAR_MAP = spatial(5, 3) * repeat(2, 2)
VEC_MAP = repeat(3, 2) * spatial(1, 8)


@taskmap.kernel
def mapping_all_workers(a: f32[10, 6], order: i32[SEQ_MAP.task_shape], par: f32[10, 6], vec: f32[3, 16]):
    n = 0
    for i, j in SEQ_MAP:
        order[i, j] = n
        n += 1
    for i, j in PAR_MAP.parallel():
        par[i, j] = a[i, j] * 3.0 + 1.0
    for i, j in VEC_MAP.vectorize():
        vec[i, j] = a[i, j % 6] - a[i + 1, j % 6]


def test_mapping_plain_parallel_vectorize_cpu():
    a = rand(10, 6)
    order = np.full(SEQ_MAP.task_shape, -1, np.int32)
    par, vec = np.full((10, 6), np.nan, np.float32), np.full((3, 16), np.nan, np.float32)
    mapping_all_workers(a, order, par, vec)
    want = np.full(SEQ_MAP.task_shape, -1, np.int32)
    for n, t in enumerate(SEQ_MAP):  # plain iteration: worker after worker, in task order
        want[t] = n
    assert (order == want).all()
    assert_close(par, a * 3 + 1)
    j = np.arange(16) % 6
    assert_close(vec, a[:3, j] - a[1:4, j])


@taskmap.kernel
def range_kinds(a: f32["n", 8], out: f32["n", 8], rows: f32["n"], strided: f32[2]):
    for i in parallel(a.shape[0]):
        for j in unroll(8):
            out[i, j] = a[i, j] * a[i, j]
    for i in vectorize(a.shape[0]):
        rows[i] = a[i, 0] + a[i, 7]
    s = 0.0
    for j in unroll(1, 8, 3):
        s += a[0, j]
    strided[0] = s
    for j in unroll(7, -1, -4):
        s -= a[0, j]
    strided[1] = s


@given(arrays(np.float32, shapes(1, 1, max_side=200)))
@FEW
def test_unroll_parallel_vectorize_range_loops(col):
    n = col.shape[0]
    a = np.repeat(col[:, None], 8, axis=1) * np.arange(1, 9, dtype=np.float32)
    out, rows, strided = np.empty_like(a), np.empty(n, np.float32), np.empty(2, np.float32)
    range_kinds(a, out, rows, strided)
    assert_close(out, a * a)
    assert_close(rows, a[:, 0] + a[:, 7])
    s = a[0, 1] + a[0, 4] + a[0, 7]
    assert_close(strided, np.array([s, s - a[0, 7] - a[0, 3]]), rtol=1e-5, atol=1e-4)


# ----------------------------------------------------------------------------- control flow and locals


@taskmap.kernel
def piecewise(a: f32["n"], out: f32["n"]):
    for i in range(a.shape[0]):
        x = a[i]
        if x < -1.0:
            out[i] = -1.0
        elif x < 0.0:
            out[i] = x * x
        elif x < 1.0:
            out[i] = 2.0 * x
        else:
            out[i] = x + 1.0


@given(arrays(np.float32, shapes(1, 1, max_side=300)))
@FEW
def test_if_elif_else(a):
    out = np.empty_like(a)
    piecewise(a, out)
    want = np.select([a < -1, a < 0, a < 1], [np.float32(-1), a * a, 2 * a], a + 1)
    assert_close(out, want)


@taskmap.kernel
def while_break_continue(a: i32["r", "c"], first: i32["r"], npos: i32["r"], steps: i32["r"]):
    for r in range(a.shape[0]):
        first[r] = -1
        for j in range(a.shape[1]):
            if a[r, j] > 50:
                first[r] = j
                break
        count = 0
        for j in range(a.shape[1]):
            if a[r, j] <= 0:
                continue
            count += 1
        npos[r] = count
        x = a[r, 0] * a[r, 0] + 1
        s = 0
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            s += 1
        steps[r] = s


def collatz(x):
    s = 0
    while x != 1:
        x = x // 2 if x % 2 == 0 else 3 * x + 1
        s += 1
    return s


@given(arrays(np.int32, shapes(2, 2, max_side=30)))
@FEW
def test_while_break_continue(a):
    r = a.shape[0]
    first, npos, steps = (np.empty(r, np.int32) for _ in range(3))
    while_break_continue(a, first, npos, steps)
    want_first = [int(np.argmax(row > 50)) if (row > 50).any() else -1 for row in a]
    assert first.tolist() == want_first
    assert npos.tolist() == (a > 0).sum(axis=1).tolist()
    assert steps.tolist() == [collatz(int(v) * int(v) + 1) for v in a[:, 0]]


@taskmap.kernel
def running(a: f32["n"], csum: f32["n"], cmax: f32["n"], total: f64[1]):
    s = 0.0
    m = a[0]
    t: f64 = 0.0
    for i in range(a.shape[0]):
        s = s + a[i]
        m = max(m, a[i])
        t += f64(a[i])
        csum[i] = s
        cmax[i] = m
    total[0] = t


@given(arrays(np.float32, shapes(1, 1, max_side=500)))
@FEW
def test_local_scalars_across_iterations(a):
    csum, cmax, total = np.empty_like(a), np.empty_like(a), np.empty(1, np.float64)
    running(a, csum, cmax, total)
    assert_close(csum, np.cumsum(a, dtype=np.float32), rtol=1e-4, atol=1e-4)
    assert_close(cmax, np.maximum.accumulate(a))
    assert_close(total, np.array([a.astype(np.float64).sum()]))


@taskmap.kernel
def augmented(a: i32["n"], b: i32["n"], out: i32["n", 8], f: f32["n"]):
    for i in range(a.shape[0]):
        x = a[i]
        x += b[i]
        x *= 3
        x -= 7
        x //= 4
        out[i, 0] = x
        out[i, 1] = a[i]
        out[i, 1] += b[i]
        out[i, 2] = a[i]
        out[i, 2] *= b[i]
        out[i, 3] = a[i]
        out[i, 3] //= b[i]
        out[i, 4] = a[i]
        out[i, 4] %= b[i]
        out[i, 5] = a[i]
        out[i, 5] -= b[i]
        out[i, 6] = a[i]
        out[i, 6] ^= b[i]
        out[i, 7] = a[i]
        out[i, 7] <<= 2
        f[i] = 1.5
        f[i] /= f32(b[i])
        f[i] **= 2


@given(arrays(np.int32, shapes(1, 1, max_side=100)), st.integers(0, 2**32 - 1))
@FEW
def test_augmented_assignment_scalars_and_elements(a, seed):
    b = np.random.default_rng(seed).integers(-9, 10, size=a.shape).astype(np.int32)
    b[b == 0] = 3
    out, f = np.empty((a.size, 8), np.int32), np.empty(a.size, np.float32)
    augmented(a, b, out, f)
    want = np.stack([((a + b) * 3 - 7) // 4, a + b, a * b, a // b, a % b, a - b, a ^ b, a << 2], axis=1)
    assert (out == want).all()
    assert_close(f, (np.float32(1.5) / b.astype(np.float32)) ** 2)


# ----------------------------------------------------------------------------- tensors


TR = 4


@taskmap.kernel
def row_tiles(a: f32["n", 16], out: f32["n", 16]):
    for r in range(a.shape[0]):
        buf = register_tensor(f32, [TR, 4])
        for i in range(TR):
            for j in range(4):
                buf[i, j] = a[r, i * 4 + j]
        for i in range(TR):
            for j in range(4):
                out[r, j * 4 + i] = buf[i, j] + buf[TR - 1 - i, j]


@given(arrays(np.float32, shapes(2, 2, max_side=16).map(lambda s: (s[0], 16))))
@FEW
def test_register_tensor(a):
    out = np.empty_like(a)
    row_tiles(a, out)
    t = a.reshape(-1, TR, 4)
    assert_close(out, (t + t[:, ::-1, :]).transpose(0, 2, 1).reshape(-1, 16))


@taskmap.kernel
def smem_reverse(a: f32[64], out: f32[64]):
    attrs.block_dim = 64
    s = shared_tensor(f32, [2, 32])
    s[threadIdx.x // 32, threadIdx.x % 32] = a[threadIdx.x]
    syncthreads()
    out[threadIdx.x] = s[(63 - threadIdx.x) // 32, (63 - threadIdx.x) % 32]


def test_shared_tensor():
    a = rand(64)
    out = np.empty_like(a)
    smem_reverse(a, out)
    assert_close(out, a[::-1])


@taskmap.kernel
def index_nd(x1: f32["a"], x2: f32["a", "b"], x3: f32["a", "b", "c"], x4: f32["a", "b", "c", "d"],
             out: f32["a", "b", "c", "d"]):
    for i in range(x4.shape[0]):
        for j in range(x4.shape[1]):
            for k in range(x4.shape[2]):
                for m in range(x4.shape[3]):
                    out[i, j, k, m] = x4[i, j, k, m] + x3[i, j, k] * 10.0 + x2[i, j] * 100.0 + x1[i] * 1000.0


@given(arrays(np.float32, shapes(4, 4, max_side=9, max_elements=2000)))
@FEW
def test_tensor_indexing_1_to_4_dims(x4):
    a, b, c, _ = x4.shape
    x3, x2, x1 = rand(a, b, c), rand(a, b), rand(a)
    out = np.empty_like(x4)
    index_nd(x1, x2, x3, x4, out)
    want = x4 + x3[..., None] * 10 + x2[..., None, None] * 100 + x1[:, None, None, None] * 1000
    assert_close(out, want, rtol=1e-5, atol=1e-3)


# ----------------------------------------------------------------------------- sizes, parameters, helpers

M_, N_ = taskmap.symbol("M_"), taskmap.symbol("N_")


@taskmap.kernel
def sym_sizes(a: f32[M_, N_], b: f32["k", N_], out: f32[M_, N_], colsum: f32["k"]):
    for i in range(M_):
        for j in range(a.shape[1]):
            out[i, j] = a[i, j] * f32(i + 1) - f32(j)
    for r in range(b.shape[0]):
        s = 0.0
        for j in range(N_):
            s += b[r, j]
        colsum[r] = s


@given(shapes(2, 2, max_side=70, odd=True), st.integers(1, 13), st.integers(0, 2**32 - 1))
@SOME
def test_symbolic_sizes_strings_and_symbols(shape, k, seed):
    m, n = shape  # odd sides, biased to 1 and primes
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-2, 2, (m, n)).astype(np.float32), rng.uniform(-2, 2, (k, n)).astype(np.float32)
    out, colsum = np.empty_like(a), np.empty(k, np.float32)
    sym_sizes(a, b, out, colsum)
    assert_close(out, a * np.arange(1, m + 1, dtype=np.float32)[:, None] - np.arange(n, dtype=np.float32))
    assert_close(colsum, b.sum(axis=1), rtol=1e-4, atol=1e-4)


@taskmap.kernel
def interleave(a: f32[M_, N_], b: f32[M_, N_], out: f32[M_, 2 * N_ + 1]):
    for i in range(M_):
        out[i, 2 * N_] = -1.0
        for j in range(N_):
            out[i, 2 * j] = a[i, j]
            out[i, 2 * j + 1] = b[i, j]


@given(shapes(2, 2, max_side=40), st.integers(0, 2**32 - 1))
@FEW
def test_dimensions_derived_from_symbolic_sizes(shape, seed):
    rng = np.random.default_rng(seed)
    a, b = rng.uniform(-2, 2, shape).astype(np.float32), rng.uniform(-2, 2, shape).astype(np.float32)
    out = np.full((shape[0], 2 * shape[1] + 1), np.nan, np.float32)
    interleave(a, b, out)
    want = np.concatenate([np.stack([a, b], axis=2).reshape(shape[0], -1), -np.ones((shape[0], 1))], axis=1)
    assert_close(out, want)


@taskmap.kernel
def scalars(a: f32["n"], out: f32["n"], alpha: f32, beta: f64, shift: i32, big: i64, flag: bool_):
    for i in range(a.shape[0]):
        v = a[i] * alpha + f32(beta) + f32(shift) + f32(big % 1000)
        out[i] = v if flag else -v


@given(arrays(np.float32, shapes(1, 1, max_side=100)), st.floats(-10, 10), st.floats(-1e3, 1e3),
       st.integers(-(2**31), 2**31 - 1), st.integers(-(2**62), 2**62), st.booleans())
@SOME
def test_scalar_parameters_int_and_float(a, alpha, beta, shift, big, flag):
    out = np.empty_like(a)
    scalars(a, out, alpha, beta, shift, big, flag)
    v = a * np.float32(alpha) + np.float32(beta) + np.float32(shift) + np.float32(big % 1000)
    assert_close(out, v if flag else -v, rtol=1e-5, atol=1e-5 * (1 + abs(shift) + abs(beta)))


@taskmap.func
def gelu(x: f32) -> f32:
    return 0.5 * x * (1.0 + erf(x * 0.7071067811865476))


@taskmap.func
def clamp_index(i: i32, n: i32) -> i32:
    if i < 0:
        return 0
    if i >= n:
        return n - 1
    return i


@taskmap.func
def scaled_row(t: f32[8], i: i32) -> f32:
    return t[i] * 2.0 + gelu(t[i])


@taskmap.kernel
def cpu_helpers(a: f32["n"], out: f32["n"], neigh: f32["n"]):
    for i in range(a.shape[0]):
        out[i] = gelu(a[i])
        neigh[i] = a[clamp_index(i - 1, a.shape[0])] + a[clamp_index(i + 1, a.shape[0])]


@taskmap.kernel
def gpu_helpers(a: f32[8], out: f32[8, 8]):
    attrs.block_dim = (8, 8)
    out[threadIdx.y, threadIdx.x] = scaled_row(a, clamp_index(threadIdx.x + threadIdx.y - 3, 8))


def gelu_ref(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))


@given(arrays(np.float32, shapes(1, 1, max_side=200)))
@FEW
def test_device_functions_cpu_and_gpu_style(a):
    n = a.size
    out, neigh = np.empty_like(a), np.empty_like(a)
    cpu_helpers(a, out, neigh)
    assert_close(out, gelu_ref(a))
    idx = np.arange(n)
    assert_close(neigh, a[np.clip(idx - 1, 0, n - 1)] + a[np.clip(idx + 1, 0, n - 1)])
    t, grid = rand(8), np.empty((8, 8), np.float32)
    gpu_helpers(t, grid)
    j = np.clip(np.arange(8)[None, :] + np.arange(8)[:, None] - 3, 0, 7)
    assert_close(grid, t[j] * 2 + gelu_ref(t[j]))


def make_tiled(tile, mapping):
    @taskmap.kernel
    def tiled(a: f32["n", "m"], out: f32["n", "m"]):
        nt = (a.shape[0] + tile - 1) // tile
        for t in range(nt):
            for i, j in mapping:
                if t * tile + i < a.shape[0] and j < a.shape[1]:
                    out[t * tile + i, j] = a[t * tile + i, j] + f32(tile)
    return tiled


CAPTURED = [make_tiled(4, spatial(4, 3)), make_tiled(3, repeat(3, 5) * spatial(1, 2))]


@pytest.mark.parametrize("which", [0, 1])
@given(shapes(2, 2, max_side=6).map(lambda s: (s[0] * 5, s[1])), st.integers(0, 2**32 - 1))
@FEW
def test_python_values_captured_from_closure(which, shape, seed):
    kern, tile, width = CAPTURED[which], (4, 3)[which], (3, 10)[which]
    a = np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)
    if a.shape[1] > width:
        a = np.ascontiguousarray(a[:, :width])
    out = np.full_like(a, np.nan)
    kern(a, out)
    assert_close(out, a + tile)


@taskmap.kernel
def grid_from_sizes(a: f32["rows", "cols"], out: f32["rows", "cols"], dims: i32[4]):
    attrs.grid_dim = ((a.shape[1] + 15) // 16, a.shape[0])
    attrs.block_dim = 16
    j = blockIdx.x * blockDim.x + threadIdx.x
    if j < a.shape[1]:
        out[blockIdx.y, j] = a[blockIdx.y, j] * 2.0
    if blockIdx.x == 0 and blockIdx.y == 0 and threadIdx.x == 0:
        dims[0] = gridDim.x
        dims[1] = gridDim.y
        dims[2] = blockDim.x
        dims[3] = blockDim.y * gridDim.z


@given(shapes(2, 2, max_side=80))
@FEW
def test_grid_dim_from_symbolic_sizes_and_dim_reads(shape):
    a = rand(*shape)
    out, dims = np.full_like(a, np.nan), np.zeros(4, np.int32)
    grid_from_sizes(a, out, dims)
    assert_close(out, a * 2)
    assert dims.tolist() == [(shape[1] + 15) // 16, shape[0], 16, 1]


def test_torch_cpu_tensors_same_as_numpy():
    torch = pytest.importorskip("torch", reason="torch tensors as kernel arguments")
    a = rand(37, 11)
    b = rand(5, 11)
    outs = [np.empty_like(a), np.empty(5, np.float32)]
    sym_sizes(a, b, *outs)
    ta, tb = torch.from_numpy(a.copy()), torch.from_numpy(b.copy())
    touts = [torch.empty(37, 11), torch.empty(5)]
    sym_sizes(ta, tb, *touts)
    for x, y in zip(outs, touts):
        assert np.array_equal(x, y.numpy())
    x = torch.randn(300)
    outs = [torch.empty_like(x), torch.empty_like(x), torch.empty(1, dtype=torch.float64)]
    running(x, *outs)
    assert_close(outs[1], torch.cummax(x, 0).values)
    assert_close(outs[2], x.double().sum().reshape(1))


@taskmap.kernel
def c_names(exp: f64["n"], sqrt: f64["n"], free: f32[4], malloc: f32[4], _Float16: i32[1]):
    for i in range(exp.shape[0]):
        floor = exp[i] // 0.5                    # a local named like the C function
        int32_t = i * 2
        sqrt[i] = math.exp(exp[i]) + math.sqrt(abs(exp[i])) + floor + f64(int32_t)
    _Float16[0] = 7
    for TM_OK in range(4):
        free[TM_OK] = malloc[3 - TM_OK]


@taskmap.kernel
def c_names_gpu(free: f32[32], aligned_alloc: f32[32]):
    attrs.block_dim = 32
    memset = shared_tensor(f32, [32])
    memset[threadIdx.x] = free[threadIdx.x]
    syncthreads()
    aligned_alloc[threadIdx.x] = memset[31 - threadIdx.x]


def test_user_names_that_are_c_library_names():
    x = rand(9, dtype=np.float64)
    out, f, m, k = np.empty(9), np.empty(4, np.float32), rand(4), np.zeros(1, np.int32)
    c_names(x, out, f, m, k)
    assert_close(out, np.exp(x) + np.sqrt(np.abs(x)) + x // 0.5 + 2 * np.arange(9))
    assert (f == m[::-1]).all() and k[0] == 7
    a, b = rand(32), np.empty(32, np.float32)
    c_names_gpu(a, b)
    assert (b == a[::-1]).all()
