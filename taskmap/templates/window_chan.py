"""The CPU f32 depthwise-convolution kernel with the **channels in the vector lanes**, written in
the DSL with task mappings; NCHW in, NCHW out.

The window template's row kernel (:func:`.window_kernels.cpu_window`) puts an output row's pixels
in the lanes and stages each plane on its own: a 7-pixel row fills 7 of 8 or 16 lanes, on a 7x7
plane the staging and the per-plane set-up cost more than the taps (EfficientNet-B0's 1152
channels 5x5 at 7x7: 84 us alone, onnxruntime's NCHWc kernel 40 us in the flow), and a 7x7
window's 49 weights do not stay in registers (a broadcast load with each FMA).  Here a unit is
``V`` channels of one image and a band of its output rows (``spatial(V)``: the lanes), so no lane
idles and every tap is one vector FMA for ``V`` outputs:

* **Bands**: a plane's output rows in bands of ``band`` rows (:attr:`ChanConfig.band`: as many as
  keep the unit's staging within :data:`CHAN_STACK_BYTES` on the core's stack, evened out); the
  input rows a band's windows cover are staged for it (neighbouring bands' overlap twice).
* **Staging**: the band's ``V`` planes transposed in ``V x V`` blocks in registers
  (``transpose_block``) into a zero-padded frame ``xt[HP * WP][V]`` (channels innermost: a
  pixel's ``V`` channels are one vector) — each input row's blocks straight into its frame row,
  the last one overlapping (:attr:`ChanConfig.direct`: rows of at least a block that the frame
  holds whole), or else the band's pixels into a pixel-major ``xu[pixel][V]`` and copied from
  there; the weights likewise into ``wv[taps][V]`` and the biases into a vector, once.  Pixels
  short of a block, the taps short of one and the last block of channels when ``C`` is not a
  multiple of ``V`` go lane by lane (channels past ``C`` repeat the last one: never stored).
* **Taps**: per output row and segment of at most :data:`TILE_REGISTERS` pixels (the last one
  overlapping), a register tile of ``seg`` pixels x ``V`` channels (``repeat(seg) * spatial(V)``):
  per tap one vector load of the weights and ``seg`` FMAs with the frame's vectors as memory
  operands.  The bias starts the sums.
* **Stores**: each row's tiles go pixel-major into ``pt[pixel][V]``, transposed in ``V x V``
  blocks in registers (``transpose_block``) into ``ot[V][pixels]``; then each channel's rows are
  stored by one vector loop — each output element stored exactly once and never read, so
  post-scheduling fusion splices an epilogue (a BatchNorm's scale, an activation, a residual)
  into these stores (:mod:`taskmap.fusion`).  With ``channels_last`` (the graph's epilogue
  permutes the output to NHWC, ConvNeXt) ``pt`` is stored pixel by pixel instead, a vector of
  channels each: the permuted stores are then whole vectors, and no transposes.
* **Cores**: ``parallel`` over the ``N x ceil(C / V) x bands`` units.

The sizes are constants (the window template's problems are static).  Taken by the window
template's cost model (:class:`.window.WindowTemplate`) where it ranks below the row and plane
kernels: windows of 5x5 and more, strided layers to small planes.
"""
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, parallel, register_tensor, transpose_block, vectorize
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel

#: Bytes of a unit's staging on a core's stack (frame, pixel-major outputs, transposed outputs,
#: weights) the kernel may take; a plane whose staging exceeds it runs in bands of output rows.
CHAN_STACK_BYTES = 128 * 1024
#: Vector registers of the register tile (a segment of a row's pixels: ``acc`` plus the weight
#: vector and one spare) with 16 lanes (AVX-512's 32 registers) and with 8 (AVX2's 16).
TILE_REGISTERS = {16: 30, 8: 14}


@dataclass(frozen=True)
class ChanConfig:
    """A depthwise convolution's static shape and window, the lanes and the cores."""

    n: int
    c: int
    h: int
    w: int
    oh: int
    ow: int
    kh: int
    kw: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int
    bias: bool
    lanes: int
    cores: int
    channels_last: bool = False           # stores a pixel's channels together (the output read channels-last)

    @property
    def frame(self) -> tuple[int, int]:
        """(HP, WP): the padded rows and columns a band's taps read."""
        return self._frame_rows(self.band), self._frame_cols

    def _frame_rows(self, rows: int) -> int:
        return (rows - 1) * self.sh + (self.kh - 1) * self.dh + 1

    @property
    def _frame_cols(self) -> int:
        return (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1

    @property
    def direct(self) -> bool:
        """Whether whole input rows are transposed straight into the frame (rows of at least a
        block, the frame holding them whole); else through a pixel-major copy of the band."""
        return self.w >= self.lanes and self.pw + self.w <= self._frame_cols

    @property
    def seg(self) -> int:
        """Pixels of a register tile: a row, or segments of it (the last one overlapping)."""
        most = TILE_REGISTERS.get(self.lanes, 14)
        return -(-self.ow // -(-self.ow // most))

    def _stack(self, rows: int) -> int:
        hp, wp = self._frame_rows(rows), self._frame_cols
        staged = 0 if self.direct else -(-min(hp, self.h) * self.w // self.lanes) * self.lanes
        pixels = -(-rows * self.ow // self.lanes) * self.lanes
        return 4 * self.lanes * (staged + hp * wp + (1 if self.channels_last else 2) * pixels + self.kh * self.kw)

    @property
    def band(self) -> int:
        """Output rows a unit computes: the plane's, or as many as the stack budget holds, evened
        out over the bands."""
        rows = self.oh
        while rows > 1 and self._stack(rows) > CHAN_STACK_BYTES:
            rows -= 1
        return -(-self.oh // -(-self.oh // rows))

    @property
    def bands(self) -> int:
        return -(-self.oh // self.band)

    @property
    def pixels(self) -> int:
        """A band's output pixels rounded up to whole transposed blocks."""
        return -(-self.band * self.ow // self.lanes) * self.lanes

    @property
    def stack_bytes(self) -> int:
        return self._stack(self.band)

    @property
    def units(self) -> int:
        return self.n * -(-self.c // self.lanes) * self.bands


def fits(cfg: ChanConfig) -> bool:
    """Whether the kernel serves ``cfg``: a band of one output row within :data:`CHAN_STACK_BYTES`."""
    return cfg._stack(1) <= CHAN_STACK_BYTES


def build_kernel(cfg: ChanConfig) -> Kernel:
    assert fits(cfg), cfg
    N, C, H, W, OH, OW = cfg.n, cfg.c, cfg.h, cfg.w, cfg.oh, cfg.ow
    KH, KW, SH, SW, PT, PL, DH, DW = cfg.kh, cfg.kw, cfg.sh, cfg.sw, cfg.ph, cfg.pw, cfg.dh, cfg.dw
    V, P, BIAS, DIRECT, NHWC = cfg.lanes, cfg.cores, cfg.bias, cfg.direct, cfg.channels_last
    TAPS = KH * KW
    HP, WP = cfg.frame                    # a band's frame
    RB, NB = cfg.band, cfg.bands          # output rows a band, bands a plane
    SEG = cfg.seg
    NSEG = -(-OW // SEG)
    OP = cfg.pixels                       # a band's outputs, in whole V x V blocks
    HW = H * W
    CW = min(W, WP - PL)                  # input columns the frame holds
    IP = 1 if DIRECT else -(-min(HP, H) * W // V) * V     # ... a band's staged input pixels
    CB = -(-C // V)
    UNITS = N * CB * NB
    PAR = parallel if P > 1 else range
    lanes = spatial(V)
    taps = repeat(TAPS, 1) * spatial(1, V)
    tile = repeat(SEG, 1) * spatial(1, V)
    X_T, W_T, Y_T = f32[N, C, H, W], f32[C, TAPS], f32[N, C, OH, OW]
    B_T = f32[C] if BIAS else W_T         # without a bias the weights stand in (never read as one)

    @func
    def unit(x: X_T, wt: W_T, bias: B_T, y: Y_T, u: i32):
        """Channels ``c0 .. c0 + V`` of image ``b``, output rows ``r0 .. r0 + nr``: stage, taps,
        transposed stores."""
        b = u // (CB * NB)
        c0 = u // NB % CB * V
        r0 = u % NB * RB
        nr = min(RB, OH - r0)
        g0 = r0 * SH - PT                 # the input row of the frame's first row
        i0 = max(g0, 0)
        i1 = min(g0 + HP, H)              # input rows i0 .. i1 staged
        xu = register_tensor(f32, [IP * V])
        xt = register_tensor(f32, [HP * WP * V])
        wv = register_tensor(f32, [TAPS * V])
        pt = register_tensor(f32, [OP * V])
        ot = register_tensor(f32, [1 if NHWC else V * OP])
        bv = register_tensor(f32, [V])    # the unit's biases, once (clamped reads are gathers)
        for fr in range(HP):              # the frame's padding: rows outside the image, columns beside it
            if g0 + fr < 0 or g0 + fr >= H:
                for j in range(WP):
                    for l in lanes.vectorize():
                        xt[(fr * WP + j) * V + l] = 0.0
            else:
                for j in range(PL):
                    for l in lanes.vectorize():
                        xt[(fr * WP + j) * V + l] = 0.0
                for j in range(PL + CW, WP):
                    for l in lanes.vectorize():
                        xt[(fr * WP + j) * V + l] = 0.0
        if c0 + V <= C:                   # whole blocks: V x V transposes (the tails: V loads each)
            if DIRECT:                    # each input row's blocks into its frame row (the last overlapping)
                for i in range(i0, i1):
                    for jb in range(W // V):
                        transpose_block(xt[((i - g0) * WP + PL + jb * V) * V], x[b, c0, i, jb * V], V, V, HW)
                    if W % V != 0:
                        transpose_block(xt[((i - g0) * WP + PL + W - V) * V], x[b, c0, i, W - V], V, V, HW)
            else:                         # the band's pixels pixel-major, then into the frame
                for pb in range((i1 - i0) * W // V):
                    transpose_block(xu[pb * V * V], x[b, c0, i0 + pb * V // W, pb * V % W], V, V, HW)
                for q in range((i1 - i0) * W // V * V, (i1 - i0) * W):
                    for l in lanes.vectorize():
                        xu[q * V + l] = x[b, c0 + l, i0 + q // W, q % W]
                for i in range(i0, i1):
                    for j in range(CW):
                        for l in lanes.vectorize():
                            xt[((i - g0) * WP + j + PL) * V + l] = xu[((i - i0) * W + j) * V + l]
            for tb in range(TAPS // V):
                transpose_block(wv[tb * V * V], wt[c0, tb * V], V, V, TAPS)
            for t in range(TAPS // V * V, TAPS):
                for l in lanes.vectorize():
                    wv[t * V + l] = wt[c0 + l, t]
        else:                             # the last, partial block of channels
            for i in range(i0, i1):
                for j in range(CW):
                    for l in lanes.vectorize():
                        xt[((i - g0) * WP + j + PL) * V + l] = x[b, min(c0 + l, C - 1), i, j]
            for t, l in taps.vectorize():
                wv[t * V + l] = wt[min(c0 + l, C - 1), t]
        for l in lanes.vectorize():
            bv[l] = bias[min(c0 + l, C - 1)] if BIAS else 0.0
        acc = register_tensor(f32, [SEG, V])
        for r in range(nr):
            for sg in range(NSEG):
                s0 = min(sg * SEG, OW - SEG)
                for s, l in tile.vectorize():
                    acc[s, l] = bv[l]
                for kh in range(KH):
                    for kw in range(KW):
                        for s, l in tile.vectorize():
                            acc[s, l] += (xt[((r * SH + kh * DH) * WP + (s0 + s) * SW + kw * DW) * V + l]
                                          * wv[(kh * KW + kw) * V + l])
                for s, l in tile.vectorize():
                    pt[(r * OW + s0 + s) * V + l] = acc[s, l]
        if NHWC:                          # pixel by pixel, a vector of channels each
            if c0 + V <= C:
                for q in range(nr * OW):
                    for l in lanes.vectorize():
                        y[b, c0 + l, r0 + q // OW, q % OW] = pt[q * V + l]
            else:
                for q in range(nr * OW):
                    for l in range(C - c0):
                        y[b, c0 + l, r0 + q // OW, q % OW] = pt[q * V + l]
        else:                             # channel by channel, transposed in V x V blocks
            for qb in range(-(-(nr * OW) // V)):
                transpose_block(ot[qb * V], pt[qb * V * V], V, OP, V)
            for l in range(min(V, C - c0)):
                if NB == 1:
                    for q in vectorize(OH * OW):
                        y[b, c0 + l, q // OW, q % OW] = ot[l * OP + q]
                else:
                    for r in range(nr):
                        for q in vectorize(OW):
                            y[b, c0 + l, r0 + r, q] = ot[l * OP + r * OW + q]

    def with_bias(x: X_T, w: W_T, bias: B_T, y: Y_T):
        for u in PAR(UNITS):
            unit(x, w, bias, y, u)

    def without_bias(x: X_T, w: W_T, y: Y_T):
        for u in PAR(UNITS):
            unit(x, w, w, y, u)

    entry = with_bias if BIAS else without_bias
    entry.__name__ = "depthwise_conv2d_cpu_chan" + ("_nhwc" if NHWC else "") + ("" if BIAS else "_nobias")
    return kernel(entry)


__all__ = ["CHAN_STACK_BYTES", "TILE_REGISTERS", "ChanConfig", "build_kernel", "fits"]
