"""CPU f32 fused attention template (flash-attention style; the kernel is
:func:`taskmap.templates.attention_kernels.build_cpu`).

A worker (a core) takes a block of ``BM`` query rows of one batch and streams the keys in blocks
of ``BN``: the ``BM x BN`` score tile (lanes along keys, ``K^T`` packed once per call), the
online softmax (running max and sum per row), and the ``BM x EV`` output tile (lanes along
``EV``) that stays in registers / L1 for the whole row block.  Causal key blocks above the
diagonal are skipped.

Tuning space, in hardware terms (the problem only prunes it):

* ``bm`` — query rows of the register tiles (1, 2, 4, 6, 8): the score tile needs
  ``BM * BN / V`` accumulators plus ``BN / V`` K^T vectors and a broadcast in the vector register
  file (32 with AVX-512, 16 with AVX2); the output tile ``BM * EVP / V`` should too (else it
  spills to L1: a cost, not a pruning, so that any head size has a point);
* ``bn`` — keys per block, 2, 4 or 8 vectors: the block of ``K^T`` and ``V``
  (``BN * (E + EV)`` floats) must fit half the core's L2 (and is charged when it leaves L1);
* ``qg`` — row tiles of a worker that take each key block in turn (1 or 4): the block is read
  from L2 / L3 once per group instead of once per tile (long sequences, whose keys and values
  do not fit L2); the group's state (``qg x BM x (EVP + V + 1)`` floats) must fit half of L1;
* ``cores`` — all of them, or one for tiny problems.

The cost model (:meth:`AttentionCpuTemplate.cost`) counts, per key block, the micro-kernels'
FMA and load cycles, the softmax's vector operations (``exp`` is ~35), the scalar row
reductions, and the block's traffic from L2 (or L3 when a head's keys and values do not fit
L2), over the blocks each core gets (whole row blocks, dealt cyclically), plus each core's packing
of ``K^T`` (once per head it meets) and the parallel region.
"""
from collections.abc import Sequence
from typing import Any

from ..backends.base import Target, TargetKind, host_cpu_target
from ..runtime.kernel import Kernel
from .attention_kernels import CpuAttnConfig, build_cpu
from .attention_problem import AttentionProblem, operand_views, scalars
from .base import KernelFamily, Schedule
from .matmul_cpu import lanes_of, vector_registers
from .matmul_problem import WORKSPACE

BMS = (1, 2, 4, 6, 8)
GROUPS = (1, 4)
BN_VECTORS = (2, 4, 8)
L1_BYTES = 32 * 1024
#: Vector operations of one ``exp`` (polynomial, 7 binary digits of 2^-n) and the rest of the
#: softmax per score vector (scale, mask, max, subtract, sum).
EXP_OPS, SOFTMAX_OPS = 35, 8
#: Bytes per cycle a core streams from L2 and from L3 / DRAM.
L2_BYTES_PER_CYCLE, L3_BYTES_PER_CYCLE = 32.0, 16.0
FORK_COST, CALL_COST = 4e-6, 3e-6
COPY_BANDWIDTH = 8e9
#: Below this many FLOPs one core is considered too; above it, only all of them.
SMALL_FLOPS, LARGE_FLOPS = 2e5, 2e7


def l2_per_core(target: Target) -> int:
    return (target.l2_bytes or (1 << 20) * max(1, target.num_cores)) // max(1, target.num_cores)


class AttentionCpuTemplate(KernelFamily):
    """f32 scaled-dot-product attention on the CPU (masks, causal, broadcast batches, GQA)."""

    name = "attention_cpu"
    version = 2


    def applies(self, problem: Any, target: Target) -> bool:
        return isinstance(problem, AttentionProblem) and target.kind is TargetKind.CPU and problem.dtype == "float32"

    # ------------------------------------------------------------------ space
    def space(self, problem: AttentionProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p, V, regs = problem, lanes_of(target), vector_registers(target)
        cores = [target.num_cores] if p.flops > LARGE_FLOPS or target.num_cores == 1 else \
            [1] if p.flops < SMALL_FLOPS else [1, target.num_cores]
        out = []
        for nv in BN_VECTORS:
            bn = nv * V
            if nv > BN_VECTORS[0] and bn // 2 >= p.S:                  # a block wider than the keys
                continue
            if bn * (p.e + p.ev) * 4 > l2_per_core(target) // 2:       # the K^T and V block stays in L2
                continue
            for bm in BMS:
                if bm * nv + nv + 1 > regs:                             # the score tile in registers
                    continue
                if bm > 1 and bm >= 2 * p.L:                             # a tile taller than the rows
                    continue
                qb = -(-p.L // bm)
                evp = -(-p.ev // V) * V
                for qg in GROUPS:
                    if qg > 1 and qg // 2 >= qb:                         # more row tiles than the rows
                        continue
                    if qg > 1 and qg * bm * (evp + V + 1) * 4 > L1_BYTES // 2:   # the group's state in L1
                        continue
                    for c in cores:
                        out.append(Schedule.of(bm=bm, bn=bn, qg=qg, cores=c))
        return out

    # ------------------------------------------------------------------ cost
    def cost(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> float:
        p, s = problem, schedule.as_dict()
        bm, bn, qg, cores = s["bm"], s["bn"], s["qg"], s["cores"]
        V, regs = lanes_of(target), vector_registers(target)
        clock = target.clock_hz or 2.5e9
        rate = target.vector_fma_rate                        # vector FMAs per cycle
        evp = -(-p.ev // V) * V
        nv, ov = bn // V, evp // V
        qk = p.e * max(bm * nv / rate, (bm + nv) / 2.0)
        spill = 1.0 if bm * ov + ov + 1 <= regs else 1.0 + 0.5 * (bm * ov + ov + 1 - regs) / regs
        pv = bn * max(bm * ov / rate, (bm + ov) / 2.0) * spill + 3 * bm * ov
        soft = bm * nv * (EXP_OPS + SOFTMAX_OPS) / 2.0 + bm * (3 * V + 40)
        block_bytes = bn * (p.e + p.ev) * 4
        head_bytes = p.S * (p.e + p.ev) * 4
        rate = L2_BYTES_PER_CYCLE if head_bytes <= l2_per_core(target) // 2 else L3_BYTES_PER_CYCLE
        qb, nkb = -(-p.L // bm), -(-p.S // bn)
        reuse = min(qg, qb)                                  # row tiles that read a key block while cached
        mem = block_bytes / rate / reuse
        # Groups of row tiles pay for their state and Q rows competing with the key block in L1
        # (measured on Zen 4, one core, E = EV = 64: qg=4 is 30-45% slower than qg=1 at S = 128
        # to 4096 — streaming a head's keys from L3 costs little there, the prefetchers keep up),
        # so the model takes them only where the key traffic dominates.
        compute = (qk + pv + soft) * (1.4 if qg > 1 else 1.0)
        # The key block is re-read by every row tile: from L1 when it fits, else from
        # L2 / L3, which the micro-kernels' loads only partly hide (measured on Zen 4: a 6-row
        # tile over 64 keys beats a 2-row tile over 128 by ~30%).
        block = max(compute, mem) + (0.25 if block_bytes <= L1_BYTES else 0.6) * mem + 30
        if p.causal:
            blocks = sum(min(nkb, (i * bm + bm - 1) // bn + 1) for i in range(qb))
        else:
            blocks = qb * nkb
        units = p.bh * -(-qb // qg)
        per_core = p.bh * blocks / units * -(-units // cores)   # whole units per core
        seconds = per_core * (block + p.e * 2) / clock
        # heads a core packs K^T of (causal units are dealt cyclically: every core meets every head)
        heads = min(p.bk, p.bh if p.causal or cores == 1 else -(-p.bh // cores) + 1)
        seconds += 8 * heads * nkb * bn * p.e / COPY_BANDWIDTH
        return seconds + FORK_COST * (cores > 1) + CALL_COST

    # ------------------------------------------------------------------ kernels
    def config(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> CpuAttnConfig:
        s = schedule.as_dict()
        return CpuAttnConfig(s["bm"], s["bn"], s["qg"], problem.e, problem.ev, lanes_of(target), s["cores"], problem.mask,
                             problem.mask_rows, problem.causal)

    def instantiate(self, problem: AttentionProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: build_cpu(cfg))

    def workspace_size(self, problem: AttentionProblem, schedule: Schedule, target: Target) -> int:
        return self.config(problem, target, schedule).workspace(problem.S)

    def arguments(self, problem: AttentionProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """q, k, v, mask (or a dummy), o, the packed-K^T workspace (without a schedule, sized for
        the widest key block of any point), then the scalars scale, kd, km, md, mm."""
        if schedule is None:
            bn = BN_VECTORS[-1] * 16
            size = max(1, (target or host_cpu_target()).num_cores) * -(-problem.S // bn) * bn * problem.e
        else:
            size = self.workspace_size(problem, schedule, target or host_cpu_target())
        return operand_views(problem, inputs, outputs) + [WORKSPACE.get("attn_kt", size)] + scalars(problem)


ATTENTION_CPU = AttentionCpuTemplate()

__all__ = ["ATTENTION_CPU", "AttentionCpuTemplate"]
