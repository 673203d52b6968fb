"""GPU f16 / bf16 fused attention on tensor cores (``mma.sync.m16n8k16``, f32 accumulation): the
kernel and its template.  Same operator layout as :mod:`.attention_kernels` (flat batches, index
maps, masks); the output is in the input dtype.

A thread block takes ``BM = 16 x NW`` query rows: warp ``w`` owns one ``m16`` tile of rows, its Q
fragments (A operands, ``E`` padded to 16) loaded once into registers.  Key tiles of ``BN`` keys
and their values are staged in shared memory (zero-filled past ``S`` and past the head sizes).
Per tile a warp computes the ``16 x BN`` scores as ``BN / 8`` accumulator fragments
(``mma_c_layout``: a lane holds rows ``g`` and ``g + 8``, columns ``2t, 2t + 1`` of each), runs the
online softmax on the fragments (row maxima and sums over the 4 lanes of a quad with
shuffles), writes ``P`` (in the input dtype) to its rows of shared memory, reads it back as A
fragments and accumulates ``P V`` into ``EVP / 8`` output fragments (V as B fragments).  Fragments
are filled with the operand layouts of :mod:`taskmap.lang.mma` as task mappings.

Space: warps per block (1, 2, 4), keys per tile (32, 64); pruned by shared memory and by the
registers of the fragments (``BN / 2 + EVP / 2 + EP / 2`` per lane).  Cost: the cost model with
``matrix_units`` FLOPs and the tiles' traffic.
"""
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.base import Target, TargetKind
from ..ir.dtypes import scalar_type
from ..ir.mapping import auto_map
from ..lang import (
    FULL_MASK,
    MMA_K,
    MMA_M,
    MMA_N,
    attrs,
    blockIdx,
    bool_,
    cast,
    exp,
    f32,
    i32,
    lane_id,
    mma_a_layout,
    mma_b_layout,
    mma_c_layout,
    mma_sync_m16n8k16,
    register_tensor,
    shared_tensor,
    shfl_xor_sync,
    symbol,
    syncthreads,
    syncwarp,
    threadIdx,
    unroll,
    warp_id,
)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from ..schedule.cost_model import Workload, estimate_time
from .attention_kernels import NEG_INF, MaskKind
from .attention_problem import AttentionProblem, operand_views, scalars
from .base import KernelFamily, Schedule

WARPS = (1, 2, 4)
TILE_KEYS = (32, 64)
MAX_FRAGMENT_REGISTERS = 128


@dataclass(frozen=True)
class TcAttnConfig:
    nw: int
    bn: int
    e: int
    ev: int
    dtype: str          # "float16" | "bfloat16"
    mask: str
    mask_rows: bool
    causal: bool

    @property
    def ep(self) -> int:
        return -(-self.e // MMA_K) * MMA_K

    @property
    def evp(self) -> int:
        return -(-self.ev // MMA_N) * MMA_N

    @property
    def bm(self) -> int:
        return MMA_M * self.nw

    def shared_bytes(self) -> int:
        return 2 * (self.bm * self.ep + self.bn * self.ep + self.bn * self.evp + self.bm * self.bn)

    def fragment_registers(self) -> int:
        """32-bit registers per lane for the fragments (Q, scores, output)."""
        return self.ep // MMA_K * 4 + self.bn // MMA_N * 4 + self.evp // MMA_N * 4


def build_tc(cfg: TcAttnConfig) -> Kernel:
    NW, BN, E, EV, EP, EVP, BM = cfg.nw, cfg.bn, cfg.e, cfg.ev, cfg.ep, cfg.evp, cfg.bm
    KT, NT, DT, PT = EP // MMA_K, BN // MMA_N, EVP // MMA_N, BN // MMA_K
    T = scalar_type(cfg.dtype)
    THREADS = NW * 32
    CAUSAL, MASK, MROWS, BOOL = cfg.causal, cfg.mask != MaskKind.NONE, cfg.mask_rows, cfg.mask == MaskKind.BOOL
    load_k = auto_map((BN, EP), THREADS)
    load_v = auto_map((BN, EVP), THREADS)
    load_q = auto_map((BM, EP), THREADS)
    bh, bk, mb, ml, L, S = (symbol(x) for x in ("bh", "bk", "mb", "ml", "L", "S"))
    MASK_T = (bool_ if BOOL else T)[mb, ml, S] if MASK else f32[mb, ml, symbol("ms")]   # additive: the input dtype

    @kernel
    def attention_tc(q: T[bh, L, E], k: T[bk, S, E], v: T[bk, S, EV], mask: MASK_T, o: T[bh, L, EV],
                     scale: f32, kd: i32, km: i32, md: i32, mm: i32):
        attrs.grid_dim = ((L + BM - 1) // BM, bh)
        attrs.block_dim = THREADS
        sq = shared_tensor(T, [BM, EP])
        sk = shared_tensor(T, [BN, EP])
        sv = shared_tensor(T, [BN, EVP])
        sp = shared_tensor(T, [BM, BN])
        qf = register_tensor(T, [KT, 8])
        pf = register_tensor(T, [8])
        bf = register_tensor(T, [4])
        cs = register_tensor(f32, [NT, 4])
        co = register_tensor(f32, [DT, 4])
        mrow = register_tensor(f32, [2])
        lrow = register_tensor(f32, [2])
        alpha = register_tensor(f32, [2])
        b = blockIdx.y
        r0 = blockIdx.x * BM
        w = warp_id()
        lane = lane_id()
        kb = b // kd % km
        mbi = b // md % mm
        for i, e in load_q.on(threadIdx.x):
            sq[i, e] = q[b, r0 + i, e] if r0 + i < L and e < E else 0.0
        syncthreads()
        for kt in unroll(KT):
            for x, (i, e) in enumerate(mma_a_layout.on(lane)):
                qf[kt, x] = sq[w * MMA_M + i, kt * MMA_K + e]
        for h in unroll(2):
            mrow[h] = NEG_INF
            lrow[h] = 0.0
        for dt in unroll(DT):
            for x in unroll(4):
                co[dt, x] = 0.0
        ntiles = (S + BN - 1) // BN
        if CAUSAL:
            ntiles = min(ntiles, (r0 + BM - 1) // BN + 1)
        for j in range(ntiles):
            n0 = j * BN
            syncthreads()                               # the previous tile is consumed
            for n, e in load_k.on(threadIdx.x):
                sk[n, e] = k[kb, n0 + n, e] if n0 + n < S and e < E else 0.0
            for n, d in load_v.on(threadIdx.x):
                sv[n, d] = v[kb, n0 + n, d] if n0 + n < S and d < EV else 0.0
            syncthreads()
            for nt in unroll(NT):                       # scores: 16 x BN of this warp
                for x in unroll(4):
                    cs[nt, x] = 0.0
                for kt in unroll(KT):
                    for x, (e, n) in enumerate(mma_b_layout.on(lane)):
                        bf[x] = sk[nt * MMA_N + n, kt * MMA_K + e]
                    mma_sync_m16n8k16(cs[nt, 0], qf[kt, 0], bf[0])
            for h in unroll(2):                         # rows g and g + 8 of the warp's tile
                i = r0 + w * MMA_M + lane // 4 + h * 8
                mx = mrow[h]
                for nt in unroll(NT):
                    for c in unroll(2):
                        n = n0 + nt * MMA_N + lane % 4 * 2 + c
                        x = cs[nt, h * 2 + c] * scale
                        ok = n < S
                        if CAUSAL:
                            ok = ok and n <= i
                        if MASK:
                            mv = mask[mbi, min(i, L - 1) if MROWS else 0, min(n, S - 1)]
                            if BOOL:
                                ok = ok and mv
                            else:
                                x = x + cast(mv, f32)
                        x = x if ok else NEG_INF
                        cs[nt, h * 2 + c] = x
                        mx = max(mx, x)
                mx = max(mx, shfl_xor_sync(FULL_MASK, mx, 1))
                mx = max(mx, shfl_xor_sync(FULL_MASK, mx, 2))
                msafe = mx if mx > NEG_INF else 0.0
                alpha[h] = exp(mrow[h] - msafe)
                mrow[h] = mx
                sm = 0.0
                for nt in unroll(NT):
                    for c in unroll(2):
                        pv = exp(cs[nt, h * 2 + c] - msafe)
                        sm += pv
                        sp[w * MMA_M + lane // 4 + h * 8, nt * MMA_N + lane % 4 * 2 + c] = pv
                lrow[h] = lrow[h] * alpha[h] + sm        # this lane's part; the quad is added at the end
            for dt in unroll(DT):
                for x in unroll(4):
                    co[dt, x] = co[dt, x] * alpha[x // 2]
            syncwarp()
            for pt in unroll(PT):                       # P V
                for x, (i, n) in enumerate(mma_a_layout.on(lane)):
                    pf[x] = sp[w * MMA_M + i, pt * MMA_K + n]
                for dt in unroll(DT):
                    for x, (n, d) in enumerate(mma_b_layout.on(lane)):
                        bf[x] = sv[pt * MMA_K + n, dt * MMA_N + d]
                    mma_sync_m16n8k16(co[dt, 0], pf[0], bf[0])
            syncwarp()
        for h in unroll(2):
            t = lrow[h]
            t += shfl_xor_sync(FULL_MASK, t, 1)
            t += shfl_xor_sync(FULL_MASK, t, 2)
            alpha[h] = 1.0 / t if t > 0.0 else 0.0
        for dt in unroll(DT):
            for x, (i, d) in enumerate(mma_c_layout.on(lane)):
                gi = r0 + w * MMA_M + i
                gd = dt * MMA_N + d
                if gi < L and gd < EV:
                    o[b, gi, gd] = co[dt, x] * alpha[x // 2]

    return attention_tc


class AttentionTcTemplate(KernelFamily):
    """f16 / bf16 scaled-dot-product attention on tensor cores (CUDA sm_80+)."""

    name = "attention_gpu_tc"
    version = 1


    def applies(self, problem: Any, target: Target) -> bool:
        return (isinstance(problem, AttentionProblem) and target.kind in (TargetKind.CUDA, TargetKind.HIP)
                and problem.dtype in ("float16", "bfloat16") and "mma_m16n8k16" in target.features)

    def _config(self, p: AttentionProblem, nw: int, bn: int) -> TcAttnConfig:
        return TcAttnConfig(nw, bn, p.e, p.ev, p.dtype, p.mask, p.mask_rows, p.causal)

    def space(self, problem: AttentionProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        out = []
        for nw in WARPS:
            for bn in TILE_KEYS:
                cfg = self._config(problem, nw, bn)
                if cfg.shared_bytes() > target.max_shared_memory or cfg.fragment_registers() > MAX_FRAGMENT_REGISTERS:
                    continue
                if nw > 1 and cfg.bm >= 2 * problem.L or bn > TILE_KEYS[0] and bn // 2 >= problem.S:
                    continue
                out.append(Schedule.of(nw=nw, bn=bn))
        return out

    def cost(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> float:
        p = problem
        cfg = self._config(p, schedule["nw"], schedule["bn"])
        qb, nkb = -(-p.L // cfg.bm), -(-p.S // cfg.bn)
        tiles = qb * nkb if not p.causal else sum(min(nkb, (i * cfg.bm + cfg.bm - 1) // cfg.bn + 1) for i in range(qb))
        padded = 2.0 * p.bh * tiles * cfg.bm * cfg.bn * (cfg.ep + cfg.evp)
        w = Workload(flops=padded, global_bytes=2.0 * p.bh * tiles * cfg.bn * (p.e + p.ev) + 4.0 * p.bh * p.L * p.e,
                     cache_bytes=2.0 * p.bh * tiles * (cfg.bn * (cfg.ep + cfg.evp) * cfg.nw + 2 * cfg.bm * cfg.bn),
                     work_items=p.bh * qb, threads_per_item=cfg.nw * 32,
                     registers_per_thread=min(255, cfg.fragment_registers() + 40), shared_per_item=cfg.shared_bytes(),
                     inner_bytes=2 * min(p.e, p.ev), matrix_units=True, compute_efficiency=0.5)
        return estimate_time(target, w) + 3e-6

    def config(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> TcAttnConfig:
        return self._config(problem, schedule["nw"], schedule["bn"])

    def instantiate(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: build_tc(cfg))

    def arguments(self, problem: AttentionProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None) -> list[Any]:
        """q, k, v, mask (or a dummy), o, then the scalars scale, kd, km, md, mm."""
        return operand_views(problem, inputs, outputs) + scalars(problem)


ATTENTION_TC = AttentionTcTemplate()

__all__ = ["ATTENTION_TC", "AttentionTcTemplate", "TcAttnConfig", "build_tc"]
