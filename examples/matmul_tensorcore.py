"""Tensor-core matmul: C[M, N] (f32) = A[M, K] (f16) @ B[K, N] (f16), with ``mma.sync.m16n8k16``.

A block of 128 threads (4 warps) computes a 64x64 tile of C; the warps form a 2x2 grid and each
computes a 32x32 tile as 2x4 ``mma`` tiles of 16x8, accumulating in f32 registers.  Tiles of A
(64x32) and B (32x64) stream through shared memory in a 3-stage ``cp_async`` pipeline: while
tile t is multiplied, tiles t+1 and t+2 are in flight.  ``ldmatrix_x4`` moves 16x16 sub-tiles
from shared memory into the fragments ``mma`` expects (``.trans`` for B, stored K x N), and the
result fragments are written back with the accumulator layout ``mma_c_layout`` — a task mapping
over the 32 lanes.

Every access is predicated, so any M, N, K works: out-of-range 16-byte chunks are zero-filled by
``cp_async`` (``src_bytes=0``); when K or N is not a multiple of 8 the rows of A or B are not
16-byte aligned, and the tiles are copied element by element instead (same pipeline, same
shared-memory layout).  Shared rows are padded by 8 halves (16 bytes) to spread them over banks.

Runs on NVIDIA GPUs from sm_80 (``matmul_tc(ta, tb, tc)`` with torch CUDA tensors) and, with the
GPU's semantics, on the CPU (numpy arrays): warps exchange fragments through the emulator.
"""
import sys

import numpy as np

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import (MMA_K, MMA_M, MMA_N, attrs, blockIdx, cp_async, cp_async_commit, cp_async_wait, f16, f32,
                          lane_id, ldmatrix_x4, ldmatrix_x4_rows, mma_c_layout, mma_sync_m16n8k16, register_tensor,
                          shared_tensor, symbol, syncthreads, threadIdx, unroll, warp_id)

BM, BN, BK = 64, 64, 32          # block tile
WM, WN = 32, 32                  # warp tile: the 4 warps form a 2x2 grid
MI, NI = WM // MMA_M, WN // MMA_N  # 2 x 4 mma tiles per warp
STAGES = 3
THREADS = 128
PAD = 8                          # halves of padding per shared row (rows stay 16-byte aligned)
VEC = 8                          # halves per 16-byte chunk
# Who copies which 16-byte chunk of a tile: (row, chunk) of A's 64x4 and B's 32x8 chunks.
A_CHUNKS = repeat(2, 1) * spatial(32, 4)
B_CHUNKS = repeat(2, 1) * spatial(16, 8)
assert A_CHUNKS.task_shape == (BM, BK // VEC) and B_CHUNKS.task_shape == (BK, BN // VEC)
assert A_CHUNKS.num_workers == B_CHUNKS.num_workers == THREADS
m, n, k = symbol("m"), symbol("n"), symbol("k")


@taskmap.kernel
def matmul_tc(a: f16[m, k], b: f16[k, n], c: f32[m, n]):
    attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM)
    attrs.block_dim = THREADS
    sa = shared_tensor(f16, [STAGES, BM, BK + PAD])
    sb = shared_tensor(f16, [STAGES, BK, BN + PAD])
    acc = register_tensor(f32, [MI, NI, 4])
    af = register_tensor(f16, [MI, 8])     # A fragments of the warp's 2 row tiles
    bf = register_tensor(f16, [NI, 4])     # B fragments of its 4 column tiles
    for i in unroll(MI):
        for j in unroll(NI):
            for q in unroll(4):
                acc[i, j, q] = 0.0
    wm = warp_id() // 2
    wn = warp_id() % 2
    row0 = blockIdx.y * BM
    col0 = blockIdx.x * BN
    aligned = k % VEC == 0 and n % VEC == 0   # rows of A and B start 16-byte aligned
    tiles = (k + BK - 1) // BK
    for t in range(tiles + STAGES - 1):       # load tile t, multiply tile t - (STAGES - 1)
        ct = t - (STAGES - 1)
        if ct >= 0:
            cp_async_wait(STAGES - 2)         # tile ct has landed (at most STAGES-2 groups pending)
            syncthreads()                     # ... for every thread; and tile ct-1 is consumed
        if t < tiles:
            st = t % STAGES
            for r, ch in A_CHUNKS.on(threadIdx.x):
                gr = row0 + r
                gk = t * BK + ch * VEC
                if aligned:
                    ok = gr < m and gk < k
                    cp_async(sa[st, r, ch * VEC], a[gr if ok else 0, gk if ok else 0], 16, 16 if ok else 0)
                else:
                    for e in unroll(VEC):
                        sa[st, r, ch * VEC + e] = a[gr, gk + e] if gr < m and gk + e < k else 0.0
            for r, ch in B_CHUNKS.on(threadIdx.x):
                gk = t * BK + r
                gc = col0 + ch * VEC
                if aligned:
                    ok = gk < k and gc < n
                    cp_async(sb[st, r, ch * VEC], b[gk if ok else 0, gc if ok else 0], 16, 16 if ok else 0)
                else:
                    for e in unroll(VEC):
                        sb[st, r, ch * VEC + e] = b[gk, gc + e] if gk < k and gc + e < n else 0.0
        cp_async_commit()                     # one group per iteration, empty ones included
        if ct >= 0:
            st = ct % STAGES
            for kk in unroll(BK // MMA_K):
                for mi in unroll(MI):
                    for i, j in ldmatrix_x4_rows.on(lane_id()):
                        ldmatrix_x4(af[mi, 0], sa[st, wm * WM + mi * MMA_M + i, kk * MMA_K + j])
                for nj in unroll(NI // 2):    # one transposed x4 load: the fragments of 2 column tiles
                    for i, j in ldmatrix_x4_rows.on(lane_id()):
                        ldmatrix_x4(bf[nj * 2, 0], sb[st, kk * MMA_K + i, wn * WN + nj * 2 * MMA_N + j], trans=True)
                for mi in unroll(MI):
                    for ni in unroll(NI):
                        mma_sync_m16n8k16(acc[mi, ni, 0], af[mi, 0], bf[ni, 0])
    for mi in unroll(MI):
        for ni in unroll(NI):
            for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
                gr = row0 + wm * WM + mi * MMA_M + i
                gc = col0 + wn * WN + ni * MMA_N + j
                if gr < m and gc < n:
                    c[gr, gc] = acc[mi, ni, q]


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the kernel computes: f16 inputs, products and sums in f32."""
    return a.astype(np.float32) @ b.astype(np.float32)


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (100, 72, 130)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (M, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    c = np.empty((M, N), np.float32)
    matmul_tc(a, b, c)
    err = np.abs(c - reference(a, b)).max()
    assert err < 1e-3, err
    print(f"tensor-core matmul {M}x{N}x{K} OK on the CPU emulation (max abs error {err:.2e})")
    built = matmul_tc.build("cuda", arch="sm_80")
    ptx = built.artifact.extra.ptx
    print("sm_80 PTX:", *(op for op in ("mma.sync.aligned.m16n8k16", "ldmatrix", "cp.async") if op in ptx))
