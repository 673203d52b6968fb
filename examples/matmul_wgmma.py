"""Hopper tensor-core matmul on TF32 with ``wgmma``: C[M, N] (f32) = A[M, K] @ B[N, K]^T (f32 data,
products on tf32 — a linear's layout, the weight stored N x K).

A block of 256 threads is two *warpgroups* (4 warps each); warpgroup ``g`` computes rows
``64 g .. 64 g + 63`` of the block's 128 x 128 tile of C with one ``wgmma_tf32`` per 8 of K: a
64 x 8 slice of A and a 128 x 8 slice of B, both read by the tensor cores straight from shared
memory, into 64 f32 accumulators per thread (``wgmma_c_layout(128)``).  Tiles of A and B (128 rows
x 32 floats: one 128-byte row each) stream through a 4-stage ``cp_async`` ring, stored in
wgmma's 128-byte swizzled K-major layout (``wgmma_sw128``: a row's 16-byte chunk ``c`` goes to chunk
``c ^ row % 8``, so the tensor cores' reads avoid bank conflicts).  Each k-tile: wait for its
copies, ``fence_proxy_async`` (the copies were ordinary writes; the tensor cores read through the
async proxy), a barrier, then ``wgmma_fence``, four ``wgmma_tf32``, ``wgmma_commit`` and
``wgmma_wait(0)`` (the tile's stage is reloaded two iterations later).

Every access is predicated, so any M, N, K works: out-of-range chunks are zero-filled; when K is
not a multiple of 4 the rows of A and B are not 16-byte aligned and the tiles are copied element
by element (same ring, same layout).  The tensor cores read the operands' top 19 bits (tf32 by
truncation); products are exact, sums in f32.

Runs on sm_90a (H100, H200: ``matmul_wgmma(ta, tb, tc)`` with torch CUDA tensors) and, with the
GPU's semantics, on the CPU (numpy arrays).
"""
import sys

import numpy as np

import taskmap
from taskmap import repeat, spatial
from taskmap.lang import (attrs, blockIdx, cp_async, cp_async_commit, cp_async_wait, f32, fence_proxy_async,
                          register_tensor, shared_tensor, symbol, syncthreads, threadIdx, unroll, wgmma_c_layout,
                          wgmma_commit, wgmma_fence, wgmma_sw128, wgmma_tf32, wgmma_wait)

BM, BN, BK = 128, 128, 32        # block tile; BK: one 128-byte swizzled row of f32
STAGES = 4
THREADS = 256                    # two warpgroups, 64 rows of C each
WG_M = 64                        # rows of one wgmma
VEC = 4                          # floats per 16-byte chunk
# Who copies which 16-byte chunk of a tile: (row, chunk) of A's and B's 128 x 8 chunks.
CHUNKS = repeat(4, 1) * spatial(32, 8)
assert CHUNKS.task_shape == (BM, BK // VEC) == (BN, BK // VEC) and CHUNKS.num_workers == THREADS
C_LAYOUT = wgmma_c_layout(BN)
m, n, k = symbol("m"), symbol("n"), symbol("k")


@taskmap.kernel
def matmul_wgmma(a: f32[m, k], b: f32[n, k], c: f32[m, n]):
    attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM)
    attrs.block_dim = THREADS
    sa = shared_tensor(f32, [STAGES, BM, BK])
    sb = shared_tensor(f32, [STAGES, BN, BK])
    acc = register_tensor(f32, [BN // 2])
    for q in unroll(BN // 2):
        acc[q] = 0.0
    wg = threadIdx.x // 128
    row0 = blockIdx.y * BM
    col0 = blockIdx.x * BN
    aligned = k % VEC == 0                    # rows of A and B start 16-byte aligned
    tiles = (k + BK - 1) // BK
    for t in range(tiles + STAGES - 1):       # load tile t, multiply tile t - (STAGES - 1)
        ct = t - (STAGES - 1)
        if ct >= 0:
            cp_async_wait(STAGES - 2)         # tile ct has landed (at most STAGES-2 groups pending)
            fence_proxy_async()               # ... visible to the tensor cores' reads
            syncthreads()                     # ... of every thread; tile ct-1 is consumed
        if t < tiles:
            st = t % STAGES
            for r, ch in CHUNKS.on(threadIdx.x):
                gk = t * BK + ch * VEC
                ga = row0 + r
                gb = col0 + r
                sw = wgmma_sw128(r, ch * VEC)
                if aligned:
                    ok_a = ga < m and gk < k
                    ok_b = gb < n and gk < k
                    cp_async(sa[st, r, sw], a[ga if ok_a else 0, gk if ok_a else 0], 16, 16 if ok_a else 0)
                    cp_async(sb[st, r, sw], b[gb if ok_b else 0, gk if ok_b else 0], 16, 16 if ok_b else 0)
                else:
                    for e in unroll(VEC):
                        sa[st, r, sw + e] = a[ga, gk + e] if ga < m and gk + e < k else 0.0
                        sb[st, r, sw + e] = b[gb, gk + e] if gb < n and gk + e < k else 0.0
        cp_async_commit()                     # one group per iteration, empty ones included
        if ct >= 0:
            st = ct % STAGES
            wgmma_fence()
            for kk in unroll(BK // 8):
                wgmma_tf32(acc, sa[st, wg * WG_M, kk * 8], sb[st, 0, kk * 8], BN)
            wgmma_commit()
            wgmma_wait(0, acc, BN // 2)
    for q, (i, j) in enumerate(C_LAYOUT.on(threadIdx.x % 128)):
        gr = row0 + wg * WG_M + i
        gc = col0 + j
        if gr < m and gc < n:
            c[gr, gc] = acc[q]


def tf32_truncated(x: np.ndarray) -> np.ndarray:
    """What the tensor cores read of an f32 operand: its top 19 bits."""
    return (np.ascontiguousarray(x, np.float32).view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)


def reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """What the kernel computes, up to f32 summation: the f64 product of the truncated operands."""
    return tf32_truncated(a).astype(np.float64) @ tf32_truncated(b).astype(np.float64).T


if __name__ == "__main__":
    M, N, K = (int(x) for x in sys.argv[1:4]) if len(sys.argv) > 3 else (100, 72, 130)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((N, K)).astype(np.float32)
    c = np.empty((M, N), np.float32)
    matmul_wgmma(a, b, c)
    err = np.abs(c - reference(a, b)).max()
    assert err < 1e-4 * np.sqrt(K), err
    print(f"wgmma TF32 matmul {M}x{N}x{K} OK on the CPU emulation (max abs error {err:.2e})")
    ptx = matmul_wgmma.build("cuda", arch="sm_90a").artifact.extra.ptx
    print("sm_90a PTX:", *(op for op in ("wgmma.mma_async", "cp.async", "fence.proxy.async") if op in ptx))
