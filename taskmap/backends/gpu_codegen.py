"""Render a lowered IR module as CUDA or HIP C++ (one renderer, two small dialects).

A GPU kernel becomes ``extern "C" __global__ void __launch_bounds__(threads) <name>(params,
sizes)``; helpers become ``__device__ __forceinline__`` functions.  Shared tensors live in one
dynamic shared-memory buffer with the same layout the CPU backend uses (so kernels above 48 KB
work through the opt-in attribute), register tensors are local arrays, ``syncthreads()`` is
``__syncthreads()``.  bfloat16 is stored as 16-bit integers and computed in float (as on the
CPU: hipRTC in ROCm 5.2 has no bf16 type); f16 is ``__half``.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import UnsupportedError
from ..ir import expr as E
from ..ir import stmt as S
from ..ir.dtypes import ScalarType, f16
from ..ir.func import FuncKind, Function, Module
from ..ir.functor import collect
from ..ir.primitives import WGMMA_OPS, Prim, PrimCall
from ..ir.types import MemScope, TensorType
from .base import Target
from .clike import SWIZZLE_ALIGN, CLikeFuncGen, const_extent, func_name, numel, smem_layout, written_tensors
from .clike_runtime import HELPERS
from .gpu_primitives import CudaPrims, GpuPrims, HipPrims
from .tma import tensor_maps, tma_calls

_INT_TYPEDEFS = """typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
"""


@dataclass(frozen=True)
class GpuDialect:
    """What differs between CUDA and HIP source."""

    name: str
    prelude: str
    prims: GpuPrims  # warp primitives, atomics, copies, tensor cores

    def launch_bounds(self, threads: int | None, min_blocks: int, warp_size: int) -> str:
        """``__launch_bounds__`` of a kernel of ``threads`` per block (when constant) that asks for
        ``min_blocks`` resident blocks per multiprocessor: CUDA's second argument; HIP's is the
        minimum waves per SIMD (four SIMDs per compute unit)."""
        if not threads:
            return ""
        if min_blocks <= 0:
            return f"__launch_bounds__({threads}) "
        if self.name == "hip":
            waves = -(-threads // warp_size)
            return f"__launch_bounds__({threads}, {-(-min_blocks * waves // 4)}) "
        return f"__launch_bounds__({threads}, {min_blocks}) "


CUDA = GpuDialect("cuda", "#include <cuda_fp16.h>\n" + _INT_TYPEDEFS, CudaPrims())
# hipRTC pre-includes hip_runtime.h, which has __half and the 32/64-bit integer typedefs only.
HIP = GpuDialect("hip", "\n".join(line for line in _INT_TYPEDEFS.splitlines() if "int8" in line or "int16" in line)
                 + "\n", HipPrims())

_COMMON = r"""
#define TM_FN static __device__ __forceinline__
#define TM_BITCAST(dst, src) memcpy(&(dst), &(src), sizeof(dst))
TM_FN uint64_t tm_bits_f64(double x) { return (uint64_t)__double_as_longlong(x); }
TM_FN double tm_f64_of_bits(uint64_t u) { return __longlong_as_double((long long)u); }
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
"""
_SPECIAL = {E.SpecialReg.THREAD_IDX: "threadIdx", E.SpecialReg.BLOCK_IDX: "blockIdx",
            E.SpecialReg.BLOCK_DIM: "blockDim", E.SpecialReg.GRID_DIM: "gridDim"}


class GpuFuncGen(CLikeFuncGen):
    TYPES = {**CLikeFuncGen.TYPES, "float16": "__half"}
    MATH = {**CLikeFuncGen.MATH, E.Intrinsic.ROUND: ("rintf", "rint")}
    #: The bit-cast intrinsics of CUDA, which HIP has too.
    FLOAT_BITS = {"float32": ("__float_as_uint", "__uint_as_float"),
                  "float64": ("tm_bits_f64", "tm_f64_of_bits"),
                  "float16": ("__half_as_ushort", "__ushort_as_half")}

    def __init__(self, gen: "GpuCodegen", func: Function) -> None:
        super().__init__(gen, func)

    def float_const(self, text: str, t: ScalarType) -> str:
        return f"__float2half({text}f)" if t is f16 else super().float_const(text, t)

    def cast(self, text: str, src: ScalarType, dst: ScalarType) -> str:
        if dst is f16 and src is not f16:
            return f"__float2half((float)({text}))"
        if src is f16 and dst is not f16 and not dst.is_bool:
            return super().cast(f"__half2float({text})", src, dst)
        return super().cast(text, src, dst)

    def special(self, e: E.Special) -> str:
        return f"((int){_SPECIAL[e.reg]}.{'xyz'[e.dim]})"  # unsigned in CUDA: keep index math signed

    def barrier(self) -> str:
        return "__syncthreads();"

    def prim(self, e: PrimCall) -> str:
        return self.gen.dialect.prims.render(self, e)

    def store(self, s: S.Store, d: int) -> None:
        """A streaming store (:attr:`Store.stream`) of a 32- or 64-bit element to global memory:
        CUDA's evict-first store (``st.global.cs``), HIP's non-temporal one; others plainly."""
        t = s.tensor.type
        if not (s.stream and t.scope is MemScope.GLOBAL and t.dtype.nbytes in (4, 8) and not t.dtype.is_bool):
            super().store(s, d)
            return
        ref = f"&{self.names(s.tensor)}[{self.expr(s.indices[0])}]"
        value = self.store_value(s.tensor, s.value)
        if self.gen.dialect.name == "cuda":
            self.emit(f"__stcs({ref}, {value});", d)
        else:
            self.emit(f"__builtin_nontemporal_store({value}, {ref});", d)

    def loop_pragmas(self, s: S.For) -> list[str]:
        if s.kind is S.ForKind.UNROLL:
            extent = const_extent(s)
            return [f"#pragma unroll {extent}" if extent else "#pragma unroll"]
        return []  # parallel / vectorize loops in GPU code run as plain loops in each thread

    def decl_tensor(self, s: S.DeclTensor, d: int) -> None:
        t: TensorType = s.var.type
        name, storage = self.names(s.var), self.storage_ctype(t.dtype)
        if t.scope is MemScope.SHARED:
            if self.func.kind is not FuncKind.GPU_KERNEL:
                raise UnsupportedError(f"shared tensor {s.var.name} declared in helper {self.func.name}: "
                                       "declare it in the kernel and pass it as an argument")
            offset = self.gen.smem_offsets[id(s.var)]
            self.emit(f"{storage} *{name} = ({storage} *)(tm_smem + {offset});", d)
        else:  # 16-byte aligned: vector copies and mma fragments reinterpret them
            self.emit(f"__align__(16) {storage} {name}[{numel(t)}];", d)


class GpuCodegen:
    """Renders a module whose entry is a GPU kernel."""

    def __init__(self, module: Module, target: Target, dialect: GpuDialect) -> None:
        self.module = module
        self.target = target
        self.dialect = dialect
        self.written = written_tensors(module)
        self.smem_offsets, self.smem_bytes = smem_layout(module.entry_function)
        for f in module.functions:
            if f is not module.entry_function and tma_calls(f):
                raise UnsupportedError(f"{f.name}: tma_load() in a device function: its tensor map is a parameter "
                                       "of the kernel, so call tma_load in the kernel itself")
        #: the kernel's tensor maps (extra parameters ``tm_map<i>``), by TensorMapSpec.key()
        self.tensor_maps = {s.key(): i for i, s in enumerate(tensor_maps(module.entry_function))}

    def render(self) -> str:
        entry = self.module.entry_function
        if entry.kind is not FuncKind.GPU_KERNEL:
            raise UnsupportedError(f"{entry.name} is a {entry.kind.value} function: only GPU-style kernels "
                                   f"(with attrs.grid_dim / attrs.block_dim) can be built for {self.dialect.name}")
        out = [f"// generated by taskmap for {self.target.name}", self.dialect.prelude + _COMMON + HELPERS]
        if any(collect(f.body, PrimCall) for f in self.module.functions):
            out.append(self.dialect.prims.prelude)
        helpers = [f for f in self.module.functions if f is not entry]
        out += [self.signature(f, GpuFuncGen(self, f)) + ";" for f in helpers]
        out += [self.function(f) for f in helpers]
        out.append(self.kernel(entry))
        return "\n\n".join(out) + "\n"

    def signature(self, f: Function, g: GpuFuncGen) -> str:
        params = [g.param_decl(p, self.written) for p in f.params]
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]
        ret = g.ctype(f.ret) if f.ret is not None else "void"
        return f"static __device__ __forceinline__ {ret} {func_name(f.name)}({', '.join(params) or 'void'})"

    def function(self, f: Function) -> str:
        g = GpuFuncGen(self, f)
        head = self.signature(f, g) + " {"
        g.stmt(f.body, 1)
        return "\n".join([head, *g.lines, "}"])

    def kernel(self, f: Function) -> str:
        g = GpuFuncGen(self, f)
        params = [g.param_decl(p, self.written) for p in f.params]
        params += [f"int32_t {g.names.size(sv.name)}" for sv in f.size_vars]
        params += [f"const __grid_constant__ tm_tensor_map tm_map{i}" for i in self.tensor_maps.values()]
        g.stmt(f.body, 1)
        threads = f.launch.block_size() if f.launch is not None else None
        bounds = self.dialect.launch_bounds(threads, f.launch.min_blocks if f.launch is not None else 0,
                                            self.target.warp_size)
        swizzled = any(c.op in WGMMA_OPS or c.op is Prim.TMA_LOAD for c in collect(f.body, PrimCall))
        smem = [f"  extern __shared__ __align__({SWIZZLE_ALIGN if swizzled else 16}) unsigned char tm_smem[];"] \
            if self.smem_bytes else []
        return "\n".join([f'extern "C" __global__ void {bounds}{f.name}({", ".join(params)}) {{',
                          *smem, *g.lines, "}"])


def render_gpu(module: Module, target: Target, dialect: GpuDialect) -> str:
    return GpuCodegen(module, target, dialect).render()
