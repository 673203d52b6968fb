"""The CPU f32 Winograd convolution kernel (3x3, stride 1, no dilation), written in the DSL with
task mappings: ``F(M x M, 3 x 3)`` for ``M`` = 2 (2.25x fewer multiplications than the direct
convolution, exact up to rounding) or 4 (4x fewer, a few more rounding errors), Lavin & Gray's
algorithm with NCHW in, NCHW out, in one kernel.

``build_kernel(cfg)`` makes one kernel per :class:`WinoConfig` (``M``, register tile, cores, top /
left padding); the image sizes are symbolic.  ``ALPHA = M + 2``: each output tile of ``M x M``
pixels reads an ``ALPHA x ALPHA`` input tile.

* **Input bands**: the zero-padded input is copied once into ``xb[ci, i, ph, b * TH + ty, TW + 1]``:
  row ``i`` (< ``ALPHA``) of tile row ``ty``'s band, split into its ``M`` column phases
  (column ``M * t + ph`` at ``t``).  With the tiles numbered over that frame, ``q = (b * TH + ty)
  * (TW + 1) + tx``, element ``(i, j)`` of tile ``q``'s input is ``xb[ci, i, j % M][q + j // M]``:
  **consecutive tiles are consecutive floats** (one unaligned vector load per element of
  ``NR`` tiles, no gathers), across rows and images.  The frame's extra column of tiles
  (``tx = TW``) is computed and never stored.
* **Weights**: ``U = G g G^T`` per output / input channel, packed as ``[ALPHA^2, C_out / MR,
  C_in, MR]`` — in the order the GEMMs read it (``xi`` by ``xi``, a core's panels in turn), so
  that a pass over U is one sequential stream the hardware prefetchers follow.  (Packed panel
  by panel, ``[C_out / MR, ALPHA^2, C_in, MR]``, a pass read ``ALPHA^2 x C_out / MR`` chunks of
  ``C_in x MR`` floats far apart: in the flow of a model, where each layer's U comes from
  memory, ResNet-50's 14x14 layers took 2.3-2.5x their time with U in cache.)  The GEMMs
  prefetch that stream ``PREFETCH_BYTES`` ahead (``prefetch``), past the 4 KiB pages where the
  hardware prefetchers stop: ResNet-50's 11 Winograd steps 4.06 -> 2.95 ms in whole runs (Zen 5,
  two cores; 4.1 against 5.7 ms while another tenant loaded the shared L3).  Transformed once
  when a graph is compiled (:func:`transform_weights`, ``prepacked``), or by the kernel on every
  call (one parallel pass, lanes along a panel's ``MR`` channels; channels past ``C_out``
  repeat the last one: their sums are never stored).
* **Per block of ``NR`` consecutive tiles** (a core's unit, lanes along the tiles): the input
  transform ``V = B^T d B`` of every input channel into ``vb[xi, ci, NR]`` (``xi`` < ``ALPHA^2``,
  in the core's slice of the workspace; the ``xi`` are a cache line more than ``C_in * NR``
  apart: 4 KB apart, the transform's ``ALPHA^2`` store streams shared one L1 set); then, ``xi``
  by ``xi`` (``V[xi]`` stays in L1), the small GEMMs ``m[xi] = U[xi] V[xi]`` of the core's panels
  of ``MR`` output channels, with the register tile ``repeat(MR, NR // V) * spatial(1, V)``
  (``MR`` broadcasts of ``U``, ``NR / V`` vector loads of ``V`` and ``MR * NR / V`` FMAs per input
  channel); then per panel the output transform ``Y = A^T m A`` into ``ob[r, i, NR * M]`` (a
  tile's ``M`` columns side by side), from where each output row of the block is **stored once,
  contiguous** (post-scheduling fusion splices epilogues into these stores, :mod:`taskmap.fusion`).
* **Cores**: ``spatial(P).parallel()`` over contiguous ranges of the ``blocks x panels`` units
  (panels innermost: a core transforms a block's input once and sweeps the panels with it).
"""
from dataclasses import dataclass

import numpy as np

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, parallel, prefetch, register_tensor, select, symbol, unroll, vectorize
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .conv_cpu_kernel import ConvKernelConfig

#: ``(B^T, G, A^T)`` of F(2x2, 3x3) and F(4x4, 3x3) (Lavin & Gray, 2016): the input, weight and
#: output transforms (only :func:`transform_weights` uses the matrices: the kernel has them
#: written out).
TRANSFORMS = {
    2: (np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], np.float64),
        np.array([[1, 0, 0], [.5, .5, .5], [.5, -.5, .5], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], np.float64)),
    4: (np.array([[4, 0, -5, 0, 1, 0], [0, -4, -4, 1, 1, 0], [0, 4, -4, -1, 1, 0], [0, -2, -1, 2, 1, 0],
                  [0, 2, -1, -2, 1, 0], [0, 4, 0, -5, 0, 1]], np.float64),
        np.array([[1 / 4, 0, 0], [-1 / 6, -1 / 6, -1 / 6], [-1 / 6, 1 / 6, -1 / 6], [1 / 24, 1 / 12, 1 / 6],
                  [1 / 24, -1 / 12, 1 / 6], [0, 0, 1]], np.float64),
        np.array([[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64)),
}


@dataclass(frozen=True)
class WinoConfig(ConvKernelConfig):
    """The Winograd kernel's: output tiles of ``m x m`` pixels, ``mr`` output channels x ``nr``
    tiles (a multiple of the lanes) per register tile; the window is 3x3, stride 1."""

    m: int = 2
    prepacked: bool = True     # ``wt`` holds U (:func:`transform_weights`), not the NCHW weights
    pf: int = 0                # elements ahead the GEMMs prefetch a ``prepacked`` U (0: none)

    @property
    def alpha(self) -> int:
        return self.m + 2

    def frame(self, n: int, oh: int, ow: int) -> tuple[int, int, int]:
        """(tile rows of all images ``N * TH``, frame width in tiles ``TW + 1``, band width ``WB``)."""
        th, tw = -(-oh // self.m), -(-ow // self.m)
        return n * th, tw + 1, self.m * (tw + 1)

    def tail(self) -> int:
        """Zeros after the bands: the reads of a block's lanes past the last tile."""
        return self.nr + 2

    def per_core(self, cin: int, cout: int) -> int:
        """Elements of a core's slice: the block's transformed input and its GEMM results."""
        return self.alpha ** 2 * (cin * self.nr + 16 + -(-cout // self.mr) * self.mr * self.nr)

    def workspace(self, n: int, cin: int, cout: int, oh: int, ow: int) -> int:
        """Elements: the input bands, their zero tail, the cores' slices and — unless the
        weights come transformed — U."""
        rows, _, wb = self.frame(n, oh, ow)
        u = 0 if self.prepacked else self.weight_size(cin, cout)
        return cin * self.alpha * rows * wb + self.tail() + self.cores * self.per_core(cin, cout) + u

    def weight_size(self, cin: int, cout: int) -> int:
        return -(-cout // self.mr) * self.alpha ** 2 * cin * self.mr


def transform_weights(w: np.ndarray, m: int, mr: int) -> np.ndarray:
    """NCHW 3x3 weights ``(C_out, C_in, 3, 3)`` as the kernel's ``U``: ``G g G^T`` (in float64,
    rounded once) packed ``[ALPHA^2, C_out / MR (rounded up), C_in, MR]`` flat, zeros past ``C_out``.
    One product with ``G (x) G`` (``ALPHA^2 x 9``), straight into that layout."""
    _, g, _ = TRANSFORMS[m]
    cout, cin = w.shape[:2]
    cp = -(-cout // mr)
    taps = np.zeros((cp * mr, cin, 9), np.float64)
    taps[:cout] = np.asarray(w, np.float64).reshape(cout, cin, 9)
    taps = taps.reshape(cp, mr, cin, 9).transpose(3, 0, 2, 1).reshape(9, cp * cin * mr)
    return np.matmul(np.kron(g, g), taps).astype(np.float32).reshape(-1)


def build_kernel(cfg: WinoConfig) -> Kernel:
    assert cfg.nr % cfg.lanes == 0 and (cfg.kh, cfg.kw, cfg.sh, cfg.sw, cfg.dh, cfg.dw) == (3, 3, 1, 1, 1, 1)
    M, MR, NR, V, P, PT, PL = cfg.m, cfg.mr, cfg.nr, cfg.lanes, cfg.cores, cfg.pt, cfg.pl
    A = cfg.alpha
    A2 = A * A
    TAIL = cfg.tail()
    PAR = parallel if P > 1 else range
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    tile = repeat(MR, NR // V) * spatial(1, V)
    lanes = spatial(NR)
    n, cin, h, w, cout, oh, ow, wsx = (symbol(s) for s in ("n", "cin", "h", "w", "cout", "oh", "ow", "wsx"))
    X_T, C_T, XP_T = f32[n, cin, h, w], f32[n, cout, oh, ow], f32[wsx]
    PRE = cfg.prepacked
    PF = cfg.pf if PRE else 0         # U from memory (in a model's flow): prefetched ahead of the stream
    W_T = f32[(cout + MR - 1) // MR * A2 * cin * MR] if PRE else f32[cout * cin * 9]
    U_T = W_T if PRE else XP_T        # where the GEMMs read U
    wlanes = spatial(MR)
    VS = cin * NR + 16      # the transformed input's stride between two xi: not a multiple of 4 KB (L1 sets)

    @func
    def band_row(x: X_T, xp: XP_T, ci: i32, i: i32, b: i32, ty: i32, th: i32, twf: i32):
        """Row ``i`` of image ``b``'s band ``ty``, input channel ``ci``: padded input row ``M * ty +
        i`` split into its ``M`` column phases (planes of ``N * TH * TWF`` elements)."""
        plane = n * th * twf
        o = (ci * A + i) * M * plane + (b * th + ty) * twf
        r = ty * M + i - PT
        ok = r >= 0 and r < h
        # phase ph's columns inside the image: lo .. hi (none outside the image's rows); all
        # phases are inside from ta (phase 0's lo) to tb (phase M-1's hi): copied jointly
        ta = select(ok, min((PL + M - 1) // M, twf), twf)
        tb = select(ok, max(min((w + PL) // M, twf), ta), twf)
        for ph in unroll(M):
            lo = select(ok, min((PL - ph + M - 1) // M, twf), twf)
            hi = select(ok, max(min((w + PL - ph + M - 1) // M, twf), lo), twf)
            for t in range(lo):
                xp[o + ph * plane + t] = 0.0
            for t in range(lo, min(ta, hi)):
                xp[o + ph * plane + t] = x[b, ci, r, t * M + ph - PL]
            for t in range(max(tb, ta), hi):
                xp[o + ph * plane + t] = x[b, ci, r, t * M + ph - PL]
            for t in range(hi, twf):
                xp[o + ph * plane + t] = 0.0
        for t in range(ta, tb):
            for ph in unroll(M):
                xp[o + ph * plane + t] = x[b, ci, r, t * M + ph - PL]

    def make_input(M: int) -> func:
        """``V = B^T d B`` of the tiles ``q0 ..`` of input channel ``ci`` into ``xp[vb + (xi * cin
        + ci) * NR + s]``; ``plane``: elements of one column phase of a band row ``i``."""
        def input_f2(xp: XP_T, ci: i32, q0: i32, plane: i32, vb: i32):
            t = register_tensor(f32, [4, 4, NR])
            for j in unroll(4):
                for s in lanes.vectorize():
                    o = (ci * 8 + j % 2) * plane + q0 + s + j // 2
                    d0 = xp[o]
                    d1 = xp[o + 2 * plane]
                    d2 = xp[o + 4 * plane]
                    d3 = xp[o + 6 * plane]
                    t[0, j, s] = d0 - d2
                    t[1, j, s] = d1 + d2
                    t[2, j, s] = d2 - d1
                    t[3, j, s] = d1 - d3
            for k in unroll(4):
                for s in lanes.vectorize():
                    o = vb + k * 4 * VS + ci * NR + s
                    e0 = t[k, 0, s]
                    e1 = t[k, 1, s]
                    e2 = t[k, 2, s]
                    e3 = t[k, 3, s]
                    xp[o] = e0 - e2
                    xp[o + VS] = e1 + e2
                    xp[o + 2 * VS] = e2 - e1
                    xp[o + 3 * VS] = e1 - e3

        def input_f4(xp: XP_T, ci: i32, q0: i32, plane: i32, vb: i32):
            t = register_tensor(f32, [6, 6, NR])
            for j in unroll(6):
                for s in lanes.vectorize():
                    o = (ci * 24 + j % 4) * plane + q0 + s + j // 4
                    d0 = xp[o]
                    d1 = xp[o + 4 * plane]
                    d2 = xp[o + 8 * plane]
                    d3 = xp[o + 12 * plane]
                    d4 = xp[o + 16 * plane]
                    d5 = xp[o + 20 * plane]
                    t[0, j, s] = 4.0 * d0 - 5.0 * d2 + d4
                    t[1, j, s] = d3 + d4 - 4.0 * (d1 + d2)
                    t[2, j, s] = 4.0 * (d1 - d2) + d4 - d3
                    t[3, j, s] = 2.0 * (d3 - d1) + d4 - d2
                    t[4, j, s] = 2.0 * (d1 - d3) + d4 - d2
                    t[5, j, s] = 4.0 * d1 - 5.0 * d3 + d5
            for k in unroll(6):
                for s in lanes.vectorize():
                    o = vb + k * 6 * VS + ci * NR + s
                    e0 = t[k, 0, s]
                    e1 = t[k, 1, s]
                    e2 = t[k, 2, s]
                    e3 = t[k, 3, s]
                    e4 = t[k, 4, s]
                    e5 = t[k, 5, s]
                    xp[o] = 4.0 * e0 - 5.0 * e2 + e4
                    xp[o + VS] = e3 + e4 - 4.0 * (e1 + e2)
                    xp[o + 2 * VS] = 4.0 * (e1 - e2) + e4 - e3
                    xp[o + 3 * VS] = 2.0 * (e3 - e1) + e4 - e2
                    xp[o + 4 * VS] = 2.0 * (e1 - e3) + e4 - e2
                    xp[o + 5 * VS] = 4.0 * e1 - 5.0 * e3 + e5
        return func(input_f2 if M == 2 else input_f4)

    def make_output(M: int) -> func:
        """``Y = A^T m A`` of output channel ``r`` of the panel (``m`` at ``xp[mb + (xi * MR + r)
        * NR + s]``) into ``ob[(r * M + i) * M * NR + s * M + j]``."""
        def output_f2(xp: XP_T, ob: f32[MR * M * M * NR], r: i32, mb: i32):
            z = register_tensor(f32, [2, 4, NR])
            for j in unroll(4):
                for s in lanes.vectorize():
                    o = mb + (j * MR + r) * NR + s
                    m0 = xp[o]
                    m1 = xp[o + 4 * MR * NR]
                    m2 = xp[o + 8 * MR * NR]
                    m3 = xp[o + 12 * MR * NR]
                    z[0, j, s] = m0 + m1 + m2
                    z[1, j, s] = m1 - m2 - m3
            for i in unroll(2):
                for s in lanes.vectorize():
                    o = (r * 2 + i) * 2 * NR + 2 * s
                    ob[o] = z[i, 0, s] + z[i, 1, s] + z[i, 2, s]
                    ob[o + 1] = z[i, 1, s] - z[i, 2, s] - z[i, 3, s]

        def output_f4(xp: XP_T, ob: f32[MR * M * M * NR], r: i32, mb: i32):
            z = register_tensor(f32, [4, 6, NR])
            for j in unroll(6):
                for s in lanes.vectorize():
                    o = mb + (j * MR + r) * NR + s
                    m0 = xp[o]
                    m1 = xp[o + 6 * MR * NR]
                    m2 = xp[o + 12 * MR * NR]
                    m3 = xp[o + 18 * MR * NR]
                    m4 = xp[o + 24 * MR * NR]
                    m5 = xp[o + 30 * MR * NR]
                    z[0, j, s] = m0 + m1 + m2 + m3 + m4
                    z[1, j, s] = m1 - m2 + 2.0 * (m3 - m4)
                    z[2, j, s] = m1 + m2 + 4.0 * (m3 + m4)
                    z[3, j, s] = m1 - m2 + 8.0 * (m3 - m4) + m5
            for i in unroll(4):
                for s in lanes.vectorize():
                    o = (r * 4 + i) * 4 * NR + 4 * s
                    e0 = z[i, 0, s]
                    e1 = z[i, 1, s]
                    e2 = z[i, 2, s]
                    e3 = z[i, 3, s]
                    e4 = z[i, 4, s]
                    e5 = z[i, 5, s]
                    ob[o] = e0 + e1 + e2 + e3 + e4
                    ob[o + 1] = e1 - e2 + 2.0 * (e3 - e4)
                    ob[o + 2] = e1 + e2 + 4.0 * (e3 + e4)
                    ob[o + 3] = e1 - e2 + 8.0 * (e3 - e4) + e5
        return func(output_f2 if M == 2 else output_f4)

    input_transform, output_transform = make_input(M), make_output(M)

    def make_weights(M: int) -> func:
        """``U = G g G^T`` of input channel ``ci`` of panel ``pn`` (``MR`` output channels) into
        ``xp[ub + ((xi * CP + pn) * cin + ci) * MR + r]`` (``CP`` panels)."""
        def weights_f2(wt: W_T, xp: XP_T, pn: i32, ci: i32, ub: i32):
            h = register_tensor(f32, [4, 3, MR])
            for col in unroll(3):
                for r in wlanes.vectorize():
                    o = (min(pn * MR + r, cout - 1) * cin + ci) * 9 + col
                    g0 = wt[o]
                    g1 = wt[o + 3]
                    g2 = wt[o + 6]
                    h[0, col, r] = g0
                    h[1, col, r] = 0.5 * (g0 + g1 + g2)
                    h[2, col, r] = 0.5 * (g0 - g1 + g2)
                    h[3, col, r] = g2
            xs = (cout + MR - 1) // MR * cin * MR       # between two xi
            for a in unroll(4):
                for r in wlanes.vectorize():
                    o = ub + (pn * cin + ci) * MR + a * 4 * xs + r
                    e0 = h[a, 0, r]
                    e1 = h[a, 1, r]
                    e2 = h[a, 2, r]
                    xp[o] = e0
                    xp[o + xs] = 0.5 * (e0 + e1 + e2)
                    xp[o + 2 * xs] = 0.5 * (e0 - e1 + e2)
                    xp[o + 3 * xs] = e2

        def weights_f4(wt: W_T, xp: XP_T, pn: i32, ci: i32, ub: i32):
            h = register_tensor(f32, [6, 3, MR])
            for col in unroll(3):
                for r in wlanes.vectorize():
                    o = (min(pn * MR + r, cout - 1) * cin + ci) * 9 + col
                    g0 = wt[o]
                    g1 = wt[o + 3]
                    g2 = wt[o + 6]
                    h[0, col, r] = 0.25 * g0
                    h[1, col, r] = (g0 + g1 + g2) * (-1.0 / 6.0)
                    h[2, col, r] = (g0 - g1 + g2) * (-1.0 / 6.0)
                    h[3, col, r] = g0 * (1.0 / 24.0) + g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0)
                    h[4, col, r] = g0 * (1.0 / 24.0) - g1 * (1.0 / 12.0) + g2 * (1.0 / 6.0)
                    h[5, col, r] = g2
            xs = (cout + MR - 1) // MR * cin * MR       # between two xi
            for a in unroll(6):
                for r in wlanes.vectorize():
                    o = ub + (pn * cin + ci) * MR + a * 6 * xs + r
                    e0 = h[a, 0, r]
                    e1 = h[a, 1, r]
                    e2 = h[a, 2, r]
                    xp[o] = 0.25 * e0
                    xp[o + xs] = (e0 + e1 + e2) * (-1.0 / 6.0)
                    xp[o + 2 * xs] = (e0 - e1 + e2) * (-1.0 / 6.0)
                    xp[o + 3 * xs] = e0 * (1.0 / 24.0) + e1 * (1.0 / 12.0) + e2 * (1.0 / 6.0)
                    xp[o + 4 * xs] = e0 * (1.0 / 24.0) - e1 * (1.0 / 12.0) + e2 * (1.0 / 6.0)
                    xp[o + 5 * xs] = e2
        return func(weights_f2 if M == 2 else weights_f4)

    weight_transform = make_weights(M)

    @func
    def gemm(u: U_T, xp: XP_T, uo: i32, vo: i32, mo: i32):
        """``m = U V`` of one ``xi``: ``MR`` output channels (``u[uo:]``) x ``NR`` tiles
        (``xp[vo:]``) over the input channels, to ``xp[mo:]``."""
        acc = register_tensor(f32, [MR, NR])
        for r, s in tile.vectorize():
            acc[r, s] = 0.0
        for ci in range(cin):
            if PF:
                prefetch(u[uo + ci * MR + PF])
            for r, s in tile.vectorize():
                acc[r, s] += u[uo + ci * MR + r] * xp[vo + ci * NR + s]
        for r, s in tile.vectorize():
            xp[mo + r * NR + s] = acc[r, s]

    @func
    def store_panel(c: C_T, xp: XP_T, q0: i32, pn: i32, th: i32, twf: i32, mb: i32):
        """Output channels ``pn * MR ..`` of the tiles ``q0 .. q0 + NR`` (frame numbering) from
        their GEMM results at ``xp[mb:]``: the output transform, then the stores."""
        ob = register_tensor(f32, [MR * M * M * NR])
        for r in range(MR):
            output_transform(xp, ob, r, mb)
        co0 = pn * MR
        for rho in range(q0 // twf, min((q0 + NR - 1) // twf + 1, n * th)):
            b = rho // th
            oh0 = rho % th * M
            off = M * (rho * twf - q0)          # ob's column of the row's first pixel
            clo = max(0, -off)
            chi = min(ow, M * NR - off)
            for r in range(min(MR, cout - co0)):
                for i in range(min(M, oh - oh0)):
                    for col in vectorize(clo, chi):
                        c[b, co0 + r, oh0 + i, col] = ob[(r * M + i) * M * NR + col + off]

    @kernel
    def conv_cpu_wino(x: X_T, wt: W_T, c: C_T, xp: XP_T):
        TH = (oh + M - 1) // M
        TWF = (ow + M - 1) // M + 1
        ROWS = n * TH
        PLANE = ROWS * TWF
        XB = cin * A * M * PLANE
        for q in PAR(cin * A):
            for b in range(n):
                for ty in range(TH):
                    band_row(x, xp, q // A, q % A, b, ty, TH, TWF)
        for z in range(TAIL):
            xp[XB + z] = 0.0
        CP = (cout + MR - 1) // MR
        UB = XB + TAIL + P * A2 * (VS + CP * MR * NR)     # U in the workspace (weights per call)
        if not PRE:
            for q in PAR(CP * cin):
                weight_transform(wt, xp, q // cin, q % cin, UB)
        units = (ROWS * TWF + NR - 1) // NR * CP
        for p in CORES:
            u0 = p * units // P
            u1 = (p + 1) * units // P
            vb = XB + TAIL + p * A2 * (VS + CP * MR * NR)
            mb = vb + A2 * VS
            if u1 > u0:
                for blk in range(u0 // CP, (u1 - 1) // CP + 1):
                    for ci in range(cin):
                        input_transform(xp, ci, blk * NR, PLANE, vb)
                    p0 = max(u0, blk * CP) - blk * CP
                    p1 = min(u1, blk * CP + CP) - blk * CP
                    for xi in range(A2):         # V[xi] stays in L1 while the panels stream U[xi] (contiguous)
                        for pn in range(p0, p1):
                            gemm(wt if PRE else xp, xp, (xi * CP + pn) * cin * MR + (0 if PRE else UB), vb + xi * VS,
                                 mb + ((pn - p0) * A2 + xi) * MR * NR)
                    for pn in range(p0, p1):
                        store_panel(c, xp, blk * NR, pn, TH, TWF, mb + (pn - p0) * A2 * MR * NR)

    return conv_cpu_wino


__all__ = ["TRANSFORMS", "WinoConfig", "build_kernel", "transform_weights"]
