"""The CPU f32 depthwise-convolution kernel with a **whole plane in the vector lanes**, for small
planes (7x7, 10x10) at stride 1 whose output is the input's size; NCHW in, NCHW out.

A channel's plane, flattened (``q = row * W + column``), is ``ceil(H*W / V)`` vectors; the output
plane is the same vectors, so a tap ``(i, j)`` of every output is one unaligned vector load of the
input shifted by ``(i*dh - ph) * W + j*dw - pw`` and one FMA with the tap's weight, broadcast.
No transposes (the channel-lane kernel, :mod:`.window_chan`, moves every element through two)
and no lane idles but the last vector's (a 7x7 plane: 49 of 64 lanes; the row kernel fills 7 of
16).  A shifted load reads across the plane's edges, which the staging handles:

* **Rows**: the plane is staged (a vector copy) between zeros, ``FRONT`` before and ``BACK``
  after, so a lane whose tap falls above or below the image reads a zero.
* **Columns**: a lane whose tap falls left or right of the image would read the neighbouring
  row's last or first pixels.  The staging makes one copy per tap column ``j``, with the input
  columns that copy's shift never reads legitimately zeroed: an AND with a table of bit masks
  built once per core (not a product, an infinity times zero being NaN; not a ``select``, which
  gcc makes a masked gather of the input); every tap of column ``j`` reads copy ``j``.
* **Pipelining**: the taps' loads span two staging stores, which cannot be forwarded from the
  store queue; so a core stages the next channel before the taps of this one (two sets of
  copies, alternating), and the loads find the stores drained.  The loop takes two planes a step,
  one from each set, so that every load's offset is a constant (with the set as a run-time index
  gcc kept each tap's address in a stack slot: 1.5x slower).  On one core the core index is
  ``opaque``: with it a constant, gcc forwarded the staged values into the taps' shifted loads
  as 64-bit scalar shifts and ORs (960 channels at 7x7 on one Zen 4 core: 69 -> 21 us).

Per channel: ``KW`` staged copies of the plane (``KW * vectors`` ANDs), ``KH * KW * vectors``
FMAs with memory operands into ``vectors`` accumulators held in registers (``repeat(vectors) *
spatial(V)``), the bias starting the sums, then the plane stored from the registers, its whole
vectors and then its last lanes one by one (a vector loop over ``H * W`` made gcc keep the
accumulators in memory and copy them out with ``memcpy``) — each output element stored exactly
once and never read, so post-scheduling fusion splices an epilogue into these stores
(:mod:`taskmap.fusion`).  Cores take contiguous ranges of the ``N * C`` planes.
Taken by the window template's cost model (:class:`.window.WindowTemplate`) where it ranks first.
"""
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import bitcast, f32, func, i32, opaque, register_tensor, select, unroll, vectorize
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel

#: Vector registers a plane's kernel keeps besides its accumulators (the weight's broadcast, spare).
SPARE_REGISTERS = 3
#: The most vectors of a plane the kernel takes.  Measured on Zen 4 (two cores, isolated, against
#: the window template's other kernels): at 7x7 (4 vectors of 16, 7 of 8) it is 1.3-2x faster than
#: the best of them; at 14x14 (13 of 16, 25 of 8) the row kernel won 4 layers of 5, by up to 1.25x.
MAX_PLANE_VECTORS = 12


@dataclass(frozen=True)
class PlaneConfig:
    """A stride-1, same-size depthwise convolution's static shape and window, the lanes and the cores."""

    n: int
    c: int
    h: int
    w: int
    kh: int
    kw: int
    ph: int
    pw: int
    dh: int
    dw: int
    bias: bool
    lanes: int
    cores: int
    registers: int = 32

    @property
    def vectors(self) -> int:
        return -(-self.h * self.w // self.lanes)

    def shift(self, i: int, j: int) -> int:
        """The flat offset tap ``(i, j)`` reads at from its output."""
        return (i * self.dh - self.ph) * self.w + j * self.dw - self.pw

    @property
    def front(self) -> int:
        """Zeros staged before a plane: the lowest shift's reach, in whole vectors."""
        low = max(0, -min(self.shift(i, j) for i in range(self.kh) for j in range(self.kw)))
        return -(-low // self.lanes) * self.lanes

    @property
    def copy(self) -> int:
        """Floats of one staged copy: front zeros, the plane, the highest shift's reach past the last vector."""
        high = max(0, max(self.shift(i, j) for i in range(self.kh) for j in range(self.kw)))
        return -(-(self.front + self.vectors * self.lanes + high) // self.lanes) * self.lanes


def fits(cfg: PlaneConfig) -> bool:
    """Whether the kernel serves ``cfg``: a plane of at most :data:`MAX_PLANE_VECTORS` vectors whose
    accumulators fit the vector registers (:data:`SPARE_REGISTERS` aside), padded to keep the
    image's size (stride 1), a window no wider than the image (each copy zeroes the columns one
    shift never reads)."""
    reach_w, reach_h = (cfg.kw - 1) * cfg.dw, (cfg.kh - 1) * cfg.dh
    return (cfg.vectors <= MAX_PLANE_VECTORS and cfg.vectors + SPARE_REGISTERS <= cfg.registers
            and reach_w == cfg.pw * 2 and reach_h == cfg.ph * 2
            and cfg.pw < cfg.w and cfg.ph < cfg.h)


def build_kernel(cfg: PlaneConfig) -> Kernel:
    assert fits(cfg), cfg
    N, C, H, W, KH, KW, PT, PL, DH, DW = cfg.n, cfg.c, cfg.h, cfg.w, cfg.kh, cfg.kw, cfg.ph, cfg.pw, cfg.dh, cfg.dw
    V, P, BIAS = cfg.lanes, cfg.cores, cfg.bias
    TAPS, HW, NV, FRONT, COPY = KH * KW, H * W, cfg.vectors, cfg.front, cfg.copy
    SET = KW * COPY                       # one channel's copies
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    plane = repeat(NV, 1) * spatial(1, V)
    whole = repeat(HW // V, 1) * spatial(1, V) if HW >= V else None    # (a plane under a vector: none)
    X_T, W_T, Y_T = f32[N, C, H, W], f32[C, TAPS], f32[N, C, H, W]
    B_T = f32[C] if BIAS else W_T         # without a bias the weights stand in (never read as one)

    @func
    def stage(x: X_T, xs: f32[2 * SET], cm: i32[KW * HW], u: i32, s: i32):
        """Plane ``u`` into copy set ``s``: copy ``j`` with the columns its shift must not read zeroed."""
        for j in range(KW):
            for q in vectorize(HW):
                xs[s * SET + j * COPY + FRONT + q] = bitcast(bitcast(x[u // C, u % C, q // W, q % W], i32)
                                                             & cm[j * HW + q], f32)

    @func
    def taps(xs: f32[2 * SET], wt: W_T, bias: B_T, y: Y_T, u: i32, s: i32):
        """Plane ``u`` from copy set ``s``: every tap a shifted vector of the plane."""
        ch = u % C
        acc = register_tensor(f32, [NV * V])
        for k, l in plane.vectorize():
            acc[k * V + l] = bias[ch] if BIAS else 0.0
        for i in unroll(KH):
            for j in unroll(KW):
                for k, l in plane.vectorize():
                    acc[k * V + l] += (xs[s * SET + j * COPY + FRONT + (i * DH - PT) * W + j * DW - PL + k * V + l]
                                       * wt[ch, i * KW + j])
        if HW >= V:     # stored from the registers: the whole vectors, then lane by lane
            for k, l in whole.vectorize():
                y[u // C, ch, (k * V + l) // W, (k * V + l) % W] = acc[k * V + l]
        for t in unroll(HW % V):
            y[u // C, ch, (HW // V * V + t) // W, (HW // V * V + t) % W] = acc[HW // V * V + t]

    @func
    def planes(x: X_T, wt: W_T, bias: B_T, y: Y_T, p: i32):
        """Core ``p``'s contiguous range of planes, staged one ahead of its taps."""
        u0 = p * (N * C) // P
        u1 = (p + 1) * (N * C) // P
        xs = register_tensor(f32, [2 * SET])
        cm = register_tensor(i32, [KW * HW])
        for e in vectorize(2 * SET):
            xs[e] = 0.0
        for j in range(KW):               # input column q % W is read by copy j's shift
            for q in vectorize(HW):
                cm[j * HW + q] = select(q % W - (j * DW - PL) >= 0 and q % W - (j * DW - PL) < W, -1, 0)
        if u0 < u1:
            stage(x, xs, cm, u0, 0)
        for v in range((u1 - u0 + 1) // 2):      # two planes a step: each set's offsets constants
            u = u0 + 2 * v
            if u + 1 < u1:
                stage(x, xs, cm, u + 1, 1)
            taps(xs, wt, bias, y, u, 0)
            if u + 1 < u1:
                if u + 2 < u1:
                    stage(x, xs, cm, u + 2, 0)
                taps(xs, wt, bias, y, u + 1, 1)

    if BIAS:
        @kernel
        def depthwise_conv2d_cpu_plane(x: X_T, w: W_T, bias: B_T, y: Y_T):
            for p in CORES:
                planes(x, w, bias, y, opaque(p))
        return depthwise_conv2d_cpu_plane

    @kernel
    def depthwise_conv2d_cpu_plane_nobias(x: X_T, w: W_T, y: Y_T):
        for p in CORES:
            planes(x, w, w, y, opaque(p))
    return depthwise_conv2d_cpu_plane_nobias


__all__ = ["MAX_PLANE_VECTORS", "PlaneConfig", "build_kernel", "fits"]
