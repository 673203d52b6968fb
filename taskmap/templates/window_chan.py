"""The CPU f32 depthwise-convolution kernel with the **channels in the vector lanes**, for small
planes (7x7, 14x14), written in the DSL with task mappings; NCHW in, NCHW out.

The window template's row kernel (:func:`.window_kernels.cpu_window`) puts an output row's pixels
in the lanes and stages each plane on its own: a 7-pixel row fills 7 of 8 or 16 lanes, and on a
7x7 plane the staging and the per-plane set-up cost more than the taps (EfficientNet-B0's 1152
channels 5x5 at 7x7: 84 us alone, onnxruntime's NCHWc kernel 40 us in the flow).  Here a unit is
``V`` channels of one image (``spatial(V)``: the lanes), so no lane idles and every tap is one
vector FMA for ``V`` outputs:

* **Staging**: the unit's ``V`` planes transposed in ``V x V`` blocks in registers
  (``transpose_block``) to pixel-major ``xu[pixel][V]``, then copied, a vector a pixel, into a
  zero-padded frame ``xt[HP * WP][V]`` on the core's stack (channels innermost: a pixel's ``V``
  channels are one vector); the weights likewise into ``wv[taps][V]``.  A plane's last pixels
  short of a block, the taps short of one and the last block of channels when ``C`` is not a
  multiple of ``V`` go lane by lane (channels past ``C`` repeat the last one: never stored).
* **Taps**: per output row, a register tile of the row's ``OW`` pixels x ``V`` channels
  (``repeat(OW) * spatial(V)``): per tap one vector load of the weights and ``OW`` FMAs with
  the frame's vectors as memory operands.  The bias starts the sums.
* **Stores**: each row's tile goes pixel-major into ``pt[pixel][V]``, transposed in ``V x V``
  blocks in registers (``transpose_block``) into ``ot[V][pixels]``; then each channel's plane is
  stored by one vector loop — each output element stored exactly once and never read, so
  post-scheduling fusion splices an epilogue (a BatchNorm's scale, an activation, a residual)
  into these stores (:mod:`taskmap.fusion`).
* **Cores**: ``parallel`` over the ``N x ceil(C / V)`` units.

The sizes are constants (the window template's problems are static).  Taken by the window
template's cost model (:class:`.window.WindowTemplate`) where it ranks below the row kernel:
planes whose frame, output and transposed copy fit :data:`CHAN_STACK_BYTES`.
"""
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, parallel, register_tensor, transpose_block, vectorize
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel

#: Bytes of a unit's staging on a core's stack (frame, pixel-major outputs, transposed outputs,
#: weights) the kernel may take: 7x7 and 14x14 planes with windows up to 5x5 fit.
CHAN_STACK_BYTES = 96 * 1024


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

    @property
    def frame(self) -> tuple[int, int]:
        """(HP, WP): the padded rows and columns the taps read."""
        return (self.oh - 1) * self.sh + (self.kh - 1) * self.dh + 1, (self.ow - 1) * self.sw + (self.kw - 1) * self.dw + 1

    @property
    def pixels(self) -> int:
        """Output pixels of a plane rounded up to whole transposed blocks."""
        return -(-self.oh * self.ow // self.lanes) * self.lanes

    @property
    def stack_bytes(self) -> int:
        hp, wp = self.frame
        inputs = -(-self.h * self.w // self.lanes) * self.lanes
        return 4 * self.lanes * (inputs + hp * wp + 2 * self.pixels + self.kh * self.kw)

    @property
    def units(self) -> int:
        return self.n * -(-self.c // self.lanes)


def fits(cfg: ChanConfig) -> bool:
    """Whether the kernel serves ``cfg``: rows short enough for a register tile (``OW``
    accumulators and the weight vector), staging within :data:`CHAN_STACK_BYTES`."""
    return cfg.ow + 2 <= 32 and cfg.stack_bytes <= CHAN_STACK_BYTES


def build_kernel(cfg: ChanConfig) -> Kernel:
    assert fits(cfg), cfg
    N, C, H, W, OH, OW = cfg.n, cfg.c, cfg.h, cfg.w, cfg.oh, cfg.ow
    KH, KW, SH, SW, PT, PL, DH, DW = cfg.kh, cfg.kw, cfg.sh, cfg.sw, cfg.ph, cfg.pw, cfg.dh, cfg.dw
    V, P, BIAS = cfg.lanes, cfg.cores, cfg.bias
    TAPS = KH * KW
    HP, WP = cfg.frame
    OP = cfg.pixels                       # a plane's outputs, in whole V x V blocks
    HW = H * W
    IP = -(-HW // V) * V                  # ... its input pixels
    CB = -(-C // V)
    UNITS = N * CB
    PAR = parallel if P > 1 else range
    lanes = spatial(V)
    frame = repeat(HP * WP, 1) * spatial(1, V)
    taps = repeat(TAPS, 1) * spatial(1, V)
    tile = repeat(OW, 1) * spatial(1, V)
    X_T, W_T, Y_T = f32[N, C, H, W], f32[C, TAPS], f32[N, C, OH, OW]
    B_T = f32[C] if BIAS else W_T         # without a bias the weights stand in (never read as one)

    @func
    def unit(x: X_T, wt: W_T, bias: B_T, y: Y_T, u: i32):
        """Channels ``c0 .. c0 + V`` of image ``b``: stage, taps, transposed stores."""
        b = u // CB
        c0 = u % CB * V
        xu = register_tensor(f32, [IP * V])
        xt = register_tensor(f32, [HP * WP * V])
        wv = register_tensor(f32, [TAPS * V])
        pt = register_tensor(f32, [OP * V])
        ot = register_tensor(f32, [V * OP])
        if c0 + V <= C:                   # whole blocks: V x V transposes (the tails: V loads each)
            for pb in range(HW // V):
                transpose_block(xu[pb * V * V], x[b, c0, pb * V // W, pb * V % W], V, V, HW)
            for q in range(HW // V * V, HW):
                for l in lanes.vectorize():
                    xu[q * V + l] = x[b, c0 + l, q // W, q % W]
            for tb in range(TAPS // V):
                transpose_block(wv[tb * V * V], wt[c0, tb * V], V, V, TAPS)
            for t in range(TAPS // V * V, TAPS):
                for l in lanes.vectorize():
                    wv[t * V + l] = wt[c0 + l, t]
        else:                             # the last, partial block of channels
            for q in range(HW):
                for l in lanes.vectorize():
                    xu[q * V + l] = x[b, min(c0 + l, C - 1), q // W, q % W]
            for t, l in taps.vectorize():
                wv[t * V + l] = wt[min(c0 + l, C - 1), t]
        for q, l in frame.vectorize():
            xt[q * V + l] = 0.0
        for i in range(min(H, HP - PT)):
            for j in range(min(W, WP - PL)):
                for l in lanes.vectorize():
                    xt[((i + PT) * WP + j + PL) * V + l] = xu[(i * W + j) * V + l]
        acc = register_tensor(f32, [OW, V])
        for r in range(OH):
            for s, l in tile.vectorize():
                acc[s, l] = bias[min(c0 + l, C - 1)] if BIAS else 0.0
            for kh in range(KH):
                for kw in range(KW):
                    for s, l in tile.vectorize():
                        acc[s, l] += xt[((r * SH + kh * DH) * WP + s * SW + kw * DW) * V + l] * wv[(kh * KW + kw) * V + l]
            for s, l in tile.vectorize():
                pt[(r * OW + s) * V + l] = acc[s, l]
        for qb in range(OP // V):
            transpose_block(ot[qb * V], pt[qb * V * V], V, OP, V)
        for l in range(min(V, C - c0)):
            for q in vectorize(OH * OW):
                y[b, c0 + l, q // OW, q % OW] = ot[l * OP + q]

    if BIAS:
        @kernel
        def depthwise_conv2d_cpu_chan(x: X_T, w: W_T, bias: B_T, y: Y_T):
            for u in PAR(UNITS):
                unit(x, w, bias, y, u)
        return depthwise_conv2d_cpu_chan

    @kernel
    def depthwise_conv2d_cpu_chan_nobias(x: X_T, w: W_T, y: Y_T):
        for u in PAR(UNITS):
            unit(x, w, w, y, u)
    return depthwise_conv2d_cpu_chan_nobias


__all__ = ["CHAN_STACK_BYTES", "ChanConfig", "build_kernel", "fits"]
