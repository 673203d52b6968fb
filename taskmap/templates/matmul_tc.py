"""Tensor-core matmul for sm_80+, as a template: f16 / bf16 in, f32 accumulation, result in the
input dtype (``mma.sync.m16n8k16`` + ``ldmatrix``), or f32 in and out with the products on TF32
tensor cores (``mma.sync.m16n8k8.tf32``: operands rounded to 10-bit mantissas, f32 sums) when the
problem allows it (``MatmulProblem.tf32``); both behind a multi-stage ``cp.async`` pipeline.

A block of ``wm x wn`` warps computes a ``BM x BN`` tile of C; warp ``(i, j)`` owns a
``WM x WN`` sub-tile (``WM = BM / wm``, ``WN = BN / wn``) as ``WM/16 x WN/8`` mma tiles whose f32
accumulators stay in registers.  Tiles of A (``BM x BK``) and B stream through shared memory in a
``stages``-deep ``cp_async`` ring: tile t is loaded while tile ``t - (stages - 1)`` is multiplied.
``ldmatrix_x4`` moves 16x16 sub-tiles into fragments: A row-major; B stored ``K x N`` with
``.trans``; a ``linear`` weight (``trans_b``, stored ``N x K``) row-major with the lanes'
row addresses of :data:`B_NK_ROWS`.  The result fragments are written through ``mma_c_layout``.

Every access is predicated, so any m, n, k works: out-of-range 16-byte chunks are zero-filled
(``src_bytes=0``); when an operand's rows are not 16-byte aligned (k, or n for a stored B, not a
multiple of 8) its tiles are copied element by element instead (same pipeline, same layout).
With ``split > 1`` K is cut into ranges whose f32 partial results an epilogue kernel sums
(:mod:`.matmul_splitk`).

TF32: the same tiles and pipeline on f32 data (16-byte chunks of 4 floats).  ``ldmatrix`` of
32-bit elements gives lane ``(g, t)`` row ``g``, column ``t`` of each 8x4 matrix — the tf32
fragments of A (``ldmatrix_x4_rows_b32``) and of an ``N x K`` B (:data:`B_NK_ROWS_B32`, two column
tiles per load); a ``K x N`` B's fragments (row ``t``, column ``g``) are read element by element
(``mma_tf32_b_layout``: a transposing ``ldmatrix`` would split the 32-bit words).  Fragments are
rounded to tf32 once for all the mma calls that read them (``tf32_operand``, ``rounded=True``).
3xTF32 (``MatmulProblem.tf32x3``, ``TcConfig.x3``): f32 products at about f32's accuracy on the
same tensor cores.  Each fragment element ``x`` is split once into ``hi = round_tf32(x)`` (exact in
tf32) and ``lo = x - hi`` (exact in f32, then a tf32 operand), and each mma tile takes three
calls — ``lo_a * hi_b``, ``hi_a * lo_b``, then ``hi_a * hi_b``; the dropped ``lo_a * lo_b`` is
~2^-22 of a product (CUTLASS's "3xTF32").  The three go into a zeroed fragment that an f32 add then
folds into the accumulators: the tensor cores truncate their sums (round toward zero), and with the
accumulators as the mma's C that bias grew with K — at 1024x768x3072 (split 2) the error was 14x
the SIMT kernel's f32 FMAs on an H200, 0.3x of them in an emulation of the truncating sums with the
partial fragment.  Three times the tensor-core work and ``MI * 4 + NI * 2 + 4`` more registers a lane.
The row padding keeps the reads free of bank conflicts: 4 floats for A and an ``N x K`` B (the 8
rows of a matrix start 20 or 36 words apart: distinct 4-bank groups), 8 floats for a ``K x N`` B
(row ``t``, column ``g``: banks ``8t + g``).

Space: block tiles 32..128 x 32..128, BK 32 / 64 (TF32: 16 / 32), warp grids of 1..8 warps with
warp tiles of at least 16 x 16, 2..4 stages, split-K; pruned by shared memory and registers per
thread.
"""
from dataclasses import dataclass
from typing import Any

from ..lang.kernel import kernel
from ..ir.mapping import auto_map, custom_mapping
from ..lang import (MMA_K, MMA_M, MMA_N, MMA_TF32_K, attrs, blockIdx, cp_async, cp_async_commit, cp_async_wait,
                    f32, lane_id, ldmatrix_x4, ldmatrix_x4_rows, ldmatrix_x4_rows_b32, mma_c_layout,
                    mma_sync_m16n8k8_tf32, mma_sync_m16n8k16, mma_tf32_b_layout, register_tensor, round_tf32,
                    shared_tensor, syncthreads, tf32_operand, threadIdx, unroll, warp_id)

from ..backends.base import Target, TargetKind
from ..ir.dtypes import scalar_type
from ..runtime.kernel import Kernel
from ..schedule.cost_model import Workload, estimate_time
from .base import Schedule
from .matmul_problem import MatmulProblem
from .matmul_simt import GpuMatmulFamily, chain, gpu_param_types
from .matmul_splitk import ceil_div, splits_for

def _b_nk_rows(half: int) -> Any:
    """``ldmatrix_x4`` row addresses for B stored N x K, ``half`` elements to a 16-byte row:
    matrices (n 0-7, k first half), (n 0-7, k second half), (n 8-15, first), (n 8-15, second)."""
    return custom_mapping((16, 2 * half), 32, 1, lambda lane, q: (lane // 16 * 8 + lane % 8, lane // 8 % 2 * half))


#: f16 / bf16: the fragments of two 8-column mma tiles, in order.
B_NK_ROWS = _b_nk_rows(8)
#: f32 (``ldmatrix_x4`` of 32-bit elements): b0, b1 of two 8-column tf32 mma tiles, in order.
B_NK_ROWS_B32 = _b_nk_rows(4)
BLOCK_TILES = (32, 64, 128)
BKS = (32, 64)
TF32_BKS = (16, 32)            # floats: the same bytes per row as f16's 32 / 64
WARP_GRIDS = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4))
STAGES = (2, 3, 4)             # 3-4 with BK 32, 2-3 with BK 64


@dataclass(frozen=True)
class TcConfig:
    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int
    split: int
    dtype: str
    out_dtype: str
    a_batched: bool
    b_batched: bool
    trans_b: bool
    bias: bool
    x3: bool = False        # f32 as 3xTF32: each operand split into a tf32 high and low part, three mma

    @property
    def tf32(self) -> bool:
        return self.dtype == "float32"

    @property
    def itemsize(self) -> int:
        return scalar_type(self.dtype).nbytes

    @property
    def vec(self) -> int:
        """Elements per 16-byte chunk (one ``cp_async``)."""
        return 16 // self.itemsize

    @property
    def pads(self) -> tuple[int, int]:
        """Padding of the A and B rows in shared memory (elements; rows stay 16-byte aligned)."""
        return self.vec, (self.vec if self.trans_b else 8)

    def smem_bytes(self) -> int:
        b_rows, b_cols = (self.bn, self.bk) if self.trans_b else (self.bk, self.bn)
        pa, pb = self.pads
        return self.stages * (self.bm * (self.bk + pa) + b_rows * (b_cols + pb)) * self.itemsize


def build_kernel(cfg: TcConfig) -> Kernel:
    BM, BN, BK, WGM, WGN, STG, S = cfg.bm, cfg.bn, cfg.bk, cfg.wm, cfg.wn, cfg.stages, cfg.split
    WM, WN = BM // WGM, BN // WGN
    MI, NI = WM // MMA_M, WN // MMA_N
    THREADS = 32 * WGM * WGN
    T = scalar_type(cfg.dtype)
    TRANS_B, A_BATCHED, B_BATCHED, TF32, X3 = cfg.trans_b, cfg.a_batched, cfg.b_batched, cfg.tf32, cfg.x3
    assert TF32 or not X3
    BIAS = cfg.bias and S == 1
    VEC, (PAD_A, PAD_B) = cfg.vec, cfg.pads
    FA, FB = (4, 2) if TF32 else (8, 4)       # fragment registers per lane: A (16 x K), B (K x 8)
    a_chunks = auto_map((BM, BK // VEC), THREADS)
    b_chunks = auto_map((BN, BK // VEC), THREADS) if TRANS_B else auto_map((BK, BN // VEC), THREADS)
    SB_SHAPE = [STG, BN, BK + PAD_B] if TRANS_B else [STG, BK, BN + PAD_B]
    (m, n, k, cz), (A_T, B_T, BIAS_T, C_T) = gpu_param_types(cfg.dtype, cfg.out_dtype, A_BATCHED, B_BATCHED, TRANS_B,
                                                              cfg.bias, S)

    @kernel
    def matmul_tc(a: A_T, b: B_T, bias: BIAS_T, c: C_T):
        attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM, cz)
        attrs.block_dim = THREADS
        sa = shared_tensor(T, [STG, BM, BK + PAD_A])
        sb = shared_tensor(T, SB_SHAPE)
        acc = register_tensor(f32, [MI, NI, 4])
        af = register_tensor(T, [MI, FA])
        bf = register_tensor(T, [NI, FB])
        af_lo = register_tensor(T, [MI if X3 else 1, FA])     # 3xTF32: the low parts
        bf_lo = register_tensor(T, [NI if X3 else 1, FB])
        part = register_tensor(f32, [4])                      # 3xTF32: one k-step's three products
        for i in unroll(MI):
            for j in unroll(NI):
                for q in unroll(4):
                    acc[i, j, q] = 0.0
        wy = warp_id() // WGN
        wx = warp_id() % WGN
        bi = blockIdx.z // S
        ai = bi if A_BATCHED else 0
        bj = bi if B_BATCHED else 0
        row0 = blockIdx.y * BM
        col0 = blockIdx.x * BN
        aligned_a = k % VEC == 0                              # rows of A start 16-byte aligned
        aligned_b = (k if TRANS_B else n) % VEC == 0          # rows of B
        kt = (k + BK - 1) // BK
        per = (kt + S - 1) // S
        t0 = blockIdx.z % S * per
        tiles = max(min(t0 + per, kt) - t0, 0)
        for t in range(tiles + STG - 1):              # load tile t, multiply tile t - (STG - 1)
            ct = t - (STG - 1)
            if ct >= 0:
                cp_async_wait(STG - 2)                # tile ct has landed ...
                syncthreads()                         # ... for every thread; tile ct-1 is consumed
            if t < tiles:
                st = t % STG
                kb = (t0 + t) * BK
                for r, ch in a_chunks.on(threadIdx.x):
                    gr = row0 + r
                    gk = kb + ch * VEC
                    if aligned_a:
                        ok = gr < m and gk < k
                        cp_async(sa[st, r, ch * VEC], a[ai, gr if ok else 0, gk if ok else 0], 16, 16 if ok else 0)
                    else:
                        for e in unroll(VEC):
                            sa[st, r, ch * VEC + e] = a[ai, gr, gk + e] if gr < m and gk + e < k else 0.0
                if TRANS_B:
                    for r, ch in b_chunks.on(threadIdx.x):
                        gn = col0 + r
                        gk = kb + ch * VEC
                        if aligned_b:
                            ok = gn < n and gk < k
                            cp_async(sb[st, r, ch * VEC], b[bj, gn if ok else 0, gk if ok else 0], 16,
                                     16 if ok else 0)
                        else:
                            for e in unroll(VEC):
                                sb[st, r, ch * VEC + e] = b[bj, gn, gk + e] if gn < n and gk + e < k else 0.0
                else:
                    for r, ch in b_chunks.on(threadIdx.x):
                        gk = kb + r
                        gc = col0 + ch * VEC
                        if aligned_b:
                            ok = gk < k and gc < n
                            cp_async(sb[st, r, ch * VEC], b[bj, gk if ok else 0, gc if ok else 0], 16,
                                     16 if ok else 0)
                        else:
                            for e in unroll(VEC):
                                sb[st, r, ch * VEC + e] = b[bj, gk, gc + e] if gk < k and gc + e < n else 0.0
            cp_async_commit()                         # one group per iteration, empty ones included
            if ct >= 0:
                st = ct % STG
                if TF32:
                    for kk in unroll(BK // MMA_TF32_K):
                        for mi in unroll(MI):
                            for i, j in ldmatrix_x4_rows_b32.on(lane_id()):
                                ldmatrix_x4(af[mi, 0], sa[st, wy * WM + mi * MMA_M + i, kk * MMA_TF32_K + j])
                            for q in unroll(FA):
                                if X3:                # high part exact in tf32, low part the rest
                                    hi = round_tf32(af[mi, q])
                                    af_lo[mi, q] = tf32_operand(af[mi, q] - hi)
                                    af[mi, q] = hi
                                else:
                                    af[mi, q] = tf32_operand(af[mi, q])
                        if TRANS_B:                   # one x4 load: the fragments of 2 column tiles
                            for nj in unroll(NI // 2):
                                for i, j in B_NK_ROWS_B32.on(lane_id()):
                                    ldmatrix_x4(bf[nj * 2, 0],
                                                sb[st, wx * WN + nj * 2 * MMA_N + i, kk * MMA_TF32_K + j])
                        else:                         # K x N: ldmatrix would split the 32-bit words
                            for ni in unroll(NI):
                                for q, (i, j) in enumerate(mma_tf32_b_layout.on(lane_id())):
                                    bf[ni, q] = sb[st, kk * MMA_TF32_K + i, wx * WN + ni * MMA_N + j]
                        for ni in unroll(NI):
                            for q in unroll(FB):
                                if X3:
                                    hi = round_tf32(bf[ni, q])
                                    bf_lo[ni, q] = tf32_operand(bf[ni, q] - hi)
                                    bf[ni, q] = hi
                                else:
                                    bf[ni, q] = tf32_operand(bf[ni, q])
                        for mi in unroll(MI):
                            for ni in unroll(NI):
                                if X3:                # the small products first: lo x hi, hi x lo, then hi x hi
                                    for q in unroll(4):
                                        part[q] = 0.0
                                    mma_sync_m16n8k8_tf32(part[0], af_lo[mi, 0], bf[ni, 0], rounded=True)
                                    mma_sync_m16n8k8_tf32(part[0], af[mi, 0], bf_lo[ni, 0], rounded=True)
                                    mma_sync_m16n8k8_tf32(part[0], af[mi, 0], bf[ni, 0], rounded=True)
                                    for q in unroll(4):   # rounded to nearest, not truncated as in the mma
                                        acc[mi, ni, q] = acc[mi, ni, q] + part[q]
                                else:
                                    mma_sync_m16n8k8_tf32(acc[mi, ni, 0], af[mi, 0], bf[ni, 0], rounded=True)
                else:
                    for kk in unroll(BK // MMA_K):
                        for mi in unroll(MI):
                            for i, j in ldmatrix_x4_rows.on(lane_id()):
                                ldmatrix_x4(af[mi, 0], sa[st, wy * WM + mi * MMA_M + i, kk * MMA_K + j])
                        for nj in unroll(NI // 2):        # one x4 load: the fragments of 2 column tiles
                            if TRANS_B:
                                for i, j in B_NK_ROWS.on(lane_id()):
                                    ldmatrix_x4(bf[nj * 2, 0], sb[st, wx * WN + nj * 2 * MMA_N + i, kk * MMA_K + j])
                            else:
                                for i, j in ldmatrix_x4_rows.on(lane_id()):
                                    ldmatrix_x4(bf[nj * 2, 0], sb[st, kk * MMA_K + i, wx * WN + nj * 2 * MMA_N + j],
                                                trans=True)
                        for mi in unroll(MI):
                            for ni in unroll(NI):
                                mma_sync_m16n8k16(acc[mi, ni, 0], af[mi, 0], bf[ni, 0])
        for mi in unroll(MI):
            for ni in unroll(NI):
                for q, (i, j) in enumerate(mma_c_layout.on(lane_id())):
                    gr = row0 + wy * WM + mi * MMA_M + i
                    gc = col0 + wx * WN + ni * MMA_N + j
                    if gr < m and gc < n:
                        if BIAS:
                            c[blockIdx.z, gr, gc] = acc[mi, ni, q] + f32(bias[gc])
                        else:
                            c[blockIdx.z, gr, gc] = acc[mi, ni, q]

    return matmul_tc


class MatmulTcTemplate(GpuMatmulFamily):
    """f16 / bf16 matmul on NVIDIA tensor cores (sm_80 and later)."""

    name = "matmul_tc"
    version = 4             # 2: per-operand cp.async alignment; TF32.  3: tf32 fragments by ldmatrix.  4: 3xTF32


    def applies(self, problem: Any, target: Target) -> bool:
        if not (isinstance(problem, MatmulProblem) and target.kind is TargetKind.CUDA and target.warp_size == 32):
            return False
        if problem.dtype == "float32":
            return (problem.tf32 or problem.tf32x3) and problem.out_dtype == "float32" and "mma_tf32" in target.features
        return problem.dtype in ("float16", "bfloat16") and problem.out_dtype in (problem.dtype, "float32") and \
            "mma_m16n8k16" in target.features

    def space(self, problem: MatmulProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p = problem
        out = []
        for bm in BLOCK_TILES:
            for bn in BLOCK_TILES:
                if bm >= 2 * max(p.m, 32) or bn >= 2 * max(p.n, 32):    # a block mostly outside C
                    continue
                for wm, wn in WARP_GRIDS:
                    wtm, wtn = bm // wm, bn // wn
                    if bm % wm or bn % wn or wtm % MMA_M or wtn % (2 * MMA_N) or wtm * wtn > 64 * 64:
                        continue
                    if wtm * wtn < 32 * 32 and bm * bn > 32 * 32:   # small warp tiles only in small blocks
                        continue
                    bks = TF32_BKS if p.dtype == "float32" else BKS
                    for bk in bks:
                        for stages in STAGES[1:] if bk == bks[0] else STAGES[:-1]:
                            cfg = self._cfg(p, bm, bn, bk, wm, wn, stages, 1)
                            if cfg.smem_bytes() > target.max_shared_memory_optin:
                                continue
                            tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn)
                            for split in splits_for(target, tiles, p.k, bk):
                                out.append(Schedule.of(bm=bm, bn=bn, bk=bk, wm=wm, wn=wn, stages=stages, split=split))
        return out

    def cost(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> float:
        p, s = problem, schedule.as_dict()
        bm, bn, bk, split = s["bm"], s["bn"], s["bk"], s["split"]
        threads = 32 * s["wm"] * s["wn"]
        tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn) * split
        padded = p.batch * ceil_div(p.m, bm) * bm * ceil_div(p.n, bn) * bn * ceil_div(p.k, bk) * bk
        wtm, wtn = bm // s["wm"], bn // s["wn"]
        cfg = self._cfg(p, bm, bn, bk, s["wm"], s["wn"], s["stages"], split)
        size = cfg.itemsize
        intensity = wtm * wtn / (wtm + wtn) / 16.0                       # mma per fragment load, per warp
        eff = min(1.0, intensity) * min(1.0, 0.6 + 0.15 * s["stages"]) * (p.batch * p.m * p.n * p.k) / padded
        for aligned in (p.k % cfg.vec == 0, (p.k if p.trans_b else p.n) % cfg.vec == 0):
            eff *= 1.0 if aligned else 0.6       # element-wise copies of that operand
        if cfg.tf32:            # half the f16 rate; a K x N B's fragments read element-wise
            eff *= 0.5 * (1.0 if p.trans_b else 0.85)
        out_b = 2 if p.out_dtype != "float32" else 4
        global_bytes = size * p.batch * (p.m * p.k * ceil_div(p.n, bn) + p.k * p.n * ceil_div(p.m, bm))
        global_bytes += p.batch * p.m * p.n * (12 * split if split > 1 else out_b)
        w = Workload(flops=p.flops * (3 if cfg.x3 else 1), global_bytes=global_bytes, cache_bytes=p.flops / 2 * size * (1 / bm + 1 / bn),
                     work_items=tiles, threads_per_item=threads,
                     registers_per_thread=min(255, 4 * wtm * wtn // 128 + 64 + (wtm // 4 + wtn // 4 + 4) * cfg.x3),
                     shared_per_item=cfg.smem_bytes(),
                     inner_bytes=size * bk, matrix_units=True, compute_efficiency=eff)
        return estimate_time(target, w) + (4e-6 if split > 1 else 0.0) + 3e-6

    @staticmethod
    def _cfg(p: MatmulProblem, bm: int, bn: int, bk: int, wm: int, wn: int, stages: int, split: int) -> TcConfig:
        return TcConfig(bm, bn, bk, wm, wn, stages, split, p.dtype, p.out_dtype, p.a_batched, p.b_batched, p.trans_b,
                        p.bias, p.dtype == "float32" and p.tf32x3 and not p.tf32)

    def config(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> TcConfig:
        """Everything the kernel depends on (the key of its cache entries)."""
        s = schedule.as_dict()
        return self._cfg(problem, s["bm"], s["bn"], s["bk"], s["wm"], s["wn"], s["stages"], s["split"])

    def instantiate(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Any:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: chain(build_kernel(cfg), cfg.split, cfg.out_dtype, cfg.bias))


MATMUL_TC = MatmulTcTemplate()

__all__ = ["B_NK_ROWS", "MATMUL_TC", "MatmulTcTemplate", "TcConfig", "build_kernel"]
