"""A CPU matmul whose workers are cores and vector lanes.

Tiles of C (MR rows x NR*LANES columns) are spread over the cores with ``spatial(...).parallel()``;
inside a tile, ``repeat(MR, NR) * spatial(1, LANES)`` maps its elements to SIMD lanes with
``.vectorize()`` (each lane owns MR*NR accumulators, kept in a register tile).  Rows and
columns past the edge of C are clamped on load and skipped on store, so any size works.
"""
import sys

import numpy as np

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import f32, register_tensor

LANES = 16          # f32 lanes of an AVX-512 register
MR, NR = 6, 2       # a 6 x 32 register tile


def build(M: int, N: int, K: int):
    # Workers are tiles of C, column strips outermost: a core walks down one strip of B (K x 32),
    # which stays in its cache, while rows of A stream through.
    tiles = spatial((M + MR - 1) // MR, (N + NR * LANES - 1) // (NR * LANES), ranks=[1, 0])
    lanes = repeat(MR, NR) * spatial(1, LANES)

    @taskmap.kernel
    def matmul_cpu(a: f32[M, K], b: f32[K, N], c: f32[M, N]):
        for ti, tj in tiles.parallel():
            acc = register_tensor(f32, [MR, NR * LANES])
            for i, j in lanes.vectorize():
                acc[i, j] = 0.0
            for kk in range(K):
                for i, j in lanes.vectorize():
                    row = min(ti * MR + i, M - 1)
                    col = min(tj * NR * LANES + j, N - 1)
                    acc[i, j] += a[row, kk] * b[kk, col]
            for i, j in lanes.vectorize():
                if ti * MR + i < M and tj * NR * LANES + j < N:
                    c[ti * MR + i, tj * NR * LANES + j] = acc[i, j]

    return matmul_cpu


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (257, 300, 129)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K), dtype=np.float32)
    b = rng.standard_normal((K, N), dtype=np.float32)
    c = np.empty((M, N), np.float32)
    build(M, N, K)(a, b, c)
    err = np.abs(c - a @ b).max()
    assert err < 1e-3, err
    print(f"cpu matmul {M}x{N}x{K} OK (max abs error {err:.2e})")
