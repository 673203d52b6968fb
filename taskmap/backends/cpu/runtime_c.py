"""The C runtime prepended to every generated CPU source file.

Besides the shared helpers (``clike_runtime``), it holds the emulation of GPU thread blocks on
the CPU: every GPU thread of a block is a fiber with its own stack, and a block's fibers run
warp by warp.  A fiber runs until it reaches ``__syncthreads()`` (a *block* barrier), a warp
primitive (a *warp* rendezvous, see ``warp_c``) or its end.  Within a warp, the scheduler runs
every runnable lane; when they have all stopped, the lanes waiting at a warp rendezvous are
released together (the exchange completes among the lanes that arrived — lanes that exited or
wait at a block barrier do not take part) and run again, until every live lane of the warp waits
at the block barrier; then the next warp runs.  Once all warps are there, the block barrier is
released.  So a barrier anywhere (inside loops, after divergent code) has the GPU's meaning: no
thread passes it before every live thread of the block has reached it; and warp primitives
interleave with block barriers in any order.  Blocks run in parallel over the cores (OpenMP),
each core with its own shared memory buffer, fiber stacks and warp exchange areas.

A fiber also stops at an ``mbarrier_wait`` whose phase has not completed and at a named barrier
(``bar_sync``) that still lacks arrivals (see ``tma_c``).  Once every warp has had its turn, the
mbarrier waiters test their barriers again and the threads a named barrier released run; the
block barrier is released only when no thread is runnable or waiting on those.  A pass in which
no barrier changed while threads wait on them is a deadlock: the block is abandoned with a fault.

Kernels without barriers, warp primitives or ``cp_async`` skip all this: each thread runs to
completion in turn, without fibers.  Faults the GPU would raise (misaligned vector accesses,
partial-warp ``mma``) are recorded in the launch's status (``tm_fault``) and reported by Python.
"""
from ...ir import exp_poly
from ..clike_runtime import HELPERS
from .tma_c import TMA_PRIMS_C, TMA_TYPES_C
from .warp_c import WARP_PRIMS_C, WARP_TYPES_C

#: The system headers every generated source includes first.  No ``<immintrin.h>``: parsing it
#: took ~0.25 s a kernel (or a precompiled header, ~1 s to make); the vector code that is not
#: gcc's own vectorization (the block transposes) uses gcc's vector extensions instead.
SYSTEM_HEADER = r"""#include <stdint.h>
#include <stdbool.h>
#include <stddef.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif
"""

RUNTIME_C = SYSTEM_HEADER + r"""
#define TM_OK 0
#define TM_ERR_ALLOC 1
#define TM_ERR_LAUNCH 2
#define TM_ERR_ALIGN 3
#define TM_ERR_WARP 4
#define TM_ERR_DIVERGED 5
#define TM_ERR_WGMMA_RACE 6
#define TM_ERR_DEADLOCK 7
#define TM_ERR_MBAR 8
#define TM_ERR_NAMED 9
#define TM_FN static inline
#define TM_BITCAST(dst, src) memcpy(&(dst), &(src), sizeof(dst))
/* A scalar argument of a packed entry: the first bytes of its 64-bit word. */
#define TM_WORD(T, w) ({ T tm_v_; memcpy(&tm_v_, &(w), sizeof tm_v_); tm_v_; })
""" + HELPERS + r"""
/* Bit-casts (the IR's BitCast) through a union: no call, a register move (or nothing) for gcc,
   so loops of them stay vectorized. */
#define TM_BITS_FN(T, U, name) \
  static inline U tm_bits_##name(T x) { union { T f; U u; } v; v.f = x; return v.u; } \
  static inline T tm_##name##_of_bits(U u) { union { T f; U u; } v; v.u = u; return v.f; }
TM_BITS_FN(float, uint32_t, f32)
TM_BITS_FN(double, uint64_t, f64)
TM_BITS_FN(_Float16, uint16_t, f16)

/* fmin / fmax as a compare and a blend, which gcc vectorizes (libm's are calls, one per lane);
   the same results — a NaN operand gives the other one — except that of two zeros, the second. */
#define TM_MIN_MAX(T, s) \
  static inline T tm_fmin##s(T a, T b) { return (a < b || b != b) ? a : b; } \
  static inline T tm_fmax##s(T a, T b) { return (a > b || b != b) ? a : b; }
TM_MIN_MAX(float, f)
TM_MIN_MAX(double, )

/* f32 erf and tanh without libm calls (gcc vectorizes loops of them): odd / even rational
   approximations on the range where the result is not +-1 in f32 (Eigen's fast erf / tanh
   coefficients); within 8 ulp (4.3e-7 absolute) of the correctly rounded result, NaN stays NaN. */
static inline float tm_erff(float x) {
  float c = x < -4.0f ? -4.0f : (x > 4.0f ? 4.0f : x);
  float x2 = c * c;
  float p = -2.72614225801306e-10f;
  p = p * x2 + 2.77068142495902e-08f;
  p = p * x2 - 2.10102402082508e-06f;
  p = p * x2 - 5.69250639462346e-05f;
  p = p * x2 - 7.34990630326855e-04f;
  p = p * x2 - 2.95459980854025e-03f;
  p = p * x2 - 1.60960333262415e-02f;
  float q = -1.45660718464996e-05f;
  q = q * x2 - 2.13374055278905e-04f;
  q = q * x2 - 1.68282697438203e-03f;
  q = q * x2 - 7.37332916720468e-03f;
  q = q * x2 - 1.42647390514189e-02f;
  return c * p / q;
}
static inline float tm_tanhf(float x) {
  float c = x < -7.90531110763549805f ? -7.90531110763549805f : (x > 7.90531110763549805f ? 7.90531110763549805f : x);
  float x2 = c * c;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return fabsf(x) < 0.0004f ? x : c * p / q;
}

/* mask ? a : b with an all-ones / all-zeros mask, as bit operations: branch-free whatever the
   flags (without -fno-trapping-math gcc keeps a ternary whose operands divide as control flow,
   which stops vectorization) */
static inline float tm_blendf(uint32_t mask, float a, float b) {
  return tm_f32_of_bits((tm_bits_f32(a) & mask) | (tm_bits_f32(b) & ~mask));
}
static inline uint32_t tm_maskf(int c) { return -(uint32_t)c; }
""" + exp_poly.c_defines() + r"""/* tm_expf's and tm_sigmoid_den's steps: t holds n = round(c / ln2) in its low bits, q = 2 exp(r)
   for c = n ln2 + r */
#define TM_EXP_STEPS(c, t, q) \
  float t = (c) * TM_LOG2E + TM_EXP_SHIFTER; \
  float q = TM_EXP_P6; \
  { \
    float n_ = t - TM_EXP_SHIFTER; \
    float r_ = ((c) - n_ * TM_LN2_HI) - n_ * TM_LN2_LO; \
    q = q * r_ + TM_EXP_P5; q = q * r_ + TM_EXP_P4; q = q * r_ + TM_EXP_P3; \
    q = q * r_ + TM_EXP_P2; q = q * r_ + TM_EXP_P1; q = q * r_ + TM_EXP_P0; \
  }
/* f32 exp without a libm call (gcc vectorizes loops of it: softplus, ELU, softmax-like epilogues):
   x = n ln2 + r with |r| <= ln2 / 2 (Cody-Waite, two constants), 2 exp(r) as a degree-6
   polynomial (ir/exp_poly.py's coefficients), times 2^(n-1) as two powers of two so that
   subnormal results and the overflow to inf come out of the last product, rounded once.  Within
   1 ulp of the correctly rounded result over the whole range; NaN stays NaN, -inf gives 0. */
static inline float tm_expf(float x) {
  float c = tm_blendf(tm_maskf(x > 89.0f), 89.0f, tm_blendf(tm_maskf(x < -104.0f), -104.0f, x));
  TM_EXP_STEPS(c, t, q)
  int32_t k = (int32_t)(tm_bits_f32(t) - tm_bits_f32(TM_EXP_SHIFTER)) - 1;
  int32_t a = k >> 1;
  return q * tm_f32_of_bits((uint32_t)(a + 127) << 23) * tm_f32_of_bits((uint32_t)(k - a + 127) << 23);
}

/* f32 sigmoid and SiLU (epilogues, the pwdw kernel): exp(-x) as tm_expf's, but with one power of
   two and the input clamped to [-87.5, 88.8] (exp then flushes what would be subnormal, which
   leaves 1 + e at 1, and overflows to inf from 88.72 up, which gives sigmoid 0): 4 vector
   operations fewer; sigmoid within 2 ulp.  A 16-lane SiLU on Zen 4: 19.7 cycles with tm_expf and
   a product with the sigmoid, 15.9 as one division.  NaN stays NaN. */
static inline float tm_sigmoid_den(float x) {      /* 1 + exp(-x) */
  float c = tm_blendf(tm_maskf(x < -88.8f), 88.8f, tm_blendf(tm_maskf(x > 87.5f), -87.5f, -x));
  TM_EXP_STEPS(c, t, q)
  int32_t k = (int32_t)(tm_bits_f32(t) - tm_bits_f32(TM_EXP_SHIFTER)) + 126;
  return 1.0f + q * tm_f32_of_bits((uint32_t)k << 23);
}
static inline float tm_sigmoidf(float x) { return 1.0f / tm_sigmoid_den(x); }
static inline float tm_siluf(float x) { return x / tm_sigmoid_den(x); }

/* f32 log, log1p and expm1 without libm calls (softplus, Mish, log-sigmoid, ELU epilogues):
   log as Cephes' logf — x = 2^e m with m in [sqrt(1/2), sqrt(2)), log(m) by a degree-8 polynomial
   of m - 1 — with subnormal inputs scaled first; log1p(x) = log(u) x / (u - 1) with u = 1 + x, and
   expm1(x) = (u - 1) x / log(u) with u = exp(x) (Goldberg's and Kahan's corrections of the
   rounding in u).  Within 2 ulp of the correctly rounded results; special values as C's. */
static inline float tm_logf(float x) {
  uint32_t tiny = tm_maskf(x < 1.17549435e-38f);
  float xs = x * tm_f32_of_bits(0x3f800000u + (tiny & (23u << 23)));    /* subnormals times 2^23 */
  uint32_t b = tm_bits_f32(xs);
  int32_t e = (int32_t)((b >> 23) & 0xffu) - 126 - (int32_t)(tiny & 23u);
  float m = tm_f32_of_bits((b & 0x007fffffu) | 0x3f000000u);          /* [0.5, 1) */
  uint32_t low = tm_maskf(m < 0.707106781186547524f);
  e += (int32_t)low;                                                  /* -1 where low */
  float f = m + tm_f32_of_bits(tm_bits_f32(m) & low) - 1.0f;
  float z = f * f;
  float y = 7.0376836292e-2f;
  y = y * f - 1.1514610310e-1f;
  y = y * f + 1.1676998740e-1f;
  y = y * f - 1.2420140846e-1f;
  y = y * f + 1.4249322787e-1f;
  y = y * f - 1.6668057665e-1f;
  y = y * f + 2.0000714765e-1f;
  y = y * f - 2.4999993993e-1f;
  y = y * f + 3.3333331174e-1f;
  y = y * f * z;
  float fe = (float)e;
  y += -2.12194440e-4f * fe;
  y += -0.5f * z;
  float r = f + y + 0.693359375f * fe;
  r = tm_blendf(tm_maskf(x == 0.0f), -__builtin_inff(), r);
  r = tm_blendf(tm_maskf(x == __builtin_inff()), x, r);
  return tm_blendf(tm_maskf(x < 0.0f) | tm_maskf(x != x), __builtin_nanf(""), r);
}
static inline float tm_log1pf(float x) {
  float u = 1.0f + x;
  float d = u - 1.0f;
  uint32_t exact = tm_maskf(d == 0.0f);
  float r = tm_logf(u) * (x / tm_blendf(exact, 1.0f, d));
  r = tm_blendf(exact, x, r);
  return tm_blendf(tm_maskf(x == __builtin_inff()), x, r);
}
static inline float tm_expm1f(float x) {
  float u = tm_expf(x);
  float d = u - 1.0f;
  float l = tm_logf(u);
  float r = d * (x / tm_blendf(tm_maskf(l == 0.0f), 1.0f, l));
  r = tm_blendf(tm_maskf(u == 1.0f), x, r);
  r = tm_blendf(tm_maskf(d == -1.0f), -1.0f, r);
  return tm_blendf(tm_maskf(u == __builtin_inff()), u, r);
}

/* ---- GPU thread-block emulation ------------------------------------------------------------ */
typedef struct {
  int tid[3], bid[3], bdim[3], gdim[3];
  char *smem;
  int *status;   /* the launch's status: faults are recorded there */
} tm_state;
static __thread tm_state tm_tls;

static inline void tm_fault(int code) {
  if (tm_tls.status) __atomic_store_n(tm_tls.status, code, __ATOMIC_RELAXED);
}

/* Context switching: a few instructions on x86-64 (callee-saved registers, the SIMD/x87 control
   words and the stack pointer), ucontext elsewhere (slower: it saves the signal mask). */
#if defined(__x86_64__)
__asm__(
  ".text\n.p2align 4\n.globl tm_switch_x86\n.hidden tm_switch_x86\n.type tm_switch_x86,@function\n"
  "tm_switch_x86:\n"
  "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
  "  subq $16, %rsp\n  stmxcsr 8(%rsp)\n  fnstcw 12(%rsp)\n"
  "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
  "  ldmxcsr 8(%rsp)\n  fldcw 12(%rsp)\n  addq $16, %rsp\n"
  "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
  "  ret\n.size tm_switch_x86,.-tm_switch_x86\n");
void tm_switch_x86(void **save_sp, void *to_sp);
typedef struct { void *sp; int state, wait_id; } tm_fiber;
typedef void *tm_main_ctx;
#define TM_SWITCH_TO_FIBER(s, f) tm_switch_x86(&(s)->main, (f)->sp)
#define TM_SWITCH_TO_MAIN(s, f) tm_switch_x86(&(f)->sp, (s)->main)
#else
typedef struct { ucontext_t ctx; int state, wait_id; } tm_fiber;
typedef ucontext_t tm_main_ctx;
#define TM_SWITCH_TO_FIBER(s, f) swapcontext(&(s)->main, &(f)->ctx)
#define TM_SWITCH_TO_MAIN(s, f) swapcontext(&(f)->ctx, &(s)->main)
#endif
enum { TM_RUN = 0, TM_AT_BLOCK = 1, TM_AT_WARP = 2, TM_DONE = 3, TM_AT_MBAR = 4, TM_AT_NAMED = 5 };  /* fiber states */
""" + WARP_TYPES_C + TMA_TYPES_C + r"""
/* ---- streaming stores (Store.stream): n floats, a whole number of vectors, written past the
   caches (non-temporal) where dst is aligned to a vector, else plainly; a thread that streamed
   fences before others may read (tm_stream_fence: the end of a parallel iteration, of a kernel). */
typedef float tm_st_f32x16 __attribute__((vector_size(64)));
typedef float tm_st_f32x8 __attribute__((vector_size(32)));
static inline __attribute__((always_inline)) void tm_stream_f32(float *dst, const float *src, int n) {
#if defined(__AVX512F__)
  if (n % 16 == 0 && ((uintptr_t)dst & 63) == 0) {
    for (int i = 0; i < n; i += 16) __builtin_ia32_movntps512(dst + i, *(const tm_st_f32x16 *)(src + i));
    return;
  }
#endif
#if defined(__AVX__)
  if (n % 8 == 0 && ((uintptr_t)dst & 31) == 0) {
    for (int i = 0; i < n; i += 8) __builtin_ia32_movntps256(dst + i, *(const tm_st_f32x8 *)(src + i));
    return;
  }
#endif
  memcpy(dst, src, (size_t)n * sizeof(float));
}
#if defined(__SSE__)
#define tm_stream_fence() __builtin_ia32_sfence()
#else
#define tm_stream_fence() __sync_synchronize()
#endif
typedef struct {
  tm_main_ctx main;
#if !defined(__x86_64__)
  ucontext_t tmpl;
#endif
  tm_fiber *fibers;
  char *stacks;
  size_t stack_size, map_size;
  int n, cur, warp_size;
  tm_warp *warps;      /* one exchange area per warp (kernels with warp primitives) */
  tm_cpq *cpq;         /* one queue of pending cp.async copies per thread (kernels with cp_async) */
  tm_wgq *wgq;         /* one queue of pending wgmma per thread (kernels with wgmma) */
  tm_wgr wgr;          /* the tiles those pending wgmma read */
  tm_tmaq *tmaq;       /* the block's pending TMA copies (kernels with mbarriers / tma_load) */
  unsigned long mbar_events;   /* changes of any mbarrier or named barrier: progress while threads wait */
  int named[16];       /* arrivals at each named barrier (bar_sync) */
  void (*entry)(const void *);
  const void *arg;
} tm_sched;
static __thread tm_sched *tm_cur_sched;

static inline void tm_set_tid(int t) {
  tm_tls.tid[0] = t % tm_tls.bdim[0];
  tm_tls.tid[1] = (t / tm_tls.bdim[0]) % tm_tls.bdim[1];
  tm_tls.tid[2] = t / (tm_tls.bdim[0] * tm_tls.bdim[1]);
}

static void tm_fiber_main(void) {
  tm_sched *s = tm_cur_sched;
  tm_fiber *f = &s->fibers[s->cur];
  s->entry(s->arg);
  f->state = TM_DONE;
#if defined(__x86_64__)
  TM_SWITCH_TO_MAIN(s, f);      /* never resumed */
  __builtin_unreachable();
#endif                          /* ucontext: returning resumes s->main through uc_link */
}

static inline void tm_barrier(void) {
  tm_sched *s = tm_cur_sched;
  if (s) { tm_fiber *f = &s->fibers[s->cur]; f->state = TM_AT_BLOCK; TM_SWITCH_TO_MAIN(s, f); }
}

/* Wait at a warp rendezvous: resumed once every runnable lane of the warp has stopped. */
static inline void tm_warp_wait(tm_sched *s) {
  tm_fiber *f = &s->fibers[s->cur];
  f->state = TM_AT_WARP;
  TM_SWITCH_TO_MAIN(s, f);
}

/* A named barrier (bar.sync id, count): the last of count arrivals releases the others. */
static inline void tm_bar_sync(int id, int count) {
  tm_sched *s = tm_cur_sched;
  if (!s) return;
  if (count <= 0 || count > s->n || count % s->warp_size) { tm_fault(TM_ERR_NAMED); return; }
  s->mbar_events++;
  if (++s->named[id] >= count) {
    s->named[id] = 0;
    for (int t = 0; t < s->n; ++t)
      if (s->fibers[t].state == TM_AT_NAMED && s->fibers[t].wait_id == id) s->fibers[t].state = TM_RUN;
    return;
  }
  tm_fiber *f = &s->fibers[s->cur];
  f->state = TM_AT_NAMED;
  f->wait_id = id;
  TM_SWITCH_TO_MAIN(s, f);
}

#define TM_NEED_WARPS 1
#define TM_NEED_CPQ 2
#define TM_NEED_WGQ 4
#define TM_NEED_TMA 8
static int tm_sched_init(tm_sched *s, int n, size_t stack_size, int warp_size, int needs) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->warp_size = warp_size;
  if (needs & TM_NEED_WARPS) {
    s->warps = (tm_warp *)calloc((size_t)((n + warp_size - 1) / warp_size), sizeof(tm_warp));
    if (!s->warps) return TM_ERR_ALLOC;
  }
  if (needs & TM_NEED_CPQ) {
    s->cpq = (tm_cpq *)calloc((size_t)n, sizeof(tm_cpq));
    if (!s->cpq) return TM_ERR_ALLOC;
  }
  if (needs & TM_NEED_WGQ) {
    s->wgq = (tm_wgq *)calloc((size_t)n, sizeof(tm_wgq));
    if (!s->wgq) return TM_ERR_ALLOC;
  }
  if (needs & TM_NEED_TMA) {
    s->tmaq = (tm_tmaq *)calloc(1, sizeof(tm_tmaq));
    if (!s->tmaq) return TM_ERR_ALLOC;
  }
  s->stack_size = (stack_size + 4095) & ~(size_t)4095;
  s->map_size = s->stack_size * (size_t)n;
  s->fibers = (tm_fiber *)calloc((size_t)n, sizeof(tm_fiber));
  s->stacks = (char *)mmap(NULL, s->map_size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (s->stacks == MAP_FAILED) s->stacks = NULL;
  if (!s->fibers || !s->stacks) return TM_ERR_ALLOC;
#if !defined(__x86_64__)
  if (getcontext(&s->tmpl) != 0) return TM_ERR_ALLOC;
#endif
  return TM_OK;
}

static void tm_sched_free(tm_sched *s) {
  if (s->stacks) munmap(s->stacks, s->map_size);
  free(s->fibers);
  free(s->warps);
  free(s->cpq);
  free(s->wgq);
  free(s->tmaq);
}

static void tm_fiber_reset(tm_sched *s, int t) {
  tm_fiber *f = &s->fibers[t];
  char *base = s->stacks + (size_t)t * s->stack_size;
  f->state = TM_RUN;
  if (s->cpq) s->cpq[t].head = s->cpq[t].tail = s->cpq[t].committed = 0;
  if (s->wgq) s->wgq[t].head = s->wgq[t].tail = s->wgq[t].committed = 0;
#if defined(__x86_64__)
  /* A frame tm_switch_x86 "returns" from into tm_fiber_main: control words, six callee-saved
     registers, the return address; tm_fiber_main starts with rsp = 8 (mod 16), as after a call. */
  uint64_t *sp = (uint64_t *)(((uintptr_t)(base + s->stack_size) & ~(uintptr_t)15) - 80);
  uint32_t mxcsr = __builtin_ia32_stmxcsr();
  uint16_t fpucw;
  __asm__ volatile("fnstcw %0" : "=m"(fpucw));
  memset(sp, 0, 80);
  memcpy((char *)sp + 8, &mxcsr, 4);
  memcpy((char *)sp + 12, &fpucw, 2);
  sp[8] = (uint64_t)(uintptr_t)tm_fiber_main;
  f->sp = sp;
#else
  f->ctx = s->tmpl;
  f->ctx.uc_stack.ss_sp = base;
  f->ctx.uc_stack.ss_size = s->stack_size;
  f->ctx.uc_link = &s->main;
  makecontext(&f->ctx, tm_fiber_main, 0);
#endif
}

/* Run one block: every thread a fiber; warp by warp, from barrier to barrier (see the top). */
static void tm_run_block(tm_sched *s, void (*entry)(const void *), const void *arg) {
  s->entry = entry; s->arg = arg;
  for (int t = 0; t < s->n; ++t) tm_fiber_reset(s, t);
  s->wgr.n = 0;
  if (s->tmaq) s->tmaq->n = 0;
  memset(s->named, 0, sizeof s->named);
  tm_sched *prev = tm_cur_sched;
  tm_cur_sched = s;
  const int W = s->warp_size;
  unsigned long events = s->mbar_events;
  for (int alive = s->n; alive > 0;) {
    for (int w0 = 0; w0 < s->n; w0 += W) {
      const int w1 = w0 + W < s->n ? w0 + W : s->n;
      for (;;) {
        int waiting = 0;
        for (int t = w0; t < w1; ++t) {
          tm_fiber *f = &s->fibers[t];
          if (f->state != TM_RUN) continue;
          s->cur = t;
          tm_set_tid(t);
          TM_SWITCH_TO_FIBER(s, f);
          if (f->state == TM_DONE) --alive;
          else if (f->state == TM_AT_WARP) ++waiting;
        }
        if (!waiting) break;
        s->warps[w0 / W].gen++;          /* the rendezvous completes: release its lanes */
        for (int t = w0; t < w1; ++t)
          if (s->fibers[t].state == TM_AT_WARP) s->fibers[t].state = TM_RUN;
      }
    }
    int waiting = 0, runnable = 0;       /* at mbarriers or named barriers; released by a named barrier */
    for (int t = 0; t < s->n; ++t) {
      waiting += s->fibers[t].state == TM_AT_MBAR || s->fibers[t].state == TM_AT_NAMED;
      runnable += s->fibers[t].state == TM_RUN;
    }
    if (waiting || runnable) {           /* mbarrier waiters test again, if anything changed */
      if (!runnable && s->mbar_events == events) { tm_fault(TM_ERR_DEADLOCK); break; }   /* abandon the block */
      events = s->mbar_events;
      for (int t = 0; t < s->n; ++t)
        if (s->fibers[t].state == TM_AT_MBAR) s->fibers[t].state = TM_RUN;
      continue;
    }
    for (int t = 0; t < s->n; ++t)       /* every live thread is at the block barrier */
      if (s->fibers[t].state == TM_AT_BLOCK) s->fibers[t].state = TM_RUN;
  }
  if (s->tmaq) tm_tma_land(NULL);        /* copies nobody waited for land all the same */
  tm_cur_sched = prev;
}
""" + WARP_PRIMS_C + TMA_PRIMS_C
