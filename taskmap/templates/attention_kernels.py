"""Kernels of the fused attention templates (``O = softmax(Q K^T * scale + mask) V``), in the DSL.

Every kernel sees the operator as flat batches (the operator layer folds batch and head
dimensions, see :mod:`taskmap.ops.attention`):

    q (bh, L, E)   k (bk, S, E)   v (bk, S, EV)   mask (mb, ml, S)   o (bh, L, EV)

Batch ``b`` of ``q`` reads ``k``/``v`` batch ``(b // kd) % km`` and mask batch ``(b // md) % mm``
(runtime scalars): that covers broadcasting batch dimensions and grouped-query attention (a
head group of ``kd`` query heads shares a key/value head).  ``ml`` is 1 (one mask row for all
query rows) or ``L``.  The mask is boolean (True: attend) or additive; ``causal`` keeps
keys ``j <= i`` (top-left aligned, as torch).  ``E`` and ``EV`` (head sizes) are compile-time;
``L``, ``S`` and the batch sizes are symbolic: one kernel serves every length.

Both kernels run the *online softmax* (flash attention): a block of query rows streams the keys
in blocks, keeping per row the running maximum ``m`` and sum ``l`` of ``exp(s - m)`` and the
unnormalised output ``acc``; a new block with maximum ``m'`` rescales them by ``exp(m - m')``.
Rows whose keys are all masked keep ``m = -inf`` (their ``exp`` terms are computed against 0
and vanish) and end with ``l = 0``: their output is 0, as torch gives.  Key blocks entirely
above the diagonal are skipped under ``causal``.

* :func:`build_cpu` — a worker (a core) per ``(batch, group of QG blocks of BM query rows)``,
  dealt out cyclically under ``causal`` (unequal work), else in contiguous ranges, all in one
  parallel region.  A core packs ``K^T`` of the head it works on into its part of the workspace
  (key blocks ``[block][E][BN]``; again only when the head changes), and stages the ``BM x E``
  rows of Q of each of its row tiles once (a prologue fused into Q — a rotary embedding — runs
  once per row, not in the score micro-kernel for every key block), so the score tile
  ``BM x BN`` is a register-blocked micro-kernel ``repeat(BM, BN // V) * spatial(1, V)`` with
  lanes along keys; ``P V`` accumulates into the ``BM x EV`` output tile with lanes along ``EV``
  (``repeat(BM, EVP // V) * spatial(1, V)``).  The QG row blocks of a group take each key block
  in turn (their state stays in L1).  Row sums stay lane-wise until the end; row maxima fold
  across lanes by a tree.  ``exp`` is computed with multiply-adds and bit-casts (:func:`exp_neg`)
  so that the loops stay vectorized.
* :func:`build_gpu` — a thread block per ``(block of BM query rows, batch)``: ``NW`` groups of
  32 lanes (a warp, or half a 64-lane wavefront) of ``RW`` rows each; a key tile of
  ``BN = 32 * KPL`` keys and its values staged in shared memory; a lane scores ``KPL`` keys of a
  row, rows are reduced by shuffle butterflies within the group, and the lane owns output
  columns ``d = c * 32 + lane``.  (The tensor-core kernel is in :mod:`.attention_tc`.)
"""

from dataclasses import dataclass

from ..ir.dtypes import ScalarType
from ..ir.mapping import auto_map, repeat, spatial
from ..lang import (
    FULL_MASK,
    attrs,
    bitcast,
    blockIdx,
    bool_,
    copy16,
    exp,
    f32,
    func,
    i32,
    register_tensor,
    select,
    shared_tensor,
    shfl_xor_sync,
    symbol,
    syncthreads,
    syncwarp,
    threadIdx,
    u32,
    unroll,
)
from ..lang.kernel import kernel
from ..runtime.kernel import Kernel
from ..schedule.fastmath import (
    EXP_POLY,
    HIGHEST,
    LN2_HI,
    LN2_LO,
    LOG2E,
    LOWEST,
    SHIFTER,
)

NEG_INF = float("-inf")

# exp(x) from fused multiply-adds and bit-casts (the method and its limits: taskmap.schedule.fastmath).
_Q = EXP_POLY


@func
def exp_neg(x: f32) -> f32:
    """``exp(x)`` (-inf gives 0, NaN gives NaN, results below 2^-125.5 are flushed to 0) with no
    libm call and no float -> int conversion, so that gcc keeps the loops around it vectorized:
    the DSL form of :func:`taskmap.schedule.fastmath.fast_exp`."""
    lo = select(x < LOWEST, LOWEST, x)
    xc = select(lo > HIGHEST, HIGHEST, lo)
    t = xc * LOG2E + SHIFTER
    n = t - SHIFTER
    r = (xc - n * LN2_HI) - n * LN2_LO
    q = (((((_Q[6] * r + _Q[5]) * r + _Q[4]) * r + _Q[3]) * r + _Q[2]) * r + _Q[1]) * r + _Q[0]
    return q * bitcast((bitcast(t, u32) + 126) << 23, f32)


class MaskKind:
    """What the kernel's mask argument holds (plain ints: part of a frozen, hashable config)."""

    NONE = "none"
    BOOL = "bool"
    ADD = "add"


@dataclass(frozen=True)
class CpuAttnConfig:
    bm: int            # query rows of a register tile
    bn: int            # keys per block (a multiple of the vector lanes)
    qg: int            # row tiles that take each key block in turn (its K^T and V stay in cache)
    e: int             # head size of q and k
    ev: int            # head size of v
    lanes: int         # f32 lanes of a vector register
    cores: int
    mask: str          # MaskKind
    mask_rows: bool    # the mask has a row per query (else one row for all)
    causal: bool

    @property
    def evp(self) -> int:
        return -(-self.ev // self.lanes) * self.lanes

    def workspace(self, s: int) -> int:
        """f32 elements of the packed K^T: a head's for each core."""
        return self.cores * -(-s // self.bn) * self.e * self.bn


def mask_type(kind: str) -> ScalarType:
    return bool_ if kind == MaskKind.BOOL else f32


def build_cpu(cfg: CpuAttnConfig) -> Kernel:
    BM, BN, E, EV, V, P, QG = cfg.bm, cfg.bn, cfg.e, cfg.ev, cfg.lanes, cfg.cores, cfg.qg
    EVP = cfg.evp
    assert BN % V == 0
    CAUSAL, MASK, MROWS, BOOL = cfg.causal, cfg.mask != MaskKind.NONE, cfg.mask_rows, cfg.mask == MaskKind.BOOL
    EV_FULL = EV == EVP
    NV = BN // V
    CORES = spatial(P).parallel() if P > 1 else spatial(1).sequential()
    tile_s = repeat(BM, NV) * spatial(1, V)           # the score tile: lanes along keys
    tile_o = repeat(BM, EVP // V) * spatial(1, V)     # the output tile: lanes along EV
    tile_r = repeat(BM, 1) * spatial(1, V)            # one vector per row (row max / sum)
    half8, half4, half2 = (repeat(BM, 1) * spatial(1, w) for w in (8, 4, 2))   # the tree's steps
    bh, bk, mb, ml, L, S, ws = (symbol(x) for x in ("bh", "bk", "mb", "ml", "L", "S", "ws"))
    MASK_T = mask_type(cfg.mask)[mb, ml, S] if MASK else f32[mb, ml, symbol("ms")]   # no mask: a dummy

    @func
    def row_max(s: f32[BM, BN], red: f32[BM, V], out: f32[BM]):
        """out[r] = max of s[r, :]: lane-wise over the vectors of a row, then a tree across lanes."""
        for r, l in tile_r.vectorize():
            red[r, l] = s[r, l]
        for c in range(1, NV):
            for r, l in tile_r.vectorize():
                red[r, l] = select(red[r, l] > s[r, c * V + l], red[r, l], s[r, c * V + l])
        if V > 8:
            for r, l in half8.vectorize():
                red[r, l] = select(red[r, l] > red[r, l + 8], red[r, l], red[r, l + 8])
        if V > 4:
            for r, l in half4.vectorize():
                red[r, l] = select(red[r, l] > red[r, l + 4], red[r, l], red[r, l + 4])
        for r, l in half2.vectorize():
            red[r, l] = select(red[r, l] > red[r, l + 2], red[r, l], red[r, l + 2])
        for r in range(BM):
            out[r] = select(red[r, 0] > red[r, 1], red[r, 0], red[r, 1])

    @func
    def row_sum(s: f32[BM, BN], lsum: f32[QG * BM * V], alpha: f32[BM], off: i32):
        """lsum[off + r * V + l] = lsum[...] * alpha[r] + the lane-l part of the sum of s[r, :]
        (lane-wise: the lanes are added up once, at the end)."""
        for r, l in tile_r.vectorize():
            lsum[off + r * V + l] = lsum[off + r * V + l] * alpha[r] + s[r, l]
        for c in range(1, NV):
            for r, l in tile_r.vectorize():
                lsum[off + r * V + l] = lsum[off + r * V + l] + s[r, c * V + l]

    @func
    def pack_kt(k: f32[bk, S, E], kt: f32[ws], off: i32, kb: i32):
        """kt[off + ((j * E + e) * BN + n] = K[kb, j * BN + n, e] (keys past S: zeros)."""
        for j in range((S + BN - 1) // BN):
            for e in range(E):
                for n in spatial(BN).vectorize():
                    kt[off + (j * E + e) * BN + n] = k[kb, j * BN + n, e] if j * BN + n < S else 0.0

    @func
    def scores(qs: f32[QG * BM * E], kt: f32[ws], s: f32[BM, BN], qoff: i32, koff: i32):
        """s = Q K^T of one row tile (staged at qoff) and one key block (packed at koff): the BM x BN
        register tile."""
        t = register_tensor(f32, [BM, BN])
        for r, n in tile_s.vectorize():
            t[r, n] = 0.0
        for e in range(E):
            for r, n in tile_s.vectorize():
                t[r, n] += qs[qoff + r * E + e] * kt[koff + e * BN + n]
        for r, n in tile_s.vectorize():
            s[r, n] = t[r, n]

    @func
    def values(v: f32[bk, S, EV], s: f32[BM, BN], acc: f32[QG * BM * EVP], alpha: f32[BM], kb: i32, n0: i32,
               cnt: i32, off: i32):
        """acc = acc * alpha + P V over the cnt keys of a block: the BM x EVP register tile (at off)."""
        t = register_tensor(f32, [BM, EVP])
        for r, d in tile_o.vectorize():
            t[r, d] = acc[off + r * EVP + d] * alpha[r]
        for n in range(cnt):
            if EV_FULL:
                for r, d in tile_o.vectorize():
                    t[r, d] += s[r, n] * v[kb, n0 + n, d]
            else:
                for r, d in tile_o.vectorize():
                    t[r, d] += s[r, n] * (v[kb, n0 + n, d] if d < EV else 0.0)
        for r, d in tile_o.vectorize():
            acc[off + r * EVP + d] = t[r, d]

    @kernel
    def attention_cpu(q: f32[bh, L, E], k: f32[bk, S, E], v: f32[bk, S, EV], mask: MASK_T,
                      o: f32[bh, L, EV], kt: f32[ws], scale: f32, kd: i32, km: i32, md: i32, mm: i32):
        NKB = (S + BN - 1) // BN
        QB = (L + BM - 1) // BM
        QGB = (QB + QG - 1) // QG         # groups of QG row tiles that share each key block
        for p in CORES:
            packed = -1                   # the key / value batch whose K^T is in my part of kt
            # causal units have unequal work: dealt cyclically; others in contiguous ranges, so a
            # core meets (and packs) as few heads as possible
            lo = p * (bh * QGB) // P
            cnt = (bh * QGB - p + P - 1) // P if CAUSAL else (p + 1) * (bh * QGB) // P - lo
            for i in range(cnt):
                u = p + i * P if CAUSAL else lo + i
                b = u // QGB
                g0 = u % QGB * QG
                ng = min(QG, QB - g0)
                kb = b // kd % km
                if kb != packed:
                    pack_kt(k, kt, p * NKB * E * BN, kb)
                    packed = kb
                mbi = b // md % mm
                nkb = min(NKB, ((g0 + ng) * BM - 1) // BN + 1) if CAUSAL else NKB
                qs = register_tensor(f32, [QG * BM * E])
                acc = register_tensor(f32, [QG * BM * EVP])
                lsum = register_tensor(f32, [QG * BM * V])
                mrow = register_tensor(f32, [QG * BM])
                s = register_tensor(f32, [BM, BN])
                red = register_tensor(f32, [BM, V])
                mnew = register_tensor(f32, [BM])
                alpha = register_tensor(f32, [BM])
                for g in range(ng):
                    for r in range(BM):       # the row tile's Q, staged once (a fused prologue runs once)
                        for e in spatial(E).vectorize():
                            qs[(g * BM + r) * E + e] = q[b, min((g0 + g) * BM + r, L - 1), e]
                    for r, d in tile_o.vectorize():
                        acc[(g * BM + r) * EVP + d] = 0.0
                    for r, l in tile_r.vectorize():
                        lsum[(g * BM + r) * V + l] = 0.0
                    for r in range(BM):
                        mrow[g * BM + r] = NEG_INF
                for j in range(nkb):
                    n0 = j * BN
                    koff = (p * NKB + j) * E * BN
                    for g in range(ng):
                        r0 = (g0 + g) * BM
                        if not CAUSAL or n0 <= r0 + BM - 1:
                            scores(qs, kt, s, g * BM * E, koff)
                            for r, n in tile_s.vectorize():
                                x = s[r, n] * scale
                                ok = n0 + n < S
                                if CAUSAL:
                                    ok = ok and n0 + n <= r0 + r
                                if MASK:
                                    mv = mask[mbi, min(r0 + r, L - 1) if MROWS else 0, min(n0 + n, S - 1)]
                                    if BOOL:
                                        ok = ok and mv
                                    else:
                                        x = x + mv
                                s[r, n] = x if ok else NEG_INF
                            row_max(s, red, mnew)
                            for r in spatial(BM).vectorize():
                                mo = mrow[g * BM + r]
                                mx = select(mnew[r] > mo, mnew[r], mo)
                                mnew[r] = mx if mx > NEG_INF else 0.0     # all masked so far: exp(-inf - 0) = 0
                                alpha[r] = exp_neg(mo - mnew[r])
                                mrow[g * BM + r] = mx
                            for r, n in tile_s.vectorize():
                                s[r, n] = exp_neg(s[r, n] - mnew[r])
                            row_sum(s, lsum, alpha, g * BM * V)
                            values(v, s, acc, alpha, kb, n0, min(BN, S - n0), g * BM * EVP)
                for g in range(ng):
                    r0 = (g0 + g) * BM
                    for r in range(BM):
                        t = 0.0
                        for l in range(V):
                            t += lsum[(g * BM + r) * V + l]
                        alpha[r] = 1.0 / t if t > 0.0 else 0.0
                    if r0 + BM <= L and EV_FULL:
                        for r, d in tile_o.vectorize():
                            o[b, r0 + r, d] = acc[(g * BM + r) * EVP + d] * alpha[r]
                    else:
                        for r, d in tile_o.vectorize():
                            if r0 + r < L and d < EV:
                                o[b, r0 + r, d] = acc[(g * BM + r) * EVP + d] * alpha[r]

    return attention_cpu


#: Registers per thread the GPU kernel may spend on the next K / V tile (more: loaded when used).
MAX_PREFETCH = 32


@dataclass(frozen=True)
class GpuAttnConfig:
    nw: int            # warps per block
    rw: int            # query rows per warp
    kpl: int           # keys per lane in a key tile
    lanes: int         # lanes of a row group (32 on every target)
    e: int
    ev: int
    mask: str          # MaskKind
    mask_rows: bool
    causal: bool

    @property
    def bm(self) -> int:
        return self.nw * self.rw

    @property
    def bn(self) -> int:
        return self.lanes * self.kpl

    @property
    def cv(self) -> int:
        """Output columns per lane."""
        return -(-self.ev // self.lanes)

    @property
    def vec(self) -> bool:
        """Shared rows read as 16-byte vectors (a head size that is a multiple of 4)."""
        return self.e % 4 == 0

    @property
    def vec_kv(self) -> bool:
        """K and V tiles loaded in 16-byte chunks (both head sizes multiples of 4)."""
        return self.vec and self.ev % 4 == 0

    @property
    def staged(self) -> int:
        """Floats of a K and a V tile per thread."""
        return -(-self.bn * self.e // (self.nw * self.lanes)) + -(-self.bn * self.ev // (self.nw * self.lanes))

    @property
    def prefetch(self) -> bool:
        """The next K / V tile loaded into registers while this one is multiplied: when that
        takes at most :data:`MAX_PREFETCH` registers per thread."""
        return self.vec_kv and self.staged <= MAX_PREFETCH

    @property
    def k_pad(self) -> int:
        """Floats after each K row in shared memory: 1 for scalar reads (lane n, row n: bank n),
        4 for 16-byte ones (rows 68 words apart: 8 lanes cover the 32 banks)."""
        return 4 if self.vec else 1

    def shared_bytes(self) -> int:
        return 4 * (self.bm * self.e + self.bn * (self.e + self.k_pad) + self.bn * self.ev + self.bm * self.bn)


def build_gpu(cfg: GpuAttnConfig) -> Kernel:
    NW, RW, KPL, WS, E, EV = cfg.nw, cfg.rw, cfg.kpl, cfg.lanes, cfg.e, cfg.ev
    BM, BN, CV, VEC, KPAD = cfg.bm, cfg.bn, cfg.cv, cfg.vec, cfg.k_pad
    THREADS = NW * WS
    CAUSAL, MASK, MROWS, BOOL = cfg.causal, cfg.mask != MaskKind.NONE, cfg.mask_rows, cfg.mask == MaskKind.BOOL
    load_q = auto_map((BM, E), THREADS)
    load_k = auto_map((BN, E), THREADS)
    load_v = auto_map((BN, EV), THREADS)
    GV = cfg.vec_kv                 # K and V tiles in 16-byte chunks
    load_k4 = auto_map((BN, E // 4 if GV else 1), THREADS)
    load_v4 = auto_map((BN, EV // 4 if GV else 1), THREADS)
    RK, RV = load_k4.tasks_per_worker * 4, load_v4.tasks_per_worker * 4
    PRE = cfg.prefetch              # ... the next tile's in flight (registers) while this one is used
    bh, bk, mb, ml, L, S = (symbol(x) for x in ("bh", "bk", "mb", "ml", "L", "S"))
    MASK_T = mask_type(cfg.mask)[mb, ml, S] if MASK else f32[mb, ml, symbol("ms")]

    @kernel
    def attention_gpu(q: f32[bh, L, E], k: f32[bk, S, E], v: f32[bk, S, EV], mask: MASK_T, o: f32[bh, L, EV],
                      scale: f32, kd: i32, km: i32, md: i32, mm: i32):
        attrs.grid_dim = ((L + BM - 1) // BM, bh)
        attrs.block_dim = THREADS
        sq = shared_tensor(f32, [BM, E])
        sk = shared_tensor(f32, [BN, E + KPAD])       # padded rows: lane n reads row n, no bank conflicts
        sv = shared_tensor(f32, [BN, EV])
        sp = shared_tensor(f32, [BM, BN])             # a warp's probabilities, read back by its lanes
        acc = register_tensor(f32, [RW, CV])
        sc = register_tensor(f32, [RW, KPL])
        qf = register_tensor(f32, [RW * 4])           # 4 columns of the warp's query rows (or 4 probabilities)
        kf = register_tensor(f32, [4])                # 4 columns of a lane's key row
        mrow = register_tensor(f32, [RW])
        lrow = register_tensor(f32, [RW])
        rk = register_tensor(f32, [RK])               # the next K / V tile, on its way to shared memory
        rv = register_tensor(f32, [RV])
        b = blockIdx.y
        r0 = blockIdx.x * BM
        w = threadIdx.x // WS
        lane = threadIdx.x % WS
        kb = b // kd % km
        mbi = b // md % mm
        for i, e in load_q.on(threadIdx.x):
            sq[i, e] = q[b, r0 + i, e] if r0 + i < L else 0.0
        for rr in range(RW):
            mrow[rr] = NEG_INF
            lrow[rr] = 0.0
            for c in range(CV):
                acc[rr, c] = 0.0
        ntiles = (S + BN - 1) // BN
        if CAUSAL:
            ntiles = min(ntiles, (r0 + BM - 1) // BN + 1)
        for j in range(ntiles):
            n0 = j * BN
            if PRE:     # f = 0: tile 0 into registers (first pass); f = 1: tile j staged, tile j + 1 fetched
                for f in unroll(2):
                    if f == 1:
                        syncthreads()                 # the previous tile is consumed
                        for qk, (n, e4) in enumerate(load_k4.on(threadIdx.x)):
                            copy16(sk[n, e4 * 4], rk[qk * 4])
                        for qv, (n, d4) in enumerate(load_v4.on(threadIdx.x)):
                            copy16(sv[n, d4 * 4], rv[qv * 4])
                        syncthreads()
                    nf = n0 + f * BN
                    if (f == 0 and j == 0) or (f == 1 and j + 1 < ntiles):
                        for qk, (n, e4) in enumerate(load_k4.on(threadIdx.x)):
                            if nf + n < S:
                                copy16(rk[qk * 4], k[kb, nf + n, e4 * 4])
                            else:
                                for t in unroll(4):
                                    rk[qk * 4 + t] = 0.0
                        for qv, (n, d4) in enumerate(load_v4.on(threadIdx.x)):
                            if nf + n < S:
                                copy16(rv[qv * 4], v[kb, nf + n, d4 * 4])
                            else:
                                for t in unroll(4):
                                    rv[qv * 4 + t] = 0.0
            elif GV:
                syncthreads()                         # the previous tile is consumed
                for n, e4 in load_k4.on(threadIdx.x):
                    if n0 + n < S:
                        copy16(sk[n, e4 * 4], k[kb, n0 + n, e4 * 4])
                    else:
                        for t in unroll(4):
                            sk[n, e4 * 4 + t] = 0.0
                for n, d4 in load_v4.on(threadIdx.x):
                    if n0 + n < S:
                        copy16(sv[n, d4 * 4], v[kb, n0 + n, d4 * 4])
                    else:
                        for t in unroll(4):
                            sv[n, d4 * 4 + t] = 0.0
                syncthreads()
            else:
                syncthreads()
                for n, e in load_k.on(threadIdx.x):
                    sk[n, e] = k[kb, n0 + n, e] if n0 + n < S else 0.0
                for n, d in load_v.on(threadIdx.x):
                    sv[n, d] = v[kb, n0 + n, d] if n0 + n < S else 0.0
                syncthreads()
            for rr in range(RW):
                for c in range(KPL):
                    sc[rr, c] = 0.0
            if VEC:                                   # 16-byte reads: RW + KPL loads per 4 RW KPL FMAs
                for e4 in range(E // 4):
                    for rr in unroll(RW):
                        copy16(qf[rr * 4], sq[w * RW + rr, e4 * 4])      # the same for the warp's lanes
                    for c in unroll(KPL):
                        copy16(kf[0], sk[c * WS + lane, e4 * 4])
                        for t in unroll(4):
                            for rr in unroll(RW):
                                sc[rr, c] += qf[rr * 4 + t] * kf[t]
            else:
                for e in range(E):
                    for c in range(KPL):
                        kv = sk[c * WS + lane, e]
                        for rr in range(RW):
                            sc[rr, c] += sq[w * RW + rr, e] * kv
            for rr in range(RW):
                i = r0 + w * RW + rr
                mx = mrow[rr]
                for c in range(KPL):
                    n = n0 + c * WS + lane
                    x = sc[rr, c] * scale
                    ok = n < S
                    if CAUSAL:
                        ok = ok and n <= i
                    if MASK:
                        mv = mask[mbi, min(i, L - 1) if MROWS else 0, min(n, S - 1)]
                        if BOOL:
                            ok = ok and mv
                        else:
                            x = x + mv
                    x = x if ok else NEG_INF
                    sc[rr, c] = x
                    mx = max(mx, x)
                off = WS // 2
                while off > 0:
                    mx = max(mx, shfl_xor_sync(FULL_MASK, mx, off))
                    off = off // 2
                msafe = mx if mx > NEG_INF else 0.0
                sm = 0.0
                for c in range(KPL):
                    pv = exp(sc[rr, c] - msafe)
                    sp[w * RW + rr, c * WS + lane] = pv
                    sm += pv
                off = WS // 2
                while off > 0:
                    sm += shfl_xor_sync(FULL_MASK, sm, off)
                    off = off // 2
                alpha = exp(mrow[rr] - msafe)
                lrow[rr] = lrow[rr] * alpha + sm
                mrow[rr] = mx
                for c in range(CV):
                    acc[rr, c] = acc[rr, c] * alpha
            syncwarp()
            nn = min(BN, S - n0)
            for n4 in range(nn // 4):                 # the warp's probabilities, 4 keys per 16-byte read
                for rr in unroll(RW):
                    copy16(qf[rr * 4], sp[w * RW + rr, n4 * 4])
                for t in unroll(4):
                    for c in unroll(CV):
                        vv = sv[n4 * 4 + t, min(c * WS + lane, EV - 1)]
                        for rr in unroll(RW):
                            acc[rr, c] += qf[rr * 4 + t] * vv
            for n in range(nn // 4 * 4, nn):
                for c in range(CV):
                    vv = sv[n, min(c * WS + lane, EV - 1)]
                    for rr in range(RW):
                        acc[rr, c] += sp[w * RW + rr, n] * vv
        for rr in range(RW):
            i = r0 + w * RW + rr
            inv = 1.0 / lrow[rr] if lrow[rr] > 0.0 else 0.0
            for c in range(CV):
                d = c * WS + lane
                if i < L and d < EV:
                    o[b, i, d] = acc[rr, c] * inv

    return attention_gpu
