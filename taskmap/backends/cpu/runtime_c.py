"""The C runtime prepended to every generated CPU source file.

Besides the shared helpers (``clike_runtime``), it holds the emulation of GPU thread blocks on the CPU: every GPU thread of a block is a fiber with its
own stack; ``__syncthreads()`` switches to the next fiber, and a block's fibers run round-robin
until all have returned, so a barrier anywhere (inside loops, after divergent code) has the
GPU's meaning: no thread passes it before every live thread of the block has reached it.
Blocks run in parallel over the cores (OpenMP), each core with its own shared memory buffer
and fiber stacks.
"""
from ..clike_runtime import HELPERS

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
#define TM_FN static inline
#define TM_BITCAST(dst, src) memcpy(&(dst), &(src), sizeof(dst))
""" + HELPERS + r"""
/* ---- GPU thread-block emulation ------------------------------------------------------------ */
typedef struct {
  int tid[3], bid[3], bdim[3], gdim[3];
  char *smem;
} tm_state;
static __thread tm_state tm_tls;

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
typedef struct { void *sp; int done; } tm_fiber;
typedef void *tm_main_ctx;
#define TM_SWITCH_TO_FIBER(s, f) tm_switch_x86(&(s)->main, (f)->sp)
#define TM_SWITCH_TO_MAIN(s, f) tm_switch_x86(&(f)->sp, (s)->main)
#else
typedef struct { ucontext_t ctx; int done; } tm_fiber;
typedef ucontext_t tm_main_ctx;
#define TM_SWITCH_TO_FIBER(s, f) swapcontext(&(s)->main, &(f)->ctx)
#define TM_SWITCH_TO_MAIN(s, f) swapcontext(&(f)->ctx, &(s)->main)
#endif

typedef struct {
  tm_main_ctx main;
#if !defined(__x86_64__)
  ucontext_t tmpl;
#endif
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
  tm_fiber *f = &s->fibers[s->cur];
  s->entry(s->arg);
  f->done = 1;
#if defined(__x86_64__)
  TM_SWITCH_TO_MAIN(s, f);      /* never resumed */
  __builtin_unreachable();
#endif                          /* ucontext: returning resumes s->main through uc_link */
}

static inline void tm_barrier(void) {
  tm_sched *s = tm_cur_sched;
  if (s) TM_SWITCH_TO_MAIN(s, &s->fibers[s->cur]);
}

static int tm_sched_init(tm_sched *s, int n, size_t stack_size) {
  memset(s, 0, sizeof *s);
  s->n = n;
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
}

static void tm_fiber_reset(tm_sched *s, int t) {
  tm_fiber *f = &s->fibers[t];
  char *base = s->stacks + (size_t)t * s->stack_size;
  f->done = 0;
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

/* Run one block: every thread a fiber, round-robin from barrier to barrier. */
static void tm_run_block(tm_sched *s, void (*entry)(const void *), const void *arg) {
  s->entry = entry; s->arg = arg;
  for (int t = 0; t < s->n; ++t) tm_fiber_reset(s, t);
  tm_sched *prev = tm_cur_sched;
  tm_cur_sched = s;
  for (int alive = s->n; alive > 0;) {
    for (int t = 0; t < s->n; ++t) {
      tm_fiber *f = &s->fibers[t];
      if (f->done) continue;
      s->cur = t;
      tm_set_tid(t);
      TM_SWITCH_TO_FIBER(s, f);
      if (f->done) --alive;
    }
  }
  tm_cur_sched = prev;
}
"""
