"""GPU f32 matmul on CUDA cores (SIMT): the Hidet paper's mapping family, as a template.

A block computes a ``BM x BN`` tile of C with the task mapping
``spatial(wm, wn) * repeat(rm, rn) * spatial(lm, ln) * repeat(tm, tn)`` — ``wm x wn`` warps, each
repeating ``rm x rn`` times a ``lm x ln`` arrangement of its lanes (4 x 8 for 32-lane warps, 8 x 8
for 64-lane wavefronts), each lane computing a ``tm x tn`` register tile; the paper's
``spatial(4, 2) * repeat(2, 2) * spatial(4, 8) * repeat(4, 4)`` is one point.  Tiles of A
(``BM x BK``, stored k-major in shared memory) and B (``BK x BN``) are loaded cooperatively
(``auto_map``) in 16-byte vectors (``copy16``) where an operand's rows start 16-byte aligned (k,
or n for a K x N B, a multiple of 4; element by element otherwise, and at the edges); shared memory
is double-buffered: the next tiles are fetched into registers while the current ones are
multiplied (the k steps of a tile unrolled: NVRTC reads each step's ``tm`` + ``tn`` values as
16-byte shared loads).  So are a lane's fragments: each k step reads the next step's from shared
memory before its FMAs (sm_90 SASS: median 48 instructions between an ``LDS.128`` and its first
use, where ptxas had placed 26 of 64 within 8), the first step's before the tile's global loads;
blocks of 256 threads ask for two resident blocks (``attrs.min_blocks``), which the second buffer
would otherwise cost them.  Every global access is predicated: any m, n, k works.
With ``split > 1`` K is cut into ranges (see :mod:`.matmul_splitk`).

Space: warps per block (1..8 in 2-D shapes), warp repeats (1x1, 1x2, 2x2), thread tiles (4x4, 8x4, 8x8),
BK (8, 16), split-K factors; pruned by threads per block, shared memory, registers per thread.
Cost: :func:`taskmap.schedule.cost_model.estimate` (FLOPs, global traffic of the tiles, shared
memory traffic, occupancy) with a factor for the tile's padding and its FMAs per shared load.
"""
import math
from dataclasses import dataclass
from typing import Any, Sequence

from ..lang.kernel import kernel
from ..ir.mapping import auto_map, repeat, spatial
from ..lang import (attrs, blockIdx, copy16, f32, register_tensor, shared_tensor, symbol, syncthreads,
                          threadIdx, unroll)

from ..backends.base import Target, TargetKind
from ..ir.dtypes import scalar_type
from ..runtime.args import aligned
from ..runtime.kernel import Kernel
from ..schedule.cost_model import Workload, estimate_time
from .base import KernelFamily, Schedule
from .matmul_problem import MatmulProblem, new_like, operand_views
from .matmul_splitk import KernelChain, ReduceConfig, build_reduce, ceil_div, splits_for

WARP_SHAPES = ((1, 1), (2, 1), (1, 2), (2, 2), (4, 2), (2, 4))
THREAD_TILES = ((4, 4), (8, 4), (8, 8))
REPEATS = ((1, 1), (1, 2), (2, 2))
BKS = (8, 16)
#: Floats per global load (16 bytes) where an operand's rows start 16-byte aligned.
VEC = 4
#: Floats of padding after each k-row of the transposed shared tiles (A, and an N x K B): a
#: warp stores a tile's 4-float chunks of 8 (BK 16) or 16 rows (BK 8) at once, each chunk as 4
#: k-rows of one column; unpadded, the rows' columns share banks (4-way conflicts at BK 16), with
#: 4 floats they spread over 2 (BK 16) or all 32 banks (BK 8).  Reads stay 16-byte vectors.
PAD = 4
#: A k-tile's fixed cost (its barrier, the loads of the next tile) in k steps of FMAs (cost model).
K_TILE_OVERHEAD = 1.5


@dataclass(frozen=True)
class SimtConfig:
    wm: int
    wn: int
    rm: int
    rn: int
    lm: int
    ln: int
    tm: int
    tn: int
    bk: int
    split: int
    a_batched: bool
    b_batched: bool
    trans_b: bool
    bias: bool
    min_blocks: int = 0      # blocks per multiprocessor the register allocation must allow (0: any)

    @property
    def mapping(self) -> Any:
        return spatial(self.wm, self.wn) * repeat(self.rm, self.rn) * spatial(self.lm, self.ln) * \
            repeat(self.tm, self.tn)


def build_kernel(cfg: SimtConfig) -> Kernel:
    block_map = cfg.mapping
    THREADS = block_map.num_workers
    BM, BN = block_map.task_shape
    BK, S = cfg.bk, cfg.split
    RN, TM, TN = cfg.rn, cfg.tm, cfg.tn
    # A lane's fragments of one k step: its rows of the A tile and columns of the B tile; the
    # block mapping's task q (ordinal over its repeats rm, rn, tm, tn) multiplies row
    # q // (rn tm tn) * tm + q // tn % tm of its A fragment by column q // (tm tn) % rn * tn + q % tn
    # of its B fragment
    frag_a = spatial(cfg.wm, cfg.wn) * repeat(cfg.rm, 1) * spatial(cfg.lm, cfg.ln) * repeat(TM, 1)
    frag_b = spatial(cfg.wm, cfg.wn) * repeat(1, RN) * spatial(cfg.lm, cfg.ln) * repeat(1, TN)
    FA, FB = frag_a.tasks_per_worker, frag_b.tasks_per_worker
    TRANS_B, BIAS, A_BATCHED, B_BATCHED = cfg.trans_b, cfg.bias and cfg.split == 1, cfg.a_batched, cfg.b_batched
    # Global loads in chunks of VEC floats along each operand's rows: (row, chunk) of the A tile,
    # of B's N x K tile or K x N tile
    load_a = auto_map((BM, BK // VEC), THREADS)
    load_b = auto_map((BN, BK // VEC), THREADS) if TRANS_B else auto_map((BK, BN // VEC), THREADS)
    (m, n, k, cz), (A_T, B_T, BIAS_T, C_T) = gpu_param_types("float32", "float32", A_BATCHED, B_BATCHED, TRANS_B,
                                                              cfg.bias, 1)

    @kernel
    def matmul_simt(a: A_T, b: B_T, bias: BIAS_T, c: C_T):
        attrs.grid_dim = ((n + BN - 1) // BN, (m + BM - 1) // BM, cz)
        attrs.block_dim = THREADS
        attrs.min_blocks = cfg.min_blocks
        sa = shared_tensor(f32, [2, BK, BM + PAD])           # A tiles, k-major (rows padded)
        sb = shared_tensor(f32, [2, BK, BN + (PAD if TRANS_B else 0)])
        acc = register_tensor(f32, [block_map.tasks_per_worker])
        ra = register_tensor(f32, [load_a.tasks_per_worker * VEC])
        rb = register_tensor(f32, [load_b.tasks_per_worker * VEC])
        fa = register_tensor(f32, [2 * FA])                 # fragments of two k steps
        fb = register_tensor(f32, [2 * FB])
        bi = blockIdx.z // S
        ai = bi if A_BATCHED else 0
        bj = bi if B_BATCHED else 0
        row0 = blockIdx.y * BM
        col0 = blockIdx.x * BN
        aligned_a = k % VEC == 0                             # rows start 16-byte aligned: vector loads
        aligned_b = (k if TRANS_B else n) % VEC == 0
        kt = (k + BK - 1) // BK
        per = (kt + S - 1) // S
        t0 = blockIdx.z % S * per
        t1 = min(t0 + per, kt)
        for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
            acc[q] = 0.0
        # Step t loads tile t into registers, multiplies tile t - 1 (staged in shared memory at
        # step t - 1) meanwhile, then stages tile t in the other buffer.
        for t in range(t0, t1 + 1):
            if t > t0:                                       # the first fragments of tile t - 1
                for qa, (i, ja) in enumerate(frag_a.on(threadIdx.x)):
                    fa[qa] = sa[(t - 1 - t0) % 2, 0, i]
                for qb, (ib, j) in enumerate(frag_b.on(threadIdx.x)):
                    fb[qb] = sb[(t - 1 - t0) % 2, 0, j]
            if t < t1:
                inside_k = (t + 1) * BK <= k                 # the whole k-tile is inside K
                if aligned_a and inside_k and row0 + BM <= m:    # interior: no checks per chunk
                    for q, (i, ch) in enumerate(load_a.on(threadIdx.x)):
                        copy16(ra[q * VEC], a[ai, row0 + i, t * BK + ch * VEC])
                else:
                    for q, (i, ch) in enumerate(load_a.on(threadIdx.x)):
                        gr = row0 + i
                        gk = t * BK + ch * VEC
                        if aligned_a and gr < m and gk < k:
                            copy16(ra[q * VEC], a[ai, gr, gk])
                        else:
                            for e in unroll(VEC):
                                ra[q * VEC + e] = a[ai, gr, gk + e] if gr < m and gk + e < k else 0.0
                if aligned_b and inside_k and col0 + BN <= n:
                    for q, (r, ch) in enumerate(load_b.on(threadIdx.x)):
                        if TRANS_B:
                            copy16(rb[q * VEC], b[bj, col0 + r, t * BK + ch * VEC])
                        else:
                            copy16(rb[q * VEC], b[bj, t * BK + r, col0 + ch * VEC])
                elif TRANS_B:
                    for q, (j, ch) in enumerate(load_b.on(threadIdx.x)):
                        gn = col0 + j
                        gk = t * BK + ch * VEC
                        if aligned_b and gn < n and gk < k:
                            copy16(rb[q * VEC], b[bj, gn, gk])
                        else:
                            for e in unroll(VEC):
                                rb[q * VEC + e] = b[bj, gn, gk + e] if gn < n and gk + e < k else 0.0
                else:
                    for q, (kk, ch) in enumerate(load_b.on(threadIdx.x)):
                        gk = t * BK + kk
                        gc = col0 + ch * VEC
                        if aligned_b and gk < k and gc < n:
                            copy16(rb[q * VEC], b[bj, gk, gc])
                        else:
                            for e in unroll(VEC):
                                rb[q * VEC + e] = b[bj, gk, gc + e] if gk < k and gc + e < n else 0.0
            if t > t0:                                       # multiply tile t - 1
                buf = (t - 1 - t0) % 2
                for kk in unroll(BK):
                    if kk + 1 < BK:                          # the next k step's fragments
                        nxt = (kk + 1) % 2
                        for qa, (i, ja) in enumerate(frag_a.on(threadIdx.x)):
                            fa[nxt * FA + qa] = sa[buf, kk + 1, i]
                        for qb, (ib, j) in enumerate(frag_b.on(threadIdx.x)):
                            fb[nxt * FB + qb] = sb[buf, kk + 1, j]
                    cur = kk % 2
                    for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
                        acc[q] += fa[cur * FA + q // (RN * TM * TN) * TM + q // TN % TM] * \
                            fb[cur * FB + q // (TM * TN) % RN * TN + q % TN]
            if t < t1:                                       # stage tile t
                buf = (t - t0) % 2
                for q, (i, ch) in enumerate(load_a.on(threadIdx.x)):
                    for e in unroll(VEC):
                        sa[buf, ch * VEC + e, i] = ra[q * VEC + e]
                if TRANS_B:
                    for q, (j, ch) in enumerate(load_b.on(threadIdx.x)):
                        for e in unroll(VEC):
                            sb[buf, ch * VEC + e, j] = rb[q * VEC + e]
                else:
                    for q, (kk, ch) in enumerate(load_b.on(threadIdx.x)):
                        copy16(sb[buf, kk, ch * VEC], rb[q * VEC])
            syncthreads()
        for q, (i, j) in enumerate(block_map.on(threadIdx.x)):
            if row0 + i < m and col0 + j < n:
                if BIAS:
                    c[blockIdx.z, row0 + i, col0 + j] = acc[q] + bias[col0 + j]
                else:
                    c[blockIdx.z, row0 + i, col0 + j] = acc[q]

    return matmul_simt


def registers(tm: int, tn: int, rm: int, rn: int, threads: int, bm: int, bn: int, bk: int) -> int:
    """Registers per thread, as ptxas allocates them (within a few, sm_90): the accumulators, two k
    steps' fragments, the next k-tile staged for shared memory, ~22 for addresses and indices."""
    staged = ceil_div(bm * bk // VEC, threads) * VEC + ceil_div(bn * bk // VEC, threads) * VEC
    return tm * tn * rm * rn + 2 * (tm * rm + tn * rn) + staged + 22


def min_blocks(target: Target, threads: int) -> int:
    """Blocks of ``threads`` to keep resident per multiprocessor: blocks of 256 threads or more
    (at most two resident) keep the count that 128 registers per thread allow, rather than lose
    one to the fragments' second buffer (ptxas: 130 registers for the 128 x 128 tile otherwise,
    one block of 8 warps); smaller blocks take what they need."""
    if threads < 256 or not target.registers_per_core:
        return 0
    return target.registers_per_core // (threads * 128)


def lane_shape(target: Target) -> tuple[int, int]:
    return (8, 8) if target.warp_size == 64 else (4, 8)


def shared_bytes(bm: int, bn: int, bk: int, trans_b: bool) -> int:
    """Shared memory of a block: two k-tiles of A and B (see :data:`PAD`)."""
    return 2 * bk * (bm + PAD + bn + (PAD if trans_b else 0)) * 4


def bank_conflicts(lanes: int, per_lane: int) -> int:
    """Shared-memory passes of one 16-byte fragment read (``ld.shared.v4``) where ``lanes`` lanes
    each read ``per_lane`` consecutive floats, over the ideal: 32 banks of 4 bytes serve eight
    16-byte chunks per pass, and lanes ``per_lane`` floats apart reuse one chunk slot in
    ``8 / gcd(per_lane / 4, 8)`` (4 lanes of 8 floats: none; 8 lanes of 8 floats: 2 passes)."""
    slots = min(lanes, 8 // math.gcd(max(per_lane // VEC, 1), 8))
    return max(1, ceil_div(lanes, slots) // max(1, ceil_div(lanes * VEC * 4, 128)))


class GpuMatmulFamily(KernelFamily):
    """What the GPU matmul templates share: their launch arguments (:func:`gpu_arguments`)."""

    def arguments(self, problem: MatmulProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None) -> list[Any]:
        """a, b, bias (a 1-element dummy without one), c; with split-K the f32 partial results."""
        return gpu_arguments(problem, inputs, outputs, None if schedule is None else schedule["split"])


class MatmulSimtTemplate(GpuMatmulFamily):
    """f32 matmul on a GPU's CUDA cores (CUDA and HIP)."""

    name = "matmul_simt"
    version = 4  # keys the tuning cache: bump when the kernels or the space change (not the cost)


    def applies(self, problem: Any, target: Target) -> bool:
        return (isinstance(problem, MatmulProblem) and target.kind in (TargetKind.CUDA, TargetKind.HIP)
                and problem.dtype == "float32" and problem.out_dtype == "float32" and target.warp_size in (32, 64))

    def space(self, problem: MatmulProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p = problem
        lm, ln = lane_shape(target)
        out = []
        for wm, wn in WARP_SHAPES:
            for rm, rn in REPEATS:
                for tm, tn in THREAD_TILES:
                    bm, bn = wm * rm * lm * tm, wn * rn * ln * tn
                    threads = wm * wn * lm * ln
                    if threads > target.max_threads_per_block or bm >= 2 * max(p.m, 16) or bn >= 2 * max(p.n, 32):
                        continue
                    if tm * tn * rm * rn > 64:                       # accumulators per thread
                        continue
                    for bk in BKS:
                        if shared_bytes(bm, bn, bk, p.trans_b) > target.max_shared_memory:
                            continue
                        tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn)
                        for split in splits_for(target, tiles, p.k, bk):
                            out.append(Schedule.of(wm=wm, wn=wn, rm=rm, rn=rn, tm=tm, tn=tn, bk=bk, split=split))
        return out

    def cost(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> float:
        p, s = problem, schedule.as_dict()
        lm, ln = lane_shape(target)
        bm = s["wm"] * s["rm"] * lm * s["tm"]
        bn = s["wn"] * s["rn"] * ln * s["tn"]
        threads = s["wm"] * s["wn"] * lm * ln
        split = s["split"]
        tiles = p.batch * ceil_div(p.m, bm) * ceil_div(p.n, bn) * split
        padded = p.batch * ceil_div(p.m, bm) * bm * ceil_div(p.n, bn) * bn * ceil_div(p.k, s["bk"]) * s["bk"]
        per_thread = s["tm"] * s["tn"] * s["rm"] * s["rn"]
        regs = registers(s["tm"], s["tn"], s["rm"], s["rn"], threads, bm, bn, s["bk"])
        blocks = min_blocks(target, threads)
        if blocks:
            regs = min(regs, target.registers_per_core // (threads * blocks))
        fma_per_load = per_thread / (s["tm"] * s["rm"] + s["tn"] * s["rn"])
        conflicts = max(bank_conflicts(lm, s["tm"]), bank_conflicts(ln, s["tn"]))
        eff = min(1.0, fma_per_load / 4.0) * 0.85 * (p.batch * p.m * p.n * p.k) / padded
        # each extra pass of a conflicting fragment read stalls the FMAs (H200: a 4 x 8 lane
        # arrangement with 8 columns per lane ran 1.3-1.45x slower than two repeats of 4); each
        # k-tile costs a barrier and the next tile's loads (BK 16 ran up to 13% faster than 8)
        eff /= 1.0 + 0.4 * (conflicts - 1)
        eff *= s["bk"] / (s["bk"] + K_TILE_OVERHEAD)
        global_bytes = 4 * p.batch * (p.m * p.k * ceil_div(p.n, bn) + p.k * p.n * ceil_div(p.m, bm))
        global_bytes += 4 * p.batch * p.m * p.n * (3 * split if split > 1 else 1)
        w = Workload(flops=p.flops, global_bytes=global_bytes,
                     cache_bytes=4 * p.flops / 2 * (1 / bm + 1 / bn) * 2, work_items=tiles, threads_per_item=threads,
                     registers_per_thread=min(255, regs),
                     shared_per_item=shared_bytes(bm, bn, s["bk"], p.trans_b), inner_bytes=4 * s["bk"], compute_efficiency=eff)
        return estimate_time(target, w) + (4e-6 if split > 1 else 0.0) + 3e-6

    def config(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> SimtConfig:
        s = schedule.as_dict()
        lm, ln = lane_shape(target)
        return SimtConfig(s["wm"], s["wn"], s["rm"], s["rn"], lm, ln, s["tm"], s["tn"], s["bk"], s["split"],
                          problem.a_batched, problem.b_batched, problem.trans_b, problem.bias,
                          min_blocks(target, s["wm"] * s["wn"] * lm * ln))

    def instantiate(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Any:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: chain(build_kernel(cfg), cfg.split, problem.out_dtype, cfg.bias))


def gpu_param_types(dtype: str, out_dtype: str, a_batched: bool, b_batched: bool, trans_b: bool, bias: bool,
                    split: int) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The GPU templates' size symbols ``(m, n, k, cz)`` and the types of their parameters
    ``(a, b, bias, c)``: A ``[batch | 1, m, k]``, B ``[batch | 1, n, k]`` (``trans_b``) or
    ``[.., k, n]``, the bias in the output's type (``nbias`` long without one), C ``[cz, m, n]`` —
    f32 partial sums under split-K."""
    T, OUT = scalar_type(dtype), scalar_type(out_dtype)
    batch, m, n, k, cz, nbias = (symbol(x) for x in ("batch", "m", "n", "k", "cz", "nbias"))
    nb_a, nb_b = batch if a_batched else 1, batch if b_batched else 1
    types = (T[nb_a, m, k], T[nb_b, n, k] if trans_b else T[nb_b, k, n], OUT[n] if bias else OUT[nbias],
             OUT[cz, m, n] if split == 1 else f32[cz, m, n])
    return (m, n, k, cz), types


def chain(main: Kernel, split: int, out_dtype: str, bias: bool) -> KernelChain:
    """The main kernel alone (arguments a, b, bias, c), or with split-K's reduction epilogue
    (arguments a, b, bias, c, partial results)."""
    if split == 1:
        return KernelChain([main], [(0, 1, 2, 3)])
    return KernelChain([main, build_reduce(ReduceConfig(split, out_dtype, bias))], [(0, 1, 2, 4), (4, 2, 3)])


def gpu_arguments(problem: MatmulProblem, inputs: Sequence[Any], outputs: Sequence[Any], split: int | None) -> list[Any]:
    """The GPU templates' launch arguments: a, b, bias (or a dummy), c, and the split-K workspace
    ``(batch * split, m, n)`` (f32) when ``split > 1`` (the largest when the split is unknown).
    The templates read their operands in 16-byte chunks (``copy16``, ``cp_async``): an input
    that starts off a 16-byte boundary is copied."""
    ops = operand_views(problem, [aligned(x, 16) for x in inputs], outputs)
    c = outputs[0]
    if not problem.bias:
        ops.insert(2, new_like(c, (1,), problem.out_dtype))
    if split != 1:
        ops.append(new_like(c, (problem.batch * (split or 16), problem.m, problem.n), "float32"))
    return ops


MATMUL_SIMT = MatmulSimtTemplate()

__all__ = ["GpuMatmulFamily", "MATMUL_SIMT", "MatmulSimtTemplate", "SimtConfig", "build_kernel", "chain",
           "gpu_arguments", "gpu_param_types", "lane_shape"]
