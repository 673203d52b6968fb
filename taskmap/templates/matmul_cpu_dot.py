"""The CPU f32 matmul's dot-product kernel, for ``trans_b`` problems with a small side (GEMV-like:
``linear`` at batch 1..8, or its swapped form ``c^T = w x^T``).

With ``trans_b`` both operands are rows of length ``k`` (``a (m, k)``, ``b (n, k)``), so a tile
of ``MR`` rows of A by ``NR`` rows of B is ``MR * NR`` dot products, vectorized along K:
``repeat(MR * NR, 1) * spatial(1, V)`` — one accumulator vector per dot product, the lanes
along K.  Each K step loads ``MR + NR`` vectors (straight from the operands, no packing: the
big operand is streamed once, the small one stays in L1) and does ``MR * NR`` FMAs; the last,
partial vector of K is a masked step; at the end the lanes of every accumulator are added up by
a tree (``V -> 8 -> 4 -> 2 -> 1``) and the tile is stored to ``c`` (with the bias) — once, so
epilogues fuse into its stores as with the blocked kernel (``cw``, ``wa``, ``wb`` are unused;
the parameters are the same).  Cores take contiguous ranges of the ``batch * MP * NP`` tiles,
``NP`` (the columns) innermost.
"""
from dataclasses import dataclass

from ..ir.mapping import repeat, spatial
from ..lang import f32, func, i32, i64, register_tensor, symbol, unroll
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel


@dataclass(frozen=True)
class DotConfig:
    """Everything the dot-product (or row-streaming) kernel's code depends on."""

    mr: int             # rows of A per tile
    nr: int             # rows of B per tile
    lanes: int          # f32 lanes of a vector register
    cores: int
    a_batched: bool
    b_batched: bool
    bias: bool
    trans_c: bool = False
    rows: bool = False  # the row-streaming kernel (:mod:`.matmul_cpu_rows`; nr: rows of B per step)

    def workspace(self, batch: int, m: int, n: int, k: int) -> tuple[int, int]:
        return 1, 1


def build_dot_kernel(cfg: DotConfig) -> Kernel:
    MR, NR, V, P, T = cfg.mr, cfg.nr, cfg.lanes, cfg.cores, cfg.mr * cfg.nr
    BIAS, TRANS_C = cfg.bias, cfg.trans_c
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    dots = repeat(T, 1) * spatial(1, V)                      # T accumulators, lanes along K
    half8, half4, half2 = (repeat(T, 1) * spatial(1, w) for w in (8, 4, 2))   # the lane tree's steps
    batch, m, n, k, nbias = symbol("batch"), symbol("m"), symbol("n"), symbol("k"), symbol("nbias")
    wsa, wsb, nidx = symbol("wsa"), symbol("wsb"), symbol("nidx")
    A_T = f32[batch if cfg.a_batched else 1, m, k]
    B_T = f32[batch if cfg.b_batched else 1, n, k]
    BIAS_T = (f32[m] if TRANS_C else f32[n]) if BIAS else f32[nbias]
    C_T = f32[batch, n, m] if TRANS_C else f32[batch, m, n]

    @func
    def dot_tile(a: A_T, b: B_T, bias: BIAS_T, c: C_T, ai: i32, bj: i32, ci: i32, i: i32, j: i32):
        """C[ci] rows i*MR.., columns j*NR.. = A rows . B rows (+ bias); rows past the ends
        repeat the last row (their results are not stored)."""
        acc = register_tensor(f32, [T, V])
        r0 = i * MR
        c0 = j * NR
        for t, l in dots.vectorize():
            acc[t, l] = 0.0
        for kk in range(k // V):
            for t, l in dots.vectorize():
                acc[t, l] += a[ai, min(r0 + t // NR, m - 1), kk * V + l] * b[bj, min(c0 + t % NR, n - 1), kk * V + l]
        kt = k // V * V
        if kt < k:                          # the last, partial vector of K
            for t, l in dots.vectorize():
                acc[t, l] += a[ai, min(r0 + t // NR, m - 1), kt + l] * b[bj, min(c0 + t % NR, n - 1), kt + l] \
                    if kt + l < k else 0.0
        if V > 8:
            for t, l in half8.vectorize():
                acc[t, l] += acc[t, l + 8]
        if V > 4:
            for t, l in half4.vectorize():
                acc[t, l] += acc[t, l + 4]
        for t, l in half2.vectorize():
            acc[t, l] += acc[t, l + 2]
        for t in unroll(T):
            r = r0 + t // NR
            s = c0 + t % NR
            if r < m and s < n:
                if TRANS_C and BIAS:
                    c[ci, s, r] = acc[t, 0] + acc[t, 1] + bias[r]
                elif TRANS_C:
                    c[ci, s, r] = acc[t, 0] + acc[t, 1]
                elif BIAS:
                    c[ci, r, s] = acc[t, 0] + acc[t, 1] + bias[s]
                else:
                    c[ci, r, s] = acc[t, 0] + acc[t, 1]

    @kernel
    def matmul_cpu(a: A_T, b: B_T, bias: BIAS_T, c: C_T, cw: C_T, wa: f32[wsa], wb: f32[wsb],
                   bidx: i64[nidx]):     # bidx: the blocked kernel's (b_groups), unused
        MP = (m + MR - 1) // MR
        NP = (n + NR - 1) // NR
        T = batch * MP * NP
        for p in CORES:
            for u in range(p * T // P, (p + 1) * T // P):
                dot_tile(a, b, bias, c, u // (MP * NP) if cfg.a_batched else 0, u // (MP * NP) if cfg.b_batched else 0,
                         u // (MP * NP), u // NP % MP, u % NP)

    return matmul_cpu


__all__ = ["DotConfig", "build_dot_kernel"]
