"""Sliding-window template: max / average pooling (fixed and adaptive windows) and depthwise
convolution (``groups == in_channels``, channel multiplier ``mult``), NCHW, on the CPU and GPUs.

A problem (:class:`WindowProblem`) is static: shapes, window, stride, padding (the top / left
padding; the bottom / right is implied by the output size), dilation.  The kernels are in
:mod:`.window_kernels` (rows of outputs in the lanes), and for f32 depthwise convolutions
:mod:`.window_chan` (channels in the lanes, any plane, in bands of rows) and :mod:`.window_plane`
(a whole small plane in the lanes, stride 1): points of the same space, ranked by the same cost
model.

Tuning space, in hardware terms: CPU — vector width (full or half registers: unaligned
full-width loads mostly cross cache lines, and a 512-bit operation is two 256-bit ones on some
cores: the cost model takes the host's measured 512-bit rate, ``Target.vector_fma_rate``) and output rows computed together (they share the loads of the input rows their windows
cover; more rows, more accumulator registers); GPU — threads per block.  ``cost`` is a
roofline: the bytes read and written against bandwidth, and per vector of outputs the larger of
the taps' FMAs (max: three operations) and the loads, plus the staging copy (a few cycles a
staged row: short rows cost more than their bytes), against the cores' throughput.  Not in the
space (chosen from the problem): output rows per worker (:func:`chunk_rows`), planes staged
ahead (:func:`plane_block`), one core below ``PARALLEL_MIN_WORK``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..backends.base import Target, TargetKind
from ..compute.nodes import accumulator_type
from ..ir.dtypes import ScalarType, scalar_type
from ..runtime.kernel import Kernel
from .base import Schedule
from .matmul_cpu import vector_registers
from .reduce import view
from .reduce_kernels import lanes_of
from .window_chan import ChanConfig, fits
from .window_chan import build_kernel as build_chan
from .window_kernels import cpu_global, cpu_window, gpu_window, staging
from .window_plane import PlaneConfig
from .window_plane import build_kernel as build_plane
from .window_plane import fits as plane_fits

OPS = ("max", "avg", "conv")
#: Below this many taps of work a CPU kernel runs on one core.  Measured (3x3, 7x7 planes): on idle
#: cores two threads pay from ~20k taps (the fork / join of a warm OpenMP team is ~1 us), but a
#: team whose second core is taken by another job can wait a whole time slice; 64k taps (~4 us
#: on one core) keeps that risk to kernels with something to gain.
PARALLEL_MIN_WORK = 1 << 16
#: A CPU worker's staged input rows should fit in its share of L2 (bytes).
STAGING_TARGET_BYTES = 48 * 1024
#: Planes whose staged input is under ``STAGE_AHEAD_BYTES / 4`` (7x7 and smaller images) are
#: staged in blocks of at least ``STAGE_AHEAD_BYTES`` before the first tap: the taps' loads each
#: span two staging stores, which cannot be forwarded, and a tiny plane's taps start before its
#: stores have drained from the store queue (Zen 4: 64 stores).  Measured: 14% off 1024x7x7;
#: no gain (or a loss) from 14x14 planes on, whose own staging takes long enough.
STAGE_AHEAD_BYTES = 4 * 1024
#: Cycles of the channel-lane depthwise kernel (:mod:`.window_chan`) per unit of ``V`` channels
#: besides its taps: per ``V x V`` block transposed (the input and the outputs), per element moved
#: lane by lane (a plane's pixels short of a block, taps short of one), per vector of the padded
#: frame (zeroed, then the pixels copied in) and per vector stored.  Rough, from its instruction
#: counts; on the Xeon of session 33 (two cores, side by side with the row kernel's best point):
#: 1152 channels 5x5 at 7x7 54-56 vs 97-105 us, 960 3x3 at 7x7 44-57 vs 48-67, 672 5x5 stride 2
#: 14x14 -> 7x7 56 vs 87; at 14x14 outputs the row kernel's 14 of 16 lanes won (672 5x5: 106 vs
#: 129, 384 3x3: 33 vs 51: before the biases below), and it was offered for rows of at most half
#: the lanes; it now serves every f32 depthwise conv (planes in bands of rows), ranked by this.
#: A block costs more where 512-bit operations issue as two halves (``Target.vector_fma_rate``
#: below 1.5): ``block_split``, refitted on Zen 4 (two cores, isolated) once the kernel loaded its
#: biases once a unit instead of gathering them for every row (1152 5x5 at 7x7: 38 -> 28 us): 60
#: ranks 12 depthwise layers of 3x3, 5x5 and 7x7 windows from 7x7 to 56x56 as measured but for
#: one near tie (576 channels 3x3 at 14x14).
CHAN_CYCLES = {"block": 48.0, "block_split": 60.0, "lane": 1.0, "frame": 1.0, "store": 1.0}
#: The row kernel's work on rows shorter than its lanes, against its model: measured on Zen 4 (two
#: cores, isolated) 1.5-1.9x at 7x7 outputs (3x3 and 5x5, strides 1 and 2) with 8 lanes, 1.3-1.5x
#: at 14x14 with 16; 1.0-1.15x for rows of whole vectors.  Applied where 512-bit operations issue
#: as two halves (Zen 4's kind), the one kind of core it was measured on.
SHORT_ROWS = 1.5
#: Cycles per output element of the row and plane kernels whose stores a fused permute makes
#: channels-last (one element a store, consecutive ones a row of channels apart).  Measured on Zen
#: 4: ConvNeXt-T's 96 channels 7x7 at 56x56 on the row kernel, 338 us alone, 460 in the flow with
#: its permute (~2.9 cycles an element at the cores' 3.6 GHz).
NHWC_STORE_CYCLES = 2.0
#: Cycles of the plane kernel (:mod:`.window_plane`) besides its FMAs: the share of a line-crossing
#: memory operand's second access that shows, per vector staged in each copy (a load, an AND, a
#: store), per vector stored, per plane (the loop, the bias, a tail).  Fitted on Zen 4 (two cores,
#: the tuner's isolated measurements, ``--repeat 30 --rounds 4``): 960 channels 3x3 at 7x7 13.6 /
#: 14.0 us with 8 / 16 lanes (the channel-lane kernel 31, the row kernel 26), 1152 5x5 at 7x7 29 /
#: 32 us (38, 60); 2048 3x3 at 7x7 23 / 25 (46, 38).  (At 14x14 it underestimates the plane kernel
#: by 15-65%: planes there are beyond :data:`.window_plane.MAX_PLANE_VECTORS`.)
PLANE_CYCLES = {"crossing": 0.5, "copy": 0.5, "store": 1.0, "plane": 8.0}


@dataclass(frozen=True)
class WindowProblem:
    """``op`` ("max", "avg", "conv") over windows of an ``(n, c_in, h, w)`` input giving
    ``(n, c_out, oh, ow)``; ``c_out = c_in * mult``.  ``adaptive``: windows
    ``[floor(o*h/oh), ceil((o+1)*h/oh))`` (kh, kw, strides and paddings unused).  avg:
    ``count_include_pad`` and ``divisor`` (torch's ``divisor_override``); conv: ``bias``.
    ``channels_last``: the kernel's stores become channels-last ones (an epilogue permutes the
    output to NHWC): the channel-lane kernel then stores a pixel's channels as one vector, the
    others an element at a time (:data:`NHWC_STORE_CYCLES`)."""

    op: str
    n: int
    c_in: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int = 1
    kw: int = 1
    sh: int = 1
    sw: int = 1
    ph: int = 0
    pw: int = 0
    dh: int = 1
    dw: int = 1
    mult: int = 1
    dtype: str = "float32"
    adaptive: bool = False
    count_include_pad: bool = True
    divisor: int | None = None
    bias: bool = False
    channels_last: bool = False     # the output is read channels-last (a fused permute to NHWC)

    def __post_init__(self) -> None:
        assert self.op in OPS, self.op

    @property
    def c_out(self) -> int:
        return self.c_in * self.mult

    @property
    def scalar(self) -> ScalarType:
        return scalar_type(self.dtype)

    @property
    def compute_type(self) -> ScalarType:
        return accumulator_type(self.scalar)

    @property
    def is_global(self) -> bool:
        """One window covering the whole plane (global pooling)."""
        if self.op == "conv" or self.oh != 1 or self.ow != 1:
            return False
        return self.adaptive or (self.kh == self.h and self.kw == self.w and self.ph == self.pw == 0
                                 and self.dh == self.dw == 1)

    def input_specs(self) -> list[tuple[tuple[int, ...], str]]:
        specs = [((self.n, self.c_in, self.h, self.w), self.dtype)]
        if self.op == "conv":
            specs.append(((self.c_out, self.kh * self.kw), self.dtype))
            if self.bias:
                specs.append(((self.c_out,), self.dtype))
        return specs

    def output_specs(self) -> list[tuple[tuple[int, ...], str]]:
        return [((self.n, self.c_out, self.oh, self.ow), self.dtype)]

    @property
    def taps(self) -> int:
        """Window elements per output (the largest adaptive window)."""
        if self.adaptive:
            return (-(-self.h // self.oh) + 1) * (-(-self.w // self.ow) + 1)
        return self.kh * self.kw


_DEFAULTS = {TargetKind.CPU: (20e9, 2.5e9), TargetKind.CUDA: (2e12, 1.5e9), TargetKind.HIP: (1.6e12, 1.5e9)}


class WindowTemplate:
    """Pooling and depthwise convolution (see the module docstring)."""

    name = "window"
    # 7: the single-core plane kernel's core index opaque; 6: the channel kernel on any plane (bands
    # of rows); 5: the plane kernel; 4: the channel-lane depthwise kernel (3: short rows through a flat buffer)
    version = 7

    def __repr__(self) -> str:
        return "<WindowTemplate>"

    def applies(self, problem: Any, target: Target) -> bool:
        return isinstance(problem, WindowProblem)

    def space(self, problem: WindowProblem, target: Target) -> list[Schedule]:
        if not self.applies(problem, target):
            return []
        if target.kind is TargetKind.CPU:
            lanes = lanes_of(target.vector_bytes, problem.compute_type)
            if problem.is_global or problem.adaptive:
                return [Schedule.of(lanes=lanes, rows=1)]
            # full or half vector registers; max pooling keeps full ones: its three operations per
            # tap are bound by instruction throughput, where full registers issue half as many
            widths = [lanes] + ([lanes // 2] if lanes >= 8 and problem.op != "max" else [])
            rows = [Schedule.of(lanes=v, rows=r) for v in widths for r in (1, 2) if r <= max(1, problem.oh)]
            chan = self._chan_config(problem, target, lanes)
            planes = [Schedule.of(lanes=v, rows=0, plane=True) for v in widths
                      if self._plane_config(problem, target, v) is not None]
            return rows + ([Schedule.of(lanes=lanes, rows=0, chan=True)] if chan is not None else []) + planes
        return [Schedule.of(block=bs) for bs in (128, 256) if bs <= target.max_threads_per_block]

    def cost(self, problem: WindowProblem, target: Target, schedule: Schedule) -> float:
        p = problem
        bw, clock = _DEFAULTS[target.kind]
        bw = target.mem_bandwidth or bw
        clock = target.clock_hz or clock
        nbytes = p.scalar.nbytes
        traffic = (p.n * p.c_in * p.h * p.w + p.n * p.c_out * p.oh * p.ow) * nbytes
        outputs = p.n * p.c_out * p.oh * p.ow
        if target.kind is TargetKind.CPU:
            cores = max(1, min(target.num_cores, p.n * p.c_out * p.oh))
            if p.is_global:
                return traffic / bw + outputs * 20 / (clock * cores)
            if schedule.get("chan", False):
                return self._chan_cost(p, target, schedule, traffic / bw)
            if schedule.get("plane", False):
                return self._plane_cost(p, target, schedule, traffic / bw)
            lanes, group = schedule["lanes"], schedule["rows"]
            vbytes = lanes * p.compute_type.nbytes
            # vector operations per cycle: two of up to 256 bits; 512-bit ones at the host's
            # measured rate (one on AMD Zen 4, whose pipes take them as two halves; two on Zen 5)
            rate = target.vector_fma_rate if vbytes > 32 else 2.0
            vectors = -(-p.ow // lanes)  # per output row (the last one overlapping)
            # per vector of outputs: the taps' FMAs (max: compare, compare, blend) ...
            compute = p.taps * (3 if p.op == "max" else 1) / rate
            # ... against the loads a group of rows shares, unaligned: a load crossing a cache
            # line costs two (most 64-byte loads do, under half of the 32-byte ones)
            loads = p.kw * ((group - 1) * p.sh + (p.kh - 1) * p.dh + 1) / group
            crossing = (vbytes - p.compute_type.nbytes) / target.transaction_bytes
            loads = loads * (1 + crossing) / rate
            if p.op == "conv" and p.taps > vector_registers(target) - group - 2:
                loads += p.taps / 2       # weights past the registers: a broadcast load an FMA
            cycles = max(compute, loads) + 1  # + the store
            # staging, per output row: each staged row costs a few cycles (pads, short and
            # de-interleaving copies; measured ~4) plus its bytes at 32 B a cycle
            chunk = chunk_rows(p, cores)
            ir, wb = staging(p, chunk)
            stage = ir * (4 + wb * p.compute_type.nbytes / 32) / chunk
            work = p.n * p.c_out * p.oh * (vectors * cycles + stage) / (clock * cores) + _scatter(p, target, cores)
            if p.ow < lanes and target.vector_fma_rate < 1.5:     # (SHORT_ROWS: measured on Zen 4)
                work *= SHORT_ROWS
            return _cpu_seconds(traffic / bw, work)
        block = schedule["block"]
        sms = max(1, target.num_cores)
        threads = target.max_threads_per_core or 2048
        waves = -(-outputs // (sms * threads))
        tail = (-(-outputs // block) * block) / outputs
        latency = waves * p.taps * 24 / clock
        return max(traffic / bw, latency * tail) + 3e-6 + (0 if block == 256 else 1e-9)

    @staticmethod
    def _chan_config(p: WindowProblem, target: Target, lanes: int) -> ChanConfig | None:
        """The channel-lane kernel's configuration for ``p``, where it is offered: an f32
        depthwise convolution (one output channel per input channel) within the kernel's stack
        budget (a band of one output row)."""
        if not _f32_depthwise(p):
            return None
        cores = target.num_cores if _parallel(p, target) else 1
        cfg = ChanConfig(p.n, p.c_in, p.h, p.w, p.oh, p.ow, p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw,
                         p.bias, lanes, cores, p.channels_last)
        return cfg if fits(cfg) else None

    def _chan_cost(self, p: WindowProblem, target: Target, schedule: Schedule, memory: float) -> float:
        """The channel-lane kernel: per unit (``V`` channels, a band of output rows) its taps (per
        output row, segment and tap, a weight load and a segment's FMAs with memory operands:
        whichever of the FMAs and the loads is slower) and the staging and transposed stores
        (:data:`CHAN_CYCLES`), over the cores."""
        cfg = self._chan_config(p, target, schedule["lanes"])
        assert cfg is not None
        V, c = cfg.lanes, CHAN_CYCLES
        hp, wp = cfg.frame
        rows = p.oh / cfg.bands                           # a band's output rows, on average
        pixels = cfg.seg * -(-p.ow // cfg.seg)            # a row's tiles' pixels (the last segment overlaps)
        taps = rows * p.taps * max(pixels / target.vector_fma_rate, (pixels + 1) / 2.0)
        staged = min(hp, p.h)                             # input rows staged a band
        if cfg.direct:                                    # blocks of each input row, the last overlapping
            blocks, lanes, moves = staged * -(-p.w // V), 0, hp * wp - staged * p.w
        else:                                             # the band's pixels, then copied into the frame
            blocks, lanes, moves = staged * p.w // V, staged * p.w % V, hp * wp + staged * p.w
        blocks += p.taps // V + (0 if p.channels_last else -(-int(rows * p.ow) // V))
        lanes = V * (lanes + p.taps % V)
        stores = V * -(-rows * p.ow // V)
        block = c["block"] if target.vector_fma_rate >= 1.5 else c["block_split"]
        cycles = taps + block * blocks + c["lane"] * lanes + c["frame"] * moves + c["store"] * stores
        work = -(-cfg.units // cfg.cores) * cycles / (target.clock_hz or 2.5e9)
        return _cpu_seconds(memory, work)

    @staticmethod
    def _plane_config(p: WindowProblem, target: Target, lanes: int) -> PlaneConfig | None:
        """The plane kernel's configuration for ``p``, where it is offered: an f32 depthwise
        convolution (one output channel per input channel) at stride 1 keeping the image's size,
        whose plane fits the vector registers (:func:`.window_plane.fits`)."""
        if not _f32_depthwise(p) or (p.sh, p.sw) != (1, 1) or (p.oh, p.ow) != (p.h, p.w):
            return None
        cores = target.num_cores if _parallel(p, target) else 1
        cfg = PlaneConfig(p.n, p.c_in, p.h, p.w, p.kh, p.kw, p.ph, p.pw, p.dh, p.dw, p.bias, lanes, cores,
                          32 if target.vector_bytes >= 64 else 16)
        return cfg if plane_fits(cfg) else None

    def _plane_cost(self, p: WindowProblem, target: Target, schedule: Schedule, memory: float) -> float:
        """The plane kernel: per plane its taps (a vector FMA with an unaligned memory operand per
        tap and vector of the plane, a share of the line-crossing loads' second access on top),
        the staged copies, the stores (:data:`PLANE_CYCLES`), over the cores."""
        cfg = self._plane_config(p, target, schedule["lanes"])
        assert cfg is not None
        vbytes = cfg.lanes * 4
        rate = target.vector_fma_rate if vbytes > 32 else 2.0
        crossing = (vbytes - 4) / target.transaction_bytes
        fmas = p.taps * cfg.vectors
        c = PLANE_CYCLES
        cycles = (fmas * (1 + c["crossing"] * crossing) / rate + c["copy"] * p.kw * cfg.vectors
                  + c["store"] * cfg.vectors + c["plane"])
        work = -(-p.n * p.c_in // cfg.cores) * cycles / (target.clock_hz or 2.5e9) + _scatter(p, target, cfg.cores)
        return _cpu_seconds(memory, work)

    def instantiate(self, problem: WindowProblem, target: Target, schedule: Schedule) -> Kernel:
        p = problem
        if target.kind is TargetKind.CPU and schedule.get("plane", False):
            cfg = self._plane_config(p, target, schedule["lanes"])
            assert cfg is not None, (p, schedule)
            return build_plane(cfg)
        if target.kind is TargetKind.CPU and schedule.get("chan", False):
            cfg = self._chan_config(p, target, schedule["lanes"])
            assert cfg is not None, (p, schedule)
            return build_chan(cfg)
        if target.kind is TargetKind.CPU:
            parallel = _parallel(p, target)
            if p.is_global:
                return Kernel(cpu_global(p, _pow2_floor(schedule["lanes"]), parallel))
            cores = target.num_cores if parallel else 1
            rows = chunk_rows(p, cores)
            planes = plane_block(p, rows, cores)
            return Kernel(cpu_window(p, schedule["lanes"], rows, schedule["rows"], parallel, planes))
        return Kernel(gpu_window(p, schedule["block"]))

    def arguments(self, problem: WindowProblem, inputs: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        p = problem
        if p.is_global:
            return [_as(inputs[0], (p.n * p.c_in, p.h * p.w)), _as(outputs[0], (p.n * p.c_out,))]
        args = [_as(inputs[0], (p.n, p.c_in, p.h, p.w))]
        if p.op == "conv":
            args.append(_as(inputs[1], (p.c_out, p.kh * p.kw)))
            if p.bias:
                args.append(inputs[2])
        return [*args, _as(outputs[0], (p.n, p.c_out, p.oh, p.ow))]


def _as(a: Any, shape: tuple[int, ...]) -> Any:
    """``a`` seen as ``shape`` (itself when it has that shape: a view costs a microsecond a call)."""
    return a if tuple(getattr(a, "shape", ())) == shape else view(a, shape)


def chunk_rows(p: WindowProblem, cores: int) -> int:
    """Output rows per CPU worker: a whole plane, halved until there are a few chunks per core
    and the staged input fits the worker's buffer."""
    rows = p.oh
    nbytes = p.compute_type.nbytes

    def staged(r: int) -> int:
        ir, wb = staging(p, r)
        return ir * wb * nbytes

    while rows > 1 and (p.n * p.c_out * -(-p.oh // rows) < 4 * cores or staged(rows) > STAGING_TARGET_BYTES):
        rows = -(-rows // 2)
    return rows


def plane_block(p: WindowProblem, rows: int, cores: int) -> int:
    """Planes a CPU worker stages before computing them (chunks of whole, small planes only): the
    largest divisor of ``N*C`` up to the planes whose staged input fills ``STAGE_AHEAD_BYTES``,
    leaving a few blocks per core."""
    if rows < p.oh:
        return 1
    ir, wb = staging(p, rows)
    per_plane = (ir + 1) * wb * p.compute_type.nbytes
    if 4 * per_plane >= STAGE_AHEAD_BYTES:
        return 1
    want = min(-(-STAGE_AHEAD_BYTES // per_plane), STAGING_TARGET_BYTES // per_plane)
    total = p.n * p.c_out
    return max(g for g in range(1, max(1, want) + 1)
               if total % g == 0 and (g == 1 or cores == 1 or total // g >= 4 * cores))


def _f32_depthwise(p: WindowProblem) -> bool:
    """An f32 depthwise convolution, one output channel per input channel (the channel-lane and
    plane kernels' problems)."""
    return p.op == "conv" and p.mult == 1 and p.dtype == "float32" and not p.adaptive


def _cpu_seconds(memory: float, work: float) -> float:
    """A CPU kernel's estimate: the larger of its memory traffic and its work, a quarter of the
    other on top (they overlap only in part), and the call."""
    return max(memory, work) + 0.25 * min(memory, work) + 2e-6


def _parallel(p: WindowProblem, target: Target) -> bool:
    """Whether a CPU kernel of ``p`` runs on all the cores (:data:`PARALLEL_MIN_WORK`)."""
    work = p.n * p.c_out * p.oh * p.ow * max(1, p.taps)
    return target.num_cores > 1 and work >= PARALLEL_MIN_WORK and p.n * p.c_out * p.oh > 1


def _scatter(p: WindowProblem, target: Target, cores: int) -> float:
    """Seconds a kernel storing rows of pixels spends on channels-last stores (an element each)."""
    if not p.channels_last:
        return 0.0
    return p.n * p.c_out * p.oh * p.ow * NHWC_STORE_CYCLES / ((target.clock_hz or 2.5e9) * cores)


def _pow2_floor(n: int) -> int:
    return 1 << (max(1, n).bit_length() - 1)


WINDOW = WindowTemplate()


def output_size(size: int, k: int, s: int, p_lo: int, p_hi: int, d: int, ceil_mode: bool = False) -> int:
    """torch's output size of a window ``k`` (dilation ``d``, stride ``s``) over ``size`` padded by
    ``p_lo`` / ``p_hi``; with ``ceil_mode`` a last partial window counts if it starts inside the
    input or the left padding."""
    span = size + p_lo + p_hi - d * (k - 1) - 1
    out = (span + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= size + p_lo:
        out -= 1
    return out


__all__ = ["OPS", "WINDOW", "WindowProblem", "WindowTemplate", "output_size"]
