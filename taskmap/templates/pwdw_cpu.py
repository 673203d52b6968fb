"""CPU f32 template of a pointwise convolution feeding a depthwise one, fused (the kernel is in
:mod:`.pwdw_kernel`): ``y = dwconv(act(conv1x1(x, w1) + b1), wd) + bd`` — MobileNet's inverted
residual without its projection.  Separately, the expanded tensor (``C_exp`` channels at the
input's resolution, 6x the input) is written to memory by one kernel and read back by the next;
fused, it lives in a core's L2 one band of rows and ``MR`` channels at a time.

Tuning space, in hardware terms: the register tile of the expansion (``MR`` channels x ``NR``
pixels: ``MR * NR / V`` accumulators, the matmul template's tiles) and the cores; the output
rows per band follow from the problem (:func:`band_rows`: a core's scratch and its input band
in L2, and enough units for the cores).  The cost model counts the expansion's FMA steps over
whole tiles (halo rows computed by both bands), the staging and the depthwise taps.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backends.base import Target, TargetKind, host_cpu_target
from ..runtime.args import view
from ..runtime.kernel import Kernel
from .attention_cpu import l2_per_core
from .base import KernelFamily, Schedule
from .matmul_cpu import CALL_COST, FORK_COST, MICRO_EFFICIENCY, SMALL_FLOPS, lanes_of
from .matmul_problem import WORKSPACE
from .pwdw_kernel import ACTIVATIONS, PwDwConfig, build_kernel
from .pwdw_problem import PwDwProblem
from .window_kernels import MAX_UNROLLED_TAPS

#: Register tiles of the expansion (MR channels, NR in vectors) with AVX-512 / AVX2.
TILES = {32: ((6, 4), (8, 3), (12, 2)), 16: ((6, 2), (4, 3), (8, 1))}
#: The tile's channels when a band has fewer pixels than the tiles above (one vector of pixels).
SMALL_TILE = 12
#: Cycles per staged element (de-interleaving copies from L1 / L2) and per depthwise tap of a
#: vector (an unaligned load, an FMA and the loop around them).
STAGE_CYCLES, TAP_CYCLES = 0.3, 1.2


def band_rows(p: PwDwProblem, mr: int, nr: int, lanes: int, cores: int, l2: int) -> int:
    """Output rows per band: all of them, halved while a core's scratch (``MR`` expanded rows of
    the band and its staged plane) overflows half its L2 or its input band a quarter, or there
    are fewer than two units per core — but never below bands of ``nr`` input pixels."""
    rows = p.oh
    while rows > 1:
        cfg = _config(p, mr, nr, lanes, rows, cores)
        units = p.n * cfg.bands * -(-p.cexp // mr)
        if cfg.per_core * 4 <= l2 // 2 and p.cin * cfg.band_pixels * 4 <= l2 // 4 and units >= 2 * cores:
            break
        if _config(p, mr, nr, lanes, -(-rows // 2), cores).min_band_pixels < nr:
            break
        rows = -(-rows // 2)
    return rows


def _config(p: PwDwProblem, mr: int, nr: int, lanes: int, rows: int, cores: int) -> PwDwConfig:
    return PwDwConfig(p, mr, nr, rows, lanes, cores)


#: A pair is fused only when one image's expanded tensor is at least this share of a core's L2: smaller,
#: the two kernels pass it through L2 anyway and the fused kernel's pixel tiles fit small images
#: worse.  Measured in MobileNetV2 on Zen 4 (1 MB L2 per core, two cores, each pair in its place
#: in the model): 1.08-1.38x faster from 28x28x192 (0.6 MB) up, 0.88-0.97x at 14x14 (0.3-0.45 MB)
#: and 0.66-0.70x at 7x7 (0.19 MB).  Per image, because the fused kernel works an image at a time:
#: at batch 8 (Zen 5) fusing the 14x14 and 7x7 pairs too (their whole batch over the threshold)
#: made MobileNetV2 1.16x slower than this rule.  On Zen 5 (1 MB L2 per core) EfficientNet-B0's and
#: MobileNetV3-Large's 14x14x672 pairs (0.53 MB) ran slower fused: leaving them to two kernels made
#: the models 1.03-1.05x (batch 1) and 1.05x (EfficientNet-B0, batch 8) faster, where at half of L2
#: they were fused.  Moving the threshold on past 28x28x192 / 28x28x240 (0.6-0.75 MB) changed the
#: models by +-1.5%, within the machine's noise.
L2_SHARE = 0.55

#: The most input channels of a fused pair's pointwise convolution.  Each expanded element costs
#: ``2 * C_in`` FLOPs and fusing saves its trip through memory, so the gain shrinks as ``C_in``
#: grows while the fused kernel's GEMM runs below the matmul template's (136 against ~200 GFLOP/s
#: at 728 channels).  Measured on Zen 4 at batch 1: the inverted residuals of MobileNetV2 and
#: EfficientNet-B0 (``C_in`` 16-40) win fused (above); timm's Xception-41p (separable layers of
#: 64-728 channels) ran 149.8 ms with all its pairs fused, 110.9 with those of up to 128 channels
#: fused and 101.7 with none, alternating in one process.
MAX_FUSED_CIN = 48


def worth_fusing(image_bytes: int, cin: int, target: Target) -> bool:
    """Whether a pointwise + depthwise pair whose expanded tensor takes ``image_bytes`` an image
    (f32), expanded from ``cin`` channels, runs faster as one kernel on ``target`` (see
    :data:`L2_SHARE` and :data:`MAX_FUSED_CIN`)."""
    return cin <= MAX_FUSED_CIN and image_bytes >= l2_per_core(target) * L2_SHARE


class PwDwCpuTemplate(KernelFamily):
    """Pointwise + activation + depthwise convolution, f32, NCHW, on the CPU."""

    name = "pwdw_cpu"
    version = 3  # keys the tuning cache: bump when the kernel changes (3: activation at the stores)

    def applies(self, problem: Any, target: Target) -> bool:
        p = problem
        return (isinstance(p, PwDwProblem) and target.kind is TargetKind.CPU and p.dtype == "float32"
                and p.act in ACTIVATIONS and p.oh > 0 and p.ow > 0 and p.h * p.w >= lanes_of(target)
                and p.kh * p.kw <= MAX_UNROLLED_TAPS)      # (the taps are unrolled)

    def space(self, problem: PwDwProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        p, V = problem, lanes_of(target)
        cores = [1] if problem.flops < SMALL_FLOPS or target.num_cores == 1 else [target.num_cores]
        tiles = TILES[32 if target.vector_bytes >= 64 else 16]
        out = [Schedule.of(mr=mr, nr=nv * V, cores=c) for mr, nv in tiles for c in cores]
        out = [s for s in out if s["nr"] <= self.config(p, target, s).min_band_pixels]
        # a small image: one vector of pixels per tile (masked where a band has fewer pixels)
        return out or [Schedule.of(mr=SMALL_TILE, nr=V, cores=c) for c in cores]

    def config(self, problem: PwDwProblem, target: Target, schedule: Schedule) -> PwDwConfig:
        s, V = schedule.as_dict(), lanes_of(target)
        rows = band_rows(problem, s["mr"], s["nr"], V, s["cores"], l2_per_core(target))
        return _config(problem, s["mr"], s["nr"], V, rows, s["cores"])

    def cost(self, problem: PwDwProblem, target: Target, schedule: Schedule) -> float:
        """Seconds of the busiest core: per unit, the expansion's tiles (``C_in`` FMA steps and
        the activated stores), the staging of its ``MR`` planes and their depthwise taps."""
        p, cfg = problem, self.config(problem, target, schedule)
        V, clock = lanes_of(target), target.clock_hz or 2.5e9
        fmas = cfg.mr * cfg.nr // V
        step = (max(fmas / target.vector_fma_rate, (cfg.mr + cfg.nr / V) / 2.0) + 0.02 * fmas) / MICRO_EFFICIENCY
        tiles = -(-cfg.band_pixels // cfg.nr)
        expand = tiles * (p.cin * step + 2 * fmas + 20)
        staged = cfg.mr * p.sw * cfg.padded_rows * cfg.phase_width * STAGE_CYCLES
        taps = cfg.mr * cfg.rows * -(-p.ow // V) * (p.kh * p.kw * TAP_CYCLES + 4)
        units = p.n * cfg.bands * -(-p.cexp // cfg.mr)
        seconds = -(-units // cfg.cores) * (expand + staged + taps) / clock
        return seconds + FORK_COST * (cfg.cores > 1) + CALL_COST

    def instantiate(self, problem: PwDwProblem, target: Target, schedule: Schedule) -> Kernel:
        cfg = self.config(problem, target, schedule)
        return self.kernel(cfg, lambda: build_kernel(cfg))

    def workspace_size(self, problem: PwDwProblem, schedule: Schedule, target: Target) -> int:
        return self.config(problem, target, schedule).workspace

    def arguments(self, problem: PwDwProblem, inputs: Sequence[Any], outputs: Sequence[Any],
                  schedule: Schedule | None = None, target: Target | None = None) -> list[Any]:
        """x (seen as (N, C_in, H * W)), w1, b1, wd, bd, y, then the scratch (without a
        schedule: one that fits every point of the space)."""
        p, target = problem, target or host_cpu_target()
        x, w1, b1, wd, bd = inputs
        points = self.space(p, target) if schedule is None else [schedule]
        size = max([self.workspace_size(p, s, target) for s in points] or [1])
        return [view(x, (p.n, p.cin, p.h * p.w)), view(w1, (p.cexp, p.cin)), b1, view(wd, (p.cexp, p.kh * p.kw)), bd,
                outputs[0], WORKSPACE.get("cpu_pwdw", size)]


PWDW_CPU = PwDwCpuTemplate()

__all__ = ["PWDW_CPU", "PwDwCpuTemplate", "PwDwProblem", "band_rows"]
