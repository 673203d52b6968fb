"""The CPU f32 direct-convolution kernel vectorized over output channels (oneDNN's blocking,
kept inside one kernel: NCHW in, NCHW out), written in the DSL with task mappings.

``build_kernel(cfg)`` makes one kernel per :class:`CvecConfig` (register tile, cores, and the
window: kernel size, stride, dilation, top / left padding); the image sizes are symbolic.

* **Input**: copied once into a zero-padded image ``xq[b, ci, HP, WP]`` (one parallel pass,
  no img2col).  ``WP`` covers whole pixel tiles, so a tile never reads past its row.  Any stride
  and dilation: the taps are broadcasts, their addresses need no contiguity.
* **Weights**: each core packs the channel panel it works on (``NR`` output channels) as
  ``wq[ci, kh, kw, NR]`` (channels innermost, zeros past ``C_out``) into its own slice of the
  workspace, once per panel: the panel is then read as aligned, contiguous vectors.
* **Register tile** ``MR`` pixels of one output row x ``NR`` channels:
  ``repeat(MR, NR // V) * spatial(1, V)`` (lanes along the channels): per input channel and
  tap, ``MR`` broadcasts of the input (``{1to16}`` memory operands), ``NR / V`` vector loads of
  the panel and ``MR * NR / V`` FMAs.  No lane is wasted on small images (``OW`` = 7 or 14 fit
  ``MR`` = 7 or 14 exactly) and stride 2 costs nothing extra.  The reduction runs over all of
  ``C_in`` in registers: **each output element is stored exactly once and never read** (post-
  scheduling fusion splices epilogues into these stores, :mod:`taskmap.fusion`).
* **Stores**: the tile is NCHW-transposed on its way out: written to memory, transposed in
  ``TB x TB`` blocks in registers (``transpose_block``; ``TB``: ``V``, or the power of two
  covering ``MR`` when smaller) into ``[NR, MRP]`` (``MRP``: ``MR`` rounded up to whole
  blocks), then per channel ``MR`` consecutive pixels as vector stores, masked at a row's
  last partial tile — a fused epilogue is computed there, vectorized.  (Whole tiles store
  exactly ``MR`` lanes, unmasked: gcc 12 does not vectorize a masked store whose epilogue
  loads a per-channel scalar, such as a bias.)
* **Channels-last stores** (``channels_last``: a graph's epilogue permutes the output to NHWC —
  ConvNeXt's and Swin's patch-embedding stems): the tile goes out pixel by pixel straight from its
  accumulators, ``NR`` channels of a pixel as whole vectors once the permute is spliced in (no
  transposes; in NCHW each would be a channel row apart), and a tile's panels are swept one after
  the other (``by_image`` order with the panels innermost), so that each pixel's lines are written
  while they are in the core's cache, not once per panel.
* **Whole planes** (``planes``: packed panels, no reduction blocks, output rows of one tile and
  shorter than a vector — 7x7 and 14x14 images): gcc 12 stores a row's 7 pixels in pieces of 4,
  2 and 1 lanes, a fused epilogue computed in each piece (a SiLU made a 192 -> 1152 1x1 conv at
  7x7 1.6x slower).  Here a unit is a channel panel of one image, all of its rows: each row's
  transposed tile is written plainly (``MRP`` lanes, the spare ones spilling into the next row,
  written after, or the plane's slack) into the core's buffer of the panel's planes in the
  workspace, then each channel's plane is stored by one vector loop, its epilogue with it
  (that conv with SiLU: 96 -> 69 us; EfficientNet-B0 1.04x).
* **Prefetch** (``pf``: elements of the weight stream ahead, :data:`.panels.PREFETCH_BYTES`): in
  a model's flow the input was just written by the other kernels (half of it in the other core's
  caches) and the packed weights come from L3 or memory.  A tile reads the input a plane apart
  channel after channel (its row's pixels), a pattern the hardware prefetchers do not follow, and
  the panel as a stream that they drop at each 4 KiB page.  So each step of the reduction
  prefetches the rows the tile reads ``pf / (kh kw NR)`` input channels ahead (as many steps of
  the micro-kernel ahead as the weights) and the panel's lines ``pf`` elements ahead.  Measured
  with both cores' caches flushed before each call (Xeon, two cores): a 576 -> 96 1x1 conv at 14x14
  394 -> 200 us (warm: 124 -> 115); in the flow MobileNetV2 1.13x, ResNet-50 and EfficientNet-B0
  1.04x.  Where the output is larger than a core's L2 (``pf_c``: a stem's 32 or 64 planes of
  112x112), a tile also prefetches, before its reduction and for writing (``prefetchw``), the
  lines its stores will write: ``NR`` rows a plane apart, too many streams for the hardware
  prefetchers, and in the flow cold in memory — each store waited on a read for ownership.
  Measured on Zen 4 in MobileNetV2's flow (both compiled graphs in one process, per step,
  alternating): its stem 3 -> 32 at 224x224 0.82-0.87x the time (0.92x with a read prefetch),
  0.91x at batch 8; ResNet-50's 7x7 stem 0.96-0.97x; the other channel-kernel layers, whose
  outputs fit L2, unchanged.  With whole planes (``pf_next``: 1x1 layers at 7x7), the first
  :data:`PF_NEXT_ROWS` rows of a unit also prefetch the panel of the core's next unit into L2,
  a share of its lines per reduction step, so that the next unit's first row does not wait on
  it (:data:`taskmap.templates.conv_cpu.PF_NEXT_PIXELS`).
* **Groups** (``groups``; ResNeXt's 3x3 layers of 16 and 32 channels a group): ``NR`` divides a
  group's output channels, so each panel is of one group and its reduction runs over that group's
  input channels alone (``C_in / groups`` of them, from the group's first; the packed panels are
  ``[C_in / groups, kh, kw, NR]``).  Measured on Zen 4 (two cores, isolated), against the pixel
  kernel, which had all grouped layers before: ResNeXt-50's stride-2 layer at 28x28 1.82 against
  2.73 ms at batch 8, its 7x7 ones 1.35 against 1.61; in the model's flow 1.4-1.9x on those steps.
* **Cores**: ``spatial(P).parallel()`` over contiguous ranges of the ``CP x N x OH x OWT``
  tiles (channel panels outermost: a core packs a panel once and sweeps the image with it).
  With packed panels and no reduction blocks, a batch is swept **image by image** (``by_image``:
  ``N x CP x OH x OWT``): a core's images are the ones it padded, each read by every panel
  while it is in the core's caches, instead of every image once per panel.  Measured at batch 8
  (Zen 5, two cores, separate processes alternating): Inception-V3 1.05x, ResNet-50 1.02-1.04x,
  MobileNetV2 0.97-1.0x (its channel-kernel steps each faster, the whole run not); the 17x17
  1x7 layers of Inception ran at 400-500 GFLOP/s in panel order, changing from run to run, and
  at 500 image by image (onnxruntime: 490).  With at least two images a core (``pad_each``),
  each core pads the images it reaches into its own padded copy, just before their tiles, instead
  of the whole batch in a pass before: the copy is written and read in the core's caches, not
  through memory (ResNet-50's 3x3 stride-2 layer at 56x56, batch 8: 4.6 -> 4.1 ms; the whole model
  1.3-1.9% faster).
"""
from dataclasses import dataclass

import numpy as np

from ..ir.mapping import repeat, spatial
from ..lang import (
    bool_,
    f32,
    func,
    i32,
    parallel,
    prefetch,
    register_tensor,
    symbol,
    transpose_block,
    vectorize,
)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .conv_cpu_kernel import ConvKernelConfig
from .panels import row_panels


@dataclass(frozen=True)
class CvecConfig(ConvKernelConfig):
    """The channel-vectorized kernel's: ``mr`` pixels of one output row x ``nr`` output
    channels (a multiple of the lanes)."""

    kc: int = 0               # input channels per reduction block (0: all of them, no partial sums)
    prepacked: bool = False   # ``wt`` holds the packed panels (:func:`pack_weights`), not NCHW weights
    by_image: bool = False    # tiles ordered image, panel, row (prepacked, kc 0): a core's images
    pad_each: bool = False    # (by_image) each core pads the images it works on as it reaches them
    planes: bool = False      # (prepacked, kc 0, a row per tile) whole output planes per unit, see the doc
    pf: int = 0               # elements of the weight stream the micro-kernel prefetches ahead (0: none)
    pf_c: bool = False        # a tile prefetches its lines of the output, for writing (see the doc)
    channels_last: bool = False  # stores each pixel's channels together (the output read channels-last)
    groups: int = 1           # a panel's channels are of one group; its reduction, that group's input channels
    pf_next: bool = False     # (planes) the rows of a unit prefetch the panel of the core's next unit into L2

    @property
    def tb(self) -> int:
        """The side of the stores' transposed blocks: the lanes, or the power of two covering
        ``mr`` when smaller."""
        return min(self.lanes, max(4, 1 << (self.mr - 1).bit_length()))

    @property
    def mrp(self) -> int:
        """The tile's pixels rounded up to whole transposed blocks."""
        return -(-self.mr // self.tb) * self.tb

    def plane_stride(self, oh: int, ow: int) -> int:
        """Elements between two channels' planes in a core's ``planes`` buffer: the plane and the
        slack that the last row's whole-block write spills into."""
        return oh * ow + self.mrp

    @property
    def taps(self) -> int:
        return self.kh * self.kw

    def padded(self, oh: int, ow: int) -> tuple[int, int]:
        """(HP, WP): rows and columns of the zero-padded input the tiles read."""
        owt = -(-ow // self.mr)
        return ((oh - 1) * self.sh + (self.kh - 1) * self.dh + 1,
                (owt * self.mr - 1) * self.sw + (self.kw - 1) * self.dw + 1)

    def direct(self, h: int, w: int, oh: int, ow: int) -> bool:
        """True when the tiles read the input itself (no padding, whole tiles inside the image)."""
        hp, wp = self.padded(oh, ow)
        return self.pt == self.pl == 0 and wp <= w and hp <= h

    def panel(self, cin: int) -> int:
        """Elements of one packed weight panel (``C_in / groups x kh x kw x NR``)."""
        return cin // self.groups * self.taps * self.nr

    def stage(self, cin: int) -> int:
        """Elements of a core's packed block of a weight panel (``kc x kh x kw x NR``)."""
        k = cin // self.groups
        return (min(self.kc, k) if self.kc else k) * self.taps * self.nr

    def workspace(self, n: int, cin: int, oh: int, ow: int) -> int:
        """Elements: the padded input, then per core its packed block of a weight panel (unless
        the weights come packed) and, with reduction blocks, the partial sums of its tiles."""
        hp, wp = self.padded(oh, ow)
        per_core = (0 if self.prepacked else self.stage(cin)) + \
            (n * oh * -(-ow // self.mr) * self.mr * self.nr if self.kc else 0)
        images = self.cores if self.pad_each and self.by_image else n
        planes = self.cores * self.nr * self.plane_stride(oh, ow) if self.planes else 0
        return images * cin * hp * wp + self.cores * per_core + planes


#: With ``pf_next``, the first this many rows of a unit prefetch the next unit's panel (their
#: reduction steps each a share of its lines).
PF_NEXT_ROWS = 4


def pack_weights(w: np.ndarray, nr: int) -> np.ndarray:
    """NCHW weights ``(C_out, C_in / groups, kh, kw)`` as the kernel's panels: ``[C_out / NR
    (rounded up), C_in / groups, kh, kw, NR]`` flat, zeros past ``C_out`` (what ``prepacked``
    kernels take as ``wt``)."""
    return row_panels(np.asarray(w).reshape(w.shape[0], -1), nr)


def build_kernel(cfg: CvecConfig) -> Kernel:
    assert cfg.nr % cfg.lanes == 0
    MR, NR, V, P, KC, PRE = cfg.mr, cfg.nr, cfg.lanes, cfg.cores, cfg.kc, cfg.prepacked
    KH, KW, SH, SW, DH, DW, PT, PL = cfg.kh, cfg.kw, cfg.sh, cfg.sw, cfg.dh, cfg.dw, cfg.pt, cfg.pl
    TAPS = cfg.taps
    G = cfg.groups                                     # a panel's channels are of one group
    assert G == 1 or not KC, "grouped panels take no reduction blocks"
    LINE = 64 // 4
    PF = cfg.pf
    PF_X = max(1, PF // (TAPS * NR)) if PF else 0     # input channels ahead: as many steps as PF
    PF_W = PF if PRE else 0                            # a panel packed per call is in the core's caches
    SEG = (MR - 1) * SW + (KW - 1) * DW + 1            # a tile's input row segment, in elements
    SEG_LINES = -(-SEG // LINE) + 1                    # prefetches covering it wherever it starts
    BY_IMAGE = cfg.by_image and PRE and not KC
    PAD_EACH = BY_IMAGE and cfg.pad_each
    PLANES = cfg.planes and PRE and not KC and not cfg.channels_last
    PF_N = cfg.pf_next and PLANES
    PN_LINES = -(-TAPS * NR // (LINE * PF_NEXT_ROWS))   # the next panel's lines a reduction step
    NHWC = cfg.channels_last
    PF_C = cfg.pf_c and not PLANES and not NHWC     # (NHWC: prefetching a pixel's lines measured no gain)
    C_LINES = -(-MR // LINE) + 1                       # lines a tile's row of MR pixels may touch
    PAR = parallel if P > 1 else range
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    tile = repeat(MR, NR // V) * spatial(1, V)
    square = repeat(V, 1) * spatial(1, V)
    TB = cfg.tb                            # the stores' transposed blocks: TB x TB
    MRP = cfg.mrp                          # the tile's pixels padded to whole blocks
    row = spatial(MRP)                     # a channel's pixels in the transposed tile (masked)
    whole = spatial(MR)                    # ... in a whole tile
    n, cin, h, w, cout, oh, ow, wsx = (symbol(s) for s in ("n", "cin", "h", "w", "cout", "oh", "ow", "wsx"))
    X_T, C_T, XP_T = f32[n, cin, h, w], f32[n, cout, oh, ow], f32[wsx]
    # the packed panels, or the NCHW weights seen flat
    W_T = f32[(cout + NR - 1) // NR * NR * (cin // G) * TAPS] if PRE else f32[cout * (cin // G) * TAPS]
    WQ_T = W_T if PRE else XP_T            # where the micro-kernel reads the packed panel

    @func
    def pad_line(x: X_T, xp: XP_T, b: i32, ci: i32, i: i32, wp: i32, row: i32):
        """Row ``i`` of plane ``ci`` of image ``b`` zero-padded (``wp`` columns), at ``xp[row:]``."""
        jlo = min(PL, wp)
        jhi = max(min(w + PL, wp), jlo)
        if i < PT or i >= h + PT:              # rows above / below the image (see conv_cpu_kernel)
            for j in range(wp):
                xp[row + j] = 0.0
        else:
            for j in range(jlo):
                xp[row + j] = 0.0
            for j in range(jlo, jhi):
                xp[row + j] = x[b, ci, i - PT, j - PL]
            for j in range(jhi, wp):
                xp[row + j] = 0.0

    @func
    def pad_row(x: X_T, xp: XP_T, r: i32, hp: i32, wp: i32, dst: i32):
        """Row ``r`` = (b, ci, i) of the zero-padded input, written as row ``dst`` of ``xp`` (rows,
        not planes, are the parallel tasks: a 3-channel image is 3 planes for any number of cores)."""
        q = r // hp
        pad_line(x, xp, q // cin, q % cin, r % hp, wp, dst * wp)

    @func
    def pad_image(x: X_T, xp: XP_T, b: i32, hp: i32, wp: i32, dst: i32):
        """Image ``b`` zero-padded, written as image ``dst`` of ``xp``: plane by plane, row by row,
        without :func:`pad_row`'s divisions (a grouped layer's planes of 14x14 at batch 8: a fifth
        of its time went to those)."""
        for ci in range(cin):
            for i in range(hp):
                pad_line(x, xp, b, ci, i, wp, ((dst * cin + ci) * hp + i) * wp)

    @func
    def pack_panel(wt: W_T, xp: XP_T, base: i32, co0: i32, c0: i32, c1: i32):
        """Output channels ``co0 .. co0 + NR``, input channels ``c0 .. c1``, as ``[ci, kh, kw,
        NR]`` at ``xp[base:]`` (channels past C_out repeat the last one: their sums are never
        stored).  A transposition in ``V x V`` blocks, each in registers (``transpose_block``:
        ``V`` vector loads of weight rows, ``V`` vector stores of its columns); a block of
        channels that crosses C_out goes through a block in L1."""
        blk = register_tensor(f32, [V, V])
        K = cin // G * TAPS
        k0 = c0 * TAPS
        kn = (c1 - c0) * TAPS
        for sb in range(NR // V):
            if co0 + sb * V + V <= cout:
                for kb in range(kn // V):
                    transpose_block(xp[base + kb * V * NR + sb * V], wt[(co0 + sb * V) * K + k0 + kb * V], V, NR, K)
            else:
                for kb in range(kn // V):
                    for r, j in square.vectorize():
                        blk[r, j] = wt[min(co0 + sb * V + r, cout - 1) * K + k0 + kb * V + j]
                    for j, r in square.vectorize():
                        xp[base + (kb * V + j) * NR + sb * V + r] = blk[r, j]
            for k in range(kn // V * V, kn):
                for r in range(V):
                    xp[base + k * NR + sb * V + r] = wt[min(co0 + sb * V + r, cout - 1) * K + k0 + k]

    def make_micro(DIRECT: bool) -> func:
        def micro(c: C_T, x: X_T, xp: XP_T, wq: WQ_T, woff: i32, cwoff: i32, b: i32, co0: i32, ho: i32,
                  wo0: i32, hp: i32, wp: i32, c0: i32, c1: i32, first: bool_, last: bool_, bx: i32, pn: i32):
            """Output channels ``co0 ..`` x pixels ``wo0 ..`` of row ``ho`` of image ``b``, input
            channels ``c0 .. c1``: from zero (``first``) or the partial sums at ``xp[cwoff:]``, to
            ``c`` (``last``) or back there.  The input from ``x`` itself (``DIRECT``: no padding
            read) or from its padded copy (image ``bx`` of ``xp``).  ``PLANES``: the tile is the
            whole row ``ho``, written (``MRP`` pixels, plainly) into the planes at ``xp[cwoff:]``.
            Grouped (``G``): input channel ``ci`` of the reduction is ``ci`` of the panel's group.
            ``pn`` >= 0 (``PF_N``): each reduction step prefetches ``PN_LINES`` lines of the next
            unit's panel from ``wq[pn:]`` into L2."""
            acc = register_tensor(f32, [MR, NR])
            plane = hp * wp
            if G > 1:
                cg = co0 // (cout // G) * (cin // G)     # the group's first input channel
                x0 = (bx * cin + cg) * plane + ho * SH * wp + wo0 * SW
            else:
                cg = 0
                x0 = bx * cin * plane + ho * SH * wp + wo0 * SW
            if PF_C and last:    # before the reduction: the lines arrive while it runs
                for s in range(NR):
                    for q in range(C_LINES):
                        prefetch(c[b, co0 + s, ho, wo0 + min(q * LINE, MR - 1)], write=True)
            if first:
                for r, s in tile.vectorize():
                    acc[r, s] = 0.0
            else:
                for r, s in tile.vectorize():
                    acc[r, s] = xp[cwoff + r * NR + s]
            for ci in range(c0, c1):
                if PF_N:
                    if pn >= 0:
                        for q in range(PN_LINES):
                            prefetch(wq[pn + ((ci - c0) * PN_LINES + q) * LINE], level=2)
                if PF_X:
                    for kh in range(KH):
                        for q in range(SEG_LINES):
                            if DIRECT:
                                prefetch(x[b, cg + ci + PF_X, ho * SH + kh * DH, wo0 * SW + min(q * LINE, SEG - 1)])
                            else:
                                prefetch(xp[x0 + (ci + PF_X) * plane + kh * DH * wp + min(q * LINE, SEG - 1)])
                for kh in range(KH):
                    for kw in range(KW):
                        if PF_W:
                            for q in range(NR // LINE):
                                prefetch(wq[woff + (((ci - c0) * KH + kh) * KW + kw) * NR + PF_W + q * LINE])
                        if DIRECT:
                            for r, s in tile.vectorize():
                                acc[r, s] += x[b, cg + ci, ho * SH + kh * DH, wo0 * SW + kw * DW + r * SW] * \
                                    wq[woff + (((ci - c0) * KH + kh) * KW + kw) * NR + s]
                        else:
                            for r, s in tile.vectorize():
                                acc[r, s] += xp[x0 + ci * plane + kh * DH * wp + kw * DW + r * SW] * \
                                    wq[woff + (((ci - c0) * KH + kh) * KW + kw) * NR + s]
            if last and NHWC:    # pixel by pixel: a pixel's channels contiguous once permuted
                if wo0 + MR <= ow and co0 + NR <= cout:
                    for r, s in tile.vectorize():
                        c[b, co0 + s, ho, wo0 + r] = acc[r, s]
                else:
                    for r in range(MR):
                        if wo0 + r < ow:
                            for s in range(NR):
                                if co0 + s < cout:
                                    c[b, co0 + s, ho, wo0 + r] = acc[r, s]
            elif last:
                out = register_tensor(f32, [MRP, NR])     # rows past MR: never stored
                outT = register_tensor(f32, [NR, MRP])
                for r, s in tile.vectorize():
                    out[r, s] = acc[r, s]
                for rb in range(MRP // TB):
                    for sb in range(NR // TB):
                        transpose_block(outT[sb * TB, rb * TB], out[rb * TB, sb * TB], TB, MRP, NR)
                if PLANES:               # row ho of each channel's plane; the spare lanes spill
                    for s in range(NR):  # into the next row (written after) or the slack
                        for r in row.vectorize():
                            xp[cwoff + s * (oh * ow + MRP) + ho * ow + r] = outT[s, r]
                elif wo0 + MR <= ow:     # a whole tile: unmasked
                    for s in range(NR):
                        if co0 + s < cout:
                            for r in whole.vectorize():
                                c[b, co0 + s, ho, wo0 + r] = outT[s, r]
                else:
                    for s in range(NR):
                        if co0 + s < cout:
                            for r in row.vectorize():
                                if r < MR and wo0 + r < ow:
                                    c[b, co0 + s, ho, wo0 + r] = outT[s, r]
            else:
                for r, s in tile.vectorize():
                    xp[cwoff + r * NR + s] = acc[r, s]
        micro.__name__ = "micro_x" if DIRECT else "micro_xp"
        return func(micro)

    micro_x, micro_xp = make_micro(True), make_micro(False)

    @func
    def store_planes(c: C_T, xp: XP_T, pb: i32, b: i32, co0: i32):
        """Channels ``co0 ..`` of image ``b`` from the planes at ``xp[pb:]``: each plane one
        vector loop (a fused epilogue computed there, in whole vectors)."""
        for s in range(NR):
            if co0 + s < cout:
                for q in vectorize(oh * ow):
                    c[b, co0 + s, q // ow, q % ow] = xp[pb + s * (oh * ow + MRP) + q]

    @kernel
    def conv_cpu_cvec(x: X_T, wt: W_T, c: C_T, xp: XP_T):
        OWT = (ow + MR - 1) // MR
        WP = OWT * MR * SW - SW + (KW - 1) * DW + 1
        HP = oh * SH - SH + (KH - 1) * DH + 1
        # no padding and every tile's reads inside the image: the tiles read x itself
        direct = (OWT * MR - 1) * SW + (KW - 1) * DW < w and HP <= h and PT + PL == 0
        if not direct and not PAD_EACH:
            for r in PAR(n * cin * HP):
                pad_row(x, xp, r, HP, WP, r)
        PU = n * oh * OWT                      # tiles per channel panel
        CP = (cout + NR - 1) // NR
        # units: tiles, or with PLANES (image, panel) pairs, each all of a panel's rows
        units = n * CP if PLANES else CP * PU
        CG = cin // G                          # a panel's reduction: its group's input channels
        PANEL = CG * TAPS * NR
        KB = (CG + KC - 1) // KC if KC else 1
        BLOCK = KC if KC else CG
        STAGE = (min(KC, CG) if KC else CG) * TAPS * NR      # a core's packed block of a panel
        for p in CORES:
            u0 = p * units // P
            u1 = (p + 1) * units // P
            if PLANES:
                pb = (P if PAD_EACH else n) * cin * HP * WP + p * NR * (oh * ow + MRP)
                for u in range(u0, u1):
                    b = u // CP if BY_IMAGE else u % n
                    i = u % CP if BY_IMAGE else u // n
                    if PAD_EACH and not direct and (u == u0 or u % CP == 0):    # as it is reached
                        pad_image(x, xp, b, HP, WP, p)
                    inext = (u + 1) % CP if BY_IMAGE else (u + 1) // n
                    pn0 = inext * PANEL if PF_N and u + 1 < u1 and inext != i else -1
                    for ho in range(oh):
                        pn = pn0 + ho * CG * PN_LINES * LINE if pn0 >= 0 and ho < PF_NEXT_ROWS else -1
                        if direct:
                            micro_x(c, x, xp, wt, i * PANEL, pb, b, i * NR, ho, 0, HP, WP, 0, CG, True, True, b, pn)
                        else:
                            micro_xp(c, x, xp, wt, i * PANEL, pb, b, i * NR, ho, 0, HP, WP, 0, CG, True, True,
                                     p if PAD_EACH else b, pn)
                    store_planes(c, xp, pb, b, i * NR)
            elif BY_IMAGE:
                PI = oh * OWT                  # tiles of a panel in one image
                for u in range(u0, u1):
                    b = u // (CP * PI)
                    if NHWC:                   # a tile's panels in turn: each pixel's lines written at once
                        i = u % CP
                        v = u // CP % PI
                    else:
                        i = u // PI % CP
                        v = u % PI
                    if direct:
                        micro_x(c, x, xp, wt, i * PANEL, 0, b, i * NR, v // OWT, v % OWT * MR, HP, WP, 0, CG,
                                True, True, b, -1)
                    elif PAD_EACH:             # this core's copy of image b, padded as it is reached
                        if u == u0 or u % (CP * PI) == 0:
                            pad_image(x, xp, b, HP, WP, p)
                        micro_xp(c, x, xp, wt, i * PANEL, 0, b, i * NR, v // OWT, v % OWT * MR, HP, WP, 0, CG,
                                 True, True, p, -1)
                    else:
                        micro_xp(c, x, xp, wt, i * PANEL, 0, b, i * NR, v // OWT, v % OWT * MR, HP, WP, 0, CG,
                                 True, True, b, -1)
            wb = n * cin * HP * WP + p * (0 if PRE else STAGE)
            cwb = n * cin * HP * WP + P * (0 if PRE else STAGE) + p * PU * MR * NR
            if u1 > u0 and not BY_IMAGE and not PLANES:
                for i in range(u0 // PU, (u1 - 1) // PU + 1):
                    lo = max(u0, i * PU)
                    hi = min(u1, i * PU + PU)
                    for kb in range(KB):
                        k0 = kb * BLOCK
                        k1 = min(k0 + BLOCK, CG)
                        if not PRE:
                            pack_panel(wt, xp, wb, i * NR, k0, k1)
                        for u in range(lo, hi):
                            v = u - i * PU
                            if direct:
                                micro_x(c, x, xp, wt if PRE else xp, i * PANEL + k0 * TAPS * NR if PRE else wb,
                                        cwb + (u - lo) * MR * NR, v // (oh * OWT), i * NR, v // OWT % oh,
                                        v % OWT * MR, HP, WP, k0, k1, kb == 0, kb == KB - 1, 0, -1)
                            else:
                                micro_xp(c, x, xp, wt if PRE else xp, i * PANEL + k0 * TAPS * NR if PRE else wb,
                                         cwb + (u - lo) * MR * NR, v // (oh * OWT), i * NR, v // OWT % oh,
                                         v % OWT * MR, HP, WP, k0, k1, kb == 0, kb == KB - 1,
                                         v // (oh * OWT), -1)

    return conv_cpu_cvec


__all__ = ["CvecConfig", "build_kernel", "pack_weights"]
