"""The CPU f32 direct-convolution kernel, written in the DSL with task mappings.

``build_kernel(cfg)`` makes one kernel per :class:`ConvCpuConfig` (register tile, cores, and the
window: kernel size, stride, dilation, top / left padding); the image sizes are symbolic.

* **Input packing** (cheap: one pass over the image, no img2col): ``xp`` holds, per image and
  input channel, the zero-padded image split into its ``SH x SW`` stride phases (only those a
  tap uses)::

      xp[b, ci, ph, pw, i, j] = x[b, ci, i*SH + ph - PT, j*SW + pw - PL]   (0 outside the image)

  with rows ``i < HQ = OH + QH`` and columns ``j < WQ = OW + QW`` (``QH = (KH-1)*DH // SH``).
  Tap ``(kh, kw)`` of output pixel ``(oh, ow)`` is then ``xp[b, ci, kh*DH % SH, kw*DW % SW,
  oh + kh*DH // SH, ow + kw*DW // SW]``: with the pixels numbered ``p = oh*WQ + ow`` in the
  plane's frame, **every tap reads the plane at p plus a constant** — a strided, padded
  convolution becomes a stride-1, unpadded one, and the taps of ``NR`` consecutive pixels are one
  contiguous (unaligned) vector load.  Pixels with ``ow >= OW`` (``QW`` per row) are computed
  and never stored; reads past the last plane land in a zeroed tail of ``NR`` elements.
* **groups**: the weights are ``(C_out, C_in / G, KH, KW)`` (``cig`` input channels a group); a
  tile's ``MR`` output channels lie in one group (the template's tiles divide ``C_out / G``), and
  its reduction runs over that group's input channels only.
* **register tile** ``MR`` output channels x ``NR`` pixels: ``repeat(MR, NR // V) * spatial(1, V)``
  (lanes along the pixels); per input channel and tap, ``NR / V`` vector loads of ``xp``, ``MR``
  broadcasts of the weights (read in place: ``w[co, ci, kh, kw]``) and ``MR * NR / V`` FMAs.  The
  taps are unrolled (a big window's rows, a very wide one's taps, stay loops:
  :data:`UNROLLED_FMAS`); the reduction runs
  over all of the group's ``C_in / G`` in registers, so there are no partial sums: **each output element is stored exactly once and the output is never read**
  (post-scheduling fusion splices epilogues into these stores, :mod:`taskmap.fusion`).
* **stores**: a tile inside one output row stores whole vectors; other tiles (across rows, or
  in the last channel panel) store, per output row they touch, that row's range of lanes of each
  channel inside ``C_out`` (no per-lane test: a fused epilogue's loads stay unconditional, and
  gcc vectorizes them).
* **cores**: ``spatial(P).parallel()`` over contiguous ranges of the ``N x CP x PT`` tiles (``CP``
  channel panels, ``PT`` pixel tiles; pixel tiles innermost, so a core's weight panel stays in
  cache); the packing is one parallel loop over the planes before — or, with ``pack_each`` (the
  batch's planes larger than the caches), each core packs the planes of a group's input channels
  (all of an image's with one group) when its tiles reach that group, into its own buffer of
  ``xp``, where the group's tiles then read them from its caches rather than from memory.
"""
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, parallel, register_tensor, symbol, unroll, vectorize
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel


@dataclass(frozen=True)
class ConvKernelConfig:
    """What the direct-convolution kernels' code depends on: the register tile, the cores and
    the window (kernel size, stride, dilation, top / left padding); the sizes are symbolic."""

    mr: int
    nr: int
    lanes: int
    cores: int
    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    pt: int
    pl: int


@dataclass(frozen=True)
class ConvCpuConfig(ConvKernelConfig):
    """The pixel-vectorized kernel's: ``mr`` output channels x ``nr`` pixels."""

    shift: bool = False     # planes per tap column (no padding columns computed; see the module doc)
    pack_each: bool = False  # each core packs a group's planes (an image's with one group) as it reaches them

    @property
    def phases(self) -> tuple[int, int]:
        """Stride phases a tap reads (rows, columns): 0 .. n-1."""
        return (len({r * self.dh % self.sh for r in range(self.kh)}),
                len({s * self.dw % self.sw for s in range(self.kw)}))

    @property
    def reach(self) -> tuple[int, int]:
        """(QH, QW): how many rows / columns of the phase planes the taps reach past a pixel."""
        return (self.kh - 1) * self.dh // self.sh, (self.kw - 1) * self.dw // self.sw

    @property
    def planes(self) -> tuple[int, int]:
        """Planes of ``xp`` per input channel (row phases, column phases or tap columns)."""
        nph, npw = self.phases
        return nph, self.kw if self.shift else npw

    def frame(self, oh: int, ow: int) -> tuple[int, int]:
        """(HQ, WQ): rows and columns of one plane of ``xp``."""
        qh, qw = self.reach
        return oh + qh, ow if self.shift else ow + qw

    def workspace(self, n: int, cin: int, oh: int, ow: int, groups: int = 1) -> int:
        """Elements of ``xp``: the packed input plus its zero tail, or with ``pack_each`` per core
        one group's planes plus their tail."""
        (nph, npc), (hq, wq) = self.planes, self.frame(oh, ow)
        if self.pack_each:
            return self.cores * (cin // groups * nph * npc * hq * wq + self.nr)
        return n * cin * nph * npc * hq * wq + self.nr


#: A row's taps are unrolled while that makes at most this many FMAs, the window's rows too while
#: all its taps do: gcc's alias analysis is quadratic in an unrolled block's loads and stores (a
#: 7x7 window on an 8x48 tile, 1176 FMAs, took gcc 29 s per kernel; a loop over its rows, 1 s; a
#: 1x128 window, wav2vec2's positional convolution, 3072 FMAs in a row, 34 s; a loop over its taps,
#: under 1 s).
UNROLLED_FMAS = 256


def valid(cfg: ConvCpuConfig) -> bool:
    """The phase planes are numbered by phase (0 .. n-1): true unless a dilated tap skips one."""
    nph, npw = cfg.phases
    return ({r * cfg.dh % cfg.sh for r in range(cfg.kh)} == set(range(nph))
            and {s * cfg.dw % cfg.sw for s in range(cfg.kw)} == set(range(npw)))


def build_kernel(cfg: ConvCpuConfig) -> Kernel:
    assert valid(cfg) and cfg.nr % cfg.lanes == 0
    MR, NR, V, P = cfg.mr, cfg.nr, cfg.lanes, cfg.cores
    KH, KW, SH, SW, DH, DW, PT, PL = cfg.kh, cfg.kw, cfg.sh, cfg.sw, cfg.dh, cfg.dw, cfg.pt, cfg.pl
    (NPH, NPW), (QH, QW) = cfg.phases, cfg.reach
    SHIFT = cfg.shift
    PACK_EACH = cfg.pack_each
    NPC = KW if SHIFT else NPW              # planes per row phase
    PAR = parallel if P > 1 else range
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    tile = repeat(MR, NR // V) * spatial(1, V)
    ROWS = unroll if KH * KW * MR * NR // V <= UNROLLED_FMAS else range   # the window's rows
    COLS = unroll if KW * MR * NR // V <= UNROLLED_FMAS else range        # a row's taps
    n, cin, cig, h, w, cout, oh, ow, wsx = (symbol(s) for s in ("n", "cin", "cig", "h", "w", "cout", "oh", "ow", "wsx"))
    X_T, W_T, C_T, XP_T = f32[n, cin, h, w], f32[cout, cig, KH, KW], f32[n, cout, oh, ow], f32[wsx]

    @func
    def pack(x: X_T, xp: f32[wsx], q: i32, hq: i32, wq: i32, base: i32):
        """Plane ``q`` = (b, ci, ph, pw) of the packed input, written at ``xp[base:]``."""
        pc = q % NPC
        pw = pc * DW if SHIFT else pc         # the plane's first column in the padded image
        ph = q // NPC % NPH
        bc = q // (NPC * NPH)
        b = bc // cin
        ci = bc % cin
        jlo = min(max((PL - pw + SW - 1) // SW, 0), wq)          # columns inside the image: jlo .. jhi
        jhi = max(min((w + PL - pw + SW - 1) // SW, wq), jlo)
        # rows inside the image: ilo .. ihi (three loops, no condition per row: gcc 12.2 at -O3
        # miscompiles the if-converted row loop once the sizes are constants)
        ilo = min((PT - ph + SH - 1) // SH, hq)
        ihi = max(min((h + PT - ph + SH - 1) // SH, hq), ilo)
        for i in range(ilo):
            for j in range(wq):
                xp[base + i * wq + j] = 0.0
        for i in range(ilo, ihi):
            row = base + i * wq
            for j in range(jlo):
                xp[row + j] = 0.0
            for j in range(jlo, jhi):
                xp[row + j] = x[b, ci, i * SH + ph - PT, j * SW + pw - PL]
            for j in range(jhi, wq):
                xp[row + j] = 0.0
        for i in range(ihi, hq):
            for j in range(wq):
                xp[base + i * wq + j] = 0.0

    @func
    def micro(wt: W_T, c: C_T, xp: f32[wsx], b: i32, i: i32, t: i32, hq: i32, wq: i32, xg: i32):
        """Output channels ``i*MR ..`` x pixels ``t*NR ..`` (frame numbering) of image ``b``; the
        planes of their group's input channels at ``xp[xg:]``."""
        acc = register_tensor(f32, [MR, NR])
        co0 = i * MR
        p0 = t * NR
        plane = hq * wq
        cpl = NPH * NPC * plane
        xb = xg + p0
        for r, s in tile.vectorize():
            acc[r, s] = 0.0
        if co0 + MR <= cout:
            for ci in range(cig):
                for kh in ROWS(KH):
                    for kw in COLS(KW):
                        for r, s in tile.vectorize():
                            acc[r, s] += wt[co0 + r, ci, kh, kw] * xp[
                                xb + ci * cpl + (kh * DH % SH * NPC + (kw if SHIFT else kw * DW % SW)) * plane
                                + kh * DH // SH * wq + (0 if SHIFT else kw * DW // SW) + s]
        else:
            for ci in range(cig):
                for kh in ROWS(KH):
                    for kw in COLS(KW):
                        for r, s in tile.vectorize():
                            acc[r, s] += wt[min(co0 + r, cout - 1), ci, kh, kw] * xp[
                                xb + ci * cpl + (kh * DH % SH * NPC + (kw if SHIFT else kw * DW % SW)) * plane
                                + kh * DH // SH * wq + (0 if SHIFT else kw * DW // SW) + s]
        ho0 = p0 // wq
        wo0 = p0 % wq
        if co0 + MR <= cout and wo0 + NR <= ow:
            for r, s in tile.vectorize():
                c[b, co0 + r, ho0, wo0 + s] = acc[r, s]
        else:      # across rows, or the last channel panel: each row's range of lanes, channels in C_out
            rows = min((wo0 + NR - 1) // wq + 1, oh - ho0)
            for j in range(rows):
                lo = j * wq - wo0
                for r in unroll(MR):
                    if co0 + r < cout:
                        for s in vectorize(max(lo, 0), min(lo + ow, NR)):
                            c[b, co0 + r, ho0 + j, s - lo] = acc[r, s]

    @kernel
    def conv_cpu(x: X_T, wt: W_T, c: C_T, xp: XP_T):
        WQ = ow if SHIFT else ow + QW
        HQ = oh + QH
        CPL = NPH * NPC * HQ * WQ              # elements of an input channel's planes
        CPG = cout // (cin // cig)             # output channels a group
        if not PACK_EACH:
            planes = n * cin * NPH * NPC
            for q in PAR(planes):
                pack(x, xp, q, HQ, WQ, q * HQ * WQ)
            for z in range(NR):
                xp[planes * HQ * WQ + z] = 0.0
        CORE = cig * CPL + NR                  # (pack_each) a core's planes of one group and their tail
        CP = (cout + MR - 1) // MR
        PTS = (oh * WQ + NR - 1) // NR
        for p in CORES:
            u0 = p * (n * CP * PTS) // P
            u1 = (p + 1) * (n * CP * PTS) // P
            for u in range(u0, u1):
                b = u // (CP * PTS)
                i = u // PTS % CP
                t = u % PTS
                first = b * cin + i * MR // CPG * cig     # image b's first input channel of the tile's group
                if PACK_EACH:
                    if u == u0 or (t == 0 and i * MR % CPG == 0):     # a group reached: its planes
                        for r in range(cig * NPH * NPC):
                            pack(x, xp, first * NPH * NPC + r, HQ, WQ, p * CORE + r * HQ * WQ)
                        for z in range(NR):
                            xp[p * CORE + cig * CPL + z] = 0.0
                    micro(wt, c, xp, b, i, t, HQ, WQ, p * CORE)
                else:
                    micro(wt, c, xp, b, i, t, HQ, WQ, first * CPL)

    return conv_cpu


__all__ = ["ConvCpuConfig", "ConvKernelConfig", "build_kernel", "valid"]
