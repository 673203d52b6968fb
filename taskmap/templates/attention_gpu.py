"""GPU f32 fused attention on CUDA cores (SIMT), for CUDA and HIP (the kernel is
:func:`taskmap.templates.attention_kernels.build_gpu`).

A thread block takes ``BM = NW x RW`` query rows of one batch: ``NW`` groups of 32 lanes (a warp
on CUDA, half a wavefront on CDNA) of ``RW`` rows each.  Key tiles of ``BN = 32 x KPL`` keys and their values are staged in shared memory (K rows
padded by one float: lane ``n`` reads row ``n`` without bank conflicts); a lane scores ``KPL``
keys for each of its warp's rows (one shared load of K feeds ``RW`` FMAs), rows are reduced with
shuffle butterflies (online softmax: running max and sum in registers), the probabilities go
through the warp's rows of shared memory, and the lane accumulates output columns
``d = c x lanes + lane`` (one shared load of V feeds ``RW`` FMAs).  All global accesses are
predicated, so any L, S and head size works; causal tiles above the diagonal are skipped.  With
head sizes that are multiples of 4, K and V tiles are loaded in 16-byte chunks, and — when that
takes at most ``MAX_PREFETCH`` registers per thread — the next tile's while this one is multiplied
(sm_90 SASS, 64-wide heads, 4 warps of 2 rows, 32 keys a tile: 8 ``LDG.128`` + 8 ``STS.128`` a tile
where there were 32 ``LDG`` + 32 ``STS``).

Space: warps per block (1, 2, 4, 8), rows per warp (1, 2, 4, 8), keys per lane (1, 2, 4);
pruned by threads per block, shared memory per block, and registers per thread (accumulators
``RW x (ceil(EV / lanes) + KPL)``).  Cost: :func:`taskmap.schedule.cost_model.estimate_time`
with the tiles' global and shared traffic, occupancy and a factor for FMAs per shared load.
"""
from collections.abc import Sequence
from typing import Any

from ..backends.base import Target, TargetKind
from ..runtime.args import aligned
from ..runtime.kernel import Kernel
from ..schedule.builder import MIN_WARP
from ..schedule.cost_model import Workload, estimate_time
from .attention_kernels import GpuAttnConfig, build_gpu
from .attention_problem import AttentionProblem, operand_views, scalars
from .base import KernelFamily, Schedule

WARPS = (1, 2, 4, 8)
ROWS = (1, 2, 4, 8)
KEYS_PER_LANE = (1, 2, 4)
MAX_ACCUMULATORS = 64
#: Lanes of a row group: 32 on every target (a 64-lane wavefront holds two groups), so that
#: shuffle butterflies never straddle a warp, whatever the hardware (or emulated) warp size.
LANES = MIN_WARP


class AttentionGpuTemplate(KernelFamily):
    """f32 scaled-dot-product attention on a GPU's CUDA cores (CUDA and HIP)."""

    name = "attention_gpu_simt"
    version = 3             # 2: 16-byte shared reads of Q, K and the probabilities; 3: K / V tiles
                            # loaded in 16-byte chunks, the next one during the products


    def applies(self, problem: Any, target: Target) -> bool:
        return (isinstance(problem, AttentionProblem) and target.kind in (TargetKind.CUDA, TargetKind.HIP)
                and problem.dtype == "float32" and target.warp_size in (32, 64))

    def _config(self, p: AttentionProblem, target: Target, nw: int, rw: int, kpl: int) -> GpuAttnConfig:
        return GpuAttnConfig(nw, rw, kpl, LANES, p.e, p.ev, p.mask, p.mask_rows, p.causal)

    def space(self, problem: AttentionProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p, out = problem, []
        for nw in WARPS:
            for rw in ROWS:
                for kpl in KEYS_PER_LANE:
                    cfg = self._config(p, target, nw, rw, kpl)
                    threads = nw * LANES
                    if threads > target.max_threads_per_block or threads % target.warp_size:   # whole warps
                        continue
                    if cfg.shared_bytes() > target.max_shared_memory:
                        continue
                    if rw * (cfg.cv + kpl) > MAX_ACCUMULATORS:
                        continue
                    min_nw = max(1, target.warp_size // LANES)
                    if (rw > 1 or nw > min_nw) and cfg.bm >= 2 * p.L or kpl > 1 and cfg.bn // 2 >= p.S:
                        continue                                                  # tiles past the problem
                    out.append(Schedule.of(nw=nw, rw=rw, kpl=kpl))
        return out

    def cost(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> float:
        p, s = problem, schedule.as_dict()
        cfg = self._config(p, target, s["nw"], s["rw"], s["kpl"])
        qb, nkb = -(-p.L // cfg.bm), -(-p.S // cfg.bn)
        tiles = qb * nkb if not p.causal else sum(min(nkb, (i * cfg.bm + cfg.bm - 1) // cfg.bn + 1) for i in range(qb))
        items = p.bh * qb
        padded = 2.0 * p.bh * tiles * cfg.bm * cfg.bn * (p.e + cfg.cv * LANES)
        eff = 0.85 * cfg.rw / (cfg.rw + 1.0) * min(1.0, p.flops / max(padded, 1.0))
        global_bytes = 4.0 * p.bh * tiles * cfg.bn * (p.e + p.ev) + 4.0 * p.bh * p.L * (p.e + p.ev)
        shared = 4.0 * p.bh * tiles * (cfg.bm * cfg.bn * 2 + cfg.bn * (p.e + p.ev) * cfg.nw)
        w = Workload(flops=p.flops + 40.0 * p.bh * tiles * cfg.bm * cfg.bn, global_bytes=global_bytes,
                     cache_bytes=shared, work_items=items, threads_per_item=cfg.nw * LANES,
                     registers_per_thread=min(255, cfg.rw * (cfg.cv + cfg.kpl) + 40 + cfg.staged * cfg.prefetch),
                     shared_per_item=cfg.shared_bytes(), inner_bytes=4 * min(p.e, p.ev), compute_efficiency=eff)
        return estimate_time(target, w) + 3e-6

    def config(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> GpuAttnConfig:
        s = schedule.as_dict()
        return self._config(problem, target, s["nw"], s["rw"], s["kpl"])

    def instantiate(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: build_gpu(cfg))

    def arguments(self, problem: AttentionProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None) -> list[Any]:
        """q, k, v, mask (or a dummy), o, then the scalars scale, kd, km, md, mm.  The kernel reads
        K and V in 16-byte chunks (a head size that is a multiple of 4): an input that starts off a
        16-byte boundary is copied."""
        return operand_views(problem, [aligned(x, 16) for x in inputs[:3]] + list(inputs[3:]), outputs) + \
            scalars(problem)


ATTENTION_GPU = AttentionGpuTemplate()

__all__ = ["ATTENTION_GPU", "AttentionGpuTemplate"]
