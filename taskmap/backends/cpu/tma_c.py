"""Hopper's mbarriers and TMA copies emulated on the CPU (part of ``runtime_c``), and how their
:class:`~taskmap.ir.primitives.PrimCall` nodes render as calls of it.

**mbarriers.**  The barrier's 8 bytes of shared memory hold its state: the arrival count per
phase (bits 0-14), the arrivals still pending in the current phase (15-29), the current phase's
parity (30) and its pending transaction bytes (32-63, signed: a copy may land before its bytes are
expected).  The phase completes, and the next begins with ``count`` arrivals pending, when both
reach zero.  ``mbarrier_wait(bar, parity)`` returns once the current phase's parity differs from
``parity`` (PTX's ``try_wait.parity``: a fresh barrier has completed "phase -1", parity 1);
otherwise the fiber stops (``TM_AT_MBAR``) and the scheduler runs the other warps.  A pass over the
block in which no barrier changed while every live thread waits is a deadlock (a GPU would hang):
the block is abandoned and the launch fails with ``TM_ERR_DEADLOCK``.

**TMA copies** are queued per block and performed when a thread waits on their barrier (or at the
block's end): a kernel that reads a tile before waiting for it reads stale data here too.  A copy
writes the box element by element at the smem offsets the hardware's swizzle gives (``128``: the
16-byte chunk bits 4-6 of an offset XOR its bits 7-9, as for wgmma's tiles), zero-fills elements
outside the tensor (coordinates may be negative), and subtracts its bytes from the barrier.  The
destination's alignment (128 bytes, 1024 swizzled) and a tensor map's constraints (16-byte aligned
base and rows) are checked as the GPU checks them (``TM_ERR_ALIGN``); issuing a copy into a tile a
pending wgmma still reads faults as ``cp_async`` does.
"""
from __future__ import annotations

from typing import Any

from ...ir.primitives import Prim, PrimCall

TMA_TYPES_C = r"""
/* a TMA copy waiting for a thread to wait on its barrier */
typedef struct { void *dst; const void *src; uint64_t *bar; int32_t esize, rows, cols, swizzle, c0, c1, c2;
                 long d0, d1, d2; } tm_tma_op;
#define TM_TMAQ 128
typedef struct { tm_tma_op op[TM_TMAQ]; int32_t n; } tm_tmaq;
static void tm_tma_land(const uint64_t *bar);
"""

TMA_PRIMS_C = r"""
/* ---- mbarriers and TMA copies (sm_90) ------------------------------------------------------ */
#define TM_MB_COUNT(v) ((uint32_t)((v) & 0x7fffu))
#define TM_MB_PENDING(v) ((uint32_t)(((v) >> 15) & 0x7fffu))
#define TM_MB_PHASE(v) ((uint32_t)(((v) >> 30) & 1u))
#define TM_MB_TX(v) ((int32_t)(uint32_t)((v) >> 32))
static inline void tm_mb_store(uint64_t *bar, uint32_t count, uint32_t pending, uint32_t phase, int32_t tx) {
  if (pending == 0 && tx == 0) { pending = count; phase ^= 1u; }       /* the phase completes */
  *bar = (uint64_t)count | (uint64_t)pending << 15 | (uint64_t)phase << 30 | (uint64_t)(uint32_t)tx << 32;
  if (tm_cur_sched) tm_cur_sched->mbar_events++;
}
/* a barrier that cannot take an arrival (arriving: one must be pending) or bytes */
static inline int tm_mb_bad(const uint64_t *bar, int arriving) {
  if ((uintptr_t)bar & 7) { tm_fault(TM_ERR_ALIGN); return 1; }
  const uint64_t v = *bar;
  if (TM_MB_COUNT(v) == 0 || (arriving && TM_MB_PENDING(v) == 0) || TM_MB_PENDING(v) > TM_MB_COUNT(v)) {
    tm_fault(TM_ERR_MBAR); return 1;
  }
  return 0;
}
static inline void tm_mbar_init(uint64_t *bar, int32_t count) {
  if ((uintptr_t)bar & 7) { tm_fault(TM_ERR_ALIGN); return; }
  if (count < 1 || count > 0x7fff) { tm_fault(TM_ERR_MBAR); return; }
  *bar = 0;
  tm_mb_store(bar, (uint32_t)count, (uint32_t)count, 0, 0);
}
static inline void tm_mb_tx(uint64_t *bar, int32_t bytes) {
  if (tm_mb_bad(bar, 0)) return;
  const uint64_t v = *bar;
  tm_mb_store(bar, TM_MB_COUNT(v), TM_MB_PENDING(v), TM_MB_PHASE(v), TM_MB_TX(v) + bytes);
}
static inline void tm_mbar_arrive(uint64_t *bar, int32_t tx) {
  if (tm_mb_bad(bar, 1)) return;
  const uint64_t v = *bar;
  tm_mb_store(bar, TM_MB_COUNT(v), TM_MB_PENDING(v) - 1, TM_MB_PHASE(v), TM_MB_TX(v) + tx);
}
static void tm_tma_do(const tm_tma_op *o) {
  const long base = (const char *)o->dst - tm_tls.smem, row_bytes = (long)o->cols * o->esize;
  const int in_batch = o->c0 >= 0 && o->c0 < o->d0;
  for (int r = 0; r < o->rows; ++r) {
    const long gr = (long)o->c1 + r;
    for (int c = 0; c < o->cols; ++c) {
      const long gc = (long)o->c2 + c;
      long l = base + r * row_bytes + (long)c * o->esize;
      if (o->swizzle) l ^= ((l >> 7) & 7) << 4;
      if (in_batch && gr >= 0 && gr < o->d1 && gc >= 0 && gc < o->d2)
        memcpy(tm_tls.smem + l, (const char *)o->src + ((o->c0 * o->d1 + gr) * o->d2 + gc) * o->esize, (size_t)o->esize);
      else
        memset(tm_tls.smem + l, 0, (size_t)o->esize);
    }
  }
  tm_mb_tx(o->bar, -(int32_t)(o->rows * row_bytes));
}
static inline tm_tmaq *tm_my_tmaq(void) { return tm_cur_sched ? tm_cur_sched->tmaq : NULL; }
/* Perform the pending copies that complete on bar (all of them: bar NULL), in the order issued. */
static void tm_tma_land(const uint64_t *bar) {
  tm_tmaq *q = tm_my_tmaq();
  if (!q) return;
  int kept = 0;
  for (int i = 0; i < q->n; ++i) {
    if (!bar || q->op[i].bar == bar) tm_tma_do(&q->op[i]);
    else q->op[kept++] = q->op[i];
  }
  q->n = kept;
}
static inline void tm_tma_load(void *dst, const void *src, uint64_t *bar, int esize, int rows, int cols, int swizzle,
                               int32_t c0, int32_t c1, int32_t c2, long d0, long d1, long d2) {
  const long off = (char *)dst - tm_tls.smem;
  tm_tma_op o = { dst, src, bar, esize, rows, cols, swizzle, c0, c1, c2, d0, d1, d2 };
  tm_tmaq *q = tm_my_tmaq();
  if ((off & (swizzle ? 1023 : 127)) || ((uintptr_t)src & 15) || ((d2 * esize) & 15)) {
    tm_fault(TM_ERR_ALIGN);     /* a GPU faults; its bytes complete here all the same, so nobody waits forever */
    q = NULL;
  }
  if (tm_cur_sched && tm_cur_sched->wgq) tm_wgr_check(dst, rows * cols * esize);
  if (!q) { tm_tma_do(&o); return; }
  if (q->n == TM_TMAQ) tm_tma_land(q->op[0].bar);                     /* early: allowed */
  q->op[q->n++] = o;
}
static inline void tm_mbar_wait(uint64_t *bar, int parity) {
  tm_sched *s = tm_cur_sched;
  for (;;) {
    tm_tma_land(bar);
    if ((int)TM_MB_PHASE(*bar) != (parity & 1)) return;
    if (!s) { tm_fault(TM_ERR_DEADLOCK); return; }
    tm_fiber *f = &s->fibers[s->cur];
    f->state = TM_AT_MBAR;
    TM_SWITCH_TO_MAIN(s, f);
  }
}
"""


def render_tma_c(g: Any, e: PrimCall) -> str:
    """C for an mbarrier or TMA primitive, rendered by ``g`` (a ``CpuFuncGen``)."""
    a, ref, x = e.args, g.ref, g.expr
    if e.op is Prim.MBAR_INIT:
        return f"tm_mbar_init((uint64_t *){ref(a[0])}, (int32_t)({x(a[1])}))"
    if e.op is Prim.MBAR_ARRIVE:
        return f"tm_mbar_arrive((uint64_t *){ref(a[0])}, (int32_t)({x(a[1])}))"
    if e.op is Prim.MBAR_WAIT:
        return f"tm_mbar_wait((uint64_t *){ref(a[0])}, (int)({x(a[1])}))"
    if e.op is Prim.BAR_SYNC:
        return f"tm_bar_sync({int(a[0].value)}, (int)({x(a[1])}))"
    shape = a[1].tensor.type.shape
    dims = ["1"] * (3 - len(shape)) + [f"(long)({x(d)})" for d in shape]
    coords = ", ".join(f"(int32_t)({x(c)})" for c in a[6:9])
    return (f"tm_tma_load({ref(a[0])}, {ref(a[1])}, (uint64_t *){ref(a[2])}, {a[0].dtype.nbytes}, {int(a[3].value)}, "
            f"{int(a[4].value)}, {int(a[5].value)}, {coords}, {', '.join(dims)})")


__all__ = ["TMA_PRIMS_C", "TMA_TYPES_C", "render_tma_c"]
