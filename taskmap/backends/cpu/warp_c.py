"""GPU primitives emulated on the CPU with GPU semantics: the C code (part of ``runtime_c``) and
how :class:`~taskmap.ir.primitives.PrimCall` nodes are rendered as calls of it.

**Warp exchange.**  Each warp of a block has an exchange area of two slot arrays, one slot per
lane, used alternately by successive rendezvous (the warp's generation ``gen`` picks the array).
A lane executing a warp primitive writes its operand (value, predicate, fragments, a row
address) and its mask into its slot, tagged ``gen + 1``, and waits (``tm_warp_wait``).  The
scheduler resumes the warp's lanes once every runnable lane of the warp has stopped (see
``runtime_c``), after incrementing ``gen``; each lane then computes its own result from the
slots tagged with its generation: a lane *took part* iff its tag matches.  Double buffering
makes a second rendezvous unnecessary: a lane can only write the same array again two
rendezvous later, when every lane has finished reading it.

Semantics (CUDA's, where CUDA defines them): ``shfl_sync`` reads lane ``src_lane % warp_size``;
``shfl_down/up`` out of range, ``shfl_xor`` out of range, and any source lane that did not take
part or is not in the caller's mask give the caller its own value; votes and ballots count the
lanes in the mask that took part.  CUDA's rule is checked: the caller is in its mask, and every
non-exited lane the mask names executes the same primitive with the same mask at the same time
(a lane waiting at ``syncthreads()`` instead, or at another primitive, is a fault: divergent warp
code, undefined on a GPU).  ``mma_sync_m16n8k16`` and ``ldmatrix`` need all 32 lanes
(else the launch fails with a fault); ``mma`` adds the exact products (f16 / bf16, tf32) to C
exactly and rounds the sum toward zero, once, as the tensor cores do (products exact, sums
truncated: Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021; it reproduces the
3xTF32 errors measured on an H200 to 10%), so a kernel whose accumulation drifts under
truncation drifts here too.  ``wgmma_tf32`` / ``wgmma_f16`` are *deferred* like ``cp_async``: each thread queues
its wgmma, ``wgmma_commit`` closes a group, and ``wgmma_wait(n)`` runs all but the newest ``n``
groups — so a kernel that reads its accumulators before the wait gets wrong results here as it
might on a GPU; and a ``cp_async`` into a tile that a pending wgmma of the block reads faults
(the copy may land before the tensor cores read).

**Memory.**  Atomics are real atomics (blocks run in parallel on the cores); ``copy16`` is a
``memcpy`` that checks 16-byte alignment; ``transpose_block`` an in-register transpose
(``n`` = 16 with AVX-512: 16 loads, unpack / shuffle stages, 16 stores; ``n`` = 8 with AVX),
else a scalar double loop; ``cp_async`` copies are *deferred*: each thread keeps a
queue of pending copies, tagged with the group ``cp_async_commit`` closes, and
``cp_async_wait(n)`` performs all but the newest ``n`` committed groups — so a kernel that reads
shared memory without waiting reads stale data here too, as it might on a GPU.  A full queue
completes its oldest copy early, which is allowed.  Misaligned addresses are recorded as a fault.
"""
from __future__ import annotations

from typing import Any

from ...errors import UnsupportedError
from ...ir.dtypes import bf16
from ...ir.primitives import MBAR_OPS, WGMMA_OPS, Prim, PrimCall
from .tma_c import render_tma_c

WARP_TYPES_C = r"""
/* ---- GPU primitives: warp exchange areas and cp.async queues ------------------------------- */
#define TM_WARP_MAX 64
typedef struct {
  uint32_t tag;          /* the warp generation + 1 at which the lane posted it */
  int32_t op;            /* which primitive (the TM_OP_* codes) */
  uint64_t mask;
  int32_t arg;
  union { uint64_t u; const void *p; unsigned char b[24]; } d;
} tm_xslot;
typedef struct { uint32_t gen; tm_xslot slot[2][TM_WARP_MAX]; } tm_warp;

typedef struct { void *dst; const void *src; int32_t n, src_n; uint32_t group; } tm_cp_op;
#define TM_CPQ 32
typedef struct { tm_cp_op op[TM_CPQ]; uint32_t head, tail, committed; } tm_cpq;
/* a thread's pending wgmma, run in order when a wgmma_wait retires their group */
typedef struct { float *c; const void *a, *b; int32_t n, accumulate, kind; uint32_t group; } tm_wg_op;
#define TM_WGQ 64
typedef struct { tm_wg_op op[TM_WGQ]; uint32_t head, tail, committed; } tm_wgq;
/* the block's shared-memory tiles pending wgmma read (each range counted once per pending wgmma) */
typedef struct { uintptr_t lo, hi; int32_t refs; } tm_wg_range;
#define TM_WGR 64
typedef struct { tm_wg_range r[TM_WGR]; int32_t n; } tm_wgr;
"""

WARP_PRIMS_C = r"""
/* ---- warp primitives (one rendezvous each) ------------------------------------------------- */
typedef struct { tm_sched *s; tm_warp *w; const tm_xslot *buf; uint32_t tag; int lane, W; } tm_xchg;

enum { TM_SHFL_IDX, TM_SHFL_XOR, TM_SHFL_DOWN, TM_SHFL_UP, TM_VOTE_ALL, TM_VOTE_ANY, TM_VOTE_BALLOT,
       TM_OP_SYNCWARP, TM_OP_MMA, TM_OP_LDMATRIX = 16 };
static inline tm_xslot *tm_warp_post(tm_xchg *x, int op, uint64_t mask, int32_t arg) {
  tm_sched *s = tm_cur_sched;
  x->s = s; x->W = s->warp_size; x->lane = s->cur % x->W;
  x->w = &s->warps[s->cur / x->W];
  const uint32_t g = x->w->gen;
  x->tag = g + 1;
  x->buf = x->w->slot[g & 1];
  tm_xslot *me = &x->w->slot[g & 1][x->lane];
  me->tag = x->tag; me->op = op; me->mask = mask; me->arg = arg;
  return me;
}
static inline int tm_took_part(const tm_xchg *x, int lane) { return x->buf[lane].tag == x->tag; }
/* CUDA's rule: the caller is in its mask, and every non-exited lane the mask names executes the
   same primitive with the same mask — not another primitive, not a block barrier. */
static void tm_warp_check(const tm_xchg *x, int op, uint64_t mask) {
  const tm_sched *s = x->s;
  const int base = s->cur - x->lane;
  if (!((mask >> x->lane) & 1)) { tm_fault(TM_ERR_DIVERGED); return; }
  for (int i = 0; i < x->W && base + i < s->n; ++i) {
    if (!((mask >> i) & 1)) continue;
    const int same = tm_took_part(x, i) ? x->buf[i].op == op && x->buf[i].mask == mask
                                        : s->fibers[base + i].state != TM_AT_BLOCK;
    if (!same) { tm_fault(TM_ERR_DIVERGED); return; }
  }
}

static uint64_t tm_warp_shfl(int op, uint64_t mask, uint64_t v, int32_t arg) {
  tm_xchg x;
  tm_warp_post(&x, op, mask, arg)->d.u = v;
  tm_warp_wait(x.s);
  tm_warp_check(&x, op, mask);
  const long W = x.W, lane = x.lane;
  long src;
  switch (op) {
    case TM_SHFL_IDX: src = arg & (W - 1); break;
    case TM_SHFL_XOR: src = lane ^ arg; break;
    case TM_SHFL_DOWN: src = lane + (long)(uint32_t)arg; break;
    default: src = lane - (long)(uint32_t)arg; break;
  }
  if (src < 0 || src >= W || !((mask >> src) & 1) || !tm_took_part(&x, (int)src)) return v;
  return x.buf[src].d.u;
}
#define TM_SHFL_T(sfx, T) \
  static inline T tm_shfl_##sfx(int op, uint64_t mask, T v, int32_t arg) { \
    uint64_t b = 0; memcpy(&b, &v, sizeof(T)); b = tm_warp_shfl(op, mask, b, arg); \
    memcpy(&v, &b, sizeof(T)); return v; }
TM_SHFL_T(f32, float) TM_SHFL_T(f64, double) TM_SHFL_T(f16, _Float16) TM_SHFL_T(b, bool)
TM_SHFL_T(i8, int8_t) TM_SHFL_T(i16, int16_t) TM_SHFL_T(i32, int32_t) TM_SHFL_T(i64, int64_t)
TM_SHFL_T(u8, uint8_t) TM_SHFL_T(u16, uint16_t) TM_SHFL_T(u32, uint32_t) TM_SHFL_T(u64, uint64_t)

static uint64_t tm_warp_vote(int op, uint64_t mask, int pred) {
  tm_xchg x;
  tm_warp_post(&x, op, mask, 0)->d.u = pred != 0;
  tm_warp_wait(x.s);
  tm_warp_check(&x, op, mask);
  uint64_t yes = 0, members = 0;
  for (int i = 0; i < x.W; ++i)
    if (((mask >> i) & 1) && tm_took_part(&x, i)) {
      members |= 1ull << i;
      if (x.buf[i].d.u) yes |= 1ull << i;
    }
  return op == TM_VOTE_ALL ? yes == members : op == TM_VOTE_ANY ? yes != 0 : yes;
}
static inline void tm_syncwarp(uint64_t mask) {
  tm_xchg x;
  tm_warp_post(&x, TM_OP_SYNCWARP, mask, 0);
  tm_warp_wait(x.s);
  tm_warp_check(&x, TM_OP_SYNCWARP, mask);
}

static inline int tm_full_warp(const tm_xchg *x, int op) {
  if (x->W != 32) return 0;
  for (int i = 0; i < 32; ++i) if (!tm_took_part(x, i)) return 0;
  tm_warp_check(x, op, ~0ull);
  return 1;
}
static inline float tm_b16_to_f32(const unsigned char *p, int bf) {
  uint16_t h; memcpy(&h, p, 2);
  if (bf) return tm_bf16_to_f32(h);
  _Float16 f; memcpy(&f, &h, 2); return (float)f;
}
/* The tensor cores' sum of c and the exact products (added in double), rounded to
   f32 toward zero. */
static inline float tm_mma_sum(double s) {
  float r = (float)s;
  if (fabs((double)r) > fabs(s)) r = nextafterf(r, 0.0f);
  return r;
}
/* mma.sync.m16n8k16.row.col.f32.{f16,bf16}: c[4] += A[16x16] B[16x8], fragments as in PTX. */
static void tm_mma_m16n8k16(float *c, const void *a, const void *b, int bf) {
  tm_xchg x;
  tm_xslot *me = tm_warp_post(&x, TM_OP_MMA + bf, ~0ull, 0);
  memcpy(me->d.b, a, 16);
  memcpy(me->d.b + 16, b, 8);
  tm_warp_wait(x.s);
  if (!tm_full_warp(&x, TM_OP_MMA + bf)) { tm_fault(TM_ERR_WARP); return; }
  const int g = x.lane >> 2, t = x.lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
    double acc = c[i];
    for (int k = 0; k < 16; ++k) {
      const int q = (k & 7) >> 1;   /* threadID_in_group of the lanes holding column / row k */
      const unsigned char *pa = x.buf[(row & 7) * 4 + q].d.b + 2 * ((row >> 3) * 2 + (k >> 3) * 4 + (k & 1));
      const unsigned char *pb = x.buf[col * 4 + q].d.b + 16 + 2 * ((k >> 3) * 2 + (k & 1));
      acc += (double)tm_b16_to_f32(pa, bf) * tm_b16_to_f32(pb, bf);
    }
    c[i] = tm_mma_sum(acc);
  }
}
/* f32 -> tf32 as cvt.rna.tf32.f32: 10 mantissa bits, round to nearest, ties away from zero (inf,
   nan unchanged); rounded: the value is taken as it is, its 13 low bits dropped (the tensor cores
   read the top 19). */
static inline float tm_tf32(float v, int rounded) {
  uint32_t u; memcpy(&u, &v, 4);
  if (rounded) u &= 0xffffe000u;
  else if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & 0xffffe000u;
  memcpy(&v, &u, 4); return v;
}
/* mma.sync.m16n8k8.row.col.f32.tf32.tf32.f32: c[4] += A[16x8] B[8x8]; lane (g, t) holds A (g, t),
   (g + 8, t), (g, t + 4), (g + 8, t + 4), B (t, g), (t + 4, g), C as in m16n8k16. */
static void tm_mma_m16n8k8_tf32(float *c, const float *a, const float *b, int rounded) {
  tm_xchg x;
  tm_xslot *me = tm_warp_post(&x, TM_OP_MMA + 2, ~0ull, 0);
  memcpy(me->d.b, a, 16);
  memcpy(me->d.b + 16, b, 8);
  tm_warp_wait(x.s);
  if (!tm_full_warp(&x, TM_OP_MMA + 2)) { tm_fault(TM_ERR_WARP); return; }
  const int g = x.lane >> 2, t = x.lane & 3;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >> 1) * 8, col = 2 * t + (i & 1);
    double acc = c[i];
    for (int k = 0; k < 8; ++k) {
      float av, bv;
      memcpy(&av, x.buf[(row & 7) * 4 + (k & 3)].d.b + 4 * ((row >> 3) + 2 * (k >> 2)), 4);
      memcpy(&bv, x.buf[col * 4 + (k & 3)].d.b + 16 + 4 * (k >> 2), 4);
      acc += (double)tm_tf32(av, rounded) * tm_tf32(bv, rounded);
    }
    c[i] = tm_mma_sum(acc);
  }
}
/* wgmma.mma_async.sync.aligned.m64n{n}k{8,16}.f32.{tf32,f16,bf16} of this thread's accumulators
   (run when a wgmma_wait retires its group): a (64 x k) and b (n x k) are K-major tiles with
   128-byte swizzled rows, element (r, k) at the logical byte L = start + r / 8 * 1024 + r % 8 * 128
   + k * (element size), stored at L ^ ((L >> 7) & 7) << 4 — offsets from the block's shared
   memory, whose base the GPU aligns to 1024 bytes.  Thread t of the warpgroup holds rows
   16 (t / 32 % 4) + (t % 32) / 4 (+8) and columns 8 j + 2 (t % 4) (+1) as register 4 j + i. */
static inline float tm_wgmma_elem(const void *tile, int r, int k, int kind) {
  const long start = (const char *)tile - tm_tls.smem;
  const long l = start + (r >> 3) * 1024 + (r & 7) * 128 + (kind ? 2 : 4) * k;
  const char *p = tm_tls.smem + (l ^ (((l >> 7) & 7) << 4));
  if (kind) return tm_b16_to_f32((const unsigned char *)p, kind == 2);
  float v;
  memcpy(&v, p, 4);
  return tm_tf32(v, 1);
}
/* kind: 0 tf32 (k = 8), 1 f16, 2 bf16 (k = 16) */
static void tm_wgmma_run(float *c, const void *a, const void *b, int n, int accumulate, int kind) {
  const int t = tm_tls.tid[0] + tm_tls.bdim[0] * (tm_tls.tid[1] + tm_tls.bdim[1] * tm_tls.tid[2]);
  const int lane = t & 31, row0 = 16 * ((t >> 5) & 3) + (lane >> 2);
  for (int j = 0; j < n / 8; ++j)
    for (int i = 0; i < 4; ++i) {
      const int row = row0 + 8 * (i >> 1), col = 8 * j + 2 * (lane & 3) + (i & 1);
      double acc = accumulate ? c[4 * j + i] : 0.0;
      for (int k = 0; k < (kind ? 16 : 8); ++k)
        acc += (double)tm_wgmma_elem(a, row, k, kind) * tm_wgmma_elem(b, col, k, kind);
      c[4 * j + i] = tm_mma_sum(acc);
    }
}
static inline tm_wgq *tm_my_wgq(void) {
  tm_sched *s = tm_cur_sched;
  return s && s->wgq ? &s->wgq[s->cur] : NULL;
}
/* The bytes of the tile a wgmma operand at p reads: rows of 128 bytes from the row p lies in. */
static inline uintptr_t tm_wg_lo(const void *p) {
  return (uintptr_t)p - (uintptr_t)(((const char *)p - tm_tls.smem) & 127);
}
static void tm_wgr_track(uintptr_t lo, uintptr_t hi, int add) {
  tm_wgr *w = &tm_cur_sched->wgr;
  for (int i = 0; i < w->n; ++i)
    if (w->r[i].lo == lo && w->r[i].hi == hi) {
      w->r[i].refs += add ? 1 : -1;
      if (w->r[i].refs <= 0) w->r[i] = w->r[--w->n];
      return;
    }
  if (add && w->n < TM_WGR) w->r[w->n++] = (tm_wg_range){ lo, hi, 1 };   /* full: that tile goes unchecked */
}
static inline void tm_wg_ranges(const tm_wg_op *o, int add) {
  tm_wgr_track(tm_wg_lo(o->a), tm_wg_lo(o->a) + 64 * 128, add);
  tm_wgr_track(tm_wg_lo(o->b), tm_wg_lo(o->b) + (uintptr_t)o->n * 128, add);
}
static inline void tm_wgr_check(const void *dst, int n) {
  const tm_wgr *w = &tm_cur_sched->wgr;
  for (int i = 0; i < w->n; ++i)
    if ((uintptr_t)dst < w->r[i].hi && (uintptr_t)dst + (uintptr_t)n > w->r[i].lo) tm_fault(TM_ERR_WGMMA_RACE);
}
static inline void tm_wg_do(const tm_wg_op *o) { tm_wgmma_run(o->c, o->a, o->b, o->n, o->accumulate, o->kind); }
static inline void tm_wg_retire(const tm_wg_op *o) { tm_wg_do(o); tm_wg_ranges(o, 0); }
static inline void tm_wgmma(float *c, const void *a, const void *b, int n, int accumulate, int kind) {
  tm_wg_op o = { c, a, b, n, accumulate, kind, 0 };
  tm_wgq *q = tm_my_wgq();
  if (!q) { tm_wg_do(&o); return; }
  tm_wg_ranges(&o, 1);
  if (q->tail - q->head == TM_WGQ) { tm_wg_retire(&q->op[q->head % TM_WGQ]); ++q->head; }  /* early: allowed */
  o.group = q->committed;
  q->op[q->tail % TM_WGQ] = o;
  ++q->tail;
}
static inline void tm_wgmma_commit(void) { tm_wgq *q = tm_my_wgq(); if (q) ++q->committed; }
static inline void tm_wgmma_wait(int n) {
  tm_wgq *q = tm_my_wgq();
  if (!q) return;
  while (q->head != q->tail && q->op[q->head % TM_WGQ].group + (uint32_t)n < q->committed) {
    tm_wg_retire(&q->op[q->head % TM_WGQ]);
    ++q->head;
  }
}
/* ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16: lane 8j+r gives row r of matrix j. */
static void tm_ldmatrix(void *dst, const void *row, int num, int trans) {
  tm_xchg x;
  const int op = TM_OP_LDMATRIX + 2 * num + trans;
  tm_warp_post(&x, op, ~0ull, 0)->d.p = row;
  if (x.lane < 8 * num && ((uintptr_t)row & 15)) tm_fault(TM_ERR_ALIGN);
  tm_warp_wait(x.s);
  if (!tm_full_warp(&x, op)) { tm_fault(TM_ERR_WARP); return; }
  unsigned char *out = (unsigned char *)dst;
  for (int j = 0; j < num; ++j)
    for (int e = 0; e < 2; ++e) {
      const int src = trans ? j * 8 + 2 * (x.lane & 3) + e : j * 8 + (x.lane >> 2);
      const int elem = trans ? x.lane >> 2 : 2 * (x.lane & 3) + e;
      memcpy(out + 2 * (2 * j + e), (const unsigned char *)x.buf[src].d.p + 2 * elem, 2);
    }
}

/* ---- atomics ------------------------------------------------------------------------------- */
#define TM_ATOMIC_INT(sfx, T) \
  static inline T tm_atomic_add_##sfx(T *p, T v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); } \
  static inline T tm_atomic_exch_##sfx(T *p, T v) { return __atomic_exchange_n(p, v, __ATOMIC_RELAXED); } \
  static inline T tm_atomic_cas_##sfx(T *p, T cmp, T v) { \
    __atomic_compare_exchange_n(p, &cmp, v, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED); return cmp; } \
  static inline T tm_atomic_max_##sfx(T *p, T v) { T old = __atomic_load_n(p, __ATOMIC_RELAXED); \
    while (old < v && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return old; } \
  static inline T tm_atomic_min_##sfx(T *p, T v) { T old = __atomic_load_n(p, __ATOMIC_RELAXED); \
    while (old > v && !__atomic_compare_exchange_n(p, &old, v, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {} \
    return old; }
TM_ATOMIC_INT(i32, int32_t) TM_ATOMIC_INT(u32, uint32_t) TM_ATOMIC_INT(i64, int64_t) TM_ATOMIC_INT(u64, uint64_t)
#define TM_ATOMIC_FLOAT(sfx, T, U) \
  static inline T tm_atomic_add_##sfx(T *p, T v) { \
    U old = __atomic_load_n((U *)p, __ATOMIC_RELAXED), nw; T f; \
    do { memcpy(&f, &old, sizeof f); f = f + v; memcpy(&nw, &f, sizeof nw); } \
    while (!__atomic_compare_exchange_n((U *)p, &old, nw, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)); \
    memcpy(&f, &old, sizeof f); return f; } \
  static inline T tm_atomic_exch_##sfx(T *p, T v) { \
    U nw, old; memcpy(&nw, &v, sizeof nw); old = __atomic_exchange_n((U *)p, nw, __ATOMIC_RELAXED); \
    T f; memcpy(&f, &old, sizeof f); return f; }
TM_ATOMIC_FLOAT(f32, float, uint32_t) TM_ATOMIC_FLOAT(f64, double, uint64_t)

/* ---- 16-byte and asynchronous copies ------------------------------------------------------- */
static inline void tm_copy16(void *dst, const void *src) {
  if (((uintptr_t)dst | (uintptr_t)src) & 15) tm_fault(TM_ERR_ALIGN);
  memcpy(dst, src, 16);
}
/* ---- block transposes: dst[b * ldd + a] = src[a * lds + b] for a, b < n --------------------- */
/* In registers, with gcc's vector extensions (no <immintrin.h>, whose parsing cost ~0.25 s a
   kernel): each shuffle is one unpack / lane-shuffle instruction. */
typedef float tm_f32x16 __attribute__((vector_size(64)));
typedef int32_t tm_i32x16 __attribute__((vector_size(64)));
typedef float tm_f32x8 __attribute__((vector_size(32)));
typedef float tm_f32x16u __attribute__((vector_size(64), may_alias, aligned(4)));   /* unaligned rows */
typedef float tm_f32x8u __attribute__((vector_size(32), may_alias, aligned(4)));
typedef int32_t tm_i32x8 __attribute__((vector_size(32)));
#if defined(__AVX512F__)
static inline __attribute__((always_inline)) void tm_transpose16_f32(float *dst, const float *src, long ldd,
                                                                     long lds) {
  const tm_i32x16 lo1 = {0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29},        /* unpack ps */
                  hi1 = {2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31},
                  lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},        /* unpack pd */
                  hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31},
                  lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27},        /* 128-bit lanes */
                  hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  tm_f32x16 r[16], t[16];
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = *(const tm_f32x16u *)(src + i * lds);
#pragma GCC unroll 8
  for (int i = 0; i < 16; i += 2) {     /* 2x2 blocks of elements */
    t[i] = __builtin_shuffle(r[i], r[i + 1], lo1);
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi1);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 16; i += 4) {     /* 4x4 blocks in each 128-bit lane */
    r[i] = __builtin_shuffle(t[i], t[i + 2], lo2);
    r[i + 1] = __builtin_shuffle(t[i], t[i + 2], hi2);
    r[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], lo2);
    r[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi2);
  }
#pragma GCC unroll 2
  for (int h = 0; h < 16; h += 8)       /* 128-bit lanes: pairs of row quads */
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {
      t[h + i] = __builtin_shuffle(r[h + i], r[h + i + 4], lo4);
      t[h + i + 4] = __builtin_shuffle(r[h + i], r[h + i + 4], hi4);
    }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    r[i] = __builtin_shuffle(t[i], t[i + 8], lo4);
    r[i + 8] = __builtin_shuffle(t[i], t[i + 8], hi4);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) *(tm_f32x16u *)(dst + i * ldd) = r[i];
}
#endif
#if defined(__AVX__)
static inline __attribute__((always_inline)) void tm_transpose8_f32(float *dst, const float *src, long ldd,
                                                                    long lds) {
  const tm_i32x8 lo1 = {0, 8, 1, 9, 4, 12, 5, 13}, hi1 = {2, 10, 3, 11, 6, 14, 7, 15},     /* unpack ps */
                 lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15},     /* shuffle ps */
                 lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};     /* 128-bit lanes */
  tm_f32x8 r[8], t[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) r[i] = *(const tm_f32x8u *)(src + i * lds);
#pragma GCC unroll 4
  for (int i = 0; i < 8; i += 2) {
    t[i] = __builtin_shuffle(r[i], r[i + 1], lo1);
    t[i + 1] = __builtin_shuffle(r[i], r[i + 1], hi1);
  }
#pragma GCC unroll 2
  for (int i = 0; i < 8; i += 4) {
    r[i] = __builtin_shuffle(t[i], t[i + 2], lo2);
    r[i + 1] = __builtin_shuffle(t[i], t[i + 2], hi2);
    r[i + 2] = __builtin_shuffle(t[i + 1], t[i + 3], lo2);
    r[i + 3] = __builtin_shuffle(t[i + 1], t[i + 3], hi2);
  }
#pragma GCC unroll 4
  for (int i = 0; i < 4; ++i) {
    t[i] = __builtin_shuffle(r[i], r[i + 4], lo4);
    t[i + 4] = __builtin_shuffle(r[i], r[i + 4], hi4);
  }
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) *(tm_f32x8u *)(dst + i * ldd) = t[i];
}
#endif
/* c[i] += a[0] * b[2i] + a[1] * b[2i + 1] (bf16 bits; n a constant): AVX-512 BF16's vdpbf16ps
   for 16 lanes (the accumulators stay in registers once inlined), else a loop in the same order */
#if defined(__AVX512BF16__)
typedef float tm_f32x16u __attribute__((vector_size(64), aligned(4)));
typedef short tm_i16x32u __attribute__((vector_size(64), aligned(2)));
typedef int tm_i32x16 __attribute__((vector_size(64)));
#endif
static inline __attribute__((always_inline)) void tm_dot2_bf16(float *c, const uint16_t *a, const uint16_t *b, int n) {
#if defined(__AVX512BF16__)
  if (n == 16) {
    int32_t w; memcpy(&w, a, 4);
    tm_i32x16 pair = {w, w, w, w, w, w, w, w, w, w, w, w, w, w, w, w};
    *(tm_f32x16u *)c = __builtin_ia32_dpbf16ps_v16sf(*(tm_f32x16u *)c, (tm_i16x32u)pair, *(const tm_i16x32u *)b);
    return;
  }
#endif
  const float a0 = tm_bf16_to_f32(a[0]), a1 = tm_bf16_to_f32(a[1]);
  for (int i = 0; i < n; ++i) {
    c[i] += a1 * tm_bf16_to_f32(b[2 * i + 1]);
    c[i] += a0 * tm_bf16_to_f32(b[2 * i]);
  }
}
/* n is a constant: one branch is left */
static inline __attribute__((always_inline)) void tm_transpose_block_f32(float *dst, const float *src, int n,
                                                                         long ldd, long lds) {
#if defined(__AVX512F__)
  if (n == 16) { tm_transpose16_f32(dst, src, ldd, lds); return; }
#endif
#if defined(__AVX__)
  if (n == 8) { tm_transpose8_f32(dst, src, ldd, lds); return; }
#endif
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) dst[(long)b * ldd + a] = src[(long)a * lds + b];
}

static inline void tm_cp_do(const tm_cp_op *o) {
  const int k = o->src_n < 0 ? 0 : o->src_n < o->n ? o->src_n : o->n;
  if (k) memcpy(o->dst, o->src, (size_t)k);
  if (k < o->n) memset((char *)o->dst + k, 0, (size_t)(o->n - k));
}
static inline tm_cpq *tm_my_cpq(void) {
  tm_sched *s = tm_cur_sched;
  return s && s->cpq ? &s->cpq[s->cur] : NULL;
}
static inline void tm_cp_async(void *dst, const void *src, int n, int src_n) {
  if (((uintptr_t)dst | (uintptr_t)src) & (uintptr_t)(n - 1)) tm_fault(TM_ERR_ALIGN);
  if (tm_cur_sched && tm_cur_sched->wgq) tm_wgr_check(dst, n);
  tm_cp_op o = { dst, src, n, src_n, 0 };
  tm_cpq *q = tm_my_cpq();
  if (!q) { tm_cp_do(&o); return; }
  if (q->tail - q->head == TM_CPQ) { tm_cp_do(&q->op[q->head % TM_CPQ]); ++q->head; }
  o.group = q->committed;
  q->op[q->tail % TM_CPQ] = o;
  ++q->tail;
}
static inline void tm_cp_async_commit(void) { tm_cpq *q = tm_my_cpq(); if (q) ++q->committed; }
static inline void tm_cp_async_wait(int n) {
  tm_cpq *q = tm_my_cpq();
  if (!q) return;
  while (q->head != q->tail && q->op[q->head % TM_CPQ].group + (uint32_t)n < q->committed) {
    tm_cp_do(&q->op[q->head % TM_CPQ]);
    ++q->head;
  }
}
"""

_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "f32", "bool": "b",
           "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
           "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64"}
_SHFL = {Prim.SHFL_IDX: "TM_SHFL_IDX", Prim.SHFL_XOR: "TM_SHFL_XOR", Prim.SHFL_DOWN: "TM_SHFL_DOWN",
         Prim.SHFL_UP: "TM_SHFL_UP"}
_VOTE = {Prim.VOTE_ALL: "TM_VOTE_ALL", Prim.VOTE_ANY: "TM_VOTE_ANY", Prim.VOTE_BALLOT: "TM_VOTE_BALLOT"}
_ATOMIC = {Prim.ATOMIC_ADD: "add", Prim.ATOMIC_MAX: "max", Prim.ATOMIC_MIN: "min", Prim.ATOMIC_EXCH: "exch",
           Prim.ATOMIC_CAS: "cas"}


def render_prim_c(g: Any, e: PrimCall) -> str:
    """C for ``e``, rendered by the function generator ``g`` (a ``CpuFuncGen``)."""
    op, a = e.op, e.args
    ref = g.ref
    x = g.expr
    if op in _SHFL:
        return f"tm_shfl_{_SUFFIX[e.dtype.name]}({_SHFL[op]}, (uint64_t)({x(a[0])}), {x(a[1])}, (int32_t)({x(a[2])}))"
    if op in _VOTE:
        return f"(({g.ctype(e.dtype)})tm_warp_vote({_VOTE[op]}, (uint64_t)({x(a[0])}), {x(a[1])}))"
    if op is Prim.SYNCWARP:
        return f"tm_syncwarp((uint64_t)({x(a[0])}))"
    if op in _ATOMIC:
        args = ", ".join([ref(a[0]), *(x(v) for v in a[1:])])
        return f"tm_atomic_{_ATOMIC[op]}_{_SUFFIX[e.dtype.name]}({args})"
    if op is Prim.COPY16:
        return f"tm_copy16({ref(a[0])}, {ref(a[1])})"
    if op is Prim.TRANSPOSE:
        return f"tm_transpose_block_f32({ref(a[0])}, {ref(a[1])}, {x(a[2])}, (long)({x(a[3])}), (long)({x(a[4])}))"
    if op is Prim.DOT2_BF16:
        return f"tm_dot2_bf16({ref(a[0])}, {ref(a[1])}, {ref(a[2])}, {x(a[3])})"
    if op is Prim.PREFETCH:      # gcc's locality 3: all levels (prefetcht0), 2: L2 and beyond (prefetcht1)
        if int(a[3].value):      # beside a store with no epilogue spliced in: nothing to fetch
            return "(void)0"
        return f"__builtin_prefetch({ref(a[0])}, {int(a[2].value)}, {4 - int(a[1].value)})"
    if op is Prim.OPAQUE:        # an empty asm that "changes" the value in its register
        return f"({{ {g.ctype(e.dtype)} tm_o = ({x(a[0])}); __asm__(\"\" : \"+r\"(tm_o)); tm_o; }})"
    if op is Prim.CP_ASYNC:
        return f"tm_cp_async({ref(a[0])}, {ref(a[1])}, {x(a[2])}, (int)({x(a[3])}))"
    if op is Prim.CP_ASYNC_COMMIT:
        return "tm_cp_async_commit()"
    if op is Prim.CP_ASYNC_WAIT:
        return f"tm_cp_async_wait({x(a[0])})"
    if op is Prim.MMA_M16N8K16:
        return f"tm_mma_m16n8k16({ref(a[0])}, {ref(a[1])}, {ref(a[2])}, {int(a[1].dtype is bf16)})"
    if op is Prim.MMA_M16N8K8_TF32:
        return f"tm_mma_m16n8k8_tf32({ref(a[0])}, {ref(a[1])}, {ref(a[2])}, {x(a[3])})"
    if op is Prim.LDMATRIX:
        return f"tm_ldmatrix({ref(a[0])}, {ref(a[1])}, {x(a[2])}, {x(a[3])})"
    if op in WGMMA_OPS:          # queued; run by the wgmma_wait that retires its group
        kind = {"float32": 0, "float16": 1, "bfloat16": 2}[a[1].dtype.name]
        return f"tm_wgmma({ref(a[0])}, {ref(a[1])}, {ref(a[2])}, {x(a[3])}, {x(a[4])}, {kind})"
    if op is Prim.WGMMA_COMMIT:
        return "tm_wgmma_commit()"
    if op is Prim.WGMMA_WAIT:
        return f"tm_wgmma_wait({x(a[0])})"
    if op in MBAR_OPS or op in (Prim.TMA_LOAD, Prim.BAR_SYNC):
        return render_tma_c(g, e)
    if op in (Prim.WGMMA_FENCE, Prim.WGMMA_KEEP, Prim.FENCE_PROXY_ASYNC):    # order nothing here
        return "((void)0)"
    raise UnsupportedError(f"the C backend cannot render {op.spec.name}()")  # pragma: no cover


__all__ = ["WARP_PRIMS_C", "WARP_TYPES_C", "render_prim_c"]
