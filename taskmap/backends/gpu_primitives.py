"""GPU primitives in CUDA and HIP C++: warp shuffles and votes, atomics, 16-byte and asynchronous
copies, block transposes, ``mma.sync`` (f16 / bf16 m16n8k16, tf32 m16n8k8) and ``ldmatrix`` (IR:
:mod:`taskmap.ir.primitives`).

``transpose_block`` is a plain loop of the calling thread (its semantics; nothing cooperative).

CUDA uses the ``*_sync`` intrinsics with their masks, ``atomic*``, and inline PTX for
``cp.async`` (``.ca`` for 4 and 8 bytes, ``.cg`` for 16; the src-size operand zero-fills),
``cp.async.commit_group`` / ``wait_group``, ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}``
and ``ldmatrix.sync.aligned.m8n8.x{1,2,4}{.trans}.shared.b16``.  Targets without ``cp_async``
(before sm_80) copy synchronously; ``mma`` needs sm_80 (feature ``mma_m16n8k16``), ``ldmatrix``
sm_75.

HIP (ROCm 5.2 hipRTC) has no ``*_sync`` warp functions: shuffles and votes render as ``__shfl*``
/ ``__all`` / ``__any`` / ``__ballot`` over the whole wavefront — **the mask is ignored** (every
active lane takes part), and a ballot is 64 bits wide, so ``ballot_sync(..., dtype=u64)`` is
required on wave64 targets.  ``syncwarp`` is a wavefront scheduling barrier (lanes run in
lockstep).  ``cp_async`` copies synchronously and ``commit``/``wait`` do nothing.  ``mma`` and
``ldmatrix`` are NVIDIA tensor-core instructions: building them for HIP raises
``UnsupportedError`` (AMD's MFMA is a different instruction with other fragment layouts).
"""
from __future__ import annotations

from typing import Any

from ..errors import UnsupportedError
from ..ir.dtypes import ScalarType, bf16, f16, u64
from ..ir.primitives import MBAR_OPS, Prim, PrimCall
from .tma import spec_of

_COPY = r"""
TM_FN void tm_copy16(void *dst, const void *src) { *(int4 *)dst = *(const int4 *)src; }
TM_FN void tm_transpose_block_f32(float *dst, const float *src, int n, long long ldd, long long lds) {
  for (int a = 0; a < n; ++a)
    for (int b = 0; b < n; ++b) dst[b * ldd + a] = src[a * lds + b];
}
TM_FN void tm_dot2_bf16(float *c, const uint16_t *a, const uint16_t *b, int n) {
  const float a0 = tm_bf16_to_f32(a[0]), a1 = tm_bf16_to_f32(a[1]);
  for (int i = 0; i < n; ++i) { c[i] += a1 * tm_bf16_to_f32(b[2 * i + 1]); c[i] += a0 * tm_bf16_to_f32(b[2 * i]); }
}
TM_FN void tm_cp_sync(void *dst, const void *src, int n, int src_n) {
  unsigned char *d = (unsigned char *)dst;
  const unsigned char *s = (const unsigned char *)src;
  if (src_n >= n) {
    if (n == 16) *(int4 *)d = *(const int4 *)s;
    else if (n == 8) *(int2 *)d = *(const int2 *)s;
    else *(int *)d = *(const int *)s;
    return;
  }
  for (int i = 0; i < n; ++i) d[i] = i < src_n ? s[i] : (unsigned char)0;
}
"""

CUDA_PRIMS = _COPY + r"""
TM_FN unsigned tm_smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }
TM_FN void tm_cp_async4(void *dst, const void *src, int src_n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(tm_smem_addr(dst)), "l"(src), "r"(src_n));
}
TM_FN void tm_cp_async8(void *dst, const void *src, int src_n) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" :: "r"(tm_smem_addr(dst)), "l"(src), "r"(src_n));
}
TM_FN void tm_cp_async16(void *dst, const void *src, int src_n) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(tm_smem_addr(dst)), "l"(src), "r"(src_n));
}
TM_FN void tm_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> TM_FN void tm_cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

#define TM_MMA_M16N8K16(NAME, TYPE) \
TM_FN void NAME(float *c, const void *a, const void *b) { \
  unsigned A[4], B[2]; memcpy(A, a, 16); memcpy(B, b, 8); \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." TYPE "." TYPE ".f32 " \
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n" \
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) \
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1])); }
TM_MMA_M16N8K16(tm_mma_m16n8k16_f16, "f16")
TM_MMA_M16N8K16(tm_mma_m16n8k16_bf16, "bf16")
/* ROUNDED: a and b hold tf32 values already (round_tf32() when the fragment was loaded). */
template <int ROUNDED> TM_FN void tm_mma_m16n8k8_tf32(float *c, const float *a, const float *b) {
  unsigned A[4], B[2];
  if (ROUNDED) { memcpy(A, a, 16); memcpy(B, b, 8); }
  else {
    for (int i = 0; i < 4; ++i) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(A[i]) : "f"(a[i]));
    for (int i = 0; i < 2; ++i) asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(B[i]) : "f"(b[i]));
  }
  asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
               "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(A[0]), "r"(A[1]), "r"(A[2]), "r"(A[3]), "r"(B[0]), "r"(B[1])); }

#define TM_LDMATRIX(NAME, SHAPE, N, REGS, ...) \
TM_FN void NAME(void *dst, const void *src) { \
  unsigned r[N]; \
  asm volatile("ldmatrix.sync.aligned.m8n8." SHAPE ".shared.b16 " REGS ", [%" #N "];\n" \
               : __VA_ARGS__ : "r"(tm_smem_addr(src))); \
  memcpy(dst, r, 4 * N); }
/* wgmma's shared-memory matrix descriptor of a K-major tile with 128-byte swizzled rows: the
   start address (>> 4), leading byte offset 1 (unused by this layout), stride byte offset 1024
   (from one 8-row atom to the next), layout type 1 (128-byte swizzle). */
TM_FN unsigned long long tm_wgmma_desc_sw128(const void *p) {
  return (unsigned long long)((tm_smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) | (64ull << 32) | (1ull << 62);
}
/* mbarriers and TMA (sm_90).  A tensor map is CUDA's opaque 128-byte CUtensorMap, passed by value
   as a __grid_constant__ kernel parameter; the copy engine reads it through its address. */
struct __align__(64) tm_tensor_map { unsigned long long opaque[16]; };
TM_FN void tm_mbar_init(void *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(tm_smem_addr(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
TM_FN void tm_mbar_arrive(void *bar, int tx) {
  if (tx) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" :: "r"(tm_smem_addr(bar)), "r"(tx)
                       : "memory");
  else asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(tm_smem_addr(bar)) : "memory");
}
/* A wait that has not ended after ~2^34 cycles (~10 s) is a deadlock (a phase that lacks arrivals
   or bytes): trap, so that the launch fails instead of hanging the GPU. */
TM_FN void tm_mbar_wait(void *bar, int parity) {
  unsigned done;
  long long start = 0;
  for (;;) {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(tm_smem_addr(bar)), "r"(parity) : "memory");
    if (done) return;
    if (!start) start = clock64();
    else if (clock64() - start > (1ll << 34)) __trap();
  }
}
/* c0: batch, c1: row, c2: column (the map's dimensions innermost first) */
TM_FN void tm_tma_load(void *dst, const tm_tensor_map *map, void *bar, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
               "[%0], [%1, {%2, %3, %4}], [%5];\n"
               :: "r"(tm_smem_addr(dst)), "l"((unsigned long long)map), "r"(c2), "r"(c1), "r"(c0),
                  "r"(tm_smem_addr(bar)) : "memory");
}
TM_LDMATRIX(tm_ldmatrix_x1, "x1", 1, "{%0}", "=r"(r[0]))
TM_LDMATRIX(tm_ldmatrix_x2, "x2", 2, "{%0, %1}", "=r"(r[0]), "=r"(r[1]))
TM_LDMATRIX(tm_ldmatrix_x4, "x4", 4, "{%0, %1, %2, %3}", "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
TM_LDMATRIX(tm_ldmatrix_x1_trans, "x1.trans", 1, "{%0}", "=r"(r[0]))
TM_LDMATRIX(tm_ldmatrix_x2_trans, "x2.trans", 2, "{%0, %1}", "=r"(r[0]), "=r"(r[1]))
TM_LDMATRIX(tm_ldmatrix_x4_trans, "x4.trans", 4, "{%0, %1, %2, %3}", "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]))
"""

# ROCm 5.2 has no signed 64-bit atomicMax / atomicMin: a compare-and-swap loop.
HIP_PRIMS = _COPY + r"""
#define TM_ATOMIC_I64(NAME, CMP) \
TM_FN long long NAME(long long *p, long long v) { \
  unsigned long long *u = (unsigned long long *)p, old = *u; \
  while ((long long)old CMP v) { \
    unsigned long long seen = atomicCAS(u, old, (unsigned long long)v); \
    if (seen == old) break; \
    old = seen; \
  } \
  return (long long)old; }
TM_ATOMIC_I64(tm_atomic_max_i64, <)
TM_ATOMIC_I64(tm_atomic_min_i64, >)
"""

_SHFL_CUDA = {Prim.SHFL_IDX: "__shfl_sync", Prim.SHFL_XOR: "__shfl_xor_sync", Prim.SHFL_DOWN: "__shfl_down_sync",
              Prim.SHFL_UP: "__shfl_up_sync"}
_SHFL_HIP = {Prim.SHFL_IDX: "__shfl", Prim.SHFL_XOR: "__shfl_xor", Prim.SHFL_DOWN: "__shfl_down",
             Prim.SHFL_UP: "__shfl_up"}
_VOTE_CUDA = {Prim.VOTE_ALL: "__all_sync", Prim.VOTE_ANY: "__any_sync", Prim.VOTE_BALLOT: "__ballot_sync"}
_VOTE_HIP = {Prim.VOTE_ALL: "__all", Prim.VOTE_ANY: "__any", Prim.VOTE_BALLOT: "__ballot"}
_ATOMIC = {Prim.ATOMIC_ADD: "atomicAdd", Prim.ATOMIC_MAX: "atomicMax", Prim.ATOMIC_MIN: "atomicMin",
           Prim.ATOMIC_EXCH: "atomicExch", Prim.ATOMIC_CAS: "atomicCAS"}
#: Shuffled as this type (the intrinsics' overloads): narrow integers and bools as int, halves as float.
_SHFL_AS = {"bool": "int", "int8": "int", "int16": "int", "uint8": "int", "uint16": "int", "float16": "float",
            "bfloat16": "float", "int64": "long long", "uint64": "unsigned long long"}


class GpuPrims:
    """Renders primitives for one dialect (CUDA or HIP); ``g`` is the ``GpuFuncGen``."""

    name = "gpu"
    prelude = ""

    def render(self, g: Any, e: PrimCall) -> str:
        op, a = e.op, e.args
        if op in _SHFL_CUDA:
            return self.shuffle(g, e)
        if op in _VOTE_CUDA:
            return self.vote(g, e)
        if op is Prim.SYNCWARP:
            return self.syncwarp(g, e)
        if op in _ATOMIC:
            return self.atomic(g, e)
        if op is Prim.COPY16:
            return f"tm_copy16({g.ref(a[0])}, {g.ref(a[1])})"
        if op is Prim.TRANSPOSE:
            return (f"tm_transpose_block_f32({g.ref(a[0])}, {g.ref(a[1])}, {g.expr(a[2])}, "
                    f"(long long)({g.expr(a[3])}), (long long)({g.expr(a[4])}))")
        if op is Prim.DOT2_BF16:
            return f"tm_dot2_bf16({g.ref(a[0])}, {g.ref(a[1])}, {g.ref(a[2])}, {g.expr(a[3])})"
        if op in (Prim.CP_ASYNC, Prim.CP_ASYNC_COMMIT, Prim.CP_ASYNC_WAIT):
            return self.cp_async(g, e)
        if op is Prim.PREFETCH:
            return self.prefetch(g, e)
        if op is Prim.OPAQUE:
            return f"({g.expr(a[0])})"
        if op is Prim.BAR_SYNC:     # AMD's s_barrier has no id or thread count: CUDA only
            return self.named_barrier(g, e)
        return self.tensor_core(g, e)

    def named_barrier(self, g: Any, e: PrimCall) -> str:
        raise UnsupportedError(f"{g.func.name}: bar_sync() (a named barrier among some warps) has no equivalent on "
                               f"{g.gen.target.name}; use syncthreads()")

    def prefetch(self, g: Any, e: PrimCall) -> str:
        """A cache hint; none by default (it changes no result)."""
        return "(void)0"

    def shuffle_value(self, g: Any, e: PrimCall, call: Any) -> str:
        """Shuffle ``e``'s value through the intrinsic's type; ``call(text)`` makes the call."""
        t: ScalarType = e.dtype
        via = _SHFL_AS.get(t.name)
        v = g.expr(e.args[1])
        if via is None:
            return call(v)
        if t is f16:
            return f"__float2half({call(f'__half2float({v})')})"
        return f"(({g.ctype(t)}){call(f'({via})({v})')})"

    def atomic(self, g: Any, e: PrimCall) -> str:
        t: ScalarType = e.dtype
        fn = _ATOMIC[e.op]
        ref, vals = g.ref(e.args[0]), [g.expr(v) for v in e.args[1:]]
        if t.is_integer and t.nbytes == 8:  # the 64-bit overloads take (unsigned) long long
            signed = t.is_signed and e.op in (Prim.ATOMIC_MAX, Prim.ATOMIC_MIN)
            c = "long long" if signed else "unsigned long long"
            args = ", ".join([f"({c} *){ref}", *(f"({c})({v})" for v in vals)])
            return f"(({g.ctype(t)}){fn}({args}))"
        return f"{fn}({', '.join([ref, *vals])})"

    def cp_async_sync(self, g: Any, e: PrimCall) -> str:
        """cp_async as a synchronous copy (commit and wait do nothing)."""
        if e.op is not Prim.CP_ASYNC:
            return "((void)0)"
        a = e.args
        return f"tm_cp_sync({g.ref(a[0])}, {g.ref(a[1])}, {g.expr(a[2])}, (int)({g.expr(a[3])}))"

    def shuffle(self, g: Any, e: PrimCall) -> str:
        raise NotImplementedError

    def vote(self, g: Any, e: PrimCall) -> str:
        raise NotImplementedError

    def syncwarp(self, g: Any, e: PrimCall) -> str:
        raise NotImplementedError

    def cp_async(self, g: Any, e: PrimCall) -> str:
        raise NotImplementedError

    def tensor_core(self, g: Any, e: PrimCall) -> str:
        raise NotImplementedError


class CudaPrims(GpuPrims):
    name = "cuda"
    prelude = CUDA_PRIMS

    def shuffle(self, g: Any, e: PrimCall) -> str:
        mask, lane = g.expr(e.args[0]), g.expr(e.args[2])
        return self.shuffle_value(g, e, lambda v: f"{_SHFL_CUDA[e.op]}((unsigned)({mask}), {v}, {lane})")

    def vote(self, g: Any, e: PrimCall) -> str:
        text = f"{_VOTE_CUDA[e.op]}((unsigned)({g.expr(e.args[0])}), {g.expr(e.args[1])})"
        return f"(({g.ctype(e.dtype)}){text})"

    def syncwarp(self, g: Any, e: PrimCall) -> str:
        return f"__syncwarp((unsigned)({g.expr(e.args[0])}))"

    def cp_async(self, g: Any, e: PrimCall) -> str:
        if "cp_async" not in g.gen.target.features:
            return self.cp_async_sync(g, e)
        a = e.args
        if e.op is Prim.CP_ASYNC_COMMIT:
            return "tm_cp_async_commit()"
        if e.op is Prim.CP_ASYNC_WAIT:
            return f"tm_cp_async_wait<{g.expr(a[0])}>()"
        return f"tm_cp_async{a[2].value}({g.ref(a[0])}, {g.ref(a[1])}, (int)({g.expr(a[3])}))"

    def named_barrier(self, g: Any, e: PrimCall) -> str:
        return f'asm volatile("bar.sync %0, %1;\\n" :: "r"({int(e.args[0].value)}), "r"((int)({g.expr(e.args[1])})) : "memory")'

    def prefetch(self, g: Any, e: PrimCall) -> str:
        # generic addressing: any state space; never faults
        if int(e.args[3].value):         # beside a store with no epilogue spliced in
            return "(void)0"
        level = int(e.args[1].value)
        return f'asm volatile("prefetch.L{level} [%0];" :: "l"((const void *){g.ref(e.args[0])}))'

    def tensor_core(self, g: Any, e: PrimCall) -> str:
        target = g.gen.target
        a = e.args
        if e.op is Prim.MMA_M16N8K16:
            if "mma_m16n8k16" not in target.features:
                raise UnsupportedError(f"{g.func.name}: mma_sync_m16n8k16() needs sm_80 or newer, not {target.name}")
            kind = "bf16" if a[1].dtype is bf16 else "f16"
            return f"tm_mma_m16n8k16_{kind}({g.ref(a[0])}, {g.ref(a[1])}, {g.ref(a[2])})"
        if e.op is Prim.MMA_M16N8K8_TF32:
            if "mma_tf32" not in target.features:
                raise UnsupportedError(f"{g.func.name}: mma_sync_m16n8k8_tf32() needs sm_80 or newer, not {target.name}")
            return f"tm_mma_m16n8k8_tf32<{int(a[3].value)}>({g.ref(a[0])}, {g.ref(a[1])}, {g.ref(a[2])})"
        if e.op in MBAR_OPS or e.op is Prim.TMA_LOAD:
            if "tma" not in target.features:
                raise UnsupportedError(f"{g.func.name}: {e.op.spec.name}() needs sm_90 or newer, not {target.name}")
            return _tma(g, e)
        if e.op is Prim.FENCE_PROXY_ASYNC:
            if "tma" not in target.features:
                raise UnsupportedError(f"{g.func.name}: fence_proxy_async() needs sm_90 or newer, not {target.name}")
            return _WGMMA[e.op](g, a)
        if e.op in _WGMMA:
            if "wgmma" not in target.features:
                raise UnsupportedError(f"{g.func.name}: {e.op.spec.name}() needs the arch-specific sm_90a "
                                       f"(wgmma), not {target.name}")
            return _WGMMA[e.op](g, a)
        if "ldmatrix" not in target.features:
            raise UnsupportedError(f"{g.func.name}: ldmatrix() needs sm_75 or newer, not {target.name}")
        trans = "_trans" if a[3].value else ""
        return f"tm_ldmatrix_x{a[2].value}{trans}({g.ref(a[0])}, {g.ref(a[1])})"


def _wgmma(g: Any, a: tuple) -> str:
    """The asm statement of one ``wgmma_tf32`` / ``wgmma_f16``: the accumulators as ``n / 2``
    read-write operands; 16-bit operands take K-major layouts (transpose immediates 0)."""
    n, c = int(a[3].value), g.ref(a[0])
    regs = ", ".join(f"%{i}" for i in range(n // 2))
    outs = ", ".join(f'"+f"(({c})[{i}])' for i in range(n // 2))
    k = n // 2
    kind = {"float32": "tf32", "float16": "f16", "bfloat16": "bf16"}[a[1].dtype.name]
    shape, tail = (f"m64n{n}k8", "") if kind == "tf32" else (f"m64n{n}k16", ", 0, 0")
    return (f'asm volatile("{{\\n.reg .pred p;\\nsetp.ne.b32 p, %{k + 2}, 0;\\n'
            f'wgmma.mma_async.sync.aligned.{shape}.f32.{kind}.{kind} {{{regs}}}, %{k}, %{k + 1}, p, 1, 1{tail};\\n}}\\n" '
            f': {outs} : "l"(tm_wgmma_desc_sw128({g.ref(a[1])})), "l"(tm_wgmma_desc_sw128({g.ref(a[2])})), '
            f'"r"({int(a[4].value)}))')


def _tma(g: Any, e: PrimCall) -> str:
    a, ref, x = e.args, g.ref, g.expr
    if e.op is Prim.MBAR_INIT:
        return f"tm_mbar_init({ref(a[0])}, (int)({x(a[1])}))"
    if e.op is Prim.MBAR_ARRIVE:
        return f"tm_mbar_arrive({ref(a[0])}, (int)({x(a[1])}))"
    if e.op is Prim.MBAR_WAIT:
        return f"tm_mbar_wait({ref(a[0])}, (int)({x(a[1])}))"
    index = g.gen.tensor_maps[spec_of(g.func, e).key()]
    coords = ", ".join(f"(int)({x(c)})" for c in a[6:9])
    return f"tm_tma_load({ref(a[0])}, &tm_map{index}, {ref(a[2])}, {coords})"


def _wgmma_keep(g: Any, a: tuple) -> str:
    """An empty asm per accumulator that 'writes' it: the compiler cannot move their reads above the
    wait before it (CUTLASS's warpgroup_fence_operand)."""
    c = g.ref(a[0])
    return "; ".join(f'asm volatile("" : "+f"(({c})[{i}]) :: "memory")' for i in range(int(a[1].value)))


_WGMMA = {
    Prim.WGMMA_TF32: _wgmma,
    Prim.WGMMA_F16: _wgmma,
    Prim.WGMMA_FENCE: lambda g, a: 'asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory")',
    Prim.WGMMA_COMMIT: lambda g, a: 'asm volatile("wgmma.commit_group.sync.aligned;\\n" ::: "memory")',
    Prim.WGMMA_WAIT: lambda g, a: f'asm volatile("wgmma.wait_group.sync.aligned {int(a[0].value)};\\n" ::: "memory")',
    Prim.WGMMA_KEEP: _wgmma_keep,
    Prim.FENCE_PROXY_ASYNC: lambda g, a: 'asm volatile("fence.proxy.async.shared::cta;\\n" ::: "memory")',
}


class HipPrims(GpuPrims):
    name = "hip"
    prelude = HIP_PRIMS

    def atomic(self, g: Any, e: PrimCall) -> str:
        t: ScalarType = e.dtype
        if e.op in (Prim.ATOMIC_MAX, Prim.ATOMIC_MIN) and t.is_signed and t.nbytes == 8:
            fn = "tm_atomic_max_i64" if e.op is Prim.ATOMIC_MAX else "tm_atomic_min_i64"
            return f"(({g.ctype(t)}){fn}((long long *){g.ref(e.args[0])}, (long long)({g.expr(e.args[1])})))"
        return super().atomic(g, e)

    def shuffle(self, g: Any, e: PrimCall) -> str:  # the mask is ignored: the whole wavefront takes part
        lane = g.expr(e.args[2])
        if e.op in (Prim.SHFL_DOWN, Prim.SHFL_UP):
            lane = f"(unsigned)({lane})"
        return self.shuffle_value(g, e, lambda v: f"{_SHFL_HIP[e.op]}({v}, {lane})")

    def vote(self, g: Any, e: PrimCall) -> str:
        target = g.gen.target
        if e.op is Prim.VOTE_BALLOT and e.dtype is not u64 and target.warp_size > 32:
            raise UnsupportedError(f"{g.func.name}: ballot_sync() returns u32, which cannot hold the ballot of a "
                                   f"{target.warp_size}-lane wavefront on {target.name}: use "
                                   "ballot_sync(mask, pred, dtype=u64)")
        return f"(({g.ctype(e.dtype)}){_VOTE_HIP[e.op]}({g.expr(e.args[1])}))"

    def syncwarp(self, g: Any, e: PrimCall) -> str:
        return "__builtin_amdgcn_wave_barrier()"

    def cp_async(self, g: Any, e: PrimCall) -> str:
        return self.cp_async_sync(g, e)

    def tensor_core(self, g: Any, e: PrimCall) -> str:
        if e.op in MBAR_OPS or e.op is Prim.TMA_LOAD:
            raise UnsupportedError(f"{g.func.name}: {e.op.spec.name}() belongs to NVIDIA Hopper's copy engine (TMA) and "
                                   f"its barriers, with no HIP equivalent on {g.gen.target.name}; this kernel runs on "
                                   "CUDA sm_90+ and on the CPU")
        raise UnsupportedError(f"{g.func.name}: {e.op.spec.name}() is an NVIDIA tensor-core instruction with no HIP "
                               f"equivalent on {g.gen.target.name} (AMD's MFMA uses other fragment layouts and is "
                               "not exposed yet); this kernel runs on CUDA sm_80+ and on the CPU")


__all__ = ["CudaPrims", "GpuPrims", "HipPrims"]
