"""The main demo: the paper's kernels written with task mappings, run on this machine.

Without a GPU everything runs on the CPU backend: GPU-style kernels (threads, blocks, shared
memory, barriers, warp-level tensor-core instructions) with the GPU's semantics, CPU-style
kernels over cores and vector lanes.  The GPU kernels are also compiled for CUDA by NVRTC (no
GPU needed), and run on the GPU when there is one.
"""
import time

import numpy as np

import cooperative_load
import matmul_cpu
import matmul_gpu
import matmul_tensorcore
import vec_add
from taskmap.backends import cuda_available
from taskmap.ir.mapping import repeat, spatial


def _seconds(fn, runs: int = 10) -> float:
    """Median seconds of ``fn()`` after a warm-up call."""
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main() -> None:
    m = spatial(2, 2) * repeat(2, 2)
    print(f"{m}: {m.num_workers} workers, task shape {m.task_shape}, worker 3 -> {m.worker2task(3)}")
    rng = np.random.default_rng(0)

    a, b = rng.random((2, 1024), dtype=np.float32)
    c = np.empty_like(a)
    vec_add.vec_add(a, b, c)
    print("vec_add:", "OK" if np.allclose(c, a + b) else "WRONG")

    tile = rng.random((64, 8), dtype=np.float32)
    out = np.empty((8, 64), np.float32)
    cooperative_load.load_tile(tile, out)
    print("cooperative load (repeat(4, 1) * spatial(16, 8)):", "OK" if np.array_equal(out, tile.T) else "WRONG")

    M, N, K = 300, 257, 129
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    matmul_gpu.matmul(a, b, c)
    print(f"GPU-style double-buffered matmul {M}x{N}x{K} on the CPU:",
          "OK" if np.allclose(c, a @ b, rtol=1e-4, atol=1e-3) else "WRONG")

    a16 = rng.uniform(-1, 1, (100, 130)).astype(np.float16)
    b16 = rng.uniform(-1, 1, (130, 72)).astype(np.float16)
    c32 = np.empty((100, 72), np.float32)
    matmul_tensorcore.matmul_tc(a16, b16, c32)
    ok = np.abs(c32 - matmul_tensorcore.reference(a16, b16)).max() < 1e-3
    print("tensor-core (mma.sync m16n8k16) matmul 100x72x130, warps emulated on the CPU:", "OK" if ok else "WRONG")

    for kernel, arch in ((matmul_gpu.matmul, "sm_90"), (matmul_tensorcore.matmul_tc, "sm_80")):
        built = kernel.build("cuda", arch=arch)
        print(f"  {kernel.__name__} built for {arch} by NVRTC: {len(built.binary)}-byte cubin")
    if cuda_available():
        import torch

        ta, tb = torch.from_numpy(a16).cuda(), torch.from_numpy(b16).cuda()
        tc = torch.empty((100, 72), dtype=torch.float32, device="cuda")
        matmul_tensorcore.matmul_tc(ta, tb, tc)
        torch.cuda.synchronize()
        print("  tensor-core matmul on the GPU:", "OK" if np.allclose(tc.cpu().numpy(), c32, atol=1e-3) else "WRONG")

    M = N = K = 1024
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    from taskmap import ops
    kernel = matmul_cpu.build(M, N, K)
    gflop = 2 * M * N * K / 1e9
    # taskmap timed first: after each call numpy's BLAS threads spin for a while, taking a core
    example, template = gflop / _seconds(lambda: kernel(a, b, c)), gflop / _seconds(lambda: ops.matmul(a, b))
    ref = a @ b
    ok = np.allclose(c, ref, rtol=1e-4, atol=1e-3)
    print(f"CPU matmul {M}^3 (cores x lanes): {'OK' if ok else 'WRONG'}, {example:.1f} GFLOP/s")
    ok = np.allclose(ops.matmul(a, b), ref, rtol=1e-4, atol=1e-3)
    print(f"CPU matmul {M}^3, the template (taskmap.ops.matmul: packed panels, register tiles, prefetch): "
          f"{'OK' if ok else 'WRONG'}, {template:.1f} GFLOP/s (numpy {gflop / _seconds(lambda: a @ b):.1f} GFLOP/s)")

    try:
        import compile_model
    except ImportError as exc:       # torch is optional for the kernel layer
        print(f"taskmap.compile(model): skipped ({exc}; pip install torch==2.13.0)")
    else:
        print("taskmap.compile(model) of a small residual CNN:")
        compile_model.main()


if __name__ == "__main__":
    main()
