"""The C runtime prepended to every generated CPU source file.

Besides small helpers (Python-style floor division and modulo, bfloat16 conversions), it holds
the emulation of GPU thread blocks on the CPU: every GPU thread of a block is a fiber with its
own stack; ``__syncthreads()`` switches to the next fiber, and a block's fibers run round-robin
until all have returned, so a barrier anywhere (inside loops, after divergent code) has the
GPU's meaning: no thread passes it before every live thread of the block has reached it.
Blocks run in parallel over the cores (OpenMP), each core with its own shared memory buffer
and fiber stacks.
"""

RUNTIME_C = r"""
#include <stdint.h>
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

#define TM_OK 0
#define TM_ERR_ALLOC 1
#define TM_ERR_LAUNCH 2

static inline int32_t tm_fdiv_i32(int32_t a, int32_t b) {
  int32_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t tm_fdiv_i64(int64_t a, int64_t b) {
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int32_t tm_fmod_i32(int32_t a, int32_t b) {
  int32_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t tm_fmod_i64(int64_t a, int64_t b) {
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline float tm_fmod_f32(float a, float b) {
  float r = fmodf(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline double tm_fmod_f64(double a, double b) {
  double r = fmod(a, b); return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }

static inline float tm_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t tm_f32_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u); return (uint16_t)(u >> 16); }
static inline float tm_round_bf16(float f) { return tm_bf16_to_f32(tm_f32_to_bf16(f)); }

/* ---- GPU thread-block emulation ------------------------------------------------------------ */
typedef struct {
  int tid[3], bid[3], bdim[3], gdim[3];
  char *smem;
} tm_state;
static __thread tm_state tm_tls;

typedef struct { ucontext_t ctx; int done; } tm_fiber;
typedef struct {
  ucontext_t main, tmpl;
  tm_fiber *fibers;
  char *stacks;
  size_t stack_size, map_size;
  int n, cur;
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
  s->entry(s->arg);
  s->fibers[s->cur].done = 1;   /* returning resumes s->main through uc_link */
}

static inline void tm_barrier(void) {
  tm_sched *s = tm_cur_sched;
  if (s) swapcontext(&s->fibers[s->cur].ctx, &s->main);
}

static int tm_sched_init(tm_sched *s, int n, size_t stack_size) {
  memset(s, 0, sizeof *s);
  s->n = n;
  s->stack_size = (stack_size + 4095) & ~(size_t)4095;
  s->map_size = s->stack_size * (size_t)n;
  s->fibers = (tm_fiber *)calloc((size_t)n, sizeof(tm_fiber));
  s->stacks = (char *)mmap(NULL, s->map_size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (!s->fibers || s->stacks == MAP_FAILED) { s->stacks = NULL; return TM_ERR_ALLOC; }
  if (getcontext(&s->tmpl) != 0) return TM_ERR_ALLOC;
  return TM_OK;
}

static void tm_sched_free(tm_sched *s) {
  if (s->stacks) munmap(s->stacks, s->map_size);
  free(s->fibers);
}

/* Run one block: every thread a fiber, round-robin from barrier to barrier. */
static void tm_run_block(tm_sched *s, void (*entry)(const void *), const void *arg) {
  s->entry = entry; s->arg = arg;
  for (int t = 0; t < s->n; ++t) {
    tm_fiber *f = &s->fibers[t];
    f->done = 0;
    f->ctx = s->tmpl;
    f->ctx.uc_stack.ss_sp = s->stacks + (size_t)t * s->stack_size;
    f->ctx.uc_stack.ss_size = s->stack_size;
    f->ctx.uc_link = &s->main;
    makecontext(&f->ctx, tm_fiber_main, 0);
  }
  tm_sched *prev = tm_cur_sched;
  tm_cur_sched = s;
  for (int alive = s->n; alive > 0;) {
    for (int t = 0; t < s->n; ++t) {
      if (s->fibers[t].done) continue;
      s->cur = t;
      tm_set_tid(t);
      swapcontext(&s->main, &s->fibers[t].ctx);
      if (s->fibers[t].done) --alive;
    }
  }
  tm_cur_sched = prev;
}
"""
