"""The wgmma matmul with its tiles loaded by the copy engine (TMA) and a producer warp: the
warp-specialized form of :mod:`.matmul_wgmma` (``WgConfig.tma``; sm_90a).

A block is ``BM / 64`` consumer warpgroups (warps ``0 .. 4 C - 1``, each computing 64 rows of the
``BM x BN`` tile of C as in :mod:`.matmul_wgmma`) and one producer warp after them, whose first
thread streams the k-tiles of A (``BM x BK``) and B (``BN x BK``, stored N x K) through a
``stages``-deep ring: per tile it waits for the stage's *empty* barrier, expects the tile's bytes
on its *full* barrier and issues one ``tma_load`` per 128-byte column of each operand (the copy
engine writes wgmma's 128-byte swizzled K-major layout itself).  The consumers wait for a tile's
*full* barrier, issue its wgmma, commit, and once the previous tile's group has retired
(``wgmma_wait(1)``) release that tile's stage: lane 0 of each consumer warp arrives on its *empty*
barrier.  So the copies of the next tiles run while the tensor cores work, no thread computes an
address per 16-byte chunk or waits on ``cp_async`` groups, and the ring needs no block barrier.

The copy engine zero-fills what lies outside A and B (any m, n; k must make rows a multiple of 16
bytes: the template applies only then, :func:`tma_applies`).  A block has ``128 C + 32`` threads,
which leaves a consumer up to 227 registers (BN 256 with two warpgroups).  Split-K, bias and the
fused epilogues are those of :mod:`.matmul_wgmma`; a K x N B stays there.

3xTF32 as in :mod:`.matmul_wgmma`, with the split shared out: once a tile has landed, each consumer
warpgroup splits its own 64 rows of A and all consumers split B together (hi in place, lo into one
of two buffers beside the ring), then retire the previous tile's products, release its stage, and
meet at a named barrier (``bar_sync(1, consumers)``; the producer warp is not held) before issuing
the tile's three wgmma per 8 of K — so no consumer overwrites lows another one's wgmma still read.

Written and checked on the CPU emulation (which runs the barriers' phases, the copy engine's
swizzle and zero fill, and faults on deadlocks) and by NVRTC for sm_90a; opt-in
(``TASKMAP_WGMMA=tma``) until it has been timed on a GPU.
"""

from typing import TYPE_CHECKING

from ..ir.dtypes import scalar_type
from ..ir.mapping import auto_map
from ..lang import (attrs, bar_sync, blockIdx, f32, fence_proxy_async, mbarrier_arrive, mbarrier_init, mbarrier_wait,
                    register_tensor, round_tf32, shared_tensor, syncthreads, threadIdx, tma_load, u64, unroll,
                    wgmma_c_layout, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_tf32, wgmma_wait)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .matmul_problem import MatmulProblem
from .matmul_simt import gpu_param_types

if TYPE_CHECKING:
    from .matmul_wgmma import WgConfig

WG_M = 64
WG_THREADS = 128
PRODUCER_THREADS = 32


def tma_applies(p: MatmulProblem) -> bool:
    """Whether the TMA form can take ``p``: B stored N x K, and rows of A and B whose byte size is a
    multiple of 16 (a tensor map's rule)."""
    return p.trans_b and p.k * scalar_type(p.dtype).nbytes % 16 == 0


def build_kernel_tma(cfg: "WgConfig") -> Kernel:
    BM, BN, BK, STG, S, X3 = cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.split, cfg.x3
    assert cfg.trans_b, "the TMA form reads an N x K B"
    T = scalar_type(cfg.dtype)
    ATOM_K = cfg.atom_k
    KSTEP = 32 // cfg.itemsize                        # k of one wgmma: 8 (tf32) or 16
    KA = BK // ATOM_K                                 # 128-byte columns of a k-tile
    WGMMA = wgmma_tf32 if T is f32 else wgmma_f16
    assert KA in (1, 2) and BK == KA * ATOM_K and STG >= 2
    CONSUMERS = WG_THREADS * (BM // WG_M)
    PRODUCER = CONSUMERS                              # the producer warp's first thread
    TILE_BYTES = (BM + BN) * BK * cfg.itemsize
    A_BATCHED, B_BATCHED = cfg.a_batched, cfg.b_batched
    BIAS = cfg.bias and S == 1
    C_LAYOUT = wgmma_c_layout(BN)
    a_split = auto_map((KA, WG_M, ATOM_K), WG_THREADS)           # 3xTF32: a warpgroup splits its rows of A ...
    b_split = auto_map((KA, BN, ATOM_K), CONSUMERS)              # ... and the consumers split B together
    (m, n, k, cz), (A_T, B_T, BIAS_T, C_T) = gpu_param_types(cfg.dtype, cfg.out_dtype, A_BATCHED, B_BATCHED, True,
                                                              cfg.bias, S)

    @kernel
    def matmul_wgmma_tma(a: A_T, b: B_T, bias: BIAS_T, c: C_T):
        attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM, cz)
        attrs.block_dim = CONSUMERS + PRODUCER_THREADS
        sa = shared_tensor(T, [STG, KA, BM, ATOM_K])              # element (r, k): [k // ATOM_K, r, swizzled]
        sb = shared_tensor(T, [STG, KA, BN, ATOM_K])
        full = shared_tensor(u64, [STG])                          # a stage's tiles have landed
        empty = shared_tensor(u64, [STG])                         # ... have been read by every consumer warp
        sa_lo = shared_tensor(T, [2, KA, BM, ATOM_K] if X3 else [1, 1, 1, ATOM_K])   # 3xTF32: two tiles' lows
        sb_lo = shared_tensor(T, [2, KA, BN, ATOM_K] if X3 else [1, 1, 1, ATOM_K])
        acc = register_tensor(f32, [BN // 2])
        part = register_tensor(f32, [BN // 2 if X3 else 1])      # 3xTF32: one k-tile's products
        bi = blockIdx.z // S
        row0 = blockIdx.y * BM
        col0 = blockIdx.x * BN
        kt = (k + BK - 1) // BK
        per = (kt + S - 1) // S
        t0 = blockIdx.z % S * per
        tiles = max(min(t0 + per, kt) - t0, 0)
        if threadIdx.x == 0:
            for s in range(STG):
                mbarrier_init(full[s], 1)
                mbarrier_init(empty[s], CONSUMERS // 32)
        syncthreads()
        if threadIdx.x == PRODUCER:
            for t in range(tiles):
                st = t % STG
                mbarrier_wait(empty[st], (t // STG + 1) % 2)      # round 0 passes: the phase before phase 0
                mbarrier_arrive(full[st], TILE_BYTES)
                kb = (t0 + t) * BK
                for j in unroll(KA):
                    tma_load(sa[st, j, 0, 0], a[bi if A_BATCHED else 0, row0, kb + j * ATOM_K], full[st], BM, ATOM_K,
                             128)
                    tma_load(sb[st, j, 0, 0], b[bi if B_BATCHED else 0, col0, kb + j * ATOM_K], full[st], BN, ATOM_K,
                             128)
        if threadIdx.x < CONSUMERS:
            wg = threadIdx.x // WG_THREADS
            for q in unroll(BN // 2):
                acc[q] = 0.0
            for ct in range(tiles):
                st = ct % STG
                mbarrier_wait(full[st], ct // STG % 2)
                if X3:        # split tile ct (hi in place, lo beside) while tile ct - 1's wgmma run
                    lb = ct % 2
                    for j, r, e in a_split.on(threadIdx.x % WG_THREADS):
                        hi = round_tf32(sa[st, j, wg * WG_M + r, e])
                        sa_lo[lb, j, wg * WG_M + r, e] = round_tf32(sa[st, j, wg * WG_M + r, e] - hi)
                        sa[st, j, wg * WG_M + r, e] = hi
                    for j, r, e in b_split.on(threadIdx.x):
                        hi = round_tf32(sb[st, j, r, e])
                        sb_lo[lb, j, r, e] = round_tf32(sb[st, j, r, e] - hi)
                        sb[st, j, r, e] = hi
                    fence_proxy_async()
                    wgmma_wait(0, part, BN // 2)                  # tile ct - 1's products ...
                    if ct > 0:                                    # ... added rounded to nearest (part is
                        for q in unroll(BN // 2):                 # never zeroed: ptxas would serialize)
                            acc[q] = acc[q] + part[q]
                    if ct > 0 and threadIdx.x % 32 == 0:
                        mbarrier_arrive(empty[(ct + STG - 1) % STG])
                    # every consumer's split of tile ct is in, and every consumer has retired tile
                    # ct - 1, whose lows the next split overwrites
                    bar_sync(1, CONSUMERS)
                    wgmma_fence()
                    # the small products first; the tile's first overwrites part
                    wgmma_tf32(part, sa_lo[lb, 0, wg * WG_M, 0], sb[st, 0, 0, 0], BN, False)
                    wgmma_tf32(part, sa[st, 0, wg * WG_M, 0], sb_lo[lb, 0, 0, 0], BN)
                    wgmma_tf32(part, sa[st, 0, wg * WG_M, 0], sb[st, 0, 0, 0], BN)
                    for kk in unroll(1, BK // KSTEP):
                        ja, ko = kk // 4, kk % 4 * KSTEP
                        wgmma_tf32(part, sa_lo[lb, ja, wg * WG_M, ko], sb[st, ja, 0, ko], BN)
                        wgmma_tf32(part, sa[st, ja, wg * WG_M, ko], sb_lo[lb, ja, 0, ko], BN)
                        wgmma_tf32(part, sa[st, ja, wg * WG_M, ko], sb[st, ja, 0, ko], BN)
                    wgmma_commit()
                else:
                    wgmma_fence()
                    for kk in unroll(BK // KSTEP):
                        WGMMA(acc, sa[st, kk // 4, wg * WG_M, kk % 4 * KSTEP], sb[st, kk // 4, 0, kk % 4 * KSTEP], BN)
                    wgmma_commit()
                    wgmma_wait(1)                                 # tile ct - 1's group has retired ...
                    if ct > 0 and threadIdx.x % 32 == 0:
                        mbarrier_arrive(empty[(ct + STG - 1) % STG])   # ... so its stage may be refilled
            if X3:
                wgmma_wait(0, part, BN // 2)
                if tiles > 0:
                    for q in unroll(BN // 2):
                        acc[q] = acc[q] + part[q]
            wgmma_wait(0, acc, BN // 2)
            for q, (i, j) in enumerate(C_LAYOUT.on(threadIdx.x % WG_THREADS)):
                gr = row0 + wg * WG_M + i
                gc = col0 + j
                if gr < m and gc < n:
                    if BIAS:
                        c[blockIdx.z, gr, gc] = acc[q] + f32(bias[gc])
                    else:
                        c[blockIdx.z, gr, gc] = acc[q]

    return matmul_wgmma_tma


__all__ = ["PRODUCER_THREADS", "build_kernel_tma", "tma_applies"]
