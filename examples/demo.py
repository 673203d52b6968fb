"""The main demo: the paper's kernels written with task mappings, run on this machine.

Without a GPU everything runs on the CPU backend: GPU-style kernels (threads, blocks, shared
memory, barriers) with the GPU's semantics, CPU-style kernels over cores and vector lanes.
"""
import time

import numpy as np

import cooperative_load
import matmul_cpu
import matmul_gpu
import vec_add
from taskmap.ir.mapping import repeat, spatial


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

    M = N = K = 1024
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    kernel = matmul_cpu.build(M, N, K)
    kernel(a, b, c)
    ok = np.allclose(c, a @ b, rtol=1e-4, atol=1e-3)
    t0 = time.perf_counter()
    kernel(a, b, c)
    t1 = time.perf_counter()
    a @ b
    t2 = time.perf_counter()
    gflop = 2 * M * N * K / 1e9
    print(f"CPU matmul {M}^3 (cores x lanes): {'OK' if ok else 'WRONG'}, "
          f"{gflop / (t1 - t0):.1f} GFLOP/s (numpy {gflop / (t2 - t1):.1f} GFLOP/s)")


if __name__ == "__main__":
    main()
