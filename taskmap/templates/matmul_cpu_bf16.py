"""CPU bfloat16 products on AVX-512 BF16's dot products, written in the DSL with task mappings —
what a bfloat16 model's ``nn.Linear`` layers and 1x1 convolutions compute, two forms:

* **linear** (``c = a @ w^T (+ bias)``, ``a (m, k)`` bf16 activations, ``w (n, k)`` a constant
  weight, or a ``k x n`` one): the weight packed once (a compiled graph's constants,
  :func:`pack_weights`) in column panels of ``NR`` outputs, ``[panel][k / 2][NR][2]`` — per pair
  of K, each output's two weights side by side (zeros past ``n`` and, for an odd ``k``, past
  ``k``); ``a`` read in place (a row's pair is adjacent in row-major ``a``).  Cores take
  contiguous ranges of the ``NP x MP`` tiles, weight panels outermost: a core sweeps all of ``a``
  (in its L2) with each of its panels.
* **gemm** (``c[img] = a @ b[img]``, ``a`` a constant ``m x k`` — a convolution's weights, read in
  place — and ``b`` a batch of ``k x n``: the implicit GEMM): cores take contiguous ranges of the
  ``batch x NP`` column panels; each packs its panel of ``b[img]`` into its part of the workspace
  (two rows interleaved: the same ``[k / 2][NR][2]`` layout), then runs every row panel of ``a``
  over it.  An img2col prologue would be spliced into those loads (:mod:`taskmap.fusion`); the
  graph uses this form for 1x1 convolutions only (see ``widen_half.native_bf16``).

Both run one micro-kernel: a register tile ``MR x NR`` of f32 accumulators,
``repeat(MR, NR // 16) * spatial(1, 16)``; per pair of K, ``MR`` 32-bit broadcasts of ``a``'s pair,
``NR / 16`` loads of the panel and ``MR * NR / 16`` ``dot2_bf16`` (``vdpbf16ps``: 16 lanes x 2
products, twice the FMAs' rate).  The products are exact and the sums f32, as PyTorch's CPU bf16
kernels (oneDNN) compute them.  Stores: ``bf16(acc + bias)`` — the bias added in f32, one
rounding — where post-scheduling fusion splices the epilogue (vector stores: the lowering's
``hoist_invariants`` takes a spliced index's divisions out of them).  ``a``'s loads are inside the primitive: it
takes no prologue (a reshape is read in place).  Single-row tiles (1 x 128, 2 x 96) serve
decoding's one-row products, bound by the weights' bytes.

Applies where the host has AVX-512 BF16 (``avx512_bf16`` in the target's features); elsewhere a
bfloat16 product is computed in float32 (:mod:`taskmap.graph.passes.widen_half`).
"""

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..backends.base import Target, TargetKind, host_cpu_target
from ..ir.dtypes import numpy_bfloat16
from ..ir.mapping import repeat, spatial
from ..lang import bf16, dot2_bf16, f32, func, i32, register_tensor, symbol, unroll
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .base import KernelFamily, Schedule
from .matmul_cpu import CALL_COST, FORK_COST, L1_BYTES, LARGE_FLOPS, SMALL_FLOPS
from .matmul_problem import MatmulProblem, operand_views

#: f32 lanes of a dot product (a 512-bit vector).
LANES = 16
#: Register tiles (rows of ``a``, outputs): ``MR * NR / 16`` accumulators, ``NR / 16`` panel
#: vectors and a broadcast fit the 32 vector registers.
TILES = ((8, 48), (14, 32), (6, 64), (4, 96), (4, 48), (1, 128), (2, 96))
#: ``vdpbf16ps`` a cycle per core (Zen 4 / 5, Sapphire Rapids: two) and its efficiency in the
#: micro-kernel (a standalone 8 x 48 tile over K = 768 in L1: 515 GFLOP/s on one Zen 5 core).
DOT_RATE = 2.0
MICRO_EFFICIENCY = 0.9
#: Cycles a step spends per row's broadcast of ``a`` beyond the dot products (fitted on Zen 5, two
#: cores, BERT's 128 x 768 x 3072 linear: 14 x 32 tiles 0.82 ms against 8 x 48's 0.66).
BROADCAST_CYCLES = 0.25
#: Bytes a cycle a core streams a weight panel from L2 when the panel overflows half of L1: fitted
#: on Zen 5, two cores — an 8 x 48 tile moves 192 bytes of panel a step of 24 dot products, and ran
#: 128 x 768 x 3072 at ~14 bytes a cycle; 4-row tiles, with half the dot products a step, were
#: ~2x slower (4 x 48: 1.41 ms against 0.66; 4 x 96 on 128 x 3072 x 768: 1.36 against 0.69).
L2_BYTES_PER_CYCLE = 14.0
#: Cycles per output element of the stores (conversion to bf16, the bias).
STORE_CYCLES = 0.5
#: Cycles per element of ``b`` a core packs into a panel (``gemm``: two rows interleaved).
PACK_CYCLES = 0.25


def supported(target: Target) -> bool:
    """Whether ``target`` runs the template: a CPU with AVX-512 BF16."""
    return target.kind is TargetKind.CPU and "avx512_bf16" in target.features


@dataclass(frozen=True)
class Bf16Config:
    mr: int
    nr: int
    cores: int
    bias: bool
    gemm: bool = False          # a constant, b packed per call (convolutions); else b packed beforehand

    def workspace(self, k: int) -> int:
        """Elements of the workspace (``gemm``): a panel a core."""
        return self.cores * pairs(k) * self.nr * 2 if self.gemm else 0


def _host_bf16(x: Any) -> np.ndarray:
    """A bf16 operand (a torch or taskmap tensor, or an array) as a host ``ml_dtypes`` array."""
    if hasattr(x, "detach"):                        # torch
        x = x.detach().float().cpu().numpy()
    elif hasattr(x, "numpy"):                       # taskmap.Tensor: bf16 comes back as f32
        x = x.numpy()
    return np.asarray(x).astype(numpy_bfloat16())


def pairs(k: int) -> int:
    """Pairs of K in a packed panel (an odd ``k`` padded with a zero)."""
    return -(-k // 2)


def pack_weights(w: np.ndarray, nr: int) -> np.ndarray:
    """``w (n, k)`` as the kernel's panels ``[ceil(n / nr)][ceil(k / 2)][nr][2]``, flat, zeros past
    ``n`` and ``k`` (the array's own dtype: bf16 from a graph, any for tests)."""
    n, k = w.shape
    panels, k2 = -(-n // nr), pairs(k)
    full = np.zeros((panels * nr, 2 * k2), dtype=w.dtype)
    full[:n, :k] = w
    return np.ascontiguousarray(full.reshape(panels, nr, k2, 2).transpose(0, 2, 1, 3)).reshape(-1)


def _tile(cfg: Bf16Config, A_T: Any, P_T: Any, BIAS_T: Any, C_T: Any, m: Any, n: Any, k: Any) -> Any:
    """The micro-kernel: tile ``(i, j)`` of image ``img`` — rows ``i * MR ..`` of ``a`` (read in
    place, pairs of K adjacent) times the panel at ``panel[pbase:]`` (``[k / 2][NR][2]``), stored
    (+ bias) to ``c``."""
    MR, NR, V, BIAS = cfg.mr, cfg.nr, LANES, cfg.bias
    NV = NR // V
    tile = repeat(MR, NV) * spatial(1, V)
    row = spatial(NR)

    @func
    def bf16_tile(a: A_T, panel: P_T, bias: BIAS_T, c: C_T, pbase: i32, i: i32, j: i32, img: i32):
        acc = register_tensor(f32, [MR, NR])
        for r, s in tile.vectorize():
            acc[r, s] = 0.0
        for kk in range(k // 2):
            for r in unroll(MR):
                for v in unroll(NV):
                    dot2_bf16(acc[r, v * V], a[0, min(i * MR + r, m - 1), 2 * kk], panel[pbase + kk * NR * 2 + v * 2 * V],
                              V)
        if k % 2 == 1:                    # the last K alone: its pair's second element a zero
            odd = register_tensor(bf16, [MR, 2])
            for r in range(MR):
                odd[r, 0] = a[0, min(i * MR + r, m - 1), k - 1]
                odd[r, 1] = bf16(0.0)
            for r in unroll(MR):
                for v in unroll(NV):
                    dot2_bf16(acc[r, v * V], odd[r, 0], panel[pbase + (k // 2) * NR * 2 + v * 2 * V], V)
        for r in range(MR):
            if i * MR + r < m:
                if j * NR + NR <= n:
                    for s in row.vectorize():
                        if BIAS:
                            c[img, i * MR + r, j * NR + s] = bf16(acc[r, s] + f32(bias[j * NR + s]))
                        else:
                            c[img, i * MR + r, j * NR + s] = bf16(acc[r, s])
                else:
                    for s in row.vectorize():
                        if j * NR + s < n:
                            if BIAS:
                                c[img, i * MR + r, j * NR + s] = bf16(acc[r, s] + f32(bias[j * NR + s]))
                            else:
                                c[img, i * MR + r, j * NR + s] = bf16(acc[r, s])
    return bf16_tile


def build_kernel(cfg: Bf16Config) -> Kernel:
    """``cfg.gemm`` False: ``c = a @ b^T`` with ``b`` packed beforehand (a linear's constant
    weight), ``a`` in place; True: ``c[img] = a @ b[img]`` with ``a`` the constant left operand (a
    convolution's weights, in place) and each core packing the column panel of ``b[img]`` it works
    on into its part of the workspace ``ws`` (an implicit GEMM's img2col prologue goes into those
    loads)."""
    MR, NR, P = cfg.mr, cfg.nr, cfg.cores
    assert NR % LANES == 0
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    row = spatial(NR)
    batch, m, n, k, nbias, wsb = (symbol(x) for x in ("batch", "m", "n", "k", "nbias", "wsb"))
    A_T, BIAS_T = bf16[1, m, k], bf16[nbias]
    if not cfg.gemm:
        W_T, C_T = bf16[(n + NR - 1) // NR * ((k + 1) // 2) * NR * 2], bf16[1, m, n]
        tile = _tile(cfg, A_T, W_T, BIAS_T, C_T, m, n, k)

        @kernel
        def matmul_cpu_bf16(a: A_T, wb: W_T, bias: BIAS_T, c: C_T):
            MP = (m + MR - 1) // MR
            units = MP * ((n + NR - 1) // NR)
            for p in CORES:
                for u in range(p * units // P, (p + 1) * units // P):
                    j = u // MP                       # the weight panel: a core's units share it
                    tile(a, wb, bias, c, j * ((k + 1) // 2) * NR * 2, u % MP, j, 0)

        return matmul_cpu_bf16

    B_T, C_T, WS_T = bf16[batch, k, n], bf16[batch, m, n], bf16[wsb]
    tile = _tile(cfg, A_T, WS_T, BIAS_T, C_T, m, n, k)

    @kernel
    def matmul_cpu_bf16_gemm(a: A_T, b: B_T, bias: BIAS_T, c: C_T, ws: WS_T):
        MP = (m + MR - 1) // MR
        NP = (n + NR - 1) // NR
        K2 = (k + 1) // 2
        units = batch * NP
        for p in CORES:
            base = p * K2 * NR * 2
            for u in range(p * units // P, (p + 1) * units // P):
                img = u // NP
                j = u % NP
                # the panel: pairs of K side by side (two rows of b interleaved), columns past n
                # repeating the last (never stored), a zero after an odd k's last row
                if j * NR + NR <= n:
                    for kk in range(k // 2):
                        for s in row.vectorize():
                            ws[base + kk * NR * 2 + s * 2] = b[img, 2 * kk, j * NR + s]
                            ws[base + kk * NR * 2 + s * 2 + 1] = b[img, 2 * kk + 1, j * NR + s]
                else:
                    for kk in range(k // 2):
                        for s in row.vectorize():
                            ws[base + kk * NR * 2 + s * 2] = b[img, 2 * kk, min(j * NR + s, n - 1)]
                            ws[base + kk * NR * 2 + s * 2 + 1] = b[img, 2 * kk + 1, min(j * NR + s, n - 1)]
                if k % 2 == 1:
                    for s in row.vectorize():
                        ws[base + (k // 2) * NR * 2 + s * 2] = b[img, k - 1, min(j * NR + s, n - 1)]
                        ws[base + (k // 2) * NR * 2 + s * 2 + 1] = bf16(0.0)
                for i in range(MP):
                    tile(a, ws, bias, c, base, i, j, img)

    return matmul_cpu_bf16_gemm


class MatmulCpuBf16Template(KernelFamily):
    """bf16 products on AVX-512 BF16: with a constant ``b`` (a linear's ``n x k`` weight, or a
    ``k x n`` one, packed alike: ``const_b``, one batch), or with a constant ``a`` shared by a
    batch of ``b`` (a convolution's implicit GEMM: ``gemm``, ``b`` packed per call)."""

    name = "matmul_cpu_bf16"
    version = 1

    def applies(self, problem: Any, target: Target) -> bool:
        p = problem
        return (isinstance(p, MatmulProblem) and supported(target) and p.dtype == p.out_dtype == "bfloat16"
                and not p.trans_c and ((p.const_b and p.batch == 1) or self.gemm(p)))

    @staticmethod
    def gemm(p: MatmulProblem) -> bool:
        """A constant ``a`` shared by the batch, ``b`` (k x n) given per call."""
        return p.const_a and not p.const_b and not p.a_batched and not p.trans_b and not p.bias

    def space(self, problem: MatmulProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        cores = [target.num_cores] if problem.flops > LARGE_FLOPS or target.num_cores == 1 else \
            [1] if problem.flops < SMALL_FLOPS else [1, target.num_cores]
        return [Schedule.of(mr=mr, nr=nr, cores=c) for mr, nr in TILES for c in cores]

    def cost(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> float:
        """Seconds: the busiest core's tiles, each ``k / 2`` steps of ``MR * NR / 16`` dot products
        and ``MR`` broadcasts (or of its loads, two a cycle, or of the weight panel's bytes from L2
        when it does not stay in L1), whole tiles (padding included), then its stores."""
        p, s = problem, schedule.as_dict()
        mr, nr, cores = s["mr"], s["nr"], s["cores"]
        dots = mr * nr / LANES
        step = max(dots / DOT_RATE + BROADCAST_CYCLES * mr, (mr + nr / LANES) / 2.0) / MICRO_EFFICIENCY
        if pairs(p.k) * nr * 4 > L1_BYTES // 2:          # the panel streams from L2 for every tile
            step = max(step, nr * 4 / L2_BYTES_PER_CYCLE)
        tile = pairs(p.k) * step + STORE_CYCLES * mr * nr + 30
        panels = p.batch * -(-p.n // nr)
        tiles = panels * -(-p.m // mr)
        seconds = -(-tiles // cores) * tile / (target.clock_hz or 2.5e9)
        if self.gemm(p):                     # each panel of b packed once, by the core that uses it
            seconds += -(-panels // cores) * p.k * nr * PACK_CYCLES / (target.clock_hz or 2.5e9)
        return seconds + FORK_COST * 2 * (cores > 1) + CALL_COST

    def config(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Bf16Config:
        return Bf16Config(schedule["mr"], schedule["nr"], schedule["cores"], problem.bias, self.gemm(problem))

    def instantiate(self, problem: MatmulProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: build_kernel(cfg))

    def weights(self, problem: MatmulProblem, schedule: Schedule, b: np.ndarray) -> np.ndarray:
        """The kernel's ``wb`` from the constant ``b`` (``n x k`` with ``trans_b``, else ``k x n``)."""
        b = np.asarray(b).reshape(problem.n, problem.k) if problem.trans_b else np.asarray(b).reshape(problem.k, problem.n).T
        return pack_weights(b, schedule["nr"])

    def arguments(self, problem: MatmulProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """a, ``b`` packed for ``schedule``'s tile (the tuner measures each schedule on its own
        panels; the space's first without one), the bias (a one-element zero without one), c."""
        ops = operand_views(problem, inputs, outputs)
        sched = schedule or self.space(problem, target or host_cpu_target())[0]
        bias = ops[2] if problem.bias else np.zeros(1, numpy_bfloat16())
        if self.gemm(problem):
            return [ops[0], ops[1], bias, ops[-1], np.zeros(self.config(problem, target or host_cpu_target(), sched)
                                                            .workspace(problem.k), numpy_bfloat16())]
        return [ops[0], self.weights(problem, sched, _host_bf16(ops[1])), bias, ops[-1]]


MATMUL_CPU_BF16 = MatmulCpuBf16Template()

__all__ = ["MATMUL_CPU_BF16", "Bf16Config", "MatmulCpuBf16Template", "build_kernel", "pack_weights", "supported"]
