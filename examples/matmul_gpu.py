"""The paper's matmul (Figures 3, 5, 13) written GPU-style, with double-buffered shared memory.

A block of 256 threads computes a 128x128 tile of C.  ``spatial(4, 2) * repeat(2, 2) *
spatial(4, 8) * repeat(4, 4)`` assigns the tile's tasks: 4x2 warps, each repeating 2x2 times a
4x8 arrangement of lanes, each lane computing 4x4 elements.  Tiles of A and B are loaded
cooperatively (``auto_map``), the next one into registers while the current one is used from
shared memory (double buffering), and every access is predicated, so any M, N, K works.
On a machine without a GPU it runs on the CPU, with the GPU's semantics.
"""
import sys

import numpy as np

import taskmap
from taskmap import auto_map, repeat, spatial
from taskmap.lang import attrs, blockIdx, f32, register_tensor, shared_tensor, symbol, syncthreads, threadIdx

BM, BN, BK = 128, 128, 8
block_map = spatial(4, 2) * repeat(2, 2) * spatial(4, 8) * repeat(4, 4)
THREADS = block_map.num_workers                      # 256
load_a = auto_map((BM, BK), THREADS)                 # repeat(4, 1) * spatial(32, 8)
load_b = auto_map((BK, BN), THREADS)                 # repeat(4, 1) * spatial(2, 128)
m, n, k = symbol("m"), symbol("n"), symbol("k")


@taskmap.kernel
def matmul(a: f32[m, k], b: f32[k, n], c: f32[m, n]):
    attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM)
    attrs.block_dim = THREADS
    sa = shared_tensor(f32, [2, BM, BK])
    sb = shared_tensor(f32, [2, BK, BN])
    acc = register_tensor(f32, [block_map.tasks_per_worker])
    ra = register_tensor(f32, [load_a.tasks_per_worker])
    rb = register_tensor(f32, [load_b.tasks_per_worker])
    row0 = blockIdx.y * BM
    col0 = blockIdx.x * BN
    for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
        acc[q] = 0.0
    for i, kk in load_a.on(threadIdx.x):
        sa[0, i, kk] = a[row0 + i, kk] if row0 + i < m and kk < k else 0.0
    for kk, j in load_b.on(threadIdx.x):
        sb[0, kk, j] = b[kk, col0 + j] if kk < k and col0 + j < n else 0.0
    syncthreads()
    tiles = (k + BK - 1) // BK
    for t in range(tiles):
        buf = t % 2
        if t + 1 < tiles:                                  # prefetch the next tiles into registers
            for q, (i, kk) in enumerate(load_a.on(threadIdx.x)):
                gk = (t + 1) * BK + kk
                ra[q] = a[row0 + i, gk] if row0 + i < m and gk < k else 0.0
            for q, (kk, j) in enumerate(load_b.on(threadIdx.x)):
                gk = (t + 1) * BK + kk
                rb[q] = b[gk, col0 + j] if gk < k and col0 + j < n else 0.0
        for kk in range(BK):                               # multiply the current tiles
            for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
                acc[q] += sa[buf, i, kk] * sb[buf, kk, j]
        if t + 1 < tiles:                                  # stage the prefetched tiles
            for q, (i, kk) in enumerate(load_a.on(threadIdx.x)):
                sa[1 - buf, i, kk] = ra[q]
            for q, (kk, j) in enumerate(load_b.on(threadIdx.x)):
                sb[1 - buf, kk, j] = rb[q]
        syncthreads()
    for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
        if row0 + i < m and col0 + j < n:
            c[row0 + i, col0 + j] = acc[q]


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (200, 130, 77)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    matmul(a, b, c)
    err = np.abs(c - a @ b).max()
    assert err < 1e-3, err
    print(f"matmul {M}x{N}x{K} OK (max abs error {err:.2e})")
