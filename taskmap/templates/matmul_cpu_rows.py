"""The CPU f32 matmul's row-streaming kernel, for small-M problems with B stored ``(k, n)``
(GEMV-like: ``x @ w`` at batch 1..8), with the blocked kernel's parameters (``wa``, ``wb`` unused).

B is streamed by rows, ``KU`` (:class:`DotConfig` ``nr``) rows at a time, front to back as the
hardware prefetchers like, over a block of at most ``ROW_BLOCK / MR`` columns (fewer when
that leaves a core without one); the ``MR`` rows of C of
the block accumulate one vector at a time (``repeat(MR, 1) * spatial(1, V)``: ``MR`` vectors,
``KU`` FMAs each with the ``MR x KU`` elements of A held in registers) with partial sums in ``cw``
(the block stays in L1), and the last group of rows stores the final values to ``c`` — once,
so epilogues fuse into its stores.  The last, partial vector of a row is shifted left to end at
``n`` and stores only its own columns; the last, partial group of rows skips the missing rows.  B narrower than a vector is not handled here (the space
leaves such problems to the blocked kernel).  Cores take contiguous ranges of the
``batch * MP * blocks`` column blocks.
"""
from ..ir.mapping import repeat, spatial
from ..lang import bool_, f32, func, i32, i64, register_tensor, symbol, unroll
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from .matmul_cpu_dot import DotConfig

#: Floats of C (all MR rows) per column block: its partial sums stay in L1.
ROW_BLOCK = 4096


def build_rows_kernel(cfg: DotConfig) -> Kernel:
    MR, KU, V, P = cfg.mr, cfg.nr, cfg.lanes, cfg.cores
    BIAS, A_BATCHED, B_BATCHED = cfg.bias, cfg.a_batched, cfg.b_batched
    assert cfg.lanes > 0 and not cfg.trans_c
    NB = max(V, ROW_BLOCK // MR // V * V)                    # columns per block
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    col = repeat(MR, 1) * spatial(1, V)                      # one vector of each of the MR rows
    batch, m, n, k, nbias = symbol("batch"), symbol("m"), symbol("n"), symbol("k"), symbol("nbias")
    wsa, wsb, nidx = symbol("wsa"), symbol("wsb"), symbol("nidx")
    A_T = f32[batch if A_BATCHED else 1, m, k]
    B_T = f32[batch if B_BATCHED else 1, k, n]
    BIAS_T = f32[n] if BIAS else f32[nbias]
    C_T = f32[batch, m, n]

    @func
    def column(b: B_T, bias: BIAS_T, c: C_T, cw: C_T, ak: f32[MR, KU], bj: i32, ci: i32, r0: i32, c0: i32, lo: i32,
               k0: i32, first: bool_, last: bool_):
        """One vector of columns c0.. of the MR rows of C (+)= KU rows of B; stores columns >= lo."""
        acc = register_tensor(f32, [MR, V])
        if first and BIAS:
            for r, s in col.vectorize():
                acc[r, s] = bias[c0 + s]
        elif first:
            for r, s in col.vectorize():
                acc[r, s] = 0.0
        else:
            for r, s in col.vectorize():
                acc[r, s] = cw[ci, min(r0 + r, m - 1), c0 + s]
        if k0 + KU <= k:
            for u in unroll(KU):
                for r, s in col.vectorize():
                    acc[r, s] += ak[r, u] * b[bj, k0 + u, c0 + s]
        else:               # the last, partial group: missing rows add nothing (inf * 0 would be NaN)
            for u in unroll(KU):
                if k0 + u < k:
                    for r, s in col.vectorize():
                        acc[r, s] += ak[r, u] * b[bj, k0 + u, c0 + s]
        if last:
            for r, s in col.vectorize():
                if r0 + r < m and c0 + s >= lo:
                    c[ci, r0 + r, c0 + s] = acc[r, s]
        else:
            for r, s in col.vectorize():
                if r0 + r < m and c0 + s >= lo:
                    cw[ci, r0 + r, c0 + s] = acc[r, s]

    @func
    def rows_step(a: A_T, b: B_T, bias: BIAS_T, c: C_T, cw: C_T, ai: i32, bj: i32, ci: i32, r0: i32, j0: i32,
                  j1: i32, k0: i32, first: bool_, last: bool_):
        """C[ci] rows r0.., columns j0..j1 (+)= A[:, k0:k0+KU] B[k0:k0+KU, j0:j1] (n >= V)."""
        ak = register_tensor(f32, [MR, KU])
        for r in unroll(MR):
            for u in unroll(KU):
                ak[r, u] = a[ai, min(r0 + r, m - 1), k0 + u] if k0 + u < k else 0.0
        for v in range(j0, min(j1, n // V * V), V):
            column(b, bias, c, cw, ak, bj, ci, r0, v, v, k0, first, last)
        if j1 == n and n % V != 0:                        # the last vector, shifted to end at n
            column(b, bias, c, cw, ak, bj, ci, r0, n - V, n // V * V, k0, first, last)

    @kernel
    def matmul_cpu(a: A_T, b: B_T, bias: BIAS_T, c: C_T, cw: C_T, wa: f32[wsa], wb: f32[wsb],
                   bidx: i64[nidx]):     # bidx: the blocked kernel's (b_groups), unused
        MP = (m + MR - 1) // MR
        pieces = (P + batch * MP - 1) // (batch * MP)     # blocks per row group: every core gets one
        nb = min(NB, (n + pieces * V - 1) // (pieces * V) * V)
        NBS = (n + nb - 1) // nb
        T = batch * MP * NBS
        for p in CORES:
            for u in range(p * T // P, (p + 1) * T // P):
                bi = u // (MP * NBS)
                j0 = u % NBS * nb
                for k0 in range(0, k, KU):
                    rows_step(a, b, bias, c, cw, bi if A_BATCHED else 0, bi if B_BATCHED else 0, bi,
                              u // NBS % MP * MR, j0, min(j0 + nb, n), k0, k0 == 0, k0 + KU >= k)

    return matmul_cpu


__all__ = ["ROW_BLOCK", "build_rows_kernel"]
