"""The CPU f32 matmul kernel (BLIS-style), written in the DSL with task mappings.

``build_kernel(cfg)`` makes one kernel per :class:`CpuConfig` (schedule + problem flags); sizes
are symbolic, so it serves every shape.  Per batch, with ``MP = ceil(m / MR)`` row panels of A
and ``NP = ceil(n / NR)`` column panels of B:

* **register tile** ``MR x NR`` of C: ``repeat(MR, NR // V) * spatial(1, V)`` — the vector lanes
  are the workers of ``spatial(1, V)``, a row of the tile is ``NR // V`` vectors, and the
  ``MR * NR / V`` accumulators stay in vector registers (``.vectorize()`` puts the lane loop
  innermost and unrolls the task loops; gcc turns each step of K into ``NR/V`` vector loads of the
  packed B row, ``MR`` broadcasts of A and ``MR * NR / V`` FMAs).
* **packing**: B's panels become ``[panel][k][NR]`` (zero padded past ``n``), A's panels
  ``[panel][k][MR]`` (rows past ``m`` repeat the last row; those results are never stored), so the
  micro-kernel streams both contiguously; K is cut into blocks of about ``KC`` (the B block of
  ``NCB`` panels, ``KC x NCB*NR``, stays in L2; the A micro-panel ``MR x KC`` in L1).
* **prefetch**: the panels packed beforehand (``pre_a`` / ``pre_b``: a graph's weights, which come
  from memory when a model runs) are prefetched ``pf`` elements ahead in the K loop (``prefetch``),
  where the hardware prefetchers would stop at each 4 KiB page (with A read in place — thin
  GEMV-like tiles, bound by B's stream from memory — into L2, ``2 pf`` ahead: a classifier's
  1280 x 1000 weights at batch 1, cold, 1.2-1.4x faster); B read in place, the lines of its
  row :data:`B_ROWS_AHEAD` steps of K ahead; the final tile of C (and what a fused epilogue
  reads with it; only that where C is streamed) before its last K loop, where C does not fit a
  core's L2 (``pf_c``).
* **cores**: ``spatial(P).parallel()``; ``split="m"`` gives each core a contiguous range of the
  ``batch * MP`` row panels (B packed once, in parallel, before; each core packs its own A
  panels while it first uses them), ``split="n"`` a range of the ``batch * NP`` column panels
  (A packed before — or read in place with ``pack_a=False`` — and each core packs the B block it
  is about to use into its own part of the workspace).
* **edges**: tiles inside C load and store whole vectors; the last row / column panels go
  through a tile buffer outside the K loop: the accumulators are stored to it whole, and a
  loop over the tile's rows inside C copies each row's columns inside C (partial sums come
  back the same way).  gcc compiles that loop once, where predicated stores of every register
  of the tile made each edge path as big as the K loop (ResNet-50's 13 matmul kernels: gcc
  7.8 -> 4.4 s), and vectorizes it with plain vector moves, where it made the predicated
  stores scatters.  With B in place its last, partial panel is shifted left to end at ``n``
  (whole-vector loads, no copy); it stores only its own columns.  A last column panel of at most
  ``ne`` columns (``CpuConfig.ne``: one vector, set for problems whose ``n`` leaves such a
  remainder) runs a register tile of ``MR x ne`` instead: its K loop does a third of the 8x48
  tile's FMAs where the full tile would spend them on zero columns (196 = 4 x 48 + 4).
* **streamed C** (``CpuConfig.stream``): the whole tiles' final stores are streaming
  (``vectorize(stream=True)``: non-temporal vector stores on the CPU), and stay so with an
  epilogue spliced in; edge tiles and partial sums are stored plainly.
* **folded batch** (``CpuConfig.fold``: A shared, B batched and packed, C plain): the batch's
  images are one problem of ``batch x n`` columns, column ``g`` being column ``g % n`` of image
  ``g // n``.  B's panels gather each image's run of their columns (``pack_b_fold``); a tile
  inside one image stores as usual, one that straddles images stores (and loads its partial sums)
  through the tile buffer, each image's run of each row as one vector loop.  For small images:
  a batch of 7x7 ones (49 columns) computes 50 columns an image instead of 64, and every K block
  of A serves the whole batch (ResNet-50's 7x7 1x1 layers at batch 8: 1.14-1.27x, two cores).
* **write-once output** (for post-scheduling fusion, :mod:`taskmap.fusion`): the kernel takes
  two C parameters, ``c`` and ``cw`` (same type).  The partial sums of every K block but the
  last are stored to ``cw`` and read back from it by the next K block; the last K block
  (``last``) stores the final tile to ``c``.  So ``c`` is written exactly once per element and
  never read: an epilogue can be spliced into its stores.  Unfused callers pass the same array
  as ``c`` and ``cw`` (no extra memory; each tile is read and written by the core that owns
  it); fused kernels get a workspace of C's size as ``cw`` (only touched when K has more than
  one block).
"""
from dataclasses import dataclass

import numpy as np

from ..ir.mapping import repeat, spatial
from ..lang import (bool_, cast, f32, func, i32, i64, parallel, prefetch, register_tensor, select, symbol, transpose_block,
                    unroll, vectorize)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .panels import row_panels

#: Rows of K packed by one parallel task of the up-front packing loops.
PACK_CHUNK = 256
#: Rows ahead the micro-kernel prefetches B read in place (``pf`` set): its rows are a row of B
#: apart, each step of K on another page, a pattern the hardware prefetchers do not follow; in a
#: model's flow B was just written by the other kernels, half of it in the other core's caches.
#: Measured (Xeon, two cores; before each call both cores' caches flushed, then B rewritten by both
#: as a producer kernel would): MobileNetV2's 144 -> 24 1x1 conv at 56x56 244 -> 210 us (warm
#: 130), its 32 -> 16 at 112x112 204 -> 175 us; the whole model 1.01-1.02x.
B_ROWS_AHEAD = 8
# With ``pf_c`` set (C larger than a core's L2, not transposed: ``MatmulCpuTemplate.config``) the
# last K block prefetches its tile of C into L1 before its K loop: the tile's ``MR`` rows are a row
# of C apart, each on another page, and a fused epilogue's prefetches cover what it reads there too
# (a residual: see :meth:`taskmap.fusion.splice.Splicer._prefetch`).  In a model's flow those lines
# are in L3 or the other core's caches.  Where C is streamed past the caches its own lines are not
# fetched, only what an epilogue reads beside them (``prefetch(..., beside=True)``; nothing without
# one): ResNeXt-50's 128 -> 256 1x1 layers at 56x56 with their residual add, batch 8 (25.7 MB of C,
# streamed), 0.92-0.96x the time in the model's flow, 0.92-0.93x alone (Zen 4, two cores; into L2
# rather than L1 no gain in the flow).  Measured (Xeon, two cores, whole model A/B in one process): ResNet-50
# at batch 8 (its 1x1 convs with a residual add write 3.2 MB an image) 1.04-1.08x, batch 1 1.01x;
# into L2 rather than L1 0.93x of that.  Prefetching every product's C, GPT-2 and BERT at batch 1
# ran 0.92-0.99x (their C, 0.4-1.5 MB, stays in L2): hence the size test.  The lines of C are
# prefetched for writing (``prefetchw``: owned at once, not read shared and then upgraded): on
# Zen 4, ResNet-50 at batch 8 summed 304.8 -> 301.1 ms of steps, its pf_c layers 0.96-1.0x each.


@dataclass(frozen=True)
class CpuConfig:
    """Everything a CPU matmul kernel's code depends on."""

    mr: int
    nr: int
    kc: int
    ncb: int            # B panels per block (the block kept in L2)
    split: str          # "m" | "n"
    pack_a: bool
    pack_b: bool        # False: B is read in place (not with trans_b)
    mcb: int            # A panels per block (split "m": the A block kept in L2 while B blocks pass)
    lanes: int          # f32 lanes of a vector register
    cores: int          # OpenMP workers
    a_batched: bool
    b_batched: bool
    trans_b: bool
    bias: bool
    trans_c: bool = False   # C stored (n, m); the bias then runs along m
    pre_a: bool = False     # ``wa`` holds A packed beforehand (a constant: :func:`pack_a_panels`)
    pre_b: bool = False     # ``wb`` holds B packed beforehand (:func:`pack_b_panels`)
    ne: int = 0             # lanes of the narrow tile of a last column panel of at most ``ne`` columns (0: none)
    pf: int = 0             # elements ahead the micro-kernel prefetches the ``pre_a`` / ``pre_b`` panels (0: none)
    stream: bool = False    # whole tiles of C stored past the caches (C does not fit them: :data:`STREAM_C`)
    fold: bool = False      # the batch folded into the columns (B batched and packed, A shared: see the doc)
    pf_c: bool = False      # the last K block prefetches its tile of C, or with ``stream`` what an epilogue reads
                            # beside it (see the comment above ``CpuConfig``)
    b_index: bool = False   # B holds ``groups`` matrices packed beforehand; batch bi multiplies by matrix bidx[bi]

    def workspace(self, batch: int, m: int, n: int, k: int, groups: int = 0) -> tuple[int, int]:
        """Elements of the two workspace buffers (packed A, packed B) — for ``pre_a`` / ``pre_b``,
        of the operand packed beforehand (all of its panels, whole K; ``groups`` matrices of B
        with ``b_index``)."""
        if self.fold:                   # one problem of batch x n columns
            batch, n = 1, batch * n
        mp, np_ = -(-m // self.mr), -(-n // self.nr)
        ba, bb = (batch if self.a_batched else 1), (batch if self.b_batched else 1)
        if self.split == "m":
            wa = batch * mp * k * self.mr if self.pack_a else 1
            panels = np_ if self.pack_b else np_ - n // self.nr
            wb = bb * panels * k * self.nr
        else:
            wa = ba * mp * k * self.mr if self.pack_a else 1
            wb = self.cores * self.ncb * self.kc * self.nr
        if self.pre_a:
            wa = ba * mp * k * self.mr
        if self.pre_b:
            wb = (groups if self.b_index else bb) * np_ * k * self.nr
        return wa, max(wb, 1)


def build_kernel(cfg: CpuConfig) -> Kernel:
    MR, NR, KC, NCB, V, P = cfg.mr, cfg.nr, cfg.kc, cfg.ncb, cfg.lanes, cfg.cores
    PACK_A, PACK_B, SPLIT_M, TRANS_B, BIAS = cfg.pack_a, cfg.pack_b or cfg.trans_b, cfg.split == "m", cfg.trans_b, cfg.bias
    MCB = cfg.mcb
    PRE_A, PRE_B = cfg.pre_a, cfg.pre_b
    assert PACK_A or not PRE_A
    assert PACK_B or not PRE_B
    B_INDEX = cfg.b_index
    PAR = parallel if P > 1 else range                 # one core: no parallel regions at all
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    A_BATCHED, B_BATCHED = cfg.a_batched, cfg.b_batched
    assert NR % V == 0
    STREAM = cfg.stream
    FOLD = cfg.fold
    assert not FOLD or (PACK_B and B_BATCHED and not A_BATCHED and not TRANS_B and not cfg.trans_c and not BIAS
                        and not PRE_B)
    assert not B_INDEX or (PRE_B and B_BATCHED and not FOLD and not SPLIT_M)
    # B indexed by batch, cores on column panels: the panels outer and the batches inner, so that a
    # run of batches with the same matrix (a mixture of experts' blocks of one expert) reads each of
    # its panels from memory once, then from L2 (with the batches outer each batch streamed it again):
    # 256 rows of 1024 -> 5632 over 8 experts in blocks of 16, 27-30 ms against 35-41 (Zen 4, two cores).
    # (Its K blocks and tiles repeat the column-panel branch's; a shared helper would cost a call per tile.)
    INDEX_N = B_INDEX
    NE = cfg.ne                                      # the narrow tile's width (see make_micro)
    assert NE % V == 0 and 0 <= NE < NR
    # The panels packed beforehand (the weights) come from memory when a model runs: the micro-kernel
    # prefetches them PF elements ahead, where the hardware prefetchers would stop at a page's end
    # (one prefetch per step of K for A's MR elements, one per cache line of B's NR).
    PF, LINE = cfg.pf, 64 // 4
    PF_A, PF_B = PF and PRE_A, PF and PRE_B
    # With A read in place (GEMV-like thin tiles, B a constant) there is one FMA per element of B,
    # which streams from memory at the cores' bandwidth: its lines go into L2, twice as far ahead
    # (8 KiB), so that more of them are in flight than L1's miss buffers hold.
    B_AHEAD, B_LEVEL = (PF, 1) if PACK_A else (2 * PF, 2)
    B_LINES = -(-NR // LINE)
    PF_ROWS = B_ROWS_AHEAD if PF and not PACK_B else 0
    PF_C = cfg.pf_c                                  # the final tile's lines of C (see the comment on pf_c)
    row = spatial(NR)                                # one k-row of a B panel: one vector loop of NR lanes
                                                     # (gcc vectorizes predicated / gathered prologue loads
                                                     # in it; split into repeat x spatial it does not)
    batch, m, n, k = symbol("batch"), symbol("m"), symbol("n"), symbol("k")
    wsa, wsb, nbias, nidx = symbol("wsa"), symbol("wsb"), symbol("nbias"), symbol("nidx")
    A_T = f32[batch if A_BATCHED else 1, m, k]
    BB = symbol("groups") if B_INDEX else (batch if B_BATCHED else 1)       # B's matrices
    B_T = f32[BB, n, k] if TRANS_B else f32[BB, k, n]
    IDX_T = i64[batch] if B_INDEX else i64[nidx]      # bidx (without b_index: a 1-element dummy)
    TRANS_C = cfg.trans_c
    BIAS_T = (f32[m] if TRANS_C else f32[n]) if BIAS else f32[nbias]
    C_T = f32[batch, n, m] if TRANS_C else f32[batch, m, n]

    @func
    def pack_a(a: A_T, wa: f32[wsa], off: i32, ai: i32, i: i32, k0: i32, kc: i32):
        """wa[off + kk*MR + r] = A[ai, i*MR + r, k0 + kk] (rows past m: the last row)."""
        for kk in range(kc):
            for r in unroll(MR):
                wa[off + kk * MR + r] = a[ai, min(i * MR + r, m - 1), k0 + kk]

    @func
    def pack_b(b: B_T, wb: f32[wsb], off: i32, bj: i32, j: i32, k0: i32, kc: i32):
        """wb[off + kk*NR + s] = B[bj, k0 + kk, j*NR + s] (columns past n: zeros)."""
        if TRANS_B and j < n // NR:           # whole panel: V x V blocks transposed in registers
            for sb in range(NR // V):
                for kb in range(kc // V):
                    transpose_block(wb[off + kb * V * NR + sb * V], b[bj, j * NR + sb * V, k0 + kb * V], V, NR, k)
            for kk in range(kc // V * V, kc):
                for s in unroll(NR):
                    wb[off + kk * NR + s] = b[bj, j * NR + s, k0 + kk]
        elif TRANS_B:
            for kk in range(kc):
                for s in unroll(NR):
                    wb[off + kk * NR + s] = b[bj, min(j * NR + s, n - 1), k0 + kk]
        elif j < n // NR:
            for kk in range(kc):
                for s in row.vectorize():
                    wb[off + kk * NR + s] = b[bj, k0 + kk, j * NR + s]
        else:                                 # the partial panel: a copy loop and a zero loop per row
            width = NE if NE and n - j * NR <= NE else NR      # the columns its micro-kernel reads
            for kk in range(kc):              # (gcc makes predicated loads of one loop gathers)
                for s in range(n - j * NR):
                    wb[off + kk * NR + s] = b[bj, k0 + kk, j * NR + s]
                for s in range(n - j * NR, width):
                    wb[off + kk * NR + s] = 0.0

    @func
    def pack_b_fold(b: B_T, wb: f32[wsb], off: i32, j: i32, k0: i32, kc: i32):
        """Panel ``j`` of the folded columns (column ``g`` is B[g // n, :, g % n]): each image's
        run of the panel's columns copied row by row (zeros past the last image)."""
        g0 = j * NR
        for q in range(g0 // n, min((g0 + NR - 1) // n, batch - 1) + 1):
            lo = max(q * n - g0, 0)
            hi = min(q * n + n - g0, NR)
            for kk in range(kc):
                for s in vectorize(hi - lo):
                    wb[off + kk * NR + lo + s] = b[q, k0 + kk, g0 + lo + s - q * n]
        for kk in range(kc):
            for s in range(max(min(batch * n - g0, NR), 0), NR):
                wb[off + kk * NR + s] = 0.0

    def make_micro(W: int, FULL: bool):
        """The micro-kernel of an ``MR x W`` register tile; ``FULL``: it also serves whole tiles (the
        narrow tile of a thin last column panel never does)."""
        tile = repeat(MR, W // V) * spatial(1, V)        # the register tile: lanes along a row
        tile_t = repeat(W, 1) * spatial(1, MR)           # the tile, lanes down its columns (C^T stores)

        def micro(a: A_T, b: B_T, wa: f32[wsa], wb: f32[wsb], bias: BIAS_T, c: C_T, cw: C_T, aoff: i32, boff: i32,
                  ai: i32, bj: i32, ci: i32, i: i32, j: i32, k0: i32, kc: i32, first: bool_, last: bool_):
            """C[ci] tile (i, j) (+)= A panel (at aoff, or A itself) x B panel (at boff, or B itself),
            over k0..k0+kc; partial sums come from / go to ``cw``, the last K block goes to ``c``."""
            acc = register_tensor(f32, [MR, W])
            r0 = i * MR
            c0 = j * NR
            if not PACK_B:                        # B in place: the last, partial panel shifts left onto
                c0 = min(j * NR, max(n - W, 0))   # whole vectors (only its own columns are stored)
            full = FULL and i < m // MR and j < n // NR
            if FOLD:                              # the tile's first image and its column there
                ci = min(c0 // n, batch - 1)
                c0 = c0 - ci * n
                full = FULL and i < m // MR and c0 + W <= n
                g0 = j * NR                       # (ci, c0) is column g0 of the folded problem
                q1 = min((g0 + W - 1) // n, batch - 1)
            if first:
                if BIAS and TRANS_C:
                    for r, s in tile.vectorize():
                        acc[r, s] = bias[min(r0 + r, m - 1)]
                elif BIAS:
                    for r, s in tile.vectorize():
                        acc[r, s] = bias[c0 + s] if c0 + s < n else 0.0
                else:
                    for r, s in tile.vectorize():
                        acc[r, s] = 0.0
            elif TRANS_C:
                for r, s in tile.vectorize():
                    acc[r, s] = cw[ci, c0 + s, r0 + r] if r0 + r < m and c0 + s < n else 0.0
            elif full:
                for r, s in tile.vectorize():
                    acc[r, s] = cw[ci, r0 + r, c0 + s]
            else:                                 # an edge tile: its rows through a buffer (see the stores)
                edge_in = register_tensor(f32, [MR, W])
                for r, s in tile.vectorize():
                    edge_in[r, s] = 0.0
                if FOLD:                          # each image's run of the tile's columns
                    for q in range(ci, q1 + 1):
                        lo = max(q * n - g0, 0)
                        for r in range(min(MR, m - r0)):
                            for s in vectorize(min(q * n + n - g0, W) - lo):
                                edge_in[r, lo + s] = cw[q, r0 + r, g0 + lo + s - q * n]
                else:
                    for r in range(min(MR, m - r0)):
                        for s in range(min(W, n - c0)):
                            edge_in[r, s] = cw[ci, r0 + r, c0 + s]
                for r, s in tile.vectorize():
                    acc[r, s] = edge_in[r, s]
            if PF_C and last:                     # before the K loop: its lines arrive while it runs
                for r in unroll(MR):
                    for q in unroll(-(-W // LINE) + 1):
                        prefetch(c[ci, min(r0 + r, m - 1), c0 + min(q * LINE, W - 1)], write=True, beside=STREAM)
            if PACK_B or n < NR:                  # B packed (or narrower than one panel)
                if PACK_A:
                    for kk in range(kc):
                        if PF_A:
                            prefetch(wa[aoff + kk * MR + PF])
                        if PF_B:
                            for q in unroll(B_LINES):
                                prefetch(wb[boff + kk * NR + B_AHEAD + q * LINE], level=B_LEVEL)
                        for r, s in tile.vectorize():
                            acc[r, s] += wa[aoff + kk * MR + r] * wb[boff + kk * NR + s]
                elif FULL and i < m // MR:
                    for kk in range(kc):
                        if PF_B:
                            for q in unroll(B_LINES):
                                prefetch(wb[boff + kk * NR + B_AHEAD + q * LINE], level=B_LEVEL)
                        for r, s in tile.vectorize():
                            acc[r, s] += a[ai, r0 + r, k0 + kk] * wb[boff + kk * NR + s]
                else:
                    for kk in range(kc):
                        if PF_B:
                            for q in unroll(B_LINES):
                                prefetch(wb[boff + kk * NR + B_AHEAD + q * LINE], level=B_LEVEL)
                        for r, s in tile.vectorize():
                            acc[r, s] += a[ai, min(r0 + r, m - 1), k0 + kk] * wb[boff + kk * NR + s]
            elif PACK_A:                          # B in place: whole vectors of its rows
                for kk in range(kc):
                    if PF_A:
                        prefetch(wa[aoff + kk * MR + PF])
                    if PF_ROWS:
                        for q in unroll(-(-W // LINE) + 1):
                            prefetch(b[bj, k0 + kk + PF_ROWS, c0 + min(q * LINE, W - 1)])
                    for r, s in tile.vectorize():
                        acc[r, s] += wa[aoff + kk * MR + r] * b[bj, k0 + kk, c0 + s]
            else:
                for kk in range(kc):
                    for r, s in tile.vectorize():
                        acc[r, s] += a[ai, min(r0 + r, m - 1), k0 + kk] * b[bj, k0 + kk, c0 + s]
            if last:
                if TRANS_C:                       # C^T: columns of the tile are rows of C in memory
                    if full:
                        for s, r in tile_t.vectorize():
                            c[ci, c0 + s, r0 + r] = acc[r, s]
                    else:
                        for s, r in tile_t.vectorize():
                            if r0 + r < m and c0 + s < n and c0 + s >= j * NR:
                                c[ci, c0 + s, r0 + r] = acc[r, s]
                elif full:
                    for r, s in tile.vectorize(stream=STREAM):
                        c[ci, r0 + r, c0 + s] = acc[r, s]
                else:
                    edge = register_tensor(f32, [MR, W])
                    for r, s in tile.vectorize():
                        edge[r, s] = acc[r, s]
                    if FOLD:
                        for q in range(ci, q1 + 1):
                            lo = max(q * n - g0, 0)
                            for r in range(min(MR, m - r0)):
                                for s in vectorize(min(q * n + n - g0, W) - lo):
                                    c[q, r0 + r, g0 + lo + s - q * n] = edge[r, lo + s]
                    else:
                        for r in range(min(MR, m - r0)):
                            for s in range(j * NR - c0, min(W, n - c0)):
                                c[ci, r0 + r, c0 + s] = edge[r, s]
            elif TRANS_C:                         # partial sums: the same stores, to cw
                if full:
                    for s, r in tile_t.vectorize():
                        cw[ci, c0 + s, r0 + r] = acc[r, s]
                else:
                    for s, r in tile_t.vectorize():
                        if r0 + r < m and c0 + s < n and c0 + s >= j * NR:
                            cw[ci, c0 + s, r0 + r] = acc[r, s]
            elif full:
                for r, s in tile.vectorize():
                    cw[ci, r0 + r, c0 + s] = acc[r, s]
            else:
                edge_cw = register_tensor(f32, [MR, W])
                for r, s in tile.vectorize():
                    edge_cw[r, s] = acc[r, s]
                if FOLD:
                    for q in range(ci, q1 + 1):
                        lo = max(q * n - g0, 0)
                        for r in range(min(MR, m - r0)):
                            for s in vectorize(min(q * n + n - g0, W) - lo):
                                cw[q, r0 + r, g0 + lo + s - q * n] = edge_cw[r, lo + s]
                else:
                    for r in range(min(MR, m - r0)):
                        for s in range(j * NR - c0, min(W, n - c0)):
                            cw[ci, r0 + r, c0 + s] = edge_cw[r, s]

        micro.__name__ = micro.__qualname__ = f"micro_{W}"
        return func(micro)

    # Two micro-kernels, not one with two K loops: the accumulators of one that merged two loops of
    # different widths went through memory to the stores (ResNet-50's 56x56 1x1 steps 1.15-1.2x
    # slower); each call site picks one (``narrow``).
    micro = make_micro(NR, True)
    micro_e = make_micro(NE, False) if NE else None


    @kernel
    def matmul_cpu(a: A_T, b: B_T, bias: BIAS_T, c: C_T, cw: C_T, wa: f32[wsa], wb: f32[wsb], bidx: IDX_T):
        NF = batch * n if FOLD else n         # columns: with FOLD all images' side by side
        LB = 1 if FOLD else batch              # batches the loops run (C's image is then per tile)
        MP = (m + MR - 1) // MR
        NP = (NF + NR - 1) // NR
        KB = (k + KC - 1) // KC               # K blocks of nearly equal size, at most KC
        CH = (k + PACK_CHUNK - 1) // PACK_CHUNK
        PJ = NP if PACK_B or n < NR else 0
        if SPLIT_M and not PRE_B:    # B packed once, by all cores (without PACK_B: only when narrower than a panel)
            for q in PAR((batch if B_BATCHED and not FOLD else 1) * PJ * CH):
                bj = q // (PJ * CH)
                j = q // CH % PJ + NP - PJ
                k0 = q % CH * PACK_CHUNK
                if FOLD:
                    pack_b_fold(b, wb, (j * k + k0) * NR, j, k0, min(PACK_CHUNK, k - k0))
                else:
                    pack_b(b, wb, ((bj * PJ + j - NP + PJ) * k + k0) * NR, bj, j, k0, min(PACK_CHUNK, k - k0))
        elif not SPLIT_M and PACK_A and not PRE_A:
            for q in PAR((batch if A_BATCHED else 1) * MP * CH):   # A, packed once, by all cores
                ai = q // (MP * CH)
                i = q // CH % MP
                k0 = q % CH * PACK_CHUNK
                pack_a(a, wa, ((ai * MP + i) * k + k0) * MR, ai, i, k0, min(PACK_CHUNK, k - k0))
        if INDEX_N:      # my column panels outer, every batch inner: batches of one matrix in a row reuse its panels
            for p in CORES:
                j0 = p * NP // P
                j1 = (p + 1) * NP // P
                for jb in range(j0, j1, NCB):
                    je = min(jb + NCB, j1)
                    for bi in range(batch):
                        ai = bi if A_BATCHED else 0
                        # this batch's matrix, as an embedding reads it: from the end when negative, clamped
                        bj = min(max(cast(select(bidx[bi] < 0, bidx[bi] + BB, bidx[bi]), i32), 0), BB - 1)
                        for pb in range(KB):
                            k0 = pb * k // KB
                            kc = (pb + 1) * k // KB - k0
                            for i in range(MP):
                                for j in range(jb, je):
                                    aoff = ((ai * MP + i) * k + k0) * MR
                                    boff = ((bj * NP + j) * k + k0) * NR
                                    if NE and NF - j * NR <= NE:            # narrow: the thin last panel
                                        micro_e(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                                pb == 0, pb == KB - 1)
                                    else:
                                        micro(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                              pb == 0, pb == KB - 1)
        else:
            for p in CORES:
                units = MP if SPLIT_M else NP
                u0 = p * (LB * units) // P
                u1 = (p + 1) * (LB * units) // P
                for bi in range(u0 // units, (u1 + units - 1) // units):
                    ai = bi if A_BATCHED else 0
                    bj = bi if B_BATCHED and not FOLD else 0
                    lo = max(u0 - bi * units, 0)
                    hi = min(u1 - bi * units, units)
                    if SPLIT_M:   # my row panels lo..hi, MCB at a time; B blocks of NCB panels pass by
                        for ib in range(lo, hi, MCB):
                            for jb in range(0, NP, NCB):
                                for pb in range(KB):
                                    k0 = pb * k // KB
                                    kc = (pb + 1) * k // KB - k0
                                    for i in range(ib, min(ib + MCB, hi)):
                                        aoff = (((ai if PRE_A else bi) * MP + i) * k + k0) * MR
                                        if PACK_A and jb == 0 and not PRE_A:
                                            pack_a(a, wa, aoff, ai, i, k0, kc)
                                        for j in range(jb, min(jb + NCB, NP)):
                                            boff = ((bj * PJ + j - NP + PJ) * k + k0) * NR
                                            if NE and NF - j * NR <= NE:        # narrow: the thin last panel
                                                micro_e(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                                        pb == 0, pb == KB - 1)
                                            else:
                                                micro(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                                      pb == 0, pb == KB - 1)
                    else:         # my column panels lo..hi, NCB at a time, each K block packed as used
                        for jb in range(lo, hi, NCB):
                            je = min(jb + NCB, hi)
                            for pb in range(KB):
                                k0 = pb * k // KB
                                kc = (pb + 1) * k // KB - k0
                                if FOLD:
                                    for j in range(jb, je):
                                        pack_b_fold(b, wb, (p * NCB + j - jb) * KC * NR, j, k0, kc)
                                elif not PRE_B:
                                    for j in range(jb if PACK_B or n < NR else je, je):
                                        pack_b(b, wb, (p * NCB + j - jb) * KC * NR, bj, j, k0, kc)
                                for i in range(MP):
                                    for j in range(jb, je):
                                        aoff = ((ai * MP + i) * k + k0) * MR
                                        boff = ((bj * NP + j) * k + k0) * NR if PRE_B else (p * NCB + j - jb) * KC * NR
                                        if NE and NF - j * NR <= NE:            # narrow: the thin last panel
                                            micro_e(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                                    pb == 0, pb == KB - 1)
                                        else:
                                            micro(a, b, wa, wb, bias, c, cw, aoff, boff, ai, bj, bi, i, j, k0, kc,
                                                  pb == 0, pb == KB - 1)

    return matmul_cpu


def pack_a_panels(a: np.ndarray, mr: int) -> np.ndarray:
    """A ``(ba, m, k)`` as the kernel's packed row panels ``[ba][ceil(m / MR)][k][MR]`` (rows past
    ``m`` repeat the last row, as the kernel's own packing does), flat: a ``pre_a`` kernel's ``wa``."""
    return row_panels(a, mr, edge=True)


def pack_b_panels(b: np.ndarray, nr: int, trans_b: bool) -> np.ndarray:
    """B ``(bb, k, n)`` (or ``(bb, n, k)`` with ``trans_b``) as the kernel's packed column panels
    ``[bb][ceil(n / NR)][k][NR]`` (zeros past ``n``), flat: a ``pre_b`` kernel's ``wb``."""
    return row_panels(b, nr, transposed=not trans_b)


__all__ = ["PACK_CHUNK", "CpuConfig", "build_kernel", "pack_a_panels", "pack_b_panels"]
