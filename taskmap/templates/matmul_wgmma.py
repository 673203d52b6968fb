"""Matmul on Hopper's warpgroup tensor cores (``wgmma``, sm_90a), as a template: f32 in and out with
products on tf32 where the problem allows TF32 (``MatmulProblem.tf32``) or as 3xTF32 (below); or
f16 / bf16 in (``wgmma_f16``, k16), f32 sums, out in the input type or f32.

A block is ``BM / 64`` warpgroups (128 threads each); warpgroup ``g`` computes rows ``64 g ..
64 g + 63`` of the block's ``BM x BN`` tile of C in ``BN / 2`` f32 accumulators a thread
(``wgmma_c_layout(BN)``), with one ``wgmma_tf32`` per 8 of K that reads a 64 x 8 slice of A and a
``BN x 8`` slice of B straight from shared memory.  Tiles of A (``BM x BK``) and B (``BN x BK``,
one or two 128-byte columns: BK 32 or 64 floats, 64 or 128 halves) stream through a
``stages``-deep ``cp_async`` ring, stored in wgmma's K-major layout: one 128-byte swizzled row per
row of A or column of C per column (``wgmma_sw128``, ``wgmma_sw128_b16``).  Per k-tile: wait
for its copies, ``fence_proxy_async`` (they are ordinary writes; the tensor cores read through the
async proxy), a barrier, ``wgmma_fence``, four ``wgmma_tf32``, ``wgmma_commit``, then
``wgmma_wait(inflight)``: with ``inflight = 1`` (TF32) a k-tile's wgmma still run while the next
tile's copies are waited for and its wgmma issued — the ring then loads ``stages - 2`` tiles ahead,
so that the stage being refilled is never one a pending wgmma reads.

B stored ``N x K`` (a linear's weight, ``trans_b``) is K-major already: 16-byte chunks.  An f32 B
stored ``K x N`` is transposed on its way in: each element is its own 4-byte ``cp_async`` to its
place in the K-major tile (tf32 wgmma reads K-major operands only); 16-bit problems take an
``N x K`` B only (the mma.sync template runs the others).  Every access is predicated, so any m,
n, k works: out-of-range chunks are zero-filled; rows that are not 16-byte aligned (k not a
multiple of 4) are copied element by element.  With ``split > 1`` K is cut into ranges whose f32
partial results an epilogue kernel sums (:mod:`.matmul_splitk`).

The tensor cores read the operands' top 19 bits (tf32 by truncation; the mma.sync template rounds
to nearest) and truncate their sums; the error is TF32's either way (``testing.TOLERANCES``).

3xTF32 (``MatmulProblem.tf32x3``, ``WgConfig.x3``): f32 products at about f32's accuracy.  Once a
k-tile has landed, the block splits it in shared memory — each element ``x`` into ``hi =
round_tf32(x)`` in place and ``lo = round_tf32(x - hi)`` in one of two buffers beside the ring —
while the previous tile's wgmma run; each 8 of K takes three wgmma, ``lo_a hi_b``, ``hi_a lo_b``,
``hi_a hi_b``, into a partial accumulator that starts at zero every k-tile and is added to the f32
accumulators with round-to-nearest once its group is done (the tensor cores truncate their sums:
summed over all of K that drift is 10x f32's error; see ``matmul_tc``).  Three times the
tensor-core work, the split once per element and block, ``BN / 2`` more registers a thread.

The graph compiler's choice on sm_90a for the products it applies to (:func:`enabled`;
``TASKMAP_WGMMA=0`` turns it off): on an H200 (session 27) every wgmma kernel matched in the GPU
tests, and it ran 1.2-2.0x faster than the mma.sync template on TF32 / f16 linears and BERT / ViT
at batch 8 1.1-1.4x faster in 3xTF32 and f16 (``benchmarks/RESULTS.md``); it is still 0.3-0.6x
cuBLAS (no TMA, no warp specialization).  ``TASKMAP_WGMMA=tma`` gives the linears it applies to the
warp-specialized TMA form instead (:mod:`.matmul_wgmma_tma`, not yet timed on a GPU).
"""

import os
from dataclasses import dataclass
from typing import Any

from ..backends.base import Target, TargetKind
from ..ir.dtypes import scalar_type
from ..ir.mapping import auto_map
from ..lang import (attrs, blockIdx, cp_async, cp_async_commit, cp_async_wait, f32, fence_proxy_async,
                    register_tensor, round_tf32, shared_tensor, syncthreads, threadIdx, unroll,
                    wgmma_c_layout, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_sw128, wgmma_sw128_b16, wgmma_tf32,
                    wgmma_wait)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from ..schedule.cost_model import Workload, estimate_time
from .base import Schedule
from .matmul_problem import MatmulProblem
from .matmul_simt import GpuMatmulFamily, chain, gpu_param_types
from .matmul_splitk import ceil_div, splits_for
from .matmul_wgmma_tma import PRODUCER_THREADS, build_kernel_tma, tma_applies

WG_M = 64                     # rows of one wgmma (a warpgroup)
WG_THREADS = 128
BLOCK_M = (64, 128)           # one or two warpgroups
BLOCK_N = (64, 128, 256)
STAGES = (3, 4)
HALF_TYPES = ("float16", "bfloat16")
L2_REREAD = 0.1               # cost model: a byte read again by another tile (an L2 hit) / one from memory
SPLIT_COST = 4e-6             # ... seconds a split of K adds (the partial sums' round trip, the reduction)
ONE_WARPGROUP = 0.8           # ... the rate of a block of one warpgroup (64 rows) against two


def enabled() -> bool:
    """Whether the graph compiler may pick this template (the default; ``TASKMAP_WGMMA=0``: not)."""
    return os.environ.get("TASKMAP_WGMMA", "1") != "0"


def tma_enabled() -> bool:
    """Whether the template's schedules are those of its TMA form where it applies
    (``TASKMAP_WGMMA=tma``: opt-in until timed on a GPU)."""
    return os.environ.get("TASKMAP_WGMMA", "1") == "tma"


@dataclass(frozen=True)
class WgConfig:
    bm: int
    bn: int
    bk: int
    stages: int
    split: int
    inflight: int             # wgmma groups left running across a k-tile: 0 or 1 (3xTF32: 1)
    a_batched: bool
    b_batched: bool
    trans_b: bool
    bias: bool
    x3: bool = False          # f32 as 3xTF32: tiles split into tf32 high and low parts, three wgmma
    dtype: str = "float32"
    out_dtype: str = "float32"
    tma: bool = False         # the TMA form: tiles by the copy engine, a producer warp (matmul_wgmma_tma)

    @property
    def itemsize(self) -> int:
        return scalar_type(self.dtype).nbytes

    @property
    def atom_k(self) -> int:
        """Elements of one 128-byte swizzled row (a k-tile has one or two)."""
        return 128 // self.itemsize

    def smem_bytes(self) -> int:
        return (self.stages + 2 * self.x3) * (self.bm + self.bn) * self.bk * self.itemsize + 16 * self.stages * self.tma

    @property
    def threads(self) -> int:
        """A block's threads: its warpgroups, and the TMA form's producer warp."""
        return WG_THREADS * self.bm // WG_M + PRODUCER_THREADS * self.tma


def build_kernel(cfg: WgConfig) -> Kernel:
    BM, BN, BK, STG, S, FLY = cfg.bm, cfg.bn, cfg.bk, cfg.stages, cfg.split, cfg.inflight
    T = scalar_type(cfg.dtype)
    ATOM_K = cfg.atom_k
    VEC = 16 // cfg.itemsize                          # elements per 16-byte chunk
    KSTEP = 32 // cfg.itemsize                        # k of one wgmma: 8 (tf32) or 16
    KA = BK // ATOM_K                                 # swizzle columns of a k-tile
    SW = wgmma_sw128 if T is f32 else wgmma_sw128_b16
    WGMMA = wgmma_tf32 if T is f32 else wgmma_f16
    AHEAD = STG - 1 - FLY                             # tiles loaded ahead of the one multiplied
    assert AHEAD >= 1 and (FLY or not cfg.x3)         # 3xTF32 leaves a group running across the split
    assert KA in (1, 2) and BK == KA * ATOM_K, f"BK {BK} is not one or two swizzle columns of {ATOM_K}"
    THREADS = WG_THREADS * (BM // WG_M)
    TRANS_B, A_BATCHED, B_BATCHED, X3 = cfg.trans_b, cfg.a_batched, cfg.b_batched, cfg.x3
    BIAS = cfg.bias and S == 1
    C_LAYOUT = wgmma_c_layout(BN)
    a_chunks = auto_map((BM, BK // VEC), THREADS)
    b_chunks = auto_map((BN, BK // VEC), THREADS) if TRANS_B else auto_map((BK, BN), THREADS)
    a_split, b_split = (auto_map((KA, rows, ATOM_K), THREADS) for rows in (BM, BN))   # 3xTF32: element by element
    (m, n, k, cz), (A_T, B_T, BIAS_T, C_T) = gpu_param_types(cfg.dtype, cfg.out_dtype, A_BATCHED, B_BATCHED, TRANS_B,
                                                              cfg.bias, S)

    @kernel
    def matmul_wgmma(a: A_T, b: B_T, bias: BIAS_T, c: C_T):
        attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM, cz)
        attrs.block_dim = THREADS
        sa = shared_tensor(T, [STG, KA, BM, ATOM_K])              # element (r, k): [k // ATOM_K, r, swizzled]
        sb = shared_tensor(T, [STG, KA, BN, ATOM_K])
        sa_lo = shared_tensor(T, [2, KA, BM, ATOM_K] if X3 else [1, 1, 1, ATOM_K])   # 3xTF32: two tiles' lows
        sb_lo = shared_tensor(T, [2, KA, BN, ATOM_K] if X3 else [1, 1, 1, ATOM_K])
        acc = register_tensor(f32, [BN // 2])
        part = register_tensor(f32, [BN // 2 if X3 else 1])     # 3xTF32: one k-tile's products
        for q in unroll(BN // 2 if X3 else 1):
            part[q] = 0.0
        for q in unroll(BN // 2):
            acc[q] = 0.0
        wg = threadIdx.x // WG_THREADS
        bi = blockIdx.z // S
        ai = bi if A_BATCHED else 0
        bj = bi if B_BATCHED else 0
        row0 = blockIdx.y * BM
        col0 = blockIdx.x * BN
        aligned = k % VEC == 0                        # rows of A (and of an N x K B) start 16-byte aligned
        kt = (k + BK - 1) // BK
        per = (kt + S - 1) // S
        t0 = blockIdx.z % S * per
        tiles = max(min(t0 + per, kt) - t0, 0)
        # The ring's first tiles, then per k-tile: multiply tile ct, load tile ct + AHEAD.  The two loops
        # repeat the load: a branch around the wgmma of one loop would make ptxas serialize them.
        for t in range(AHEAD):
            if t < tiles:
                st = t % STG
                kb = (t0 + t) * BK
                for r, ch in a_chunks.on(threadIdx.x):
                    gr = row0 + r
                    gk = kb + ch * VEC
                    sw = SW(r, ch * VEC % ATOM_K)
                    if aligned:
                        ok = gr < m and gk < k
                        cp_async(sa[st, ch * VEC // ATOM_K, r, sw], a[ai, gr if ok else 0, gk if ok else 0], 16,
                                 16 if ok else 0)
                    else:
                        for e in unroll(VEC):
                            sa[st, ch * VEC // ATOM_K, r, sw + e] = a[ai, gr, gk + e] if gr < m and gk + e < k \
                                else 0.0
                if TRANS_B:
                    for r, ch in b_chunks.on(threadIdx.x):
                        gn = col0 + r
                        gk = kb + ch * VEC
                        sw = SW(r, ch * VEC % ATOM_K)
                        if aligned:
                            ok = gn < n and gk < k
                            cp_async(sb[st, ch * VEC // ATOM_K, r, sw], b[bj, gn if ok else 0, gk if ok else 0],
                                     16, 16 if ok else 0)
                        else:
                            for e in unroll(VEC):
                                sb[st, ch * VEC // ATOM_K, r, sw + e] = b[bj, gn, gk + e] \
                                    if gn < n and gk + e < k else 0.0
                else:                                 # K x N: each element to its K-major place
                    for kr, cn in b_chunks.on(threadIdx.x):
                        gk = kb + kr
                        gc = col0 + cn
                        ok = gk < k and gc < n
                        cp_async(sb[st, kr // ATOM_K, cn, SW(cn, kr % ATOM_K)],
                                 b[bj, gk if ok else 0, gc if ok else 0], 4, 4 if ok else 0)
            cp_async_commit()
        for ct in range(tiles):
            cp_async_wait(AHEAD - 1)                  # tile ct has landed ...
            fence_proxy_async()                       # ... for the tensor cores' reads ...
            syncthreads()                             # ... of every thread; tile ct - 1 is consumed
            st = ct % STG
            if X3:                                # split tile ct while tile ct - 1's wgmma run
                lb = ct % 2
                for j, r, e in a_split.on(threadIdx.x):   # place by place: the layout stays
                    hi = round_tf32(sa[st, j, r, e])
                    sa_lo[lb, j, r, e] = round_tf32(sa[st, j, r, e] - hi)
                    sa[st, j, r, e] = hi
                for j, r, e in b_split.on(threadIdx.x):
                    hi = round_tf32(sb[st, j, r, e])
                    sb_lo[lb, j, r, e] = round_tf32(sb[st, j, r, e] - hi)
                    sb[st, j, r, e] = hi
                fence_proxy_async()
                syncthreads()
                wgmma_wait(0, part, BN // 2)          # tile ct - 1's products ...
                for q in unroll(BN // 2):             # ... added rounded to nearest (the wgmma truncate)
                    acc[q] = acc[q] + part[q]
                    part[q] = 0.0
                wgmma_fence()
                for kk in unroll(BK // KSTEP):        # the small products first
                    ja, ko = kk // 4, kk % 4 * KSTEP  # a swizzle column holds 4 k-steps
                    wgmma_tf32(part, sa_lo[lb, ja, wg * WG_M, ko], sb[st, ja, 0, ko], BN)
                    wgmma_tf32(part, sa[st, ja, wg * WG_M, ko], sb_lo[lb, ja, 0, ko], BN)
                    wgmma_tf32(part, sa[st, ja, wg * WG_M, ko], sb[st, ja, 0, ko], BN)
                wgmma_commit()
            else:
                wgmma_fence()
                for kk in unroll(BK // KSTEP):
                    WGMMA(acc, sa[st, kk // 4, wg * WG_M, kk % 4 * KSTEP], sb[st, kk // 4, 0, kk % 4 * KSTEP], BN)
                wgmma_commit()
                if FLY:                           # its stage is not refilled next; acc is not read
                    wgmma_wait(FLY)
                else:
                    wgmma_wait(0, acc, BN // 2)
            t = ct + AHEAD
            if t < tiles:
                st = t % STG
                kb = (t0 + t) * BK
                for r, ch in a_chunks.on(threadIdx.x):
                    gr = row0 + r
                    gk = kb + ch * VEC
                    sw = SW(r, ch * VEC % ATOM_K)
                    if aligned:
                        ok = gr < m and gk < k
                        cp_async(sa[st, ch * VEC // ATOM_K, r, sw], a[ai, gr if ok else 0, gk if ok else 0], 16,
                                 16 if ok else 0)
                    else:
                        for e in unroll(VEC):
                            sa[st, ch * VEC // ATOM_K, r, sw + e] = a[ai, gr, gk + e] if gr < m and gk + e < k \
                                else 0.0
                if TRANS_B:
                    for r, ch in b_chunks.on(threadIdx.x):
                        gn = col0 + r
                        gk = kb + ch * VEC
                        sw = SW(r, ch * VEC % ATOM_K)
                        if aligned:
                            ok = gn < n and gk < k
                            cp_async(sb[st, ch * VEC // ATOM_K, r, sw], b[bj, gn if ok else 0, gk if ok else 0],
                                     16, 16 if ok else 0)
                        else:
                            for e in unroll(VEC):
                                sb[st, ch * VEC // ATOM_K, r, sw + e] = b[bj, gn, gk + e] \
                                    if gn < n and gk + e < k else 0.0
                else:                                 # K x N: each element to its K-major place
                    for kr, cn in b_chunks.on(threadIdx.x):
                        gk = kb + kr
                        gc = col0 + cn
                        ok = gk < k and gc < n
                        cp_async(sb[st, kr // ATOM_K, cn, SW(cn, kr % ATOM_K)],
                                 b[bj, gk if ok else 0, gc if ok else 0], 4, 4 if ok else 0)
            cp_async_commit()                         # one group per tile, empty ones included
        if X3:
            wgmma_wait(0, part, BN // 2)
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

    return matmul_wgmma


class MatmulWgmmaTemplate(GpuMatmulFamily):
    """Matmul on Hopper's wgmma (sm_90a): f32 with TF32 or 3xTF32 products, or f16 / bf16."""

    name = "matmul_wgmma"

    @property
    def version(self) -> Any:
        """1: TF32 (0 or 1 wgmma group left running), 3xTF32, f16 / bf16; "1-tma": the space of
        ``TASKMAP_WGMMA=tma`` (its choices are remembered and cached apart)."""
        return "1-tma" if tma_enabled() else 1

    def applies(self, problem: Any, target: Target) -> bool:
        if not (isinstance(problem, MatmulProblem) and target.kind is TargetKind.CUDA and "wgmma" in target.features
                and not problem.trans_c):
            return False
        p = problem
        if p.dtype == "float32":
            return p.out_dtype == "float32" and (p.tf32 or p.tf32x3)
        return p.dtype in HALF_TYPES and p.out_dtype in (p.dtype, "float32") and p.trans_b

    def space(self, problem: MatmulProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p = problem
        x3 = self._cfg(p, 64, 64, 64, 3, 1, 1).x3
        atom = 128 // scalar_type(p.dtype).nbytes
        tma = int(tma_enabled() and tma_applies(p))
        out = []
        for bm in BLOCK_M:
            for bn in BLOCK_N:
                if (bm > WG_M and bm >= 2 * p.m) or (bn > BLOCK_N[0] and bn >= 2 * p.n):   # mostly outside C
                    continue
                if bn > 128 and x3:                    # two accumulator sets of 128: past 255 registers
                    continue
                for bk in (atom, 2 * atom):
                    for stages in STAGES:
                        cfg = self._cfg(p, bm, bn, bk, stages, 1, 0, tma)
                        if cfg.smem_bytes() > target.max_shared_memory_optin:
                            continue
                        tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn)
                        for split in splits_for(target, tiles, p.k, bk):
                            if tma:                   # one group always left running
                                out.append(Schedule.of(bm=bm, bn=bn, bk=bk, stages=stages, split=split, inflight=1,
                                                       tma=1))
                                continue
                            # a group left running: 3xTF32 always; ptxas serializes the wgmma past 128
                            # columns or with one tile loaded ahead (3 stages)
                            flights = (0, 1) if bn <= 128 and stages >= 4 else (0,)
                            for inflight in [f for f in flights if f or not x3]:
                                out.append(Schedule.of(bm=bm, bn=bn, bk=bk, stages=stages, split=split,
                                                       inflight=inflight))
        return out

    def cost(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> float:
        p, s = problem, schedule.as_dict()
        bm, bn, bk, split = s["bm"], s["bn"], s["bk"], s["split"]
        cfg = self._cfg(p, bm, bn, bk, s["stages"], split, s["inflight"], s.get("tma", 0))
        size = cfg.itemsize
        tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn) * split
        padded = p.batch * ceil_div(p.m, bm) * bm * ceil_div(p.n, bn) * bn * ceil_div(p.k, bk) * bk
        # TF32 at half the f16 rate; a group left running hides a little more (the ring's depth did not
        # matter on an H200; these factors and the constants above are fitted to session 27's
        # measurements of its whole space on BERT's batch-8 linears: model_vs_exhaustive.py wgmma)
        eff = (0.5 if p.dtype == "float32" else 1.0) * (0.55 + 0.05 * s["inflight"])
        eff *= (ONE_WARPGROUP if bm == WG_M else 1.0) * (p.batch * p.m * p.n * p.k) / padded
        eff *= bk / (bk + 32 // size)   # each k-tile's wait, barrier and copies' addressing
        if p.k % (16 // size):
            eff *= 0.6                  # element-wise copies
        if not p.trans_b:
            eff *= 0.8                  # B's elements copied one by one into K-major tiles
        if cfg.x3:
            eff *= 0.85                 # the split pass (beside the previous tile's wgmma) and a barrier
        if cfg.tma:
            eff *= 0.8 / 0.6            # no copies' addressing, no block barrier: not measured yet (a guess)
        out_b = scalar_type(p.out_dtype).nbytes
        # A and B from memory once; the tiles' re-reads mostly hit the L2, at a fifth of the cost
        once = size * p.batch * (p.m * p.k + p.k * p.n)
        reread = size * p.batch * (p.m * p.k * ceil_div(p.n, bn) + p.k * p.n * ceil_div(p.m, bm)) - once
        global_bytes = once + L2_REREAD * reread + p.batch * p.m * p.n * (12 * split if split > 1 else out_b)
        w = Workload(flops=p.flops * (3 if cfg.x3 else 1), global_bytes=global_bytes,
                     cache_bytes=p.flops / 2 * size * (1 / bm + 1 / bn), work_items=tiles,
                     threads_per_item=cfg.threads,
                     registers_per_thread=min(255, bn // 2 * (1 + cfg.x3) + 48), shared_per_item=cfg.smem_bytes(),
                     inner_bytes=size * bk, matrix_units=True, compute_efficiency=eff)
        return estimate_time(target, w) + (SPLIT_COST if split > 1 else 0.0) + 3e-6

    @staticmethod
    def _cfg(p: MatmulProblem, bm: int, bn: int, bk: int, stages: int, split: int, inflight: int,
             tma: int = 0) -> WgConfig:
        return WgConfig(bm, bn, bk, stages, split, inflight, p.a_batched, p.b_batched, p.trans_b, p.bias,
                        p.dtype == "float32" and p.tf32x3 and not p.tf32, p.dtype, p.out_dtype, bool(tma))

    def config(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> WgConfig:
        """Everything the kernel depends on (the key of its cache entries)."""
        s = schedule.as_dict()
        return self._cfg(problem, s["bm"], s["bn"], s["bk"], s["stages"], s["split"], s["inflight"], s.get("tma", 0))

    @staticmethod
    def without_tma(schedule: Schedule) -> Schedule:
        """The cp.async form of a schedule: for operands a fused prologue computes (the copy engine
        reads tensors, not definitions); a group is left running where that form allows it."""
        s = schedule.as_dict()
        if not s.pop("tma", 0):
            return schedule
        s["inflight"] = int(s["bn"] <= 128 and s["stages"] >= 4)
        return Schedule.of(**s)

    def instantiate(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Any:
        cfg = self.config(problem, target, schedule)
        build = build_kernel_tma if cfg.tma else build_kernel
        return self.kernel(cfg, lambda: chain(build(cfg), cfg.split, cfg.out_dtype, cfg.bias))


MATMUL_WGMMA = MatmulWgmmaTemplate()

__all__ = ["MATMUL_WGMMA", "MatmulWgmmaTemplate", "WgConfig", "build_kernel", "enabled", "tma_enabled"]
