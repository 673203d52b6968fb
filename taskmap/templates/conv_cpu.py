"""CPU f32 convolution template: two direct kernels and Winograd's, no img2col.

* lanes along the **pixels** (:mod:`.conv_cpu_kernel`): the input is packed once into its
  zero-padded stride phases and a register tile of ``MR`` output channels x ``NR`` output pixels
  accumulates over ``C_in x kh x kw`` with contiguous vector loads of the input and broadcasts
  of the weights (read in place);
* lanes along the **output channels** (:mod:`.conv_cpu_cvec`, ``vec="channels"``): a tile of
  ``MR`` pixels of a row x ``NR`` channels, broadcasts of the (zero-padded) input and aligned
  vector loads of weight panels packed with the channels innermost — by the kernel, per call,
  or once when the weights are constants (``ConvProblem.const_weights``: a compiled graph packs
  them at compile time, :meth:`ConvCpuTemplate.weights`).  No lane is wasted on 7x7 / 14x14
  images and strides cost nothing extra;
* **Winograd** (:mod:`.conv_cpu_wino`, ``vec="winograd"``): 3x3 stride-1 layers with constant
  weights as ``F(2x2, 3x3)`` or ``F(4x4, 3x3)`` — 2.25x / 4x fewer multiplications, paid for by
  the input / output transforms and the transformed weights' size (``(M + 2)^2 / 9`` times the
  weights), so the cost model takes it where there are many tiles per weight: ResNet-50's 56x56,
  28x28 and 14x14 layers (1.5-1.7x faster than the channel kernel on one core), not its 7x7 one.

Tuning space of the pixel kernel, in hardware terms (the problem only prunes it):

* ``mr, nr`` — the register tile: ``MR * NR / V`` accumulators plus ``NR / V`` input vectors plus
  one broadcast within the vector register file (the matmul template's tiles,
  :data:`.matmul_cpu.TILES`);
* ``shift`` — the input's planes: one per stride phase (``False``: the ``QW`` padding columns of
  each row are computed too, and never stored) or one per tap column (``True``: ``kw`` times
  the packing, no wasted columns — for small images);
* ``cores`` — all of them, or one for tiny problems.

Of the channel kernel: its register tile (:data:`CVEC_TILES`), ``kc`` — the input channels of
a reduction block, so that a core's block of the weight panel stays in its L2 (0: all; else
partial sums in the workspace) — and the cores.  Of the Winograd kernel: ``M`` (2 or 4), its
register tile (:data:`WINO_TILES`: output channels x vectors of tiles) and the cores.

The cost model (:meth:`ConvCpuTemplate.cost`) is analytic: FMA cycles of the micro-kernel over
whole padded tiles (the ``QW`` extra columns per row of the phase planes, the last channel
panel and pixel tile), its loads per FMA (input vectors are unaligned: most split a cache line),
the stores, load balance over cores in whole tiles, the packing traffic and the parallel
regions.  :func:`select` compares it with the implicit GEMM (:data:`.matmul_cpu.MATMUL_CPU`
with an img2col gather in its B packing) and is the one place that decides which a convolution
runs on (``taskmap.ops.conv2d`` and the graph compiler both ask it).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from ..backends.base import Target, TargetKind, host_cpu_target
from ..errors import UnsupportedError
from ..runtime.args import view
from ..runtime.kernel import Kernel
from .attention_cpu import l2_per_core
from .base import KernelFamily, Schedule
from .conv_cpu_cvec import CvecConfig, pack_weights
from .conv_cpu_cvec import build_kernel as build_cvec
from .conv_cpu_kernel import ConvCpuConfig, build_kernel, valid
from .conv_cpu_wino import WinoConfig, transform_weights
from .conv_cpu_wino import build_kernel as build_wino
from .conv_problem import ConvProblem
from .matmul_cpu import (
    CALL_COST,
    FORK_COST,
    L1_BYTES,
    LARGE_FLOPS,
    MATMUL_CPU,
    MICRO_EFFICIENCY,
    SMALL_FLOPS,
    TILES,
    lanes_of,
    vector_registers,
)
from .matmul_problem import WORKSPACE
from .panels import PREFETCH_BYTES

#: Seconds per element the implicit GEMM spends gathering img2col into its packed B panels
#: (measured on Zen 4: index arithmetic and masked gathers, ~4 cycles an element).
GATHER_COST = 1.1e-9
#: Load slots of one unaligned vector load of the input (most cross a cache line).
SPLIT_LOAD = 1.6
#: Measured on Zen 4 (C1-C12 of TVM's Table 2, one core): the packing's slow-down when it reads
#: strided columns.  (Taps reading several stride-phase planes measured no slower: against the
#: exhaustive records of ``benchmarks/model_vs_exhaustive.py`` a penalty there misrouted C10.)
STRIDED_PACK = 6
#: Bytes per second one core packs the input (reads + writes contiguous rows; measured ~17e9).
PACK_BANDWIDTH = 16e9
#: The channel kernel's tiles (pixels, vectors of channels): ``MR * NV`` accumulators and ``NV``
#: weight vectors in the register file (the input broadcasts are memory operands).
#: Every ``MR x NV`` with 18+ accumulators (FMA latency x pipes) that fits; the row length and
#: channel count decide which wastes least.  And 16 x 2: its 32 accumulators and two weight
#: vectors are two registers over, but its stores are whole vectors (gcc stores other ``MR`` in
#: pieces of 8, 4, 2 and 1 lanes: 13 as three, and a fused SiLU's exp runs once per piece: a
#: 3-channel stem + SiLU at 128x128 113 -> 45 us).  Measured on Zen 5 (two cores, in isolation),
#: against the cost model's former choice: 64 -> 64 channels 3x3 stride 2 at 64x64 457 -> 357 us
#: (11 x 32 before), a 3-channel stem at 128x128 60 -> 47 us, 256 -> 256 at 16x16 667 -> 609 us
#: (8 x 48), 128 -> 128 at 32x32 638 -> 610 us.
CVEC_TILES = {32: tuple((mr, nv) for nv in (2, 3, 4) for mr in range(1, 16) if mr * nv >= 18 and (mr + 1) * nv <= 32)
              + ((16, 2),),
              16: ((6, 2), (7, 2), (4, 3))}
#: The channel kernel's tiles are whole output rows shorter than a vector on 7x7 / 14x14 images:
#: per channel a row's pixels are stored in 4 + 2 + 1 lanes (gcc 12's pieces for a 7-lane loop),
#: a fused epilogue computed in each piece (SiLU: a 192 -> 1152 1x1 conv at 7x7 ran 61 us alone,
#: 96 us with it).  With ``planes`` a unit is a channel panel of one image, all of its rows: the
#: rows are written plainly into a core's buffer of the panel's planes (``PLANE_BYTES`` at most,
#: in L1 / L2), then each channel's plane goes out as one vector loop, its epilogue with it.
#: Taken where it balances the cores within ``PLANE_BALANCE`` of tile by tile.
PLANE_BYTES = 64 << 10
PLANE_BALANCE = 1.1
#: A 1x1 layer on whole planes of at most this many pixels prefetches the panel of each core's next
#: unit into L2 while its rows run (``CvecConfig.pf_next``): in a model's flow a unit's first row
#: otherwise waits on its panel from memory, and at 7x7 a row's reduction is short.  Measured on
#: Zen 4 in the flow (both compiled graphs in one process, alternating): ResNet-50's 7x7 1x1 layers
#: at batch 1 0.92-0.94x the time, RegNetY's 1088 -> 1088 0.93-1.0x, MobileNetV2's 0.96-1.0x; the
#: 14x14 ones (512 -> 512) and the 3x3 layers ran 1.01-1.10x slower with it (the hints cost more).
PF_NEXT_PIXELS = 49
#: The pixel kernel's cost on a grouped layer, against the channel kernel's, is multiplied by this:
#: where the two tie alone they do not in a model's flow.  Measured on Zen 4 (both compiled graphs
#: in one process, alternating, batch 1): ResNeXt-50's 16-channel groups at 14x14 0.37-0.40 ms on
#: the pixel kernel, 0.32-0.34 on the channel kernel (alone 0.188 and 0.191); RegNetY's 128
#: channels of 64-channel groups at 56x56 2.42 against 2.25 (the model's costs 0.998 and 0.999 to 1).
GROUPED_PIXEL_FLOW = 1.05
#: Reduction blocks (input channels) of the channel kernel, besides 0 (all of C_in).
CVEC_KCS = (64, 128)
#: The channel kernel sweeping a batch image by image pads each image on the core that works on it,
#: as it reaches it, into that core's one padded copy (which stays in its caches), when every core
#: gets at least this many images: an image two cores share is padded by both.
PAD_EACH_IMAGES = 2
#: ... and that padding costs this share of a pass through memory (``PACK_BANDWIDTH``): its copy is
#: written and read in the core's caches.  Measured on Zen 4 in ResNeXt-50's flow at batch 8 (both
#: compiled graphs in one process, alternating): its 3x3 layers of 16-channel groups at 14x14, a
#: tie for the model without it (the pixel kernel's whole-batch pass through memory against the
#: channel kernel's pass charged the same), 1.9-2.1 ms on the pixel kernel, 1.38-1.47 on the channel
#: kernel (1.3x).
PAD_EACH_SHARE = 0.5
#: The pixel kernel packs the whole batch's stride-phase planes in a parallel pass before its tiles;
#: where those exceed this share of the last-level cache, each core packs instead the planes of a
#: group (an image with one group) as it reaches its tiles, into one buffer that stays in its caches
#: (``ConvCpuConfig.pack_each``).  Measured on Zen 4 (32 MB L3, two cores, side by side), ResNeXt-50's
#: grouped 3x3 layers (32 groups) at batch 8: stride 2 at 56x56 (27.6 MB of planes) 6.35 -> 3.63 ms,
#: at 28x28 (14.7 MB) 4.03 -> 3.09; below, 0.96-0.85x: stride 2 at 14x14 (8.4 MB) 2.18 -> 2.26,
#: stride 1 at 14x14 (4.2 MB) 1.53 -> 1.80, at 7x7 (2.6 MB) 1.65 -> 1.67, at batch 1 0.87-0.96x.
PACK_EACH_LLC = 1 / 3
#: Seconds per weight element the channel kernel packs per call (a transposition in 16 x 16
#: blocks in registers; measured on Zen 4, one core: ~0.05-0.11 ns more than reading packed
#: panels, a quarter of the former two-loop transposition, whose constants fitted to the
#: exhaustive records were 0.9 / 1.8 ns: scaled alike), into a block of the panel that stays in
#: L2 and beyond; and the cycles of its stores (through a transposed tile: vector stores) per
#: output element and per channel row of a tile (measured on Zen 4, warm and alone: 0.54 per element
#: with 14-pixel rows, 0.84 with 7, which a per-element 0.25 fitted).  The per-element cost is 1.25:
#: fitted with :data:`POINTWISE_EDGE` on Zen 4 (session 44) to which of the channel kernel and the
#: GEMM ran 42 1x1 layers faster side by side, batch 1 and 8: at 0.25 the channel kernel's estimate
#: was too low where its stores outweigh a short reduction (MobileNetV2's 64 -> 384 at 14x14, K = 64,
#: ran 1.2-1.3x slower on it in the model's flow) and no edge separated those from the wide layers
#: it ran faster (ResNeXt-50's 1024 -> 512 at 14x14, batch 8: 7.3 against 8.0 ms).
WEIGHT_PACK_COST = (0.25e-9, 0.5e-9)
CVEC_STORE_CYCLES = (1.25, 4.2)
#: Bytes per second one core reads an input that does not stay in its L2 (from L3): the channel
#: kernel sweeps the whole image once per channel panel, so a large input is streamed for every
#: panel of a core, its first included (channel by channel, a row apart: the prefetchers lag).
#: The host's own rate where :mod:`taskmap.backends.host_probe` measured it
#: (``Target.llc_bandwidth``), else this one, measured on a 2-core Cascade Lake (2.5 GHz, 1 MB L2
#: per core, ResNet-50's stride-2 1x1 layer 256 -> 512 at 56x56: 2.08 ms direct vs 1.43 ms of
#: compute in the model, ~13 MB re-read per core): ~20e9.  Counting the first sweep too (session
#: 18) moved 1x1 layers whose input exceeds half of L2 to the implicit GEMM where it is faster,
#: side by side on two cores: 512 -> 128 at 28x28 0.61 -> 0.46 ms, Inception-V3's 192 -> 64 and
#: 288 -> 64 at 35x35 0.21 -> 0.15 and 0.42 -> 0.33 ms (256 -> 48 there: 0.22 -> 0.24).  A Zen 5
#: core reads its L3 at ~120 GB/s (the probe): there the measured rate sends ResNet-50's 14x14
#: 1x1 layers 1024 -> 256 and 1024 -> 2048 (stride 2) to the channel kernel, which runs them in
#: 0.19 / 0.42 ms against the implicit GEMM's 0.22 / 0.55 (exhaustive records, two cores).
LLC_BANDWIDTH = 20e9
#: On 1x1 layers the two models are not on one scale: the channel kernel must win by this factor,
#: on cores with one full-width FMA a cycle (``Target.vector_fma_rate`` 1: Zen 4's two 256-bit
#: halves) and with two (Cascade Lake, Zen 5).  One pipe, fitted on Zen 4 in session 44 with the
#: stores' cost above (two cores; the model's channel-kernel and GEMM picks of 42 1x1 layers of
#: ResNet-50, ResNeXt-50 and MobileNetV2, 7x7 to 56x56, batch 1 and 8, stride 1 and 2, each pair
#: measured side by side): ranked by the GEMM's estimate over the channel kernel's, every layer
#: above 0.985 but two ran faster on the channel kernel (ResNeXt-50's 1024 -> 512 at 14x14: 0.91
#: against 0.96 ms at batch 1, 7.3 against 8.0 at batch 8; the stride-2 1x1 layers 1.02-1.34x),
#: every one below but two on the GEMM (MobileNetV2's 96 -> 576 and 64 -> 384 at 14x14, at 0.937
#: and 0.899: 113 against 107 us, 56 against 50); the four exceptions are within 2-3.6%.  Session
#: 37's 1.25 came from channel kernels that stored their planes through a division per element
#: (fixed in session 43) against GEMMs priced with B's rows in place at the Cascade Lake's cost.
#: Two pipes: a Cascade Lake ran ResNet-50's stride-2 layers 1.5-2.1 ms on the channel kernel,
#: 1.0-1.2 ms on the implicit GEMM, with the models 10% apart; a Zen 5 ran the 1x1 layers at 28x28
#: and 56x56 7-13% faster on the GEMM (exhaustive records; measured before the session 43 fix too,
#: so that edge may also be high).
POINTWISE_EDGE = 0.985
POINTWISE_EDGE_TWO_FMAS = 1.25
#: Slow-down of the channel kernel's steps when a core's block of the weight panel does not
#: fit half its L2 (streams from L3; measured ~15%).
L2_SPILL = 1.15
#: The Winograd kernel's tiles (output channels, vectors of tiles) and output tile sizes ``M``.
WINO_TILES = {32: ((8, 2), (8, 3), (12, 2), (16, 1), (24, 1)), 16: ((6, 2), (4, 3), (8, 1))}
WINO_M = (2, 4)
#: The Winograd kernel's overheads, measured on Zen 4 (one core, ResNet-50's 3x3 layers): cycles
#: of the input transform per input channel, ``xi`` and vector of tiles (strided band reads, the
#: transform and its stores), seconds per element of the input bands (short rows: the copy is
#: bound by per-row work) and per output element of the output transform and stores.
WINO_INPUT_CYCLES = 20.0
WINO_BAND_COST = 1.0e-9
WINO_OUTPUT_COST = 0.4e-9
#: Seconds per element of U when the kernel transforms the weights per call: the transform
#: (strided loads of the weights, the stores) and the freshly written U streaming back from memory
#: for the GEMMs — bound by the shared memory bandwidth, not by the cores (fitted on Zen 4, two
#: cores: C9 of TVM's Table 2, 14x14x256, ran 1.6 ms on Winograd with U per call, 1.4 ms direct).
WINO_WEIGHT_COST = 0.6e-9
#: Bytes per second one core streams the transformed weights ``U`` from L3 / DRAM when they do
#: not fit half its L2 (every block of tiles reads all of them).
WINO_STREAM_BANDWIDTH = 10e9


def _planes(p: ConvProblem, cfg: CvecConfig) -> bool:
    """Whether the channel kernel works whole output planes (``CvecConfig.planes``): packed
    panels, no reduction blocks, a tile per output row, rows shorter than a vector, a core's
    planes within :data:`PLANE_BYTES`, and the cores no worse balanced than tile by tile."""
    if not (cfg.prepacked and not cfg.kc and p.ow <= cfg.mr and p.ow < cfg.lanes
            and cfg.nr * cfg.plane_stride(p.oh, p.ow) * 4 <= PLANE_BYTES):
        return False
    units = p.n * -(-p.cout // cfg.nr)
    return -(-units // cfg.cores) * p.oh <= PLANE_BALANCE * -(-units * p.oh // cfg.cores)


def grouped_tiles(cog: int, regs: int) -> tuple[tuple[int, int], ...]:
    """The pixel kernel's register tiles for a grouped convolution of ``cog`` output channels a
    group: ``MR`` dividing ``cog`` (a tile's channels in one group), ``MR x NV`` accumulators — at
    least 16 where the register file allows — with ``NV`` input vectors and a broadcast within it,
    and ``MR`` at least 8 where ``cog`` allows (fewer input vectors per FMA: gcc reads each one
    from memory into every FMA).  (ResNeXt-50's 3x3 layers have 4 to 32 output channels a group;
    RegNets 8 to 232.)"""
    tiles = [(mr, nv) for mr in range(1, min(cog, 24) + 1) if cog % mr == 0
             for nv in range(1, (regs - 1) // (mr + 1) + 1)]
    # measured (Zen 5, ResNeXt-50's 3x3 layers with 32 channels a group): 8 x 2 vectors 1.3-1.8x
    # faster than 4 x 4, which the cost model ranks first
    tall = min(8, tiles[-1][0])
    return tuple(t for t in tiles if t[0] * t[1] >= 16 and t[0] >= tall) or tuple(tiles[-1:])


def grouped_cvec_tiles(cog: int, regs: int, lanes: int) -> tuple[tuple[int, int], ...]:
    """The channel kernel's register tiles for a grouped convolution of ``cog`` output channels
    a group: ``NV`` vectors of channels dividing ``cog`` (a panel's channels in one group, whose
    input channels its broadcasts read) — :data:`CVEC_TILES`, and one vector of ``MR`` = 4-16
    pixels (ResNeXt-50's 16 channels a group at 14x14)."""
    tiles = CVEC_TILES[regs] + tuple((mr, 1) for mr in range(4, 17) if mr + 2 <= regs)
    return tuple((mr, nv) for mr, nv in tiles if cog % (nv * lanes) == 0)


class ConvCpuTemplate(KernelFamily):
    """f32 2-D convolution (any kernel / stride / padding / groups — groups on the pixel kernel,
    and on the channel kernel where a group's output channels are whole vectors; dilation with
    stride 1 or where every stride phase is used) on the CPU."""

    name = "conv_cpu"
    version = 18  # keys the tuning cache: bump when the kernels change (18: grouped channel kernel, next panel)

    def applies(self, problem: Any, target: Target) -> bool:
        p = problem
        return (isinstance(p, ConvProblem) and target.kind is TargetKind.CPU and p.dtype == "float32"
                and p.oh > 0 and p.ow > 0 and (not p.pointwise or p.const_weights)
                and (p.groups == 1 or not p.pointwise))

    @staticmethod
    def _window(p: ConvProblem, mr: int, nr: int, lanes: int, cores: int, shift: bool = False) -> ConvCpuConfig:
        return ConvCpuConfig(mr, nr, lanes, cores, p.kh, p.kw, p.sh, p.sw, p.dh, p.dw, p.pt, p.pl, shift)

    # ------------------------------------------------------------------ space
    def space(self, problem: ConvProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p, V, regs = problem, lanes_of(target), vector_registers(target)
        flops = 2.0 * p.n * p.cout * p.oh * p.ow * p.cin // p.groups * p.kh * p.kw
        cores = [target.num_cores] if flops > LARGE_FLOPS or target.num_cores == 1 else \
            [1] if flops < SMALL_FLOPS else [1, target.num_cores]
        shifts = (False, True) if p.kw > 1 else (False,)
        tiles = TILES[regs] if p.groups == 1 else grouped_tiles(p.cout // p.groups, regs)
        pixels = [Schedule.of(mr=mr, nr=nv * V, cores=c, shift=sh) for mr, nv in tiles
                  for c in cores for sh in shifts] if valid(self._window(p, 1, V, V, 1)) and not p.pointwise else []
        if p.groups > 1:       # the channel kernel where a group's channels are whole vectors
            return pixels + [Schedule.of(vec="channels", mr=mr, nr=nv * V, cores=c, kc=0, packed=p.const_weights)
                             for mr, nv in grouped_cvec_tiles(p.cout // p.groups, regs, V)
                             if mr <= max(p.ow, 7) for c in cores]
        # reduction blocks only for pre-packed panels that overflow half the L2 (packing per call
        # in blocks measured slower: C10 / C12 of TVM's Table 2, one core)
        half_l2 = l2_per_core(target) // 2
        channels = [Schedule.of(vec="channels", mr=mr, nr=nv * V, cores=c, kc=kc, packed=p.const_weights)
                    for mr, nv in CVEC_TILES[regs] if mr <= max(p.ow, 7) for c in cores
                    for kc in [0] + [kc for kc in CVEC_KCS if kc < p.cin and p.const_weights and
                                     p.cin * p.kh * p.kw * nv * V * 4 > half_l2]]
        return pixels + channels + self._wino_space(p, target, cores)

    @staticmethod
    def winograd(p: ConvProblem) -> bool:
        """Whether the Winograd kernel applies: 3x3, stride 1, no dilation."""
        return (p.kh, p.kw, p.sh, p.sw, p.dh, p.dw) == (3, 3, 1, 1, 1, 1)

    def _wino_space(self, p: ConvProblem, target: Target, cores: list[int]) -> list[Schedule]:
        """Constant weights come transformed (``packed``: once, when the graph is compiled);
        others are transformed by the kernel on every call."""
        if not self.winograd(p):
            return []
        V = lanes_of(target)
        return [Schedule.of(vec="winograd", m=m, mr=mr, nr=nv * V, cores=c, packed=p.const_weights)
                for m in WINO_M for mr, nv in WINO_TILES[vector_registers(target)] for c in cores]

    # ------------------------------------------------------------------ cost
    def cost(self, problem: ConvProblem, target: Target, schedule: Schedule) -> float:
        """Seconds: the busiest core's micro-kernel cycles over whole padded tiles, plus the
        input packing, plus the parallel regions.  Only the ranking matters."""
        if schedule.get("vec") == "channels":
            return self._cvec_cost(problem, target, schedule)
        if schedule.get("vec") == "winograd":
            return self._wino_cost(problem, target, schedule)
        p, s = problem, schedule.as_dict()
        mr, nr, cores = s["mr"], s["nr"], s["cores"]
        cfg = self.config(p, target, schedule)
        V = lanes_of(target)
        clock = target.clock_hz or 2.5e9
        (nph, npw), (_, npc), (hq, wq) = cfg.phases, cfg.planes, cfg.frame(p.oh, p.ow)
        k = p.cin // p.groups * p.kh * p.kw
        fmas = mr * nr // V
        loads = mr + SPLIT_LOAD * nr / V
        step = (max(fmas / target.vector_fma_rate, loads / 2.0) + 0.02 * loads) / MICRO_EFFICIENCY
        if mr * k * 4 > L1_BYTES:      # the weight rows (read in place) stream from L2
            step *= 1.04
        tile = k * step + 3 * fmas + 40
        tiles = p.n * -(-p.cout // mr) * -(-(p.oh * wq) // nr)
        seconds = -(-tiles // cores) * tile / clock
        packed = p.n * p.cin * nph * npc * hq * wq
        seconds += 8 * packed / (PACK_BANDWIDTH * cores) * (1 if p.sw == 1 else STRIDED_PACK)
        return (seconds + FORK_COST * 2 * (cores > 1) + CALL_COST) * (GROUPED_PIXEL_FLOW if p.groups > 1 else 1.0)

    def _cvec_cost(self, p: ConvProblem, target: Target, schedule: Schedule) -> float:
        """The channel kernel: micro-kernel steps (``NV`` aligned loads and ``MR`` broadcasts
        per ``MR x NV`` FMAs) over whole tiles (a row's last tile padded to ``MR`` pixels, the
        last panel to ``NR`` channels), the transposed stores, partial sums between reduction
        blocks, the input's padding pass (``PAD_EACH_SHARE`` of it where each core pads its
        images in its caches) and — unless the weights come packed — their packing."""
        cfg = self.config(p, target, schedule)
        mr, nr, cores, V = cfg.mr, cfg.nr, cfg.cores, lanes_of(target)
        clock = target.clock_hz or 2.5e9
        fmas = mr * nr // V
        loads = nr // V + mr
        step = (max(fmas / target.vector_fma_rate, loads / 2.0) + 0.02 * loads) / MICRO_EFFICIENCY
        spills = cfg.stage(p.cin) * 4 > l2_per_core(target) // 2
        if spills:
            step *= L2_SPILL
        k = p.cin // p.groups          # a panel's reduction: its group's input channels
        blocks = -(-k // cfg.kc) if cfg.kc else 1
        stores = CVEC_STORE_CYCLES[0] * mr * nr + CVEC_STORE_CYCLES[1] * nr
        tile = k * cfg.taps * step + stores + (blocks - 1) * 3 * fmas + 40
        panels = -(-p.cout // nr)
        tiles = panels * p.n * p.oh * -(-p.ow // mr)
        # whole planes: the cores share (image, panel) units, each all of its rows
        busiest = -(-(panels * p.n) // cores) * p.oh if cfg.planes else -(-tiles // cores)
        seconds = busiest * tile / clock
        direct = cfg.direct(p.h, p.w, p.oh, p.ow)
        hp, wp = (p.h, p.w) if direct else cfg.padded(p.oh, p.ow)
        if not direct:
            seconds += 8 * p.n * p.cin * hp * wp / (PACK_BANDWIDTH * cores) * (PAD_EACH_SHARE if cfg.pad_each else 1)
        # the image's rows the tiles read (whole rows: the lines hold every column), once per panel:
        # every core streams the whole image (a group's channels of it) for each of its panels, from
        # L3 when it does not stay in L2 (channel by channel, a row apart: the prefetchers lag), its
        # first pass too
        image = 4 * p.n * k * min(hp, p.oh * p.kh) * wp
        passes = -(-panels // cores)
        if image + 4 * cfg.stage(p.cin) > l2_per_core(target) // 2:
            seconds += passes * image / (target.llc_bandwidth or LLC_BANDWIDTH)
        if not cfg.prepacked:
            seconds += WEIGHT_PACK_COST[spills] * panels * cfg.panel(p.cin) / cores
        return seconds + FORK_COST * 2 * (cores > 1) + CALL_COST

    def _wino_cost(self, p: ConvProblem, target: Target, schedule: Schedule) -> float:
        """The Winograd kernel: per unit (a block of ``NR`` tiles x a panel of ``MR`` channels)
        ``ALPHA^2`` GEMM steps per input channel over the padded frame of tiles, the input
        transform once per block (twice where a block is split over cores), the output transform
        and stores, the band copy, and the transformed weights streamed per block when they do
        not stay in L2."""
        cfg = self.config(p, target, schedule)
        assert isinstance(cfg, WinoConfig)
        mr, nr, cores, V, a2 = cfg.mr, cfg.nr, cfg.cores, lanes_of(target), cfg.alpha ** 2
        clock = target.clock_hz or 2.5e9
        rows, twf, wb = cfg.frame(p.n, p.oh, p.ow)
        blocks, panels = -(-rows * twf // nr), -(-p.cout // mr)
        units = -(-blocks * panels // cores)
        fmas = mr * nr // V
        loads = mr + nr // V
        step = (max(fmas / target.vector_fma_rate, loads / 2.0) + 0.02 * loads) / MICRO_EFFICIENCY
        half_l2 = l2_per_core(target) // 2
        if a2 * (p.cin + panels * mr) * nr * 4 > half_l2:     # the block's V and m spill from L2
            step *= L2_SPILL
        gemm = units * a2 * p.cin * step / clock
        u_bytes = a2 * p.cin * panels * mr * 4
        if u_bytes > half_l2:
            gemm = max(gemm, -(-blocks // cores) * u_bytes / WINO_STREAM_BANDWIDTH)
        per_core_blocks = min(blocks, -(-units // panels) + (cores > 1 and units % panels != 0))
        seconds = gemm + per_core_blocks * p.cin * a2 * (nr // V) * WINO_INPUT_CYCLES / clock
        seconds += units * mr * nr * cfg.m ** 2 * WINO_OUTPUT_COST
        seconds += p.cin * cfg.alpha * rows * wb * WINO_BAND_COST / cores
        if not cfg.prepacked:        # U made per call, then read from memory by the GEMMs
            seconds += u_bytes / 4 * WINO_WEIGHT_COST + FORK_COST * (cores > 1)
        return seconds + FORK_COST * 2 * (cores > 1) + CALL_COST

    # ------------------------------------------------------------------ kernels
    def config(self, problem: ConvProblem, target: Target,
               schedule: Schedule) -> ConvCpuConfig | CvecConfig | WinoConfig:
        s, p = schedule.as_dict(), problem
        if s.get("vec") == "winograd":
            return WinoConfig(s["mr"], s["nr"], lanes_of(target), s["cores"], 3, 3, 1, 1, 1, 1, p.pt, p.pl, s["m"],
                              s["packed"], PREFETCH_BYTES // 4)
        if s.get("vec") == "channels":
            if p.groups > 1 and ((p.cout // p.groups) % s["nr"] or s["kc"]):
                raise UnsupportedError(f"conv_cpu: the channel kernel's panels of {s['nr']} channels (kc={s['kc']}) "
                                       f"do not divide the {p.cout // p.groups} output channels of a group of {p}: "
                                       "a panel must hold one group's channels, without reduction blocks")
            by_image = s["packed"] and not s["kc"] and (p.n > 1 or p.channels_last)
            cfg = CvecConfig(s["mr"], s["nr"], lanes_of(target), s["cores"], p.kh, p.kw, p.sh, p.sw, p.dh, p.dw,
                             p.pt, p.pl, s["kc"], s["packed"], by_image,
                             by_image and p.n >= PAD_EACH_IMAGES * s["cores"], pf=PREFETCH_BYTES // 4,
                             pf_c=4 * p.n * p.cout * p.oh * p.ow > l2_per_core(target),
                             channels_last=p.channels_last, groups=p.groups)
            planes = _planes(p, cfg) and not p.channels_last
            return replace(cfg, planes=planes, pf_next=planes and p.kh * p.kw == 1 and p.oh * p.ow <= PF_NEXT_PIXELS)
        cfg = self._window(p, s["mr"], s["nr"], lanes_of(target), s["cores"], s.get("shift", False))
        return replace(cfg, pack_each=4 * cfg.workspace(p.n, p.cin, p.oh, p.ow) > PACK_EACH_LLC * target.llc_bytes > 0)

    def instantiate(self, problem: ConvProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        build = build_wino if isinstance(cfg, WinoConfig) else build_cvec if isinstance(cfg, CvecConfig) else build_kernel
        return self.kernel(cfg, lambda: build(cfg))

    def weight_shape(self, problem: ConvProblem, schedule: Schedule, target: Target | None = None) -> tuple[int, ...]:
        """The shape of the kernel's ``wt``: the NCHW weights (pixel kernel), seen flat, or
        their packed panels (``packed`` schedules), or their Winograd transform."""
        p, cfg = problem, self.config(problem, target or host_cpu_target(), schedule)
        if isinstance(cfg, WinoConfig):
            return (cfg.weight_size(p.cin, p.cout) if cfg.prepacked else p.cout * p.cin * 9,)
        if not isinstance(cfg, CvecConfig):
            return (p.cout, p.cin // p.groups, p.kh, p.kw)
        return (-(-p.cout // cfg.nr) * cfg.panel(p.cin) if cfg.prepacked else p.cout * cfg.panel(p.cin) // cfg.nr,)

    def weights(self, problem: ConvProblem, schedule: Schedule, w: Any, target: Target | None = None) -> Any:
        """The kernel's ``wt`` from the NCHW weights ``w`` (:meth:`weight_shape`): a view, or for
        ``packed`` schedules a new host array (a compiled graph packs its constants once)."""
        if schedule.get("packed"):
            w = np.asarray(w, np.float32)
            return transform_weights(w, schedule["m"], schedule["mr"]) if schedule.get("vec") == "winograd" \
                else pack_weights(w, schedule["nr"])
        return view(w, self.weight_shape(problem, schedule, target))

    def workspace_size(self, problem: ConvProblem, schedule: Schedule, target: Target) -> int:
        p, cfg = problem, self.config(problem, target, schedule)
        if isinstance(cfg, WinoConfig):
            return cfg.workspace(p.n, p.cin, p.cout, p.oh, p.ow)
        if isinstance(cfg, CvecConfig):
            return cfg.workspace(p.n, p.cin, p.oh, p.ow)
        return cfg.workspace(p.n, p.cin, p.oh, p.ow, p.groups)

    def arguments(self, problem: ConvProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """x (N, C_in, H, W), w (C_out, C_in, kh, kw), c (N, C_out, OH, OW), then the packed
        input's workspace (without a schedule: one that fits every point of the space)."""
        target = target or host_cpu_target()
        points = self.space(problem, target) if schedule is None else [schedule]
        size = max([self.workspace_size(problem, s, target) for s in points] or [1])
        w = inputs[1] if schedule is None else self.weights(problem, schedule, inputs[1], target)
        return [inputs[0], w, outputs[0], WORKSPACE.get("cpu_conv_x", size)]


CONV_CPU = ConvCpuTemplate()


def gemm_space(p: ConvProblem, target: Target, packs_b: bool = False) -> list[Schedule]:
    """The matmul template's points the implicit GEMM of ``p`` can run: those that pack B (the
    img2col prologue runs while packing; a 1x1 stride-1 layer's input is B itself, read in place
    too unless ``packs_b``: a prologue on it needs the packing) and, when the weights are per
    group and image, A."""
    mp = p.matmul()
    grouped = p.groups > 1 and p.n > 1
    return [s for s in MATMUL_CPU.space(mp, target)
            if (s["pack_b"] or (p.pointwise and not packs_b)) and (s.get("pack_a", True) or not grouped)]


def gemm_cost(p: ConvProblem, target: Target, schedule: Schedule) -> float:
    """The implicit GEMM's estimated seconds with the matmul ``schedule``: the matmul, plus the
    img2col gather into its packed B panels (1x1 stride-1 convolutions need none)."""
    mp = p.matmul()
    gather = 0.0 if p.pointwise else mp.batch * mp.k * mp.n * GATHER_COST / max(1, target.num_cores)
    return MATMUL_CPU.cost(mp, target, schedule) + gather


def best_gemm(p: ConvProblem, target: Target, packs_b: bool = False) -> Schedule | None:
    """The implicit GEMM's schedule the cost model ranks first (None: no point applies), of those
    that pack B where ``packs_b``."""
    return min(gemm_space(p, target, packs_b), key=lambda s: gemm_cost(p, target, s), default=None)


def implicit_gemm_cost(p: ConvProblem, target: Target) -> float:
    """The implicit GEMM's estimated seconds on its best schedule."""
    best = best_gemm(p, target)
    return float("inf") if best is None else gemm_cost(p, target, best)


def direct_cost(p: ConvProblem, target: Target, schedule: Schedule) -> float:
    """The direct template's estimate of ``schedule`` as weighed against the implicit GEMM: an
    unpadded 1x1 layer's by :func:`pointwise_edge` (the GEMM's measured edge there)."""
    unpadded_1x1 = (p.kh, p.kw, p.pt, p.pb, p.pl, p.pr) == (1, 1, 0, 0, 0, 0)
    return CONV_CPU.cost(p, target, schedule) * (pointwise_edge(target) if unpadded_1x1 else 1.0)


def pointwise_edge(target: Target) -> float:
    """:data:`POINTWISE_EDGE` on cores with one full-width FMA a cycle, else
    :data:`POINTWISE_EDGE_TWO_FMAS`."""
    return POINTWISE_EDGE_TWO_FMAS if target.vector_fma_rate > 1.5 else POINTWISE_EDGE


def select(p: ConvProblem, target: Target) -> Schedule | None:
    """The cost model's routing: the direct template's best schedule for ``p`` when it applies
    and beats the implicit GEMM's estimate; None: run the implicit GEMM.  (Measured routing:
    :mod:`taskmap.ops.conv_route`.)"""
    space = CONV_CPU.space(p, target)
    if not space:
        return None
    costs = {s: direct_cost(p, target, s) for s in space}
    best = min(space, key=costs.__getitem__)
    return best if costs[best] < implicit_gemm_cost(p, target) else None


__all__ = ["CONV_CPU", "ConvCpuTemplate", "best_gemm", "direct_cost", "gemm_cost", "gemm_space", "implicit_gemm_cost",
           "pointwise_edge", "select"]
