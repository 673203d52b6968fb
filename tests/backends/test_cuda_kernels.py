"""Every GPU-style DSL kernel family, launched with torch CUDA tensors and with taskmap Tensors on
an NVIDIA GPU (``cuda`` marker), compared with numpy.  The same tests run with numpy arrays and
host taskmap Tensors on the CPU backend everywhere, which checks the expectations themselves.

Run the GPU part alone with ``python -m pytest -m cuda tests/``.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import test_cpu_constructs as con
import test_gpu_semantics as sem
from array_kinds import GPU, KINDS, cases, empty, get, is_gpu, put

import taskmap
from taskmap import repeat, spatial
from taskmap.backends.cuda import driver
from taskmap.errors import LaunchError
from taskmap.lang import (
    attrs,
    bf16,
    blockIdx,
    f16,
    f32,
    i32,
    register_tensor,
    shared_tensor,
    syncthreads,
    threadIdx,
    unroll,
)
from taskmap.runtime import kernel as kernel_mod
from taskmap.testing import assert_close

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
RNG = np.random.default_rng(7)


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"taskmap_example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


VEC_ADD, COOP, MATMUL = _example("vec_add"), _example("cooperative_load"), _example("matmul_gpu")


def rand(*shape):
    return RNG.uniform(-2, 2, size=shape).astype(np.float32)


# ----------------------------------------------------------------------------- element-wise, symbolic sizes


@taskmap.kernel
def saxpy(x: f32["n"], y: f32["n"], out: f32["n"], alpha: f32):
    attrs.grid_dim = (x.shape[0] + 255) // 256
    attrs.block_dim = 256
    i = blockIdx.x * 256 + threadIdx.x
    if i < x.shape[0]:
        out[i] = alpha * x[i] + y[i]


@pytest.mark.parametrize("kind", KINDS)
def test_vec_add(kind):
    a, b = rand(1024), rand(1024)
    for kern in (sem.vec_add, VEC_ADD.vec_add):
        c = empty(1024, kind)
        kern(put(a, kind), put(b, kind), c)
        assert_close(get(c), a + b)


@pytest.mark.parametrize("n, kind", cases([1, 255, 257, 100003]) + cases([1 << 22], GPU))
def test_symbolic_size_elementwise(n, kind):
    x, y = rand(n), rand(n)
    out = empty(n, kind)
    saxpy(put(x, kind), put(y, kind), out, 1.5)
    assert_close(get(out), np.float32(1.5) * x + y)


@pytest.mark.parametrize("shape, kind", cases([(1, 1), (2, 17), (45, 80), (97, 1023)]))
def test_grid_from_symbolic_sizes(shape, kind):
    a = rand(*shape)
    out, dims = empty(shape, kind), empty(4, kind, "int32", fill=-1)
    con.grid_from_sizes(put(a, kind), out, dims)
    assert_close(get(out), a * 2)
    assert get(dims).tolist() == [(shape[1] + 15) // 16, shape[0], 16, 1]


@pytest.mark.parametrize("n, kind", cases([1, 31, 1024]))
def test_block_dim_from_a_symbolic_size(n, kind):
    a = rand(n)
    out = empty(n, kind)
    sem.reverse_in_one_block(put(a, kind), out)
    assert np.array_equal(get(out), a[::-1])


# ----------------------------------------------------------------------------- shared memory and barriers


@pytest.mark.parametrize("tiles, kind", cases([1, 9]))
def test_cooperative_load(tiles, kind):
    a = rand(tiles, 64, 8)
    out = empty((tiles, 8, 64), kind)
    sem.load_tiles(put(a, kind), out)
    assert np.array_equal(get(out), a.transpose(0, 2, 1))
    single = empty((8, 64), kind)
    COOP.load_tile(put(a[0], kind), single)
    assert np.array_equal(get(single), a[0].T)


@pytest.mark.parametrize("shape, kind", cases([(1, 1), (5, 3), (12, 401)]))
def test_tree_reductions(shape, kind):
    a = rand(*shape)
    sums, maxs = empty(shape[0], kind), empty(shape[0], kind)
    sem.row_sum_while(put(a, kind), sums)
    sem.row_max_for(put(a, kind), maxs)
    assert_close(get(sums), a.astype(np.float64).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert np.array_equal(get(maxs), a.max(axis=1))


@pytest.mark.parametrize("kind", KINDS)
def test_barrier_after_divergence(kind):
    a = rand(96)
    out, extra = empty(96, kind), empty(96, kind, "int32", fill=0)
    sem.rotate_after_divergence(put(a, kind), out, extra)
    v = a.copy()
    for t in range(0, 96, 3):
        for _ in range(50 + t):
            v[t] = v[t] * np.float32(0.5) + np.float32(1.0)
    assert_close(get(out), np.roll(v, -1))
    assert get(extra).tolist() == [50 + t if t % 3 == 0 else -1 - (t % 3 == 2) for t in range(96)]


@pytest.mark.parametrize("live, kind", cases([1, 17, 64]))
def test_threads_returning_before_barriers(live, kind):
    a = rand(64)
    out = empty(64, kind)
    sem.early_return(put(a, kind), out, live)
    first = np.roll(a[:live] * 3, -1)
    got = get(out)
    assert_close(got[:live], np.roll(first + 1, 1))
    assert np.isnan(got[live:]).all()


@pytest.mark.parametrize("kind", KINDS)
def test_shared_tensor_2d_and_names_of_c_functions(kind):
    a = rand(64)
    out = empty(64, kind)
    con.smem_reverse(put(a, kind), out)
    assert_close(get(out), a[::-1])
    b = rand(32)
    out = empty(32, kind)
    con.c_names_gpu(put(b, kind), out)
    assert np.array_equal(get(out), b[::-1])


@pytest.mark.parametrize("kind", KINDS)
def test_fewer_workers_than_threads(kind):
    a = rand(8, 16)
    out, owner = empty((12, 20), kind), empty((12, 20), kind, "int32", fill=-1)
    sem.fewer_workers(put(a, kind), out, owner)
    got = get(out)
    assert_close(got[:8, :16], a + 1)
    assert np.isnan(got[8:]).all() and np.isnan(got[:, 16:]).all()
    want = np.full((12, 20), -1, np.int32)
    for w in range(sem.FEW_WORKERS.num_workers):
        for t in sem.FEW_WORKERS.worker2task(w):
            want[t] = w
    assert (get(owner) == want).all()
    out2 = empty((12, 20), kind)
    sem.fewer_workers_sync(put(a, kind), out2)
    assert_close(get(out2)[:8, :16], a[::-1, ::-1])


# ----------------------------------------------------------------------------- grids, blocks, helpers


@pytest.mark.parametrize("shape, kind", cases([(1, 1), (13, 45), (45, 13)]))
def test_2d_grid(shape, kind):
    a = rand(*shape)
    out, who = empty(shape, kind), empty(shape, kind, "int32", fill=-1)
    sem.grid_2d(put(a, kind), out, who)
    assert_close(get(out), a * 2 + 1)
    r, c = np.indices(shape)
    assert (get(who) == (((r // 4) * 1000 + c // 8) * 100 + r % 4) * 10 + c % 8).all()


@pytest.mark.parametrize("kind", KINDS)
def test_3d_blocks_and_grids(kind):
    out, nxt = empty((2, 3, 4), kind, "int32", fill=-1), empty((2, 3, 4), kind, "int32", fill=-1)
    sem.block_3d_with_barrier(out, nxt)
    assert get(out).ravel().tolist() == list(range(24))
    assert get(nxt).ravel().tolist() == [((t + 5) % 24) * 7 for t in range(24)]
    big = empty((3, 2, 2, 2, 3, 4), kind, "int32", fill=-1)
    sem.grid_3d_no_barrier(big)
    assert get(big).ravel().tolist() == list(range(288))


@pytest.mark.parametrize("kind", KINDS)
def test_device_functions(kind):
    t = rand(8)
    grid = empty((8, 8), kind)
    con.gpu_helpers(put(t, kind), grid)
    j = np.clip(np.arange(8)[None, :] + np.arange(8)[:, None] - 3, 0, 7)
    assert_close(get(grid), t[j] * 2 + con.gelu_ref(t[j]))
    a = rand(64)
    out = empty(64, kind)
    sem.helper_barrier(put(a, kind), out)
    assert np.array_equal(get(out), a.reshape(2, 32)[:, ::-1].ravel())


@pytest.mark.parametrize("kind", KINDS)
def test_helper_register_tensor_of_160_kb(kind):
    a = rand(8)
    out = empty(8, kind)
    sem.helper_registers_across_barrier(put(a, kind), out)
    js = np.arange(0, 40000, 997)
    sums = np.array([np.float32(0) + np.sum(a[i] + (js % 7).astype(np.float32)) for i in range(8)])
    assert_close(get(out), np.roll(sums, -3), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_helper_writing_a_kernel_parameter(kind):
    # `out` is written only inside a helper: the renderer must not declare it const (NVRTC
    # rejected that once; passes on an H200, 2026-11-26)
    out = empty(64, kind)
    sem.helper_reads_indices(out)
    assert get(out).tolist() == [2 * t + t // 32 for t in range(64)]


# ----------------------------------------------------------------------------- matmul (examples/matmul_gpu.py)

SMALL = [(1, 1, 1), (7, 3, 5), (130, 129, 17)]
LARGE = [(200, 257, 77), (513, 1000, 77), (1024, 1024, 1024), (2039, 2039, 2039)]


@pytest.mark.parametrize("mnk, kind", cases(SMALL) + cases(LARGE, GPU))
def test_matmul_example(mnk, kind):
    m, n, k = mnk
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
    c = empty((m, n), kind)
    MATMUL.matmul(put(a, kind), put(b, kind), c)
    assert_close(get(c), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-4, atol=1e-4 * np.sqrt(k))


# ----------------------------------------------------------------------------- f16 / bf16


@taskmap.kernel
def half_gpu(a: f16["n"], b: f16["n"], out: f16["n"], diff: f32["n"]):
    attrs.grid_dim = (a.shape[0] + 127) // 128
    attrs.block_dim = 128
    i = blockIdx.x * 128 + threadIdx.x
    if i < a.shape[0]:
        out[i] = a[i] * b[i] + f16(0.5)
        diff[i] = f32(a[i]) - f32(b[i])


@taskmap.kernel
def bf16_gpu(a: bf16["n"], b: bf16["n"], out: bf16["n"], diff: f32["n"]):
    attrs.grid_dim = (a.shape[0] + 127) // 128
    attrs.block_dim = 128
    i = blockIdx.x * 128 + threadIdx.x
    if i < a.shape[0]:
        out[i] = a[i] * b[i] + 1.0
        diff[i] = f32(a[i]) - f32(b[i])


@pytest.mark.parametrize("n, kind", cases([1, 300, 4099]))
def test_f16(n, kind):
    a, b = rand(n).astype(np.float16), rand(n).astype(np.float16)
    out, diff = empty(n, kind, "float16"), empty(n, kind)
    half_gpu(put(a, kind), put(b, kind), out, diff)
    assert get(out).dtype == np.float16
    assert_close(get(out), (a * b + np.float16(0.5)).astype(np.float16), rtol=1e-2, atol=4e-3)
    assert_close(get(diff), a.astype(np.float32) - b.astype(np.float32))


def bf16_round(x: np.ndarray) -> np.ndarray:
    return taskmap.runtime.tensor.from_bf16_bits(taskmap.runtime.tensor.to_bf16_bits(x))


@pytest.mark.parametrize("n, kind", cases([1, 300, 4099]))
def test_bf16(n, kind):
    a, b = bf16_round(rand(n)), bf16_round(rand(n))
    out, diff = empty(n, kind, "bfloat16"), empty(n, kind)
    bf16_gpu(put(a, kind, "bfloat16"), put(b, kind, "bfloat16"), out, diff)
    assert_close(get(out), bf16_round(a * b + 1), dtype="bfloat16")
    assert_close(get(diff), a - b)


# ----------------------------------------------------------------------------- more than 48 KB of shared memory


def make_big_smem(kb: int):
    rows = kb * 1024 // (4 * 128)
    fill = repeat(rows // 2, 1) * spatial(2, 128)          # 256 threads cover a rows x 128 tile

    @taskmap.kernel
    def big_smem(a: f32["blocks", rows, 128], out: f32["blocks", rows, 128]):
        attrs.grid_dim = a.shape[0]
        attrs.block_dim = 256
        tile = shared_tensor(f32, [rows, 128])
        for i, j in fill.on(threadIdx.x):
            tile[i, j] = a[blockIdx.x, i, j]
        syncthreads()
        for i, j in fill.on(threadIdx.x):                   # read what other threads wrote
            out[blockIdx.x, i, j] = tile[rows - 1 - i, 127 - j] + 1.0
    return big_smem


BIG_SMEM = {kb: make_big_smem(kb) for kb in (64, 160, 200)}


@pytest.mark.parametrize("kb, kind", cases([64]) + cases([160, 200], GPU))
def test_shared_memory_above_48_kb(kb, kind):
    kern = BIG_SMEM[kb]
    if is_gpu(kind):
        optin = taskmap.backends.cuda.driver.device_properties(0).shared_memory_per_block_optin
        if kb * 1024 > optin:
            pytest.skip(f"this GPU allows {optin} bytes of shared memory per block")
        assert kern.build("cuda").smem_bytes == kb * 1024
    rows = kb * 1024 // 512
    a = rand(3, rows, 128)
    out = empty(a.shape, kind)
    kern(put(a, kind), out)
    assert np.array_equal(get(out), a[:, ::-1, ::-1] + 1)


# ----------------------------------------------------------------------------- register pressure

HOG = 96


@taskmap.kernel
def register_hog(a: f32["n"], out: f32["n"], steps: i32):
    attrs.block_dim = a.shape[0]     # known only at launch: no __launch_bounds__ caps the registers
    r = register_tensor(f32, [HOG])
    for j in unroll(HOG):
        r[j] = a[(threadIdx.x + j) % a.shape[0]]
    for _ in range(steps):
        for j in unroll(HOG):
            r[j] = r[j] * 0.5 + r[(j + 1) % HOG] * 0.25
    s = 0.0
    for j in unroll(HOG):
        s += r[j]
    out[threadIdx.x] = s


def hog_ref(a: np.ndarray, steps: int) -> np.ndarray:
    n = a.size
    r = a[(np.arange(n)[:, None] + np.arange(HOG)[None, :]) % n].astype(np.float32)
    for _ in range(steps):
        for j in range(HOG):
            r[:, j] = r[:, j] * np.float32(0.5) + r[:, (j + 1) % HOG] * np.float32(0.25)
    return r.astype(np.float64).sum(axis=1)


@pytest.mark.parametrize("n, kind", cases([5, 128]))
def test_register_heavy_kernel(n, kind):
    a = rand(n)
    out = empty(n, kind)
    register_hog(put(a, kind), out, 4)
    assert_close(get(out), hog_ref(a, 4), rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_launch_over_the_register_limit_is_refused_with_the_numbers():
    torch = pytest.importorskip("torch")
    built = register_hog.build("cuda")
    fn = built.launcher.function(0)
    props = driver.device_properties(0)
    regs = fn.num_registers
    if regs * 1024 <= props.registers_per_block and fn.max_threads_per_block >= 1024:
        pytest.skip(f"NVRTC gave register_hog only {regs} registers per thread: 1024 threads fit")
    a, out = torch.randn(1024, device="cuda"), torch.full((1024,), float("nan"), device="cuda")
    with pytest.raises(LaunchError, match=rf"register_hog\(\): a block of 1024 threads needs {regs} registers per "
                                          rf"thread, {regs * 1024} in all, but .* \(cuda:0\) has "
                                          rf"{props.registers_per_block} registers per block"):
        register_hog(a, out, 2)
    torch.cuda.synchronize()
    assert torch.isnan(out).all()                      # nothing was launched
    small = torch.randn(256, device="cuda")
    out = torch.empty(256, device="cuda")
    register_hog(small, out, 2)                        # a block that fits runs, and is right
    assert_close(out, hog_ref(small.cpu().numpy(), 2), rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- other array kinds on the GPU


class CaiView:
    """A Numba-like array: only ``__cuda_array_interface__``, no device (the driver is asked)."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


class DLPackView:
    """A JAX-like array: only the DLPack protocol."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kwargs):
        return self.t.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.cuda
def test_cuda_array_interface_and_dlpack_arrays_as_arguments():
    torch = pytest.importorskip("torch")
    n = 5000
    x, y = rand(n), rand(n)
    tx, ty = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
    out = torch.full((n,), float("nan"), device="cuda")
    saxpy(CaiView(tx.__cuda_array_interface__), DLPackView(ty), CaiView(out.__cuda_array_interface__), 3.0)
    torch.cuda.synchronize()
    assert_close(out.cpu(), np.float32(3) * x + y)
    shared = taskmap.from_dlpack(out)                  # a taskmap view of torch memory, mixed with torch
    saxpy(taskmap.from_dlpack(tx), ty, shared, -1.0)
    torch.cuda.synchronize()
    assert_close(out.cpu(), y - x)
    bogus = {"shape": (n,), "typestr": "<f4", "data": (0xBAD0_0000_0000, False), "version": 3, "strides": None}
    with pytest.raises(LaunchError, match=r"argument 'x': __cuda_array_interface__ pointer 0xbad000000000 is not "
                                          r"memory of any CUDA device"):
        saxpy(CaiView(bogus), ty, out, 1.0)


# ----------------------------------------------------------------------------- streams


@pytest.mark.cuda
def test_launches_go_to_the_current_torch_stream(monkeypatch):
    torch = pytest.importorskip("torch")
    used = []
    real = kernel_mod._current_stream

    def spy(kind, device):
        stream = real(kind, device)
        used.append(stream)
        return stream

    monkeypatch.setattr(kernel_mod, "_current_stream", spy)
    n = 1 << 22
    x, y = rand(n), rand(n)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        busy = torch.randn(4096, 4096, device="cuda")
        for _ in range(8):                             # keep the side stream busy before the inputs exist
            busy = busy @ busy.T / 4096
        tx, ty = torch.from_numpy(x).cuda(non_blocking=True), torch.from_numpy(y).cuda(non_blocking=True)
        out = torch.empty(n, device="cuda")
        saxpy(tx, ty, out, 2.0)                        # must run after tx, ty are written, on `side`
        doubled = out * 2                              # and before this
    assert used[-1] == side and used[-1].cuda_stream == side.cuda_stream != 0
    side.synchronize()
    assert_close(doubled.cpu(), 2 * (np.float32(2) * x + y))
    saxpy(tx, ty, out, 1.0)                            # outside the context: the default stream
    assert used[-1] == torch.cuda.default_stream()
    torch.cuda.synchronize()
    assert_close(out.cpu(), x + y)


@pytest.mark.cuda
def test_taskmap_tensors_launch_on_the_legacy_stream_without_torch(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)   # as if torch were never imported
    assert kernel_mod._current_stream("cuda", 0) is None
    x, y = rand(1000), rand(1000)
    out = taskmap.empty(1000, "float32", "cuda")
    saxpy(taskmap.tensor(x), taskmap.tensor(y), out, -1.0)
    assert_close(out.numpy(), y - x)


# ----------------------------------------------------------------------------- everything above compiles (no GPU needed)

SUITE = {
    **{f"sem.{k}": getattr(sem, k) for k in (
        "vec_add", "load_tiles", "row_sum_while", "row_max_for", "rotate_after_divergence", "grid_2d",
        "block_3d_with_barrier", "grid_3d_no_barrier", "reverse_in_one_block", "fewer_workers",
        "fewer_workers_sync", "early_return", "helper_registers_across_barrier", "helper_barrier")},
    **{f"con.{k}": getattr(con, k) for k in ("grid_from_sizes", "smem_reverse", "c_names_gpu", "gpu_helpers")},
    "examples.vec_add": VEC_ADD.vec_add, "examples.load_tile": COOP.load_tile, "examples.matmul": MATMUL.matmul,
    "saxpy": saxpy, "half_gpu": half_gpu, "bf16_gpu": bf16_gpu, "register_hog": register_hog,
    **{f"big_smem_{kb}": k for kb, k in BIG_SMEM.items()},
}


@pytest.mark.parametrize("name", sorted(SUITE))
def test_suite_kernels_compile_for_sm_90(name):
    built = SUITE[name].build("cuda", arch="sm_90")
    assert built.binary[:4] == b"\x7fELF" and f".entry {SUITE[name].__name__}(" in built.artifact.extra.ptx
    if name == "register_hog":        # its block size is known only at launch
        assert "__launch_bounds__" not in built.source
    if name.startswith("big_smem"):
        assert built.smem_bytes == int(name.rsplit("_", 1)[1]) * 1024


# ----------------------------------------------------------------------------- the GPU benchmark

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "matmul_gpu.py"


def test_gpu_benchmark_says_why_it_cannot_run():
    if driver.cuda_available():
        pytest.skip("an NVIDIA GPU is present")
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0 and proc.stdout == ""
    assert "skipped: no NVIDIA GPU here" in proc.stderr


@pytest.mark.cuda
def test_gpu_benchmark_runs(capsys):
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("taskmap_bench_matmul_gpu", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main([256, 2039]) == 0
    out = capsys.readouterr().out
    assert "taskmap/cuBLAS time" in out and "| 2039 " in out
