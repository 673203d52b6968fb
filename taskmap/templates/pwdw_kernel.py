"""The CPU f32 kernel of a pointwise convolution feeding a depthwise one (MobileNet's inverted
residual: 1x1 expansion + activation, then a ``kh x kw`` depthwise convolution), in one pass
that never writes the expanded tensor to memory.  Written in the DSL with task mappings.

``build_kernel(cfg)`` makes one kernel per :class:`PwDwConfig` (the sizes are constants).

* **Units**: ``n x bands x channel blocks`` — a band is ``rows`` output rows, a channel block
  ``MR`` expanded channels; the cores take contiguous ranges of units (``spatial(P).parallel()``,
  channel blocks innermost: a core sweeps all its channel blocks over one band of the input,
  which stays in its L2).
* **Expansion** (the pointwise convolution): the input rows a band's windows read (the halo
  rows of neighbouring bands are computed by both), ``MR`` channels at a time, as a register
  tile of ``MR`` channels x ``NR`` pixels (``repeat(MR, NR // V) * spatial(1, V)``: per input
  channel ``MR`` weight broadcasts, ``NR / V`` vector loads of the input row, ``MR * NR / V``
  FMAs), bias and activation applied on the way to the core's scratch ``E`` (L1 / L2).  The last
  pixel tile of a band is shifted left to end at the band's end (whole vectors, a few pixels
  computed twice); a band of fewer pixels than a tile (tiny images) takes masked tiles.
* **Depthwise**: per expanded channel, the band's rows of ``E`` are staged zero-padded and split
  into the column phases of the stride (1 or 2; ``P[q][row][t]`` = padded column ``t * sw + q``:
  constant bounds, vectorized copies), so every tap reads contiguous lanes; then each output row
  is vectors of ``V`` outputs, up to 8 of them together (independent accumulators; the last one
  shifted left onto the row's end, a row shorter than ``V`` one masked vector), each lane summing
  its window's taps with the channel's weights held in registers.  Each output element is stored
  (with the same value) by one or two vectors and never read: post-scheduling fusion splices an
  epilogue (BatchNorm, activation, residual) into these stores (:mod:`taskmap.fusion`).
"""
import functools
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, register_tensor, select, silu, symbol, unroll
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .pwdw_problem import PwDwProblem

#: Activations between the two convolutions (of the graph's unary functions).
ACTIVATIONS = ("none", "relu", "relu6", "hardswish", "silu")


@dataclass(frozen=True)
class PwDwConfig:
    """Everything the kernel's code depends on: the problem (sizes, window, activation), the
    register tile (``mr`` channels x ``nr`` pixels), the output rows per band and the cores."""

    p: PwDwProblem
    mr: int
    nr: int
    rows: int
    lanes: int
    cores: int

    @property
    def bands(self) -> int:
        return -(-self.p.oh // self.rows)

    def band_rows(self, band: int) -> tuple[int, int]:
        """Input rows (of the image) that band ``band``'s windows read: ``[lo, hi)``."""
        oi0 = band * self.rows
        oi1 = min(oi0 + self.rows, self.p.oh)
        return max(oi0 * self.p.sh - self.p.pt, 0), min((oi1 - 1) * self.p.sh + self.p.kh - self.p.pt, self.p.h)

    @property
    def band_pixels(self) -> int:
        """The most input pixels of a band (the rows of ``E``)."""
        return max((hi - lo) * self.p.w for lo, hi in map(self.band_rows, range(self.bands)))

    @property
    def min_band_pixels(self) -> int:
        return min((hi - lo) * self.p.w for lo, hi in map(self.band_rows, range(self.bands)))

    @property
    def padded_rows(self) -> int:
        """Rows of a band's staged, padded plane."""
        return (self.rows - 1) * self.p.sh + self.p.kh

    @property
    def phase_width(self) -> int:
        """Columns of one stride phase of the staged plane: the taps of every output vector
        (a masked one included) stay inside."""
        p = self.p
        return max(-(-((p.ow - 1) * p.sw + p.kw) // p.sw), self.lanes + (p.kw - 1) // p.sw)

    @property
    def per_core(self) -> int:
        """Scratch elements of one core: ``E`` (``MR`` channels of a band) and the staged plane."""
        return self.mr * self.band_pixels + self.p.sw * self.padded_rows * self.phase_width

    @property
    def workspace(self) -> int:
        return self.cores * self.per_core


@functools.cache
def make_activation(act: str) -> func:
    """``act`` (one of :data:`ACTIVATIONS`) as a device function of one value, applied as a tile
    is stored: in a loop of its own over the tile before the stores, gcc 12 kept the tile's
    accumulators on the stack (the pairs 1.01-1.08x slower)."""
    RELU, RELU6, HSWISH, SILU = act in ("relu", "relu6"), act == "relu6", act == "hardswish", act == "silu"

    def activate(v: f32) -> f32:
        if RELU6:
            return select(v > 6.0, 6.0, select(v < 0.0, 0.0, v))
        elif RELU:
            return select(v < 0.0, 0.0, v)
        elif HSWISH:
            u = v + 3.0
            return v * select(u > 6.0, 6.0, select(u < 0.0, 0.0, u)) * (1.0 / 6.0)
        elif SILU:
            return silu(v)
        else:
            return v
    activate.__name__ = f"activate_{act}"
    return func(activate)


def build_kernel(cfg: PwDwConfig) -> Kernel:
    p = cfg.p
    activate = make_activation(p.act)
    assert cfg.nr % cfg.lanes == 0 and p.act in ACTIVATIONS and p.sw in (1, 2)
    N, CIN, H, W, CEXP = p.n, p.cin, p.h, p.w, p.cexp
    KH, KW, SH, SW, PT, PL, OH, OW = p.kh, p.kw, p.sh, p.sw, p.pt, p.pl, p.oh, p.ow
    MR, NR, V, P, ROWS = cfg.mr, cfg.nr, cfg.lanes, cfg.cores, cfg.rows
    NB, CB = cfg.bands, -(-CEXP // MR)
    EB, PR, WQ, PER_CORE = cfg.band_pixels, cfg.padded_rows, cfg.phase_width, cfg.per_core
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    WS_T = f32[symbol("wsz")]                   # the scratch (at least P * PER_CORE)
    tile = repeat(MR, NR // V) * spatial(1, V)
    WIDE = OW >= V                       # whole output vectors (the last one shifted left)
    VECS = -(-OW // V)
    VG = min(VECS, 8)                    # vectors of an output row computed together
    GROUPS = -(-VECS // VG)
    row = repeat(VG, 1) * spatial(1, V)  # (a group's last vectors shift left onto the row's end)
    SHORT = cfg.min_band_pixels < NR     # (tiny images) masked pixel tiles

    @func
    def expand(x: f32[N, CIN, H * W], w1: f32[CEXP, CIN], b1: f32[CEXP], ws: WS_T, e0: i32, b: i32,
               c0: i32, pix0: i32, npix: i32):
        """Channels ``c0 .. c0 + MR`` of the pointwise convolution, activated, at the band's
        pixels ``pix0 .. pix0 + npix`` of image ``b``: to ``E`` at ``ws[e0:]`` (``MR`` rows of
        ``EB``).  Channels past C_exp repeat the last one (never read)."""
        acc = register_tensor(f32, [MR, NR])
        for t in range((npix + NR - 1) // NR):
            p0 = max(min(t * NR, npix - NR), 0)
            for r, s in tile.vectorize():
                acc[r, s] = b1[min(c0 + r, CEXP - 1)]
            for k in range(CIN):
                if SHORT:       # a band of fewer pixels than a tile: lanes past it read its last pixel
                    for r, s in tile.vectorize():
                        acc[r, s] += w1[min(c0 + r, CEXP - 1), k] * x[b, k, pix0 + min(p0 + s, npix - 1)]
                else:
                    for r, s in tile.vectorize():
                        acc[r, s] += w1[min(c0 + r, CEXP - 1), k] * x[b, k, pix0 + p0 + s]
            if SHORT:
                for r, s in tile.vectorize():
                    if p0 + s < npix:
                        ws[e0 + r * EB + p0 + s] = activate(acc[r, s])
            else:
                for r, s in tile.vectorize():
                    ws[e0 + r * EB + p0 + s] = activate(acc[r, s])

    # per stride phase q: the phase columns t whose image column t * SW + q - PL is inside: [lo, hi)
    SPANS = []
    for q in range(SW):
        lo = min(max(-(-(PL - q) // SW), 0), WQ)
        SPANS.append((lo, max(min(-(-(W + PL - q) // SW), WQ), lo)))

    def make_stage(q: int, lo: int, hi: int) -> func:
        inside = spatial(max(hi - lo, 1))
        left, right = spatial(max(lo, 1)), spatial(max(WQ - hi, 1))
        every = spatial(WQ)

        def stage(ws: WS_T, e0: i32, q0: i32, r: i32, ilo: i32, top: i32):
            """Phase ``q`` of channel row ``r`` of ``E`` (image rows from ``ilo``) as the band's
            padded plane at ``ws[q0:]``: ``P[q][pr][t]`` = padded row ``top + pr``, column
            ``t * SW + q`` (zero outside the image); constant bounds, vectorized copies."""
            for pr in range(PR):
                i = top + pr - PT                        # the image row
                row = q0 + (q * PR + pr) * WQ
                if i >= 0 and i < H:
                    src = e0 + r * EB + (i - ilo) * W + q - PL
                    if lo > 0:
                        for t in left.vectorize():
                            ws[row + t] = 0.0
                    if hi > lo:
                        for t in inside.vectorize():
                            ws[row + lo + t] = ws[src + (lo + t) * SW]
                    if WQ > hi:
                        for t in right.vectorize():
                            ws[row + hi + t] = 0.0
                else:
                    for t in every.vectorize():
                        ws[row + t] = 0.0
        stage.__name__ = f"stage_{q}"
        return func(stage)

    stage0 = make_stage(0, *SPANS[0])
    stage1 = make_stage(1, *SPANS[-1]) if SW == 2 else stage0

    @func
    def depthwise(ws: WS_T, wd: f32[CEXP, KH * KW], bd: f32[CEXP], y: f32[N, CEXP, OH, OW], q0: i32,
                  b: i32, c: i32, oi0: i32, oi1: i32, top: i32):
        """Output rows ``oi0 .. oi1`` of channel ``c`` from the staged plane at ``ws[q0:]``: ``VG``
        vectors of a row at a time (independent accumulators), the weights in registers."""
        acc = register_tensor(f32, [VG, V])
        wv = register_tensor(f32, [KH * KW])
        for t in range(KH * KW):
            wv[t] = wd[c, t]
        for oi in range(oi0, oi1):
            base = q0 + (oi * SH - top) * WQ
            for g in range(GROUPS):
                for v, j in row.vectorize():
                    acc[v, j] = bd[c]
                for kh in unroll(KH):
                    for kw in unroll(KW):
                        for v, j in row.vectorize():
                            col = max(min((g * VG + v) * V, OW - V), 0) + j + kw // SW
                            acc[v, j] += ws[base + ((kw % SW) * PR + kh) * WQ + col] * wv[kh * KW + kw]
                if WIDE:
                    for v, j in row.vectorize():
                        y[b, c, oi, max(min((g * VG + v) * V, OW - V), 0) + j] = acc[v, j]
                else:
                    for v, j in row.vectorize():
                        if j < OW:
                            y[b, c, oi, j] = acc[v, j]

    @kernel
    def pwdw_cpu(x: f32[N, CIN, H * W], w1: f32[CEXP, CIN], b1: f32[CEXP], wd: f32[CEXP, KH * KW], bd: f32[CEXP],
                 y: f32[N, CEXP, OH, OW], ws: WS_T):
        units = N * NB * CB
        for p in CORES:
            u0 = p * units // P
            u1 = (p + 1) * units // P
            e0 = p * PER_CORE
            q0 = e0 + MR * EB
            for u in range(u0, u1):
                b = u // (NB * CB)
                band = u // CB % NB
                c0 = u % CB * MR
                oi0 = band * ROWS
                oi1 = min(oi0 + ROWS, OH)
                top = oi0 * SH                               # the band's first padded row
                ilo = max(top - PT, 0)
                ihi = min((oi1 - 1) * SH + KH - PT, H)
                expand(x, w1, b1, ws, e0, b, c0, ilo * W, (ihi - ilo) * W)
                for r in range(min(MR, CEXP - c0)):
                    stage0(ws, e0, q0, r, ilo, top)
                    if SW == 2:
                        stage1(ws, e0, q0, r, ilo, top)
                    depthwise(ws, wd, bd, y, q0, b, c0 + r, oi0, oi1, top)

    return pwdw_cpu


__all__ = ["ACTIVATIONS", "PwDwConfig", "build_kernel"]
