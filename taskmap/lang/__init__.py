"""The kernel DSL: write kernels as Python functions with task mappings; ``transpile`` makes IR.

Inside a ``@taskmap.kernel`` function::

    @taskmap.kernel
    def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
        attrs.grid_dim = 4
        attrs.block_dim = 256
        for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
            c[i] = a[i] + b[i]

Compile-time Python values (closure ints, mappings, config objects) are evaluated while
transpiling; everything else becomes IR. The rule for local variables is documented in
:mod:`taskmap.lang.scope`. The builtins below raise ``TypeError`` when called in plain Python;
dtypes and task mappings are ordinary values.  GPU primitives (warp shuffles and votes, atomics,
16-byte and asynchronous copies, block transposes, tensor cores) are in :mod:`.gpu_builtins`, the copy
engine's (TMA) and its barriers in :mod:`.tma_builtins`, the tensor-core
operand layouts, as task mappings, in :mod:`.mma`.
"""
from ..ir.dtypes import bf16, bool_, f16, f32, f64, i8, i16, i32, i64, u8, u16, u32, u64
from ..ir.expr import blockDim, blockIdx, gridDim, threadIdx
from ..ir.mapping import auto_map, custom_mapping, repeat, spatial
from .builtins import (DeviceFunction, acos, acosh, asin, asinh, atan, atan2, atanh, attrs, bitcast, cast, ceil, cos,
                       cosh, erf, exp, exp2, expm1, floor, fma, fmod, func, lgamma, log, log1p, log2, parallel, pow,
                       register_tensor, round, rsqrt, select, shared_tensor, sigmoid, silu, sin, sinh, sqrt, symbol,
                       syncthreads, tan, tanh, trunc, unroll, vectorize)
from .gpu_builtins import (FULL_MASK, all_sync, any_sync, atomic_add, atomic_cas, atomic_exch, atomic_max, atomic_min,
                           ballot_sync, copy16, cp_async, cp_async_commit, cp_async_wait, dot2_bf16, lane_id, ldmatrix_x1,
                           ldmatrix_x2, ldmatrix_x4, mma_sync_m16n8k8_tf32, mma_sync_m16n8k16, opaque, prefetch,
                           shfl_down_sync, shfl_sync, shfl_up_sync, shfl_xor_sync, syncwarp, transpose_block, warp_id,
                           warp_size, fence_proxy_async, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_tf32,
                           wgmma_wait)
from .kernel import kernel
from .tma_builtins import bar_sync, mbarrier_arrive, mbarrier_init, mbarrier_wait, tma_load
from .mma import (MMA_K, MMA_M, MMA_N, MMA_TF32_K, ldmatrix_x1_rows, ldmatrix_x2_rows, ldmatrix_x4_rows,
                  ldmatrix_x4_rows_b32, mma_a_layout, mma_b_layout, mma_c_layout, mma_tf32_a_layout, mma_tf32_b_layout, round_tf32,
                  tf32_operand, wgmma_c_layout, wgmma_sw128, wgmma_sw128_b16)
from .transpiler import transpile

__all__ = [
    "FULL_MASK", "MMA_K", "MMA_M", "MMA_N", "MMA_TF32_K", "all_sync", "any_sync", "atomic_add", "atomic_cas", "atomic_exch",
    "atomic_max", "atomic_min", "ballot_sync", "copy16", "cp_async", "cp_async_commit", "cp_async_wait", "dot2_bf16", "lane_id",
    "ldmatrix_x1", "ldmatrix_x1_rows", "ldmatrix_x2", "ldmatrix_x2_rows", "ldmatrix_x4", "ldmatrix_x4_rows",
    "ldmatrix_x4_rows_b32", "mma_a_layout", "mma_b_layout", "mma_c_layout", "mma_sync_m16n8k16", "mma_sync_m16n8k8_tf32",
    "mma_tf32_a_layout", "mma_tf32_b_layout", "prefetch", "round_tf32", "tf32_operand", "shfl_down_sync", "shfl_sync",
    "shfl_up_sync", "shfl_xor_sync", "syncwarp", "transpose_block", "warp_id", "warp_size", "DeviceFunction", "acos",
    "acosh", "asin", "asinh", "atan", "atan2", "atanh", "attrs", "auto_map", "bf16", "bitcast", "blockDim",
    "blockIdx", "bool_", "cast", "ceil", "cos", "cosh", "custom_mapping", "erf", "exp", "exp2", "expm1", "f16",
    "f32", "f64", "floor", "fma", "fmod", "func", "gridDim", "i8", "i16", "i32", "i64", "kernel", "lgamma", "log",
    "log1p", "log2", "parallel", "pow", "register_tensor", "repeat", "round", "rsqrt", "select", "shared_tensor",
    "sigmoid", "silu", "sin", "sinh", "spatial", "sqrt", "symbol", "syncthreads", "tan", "tanh", "threadIdx", "transpile",
    "trunc",
    "u8", "u16", "u32", "u64", "unroll", "vectorize", "fence_proxy_async", "wgmma_c_layout", "wgmma_commit",
    "wgmma_f16", "wgmma_fence", "wgmma_sw128", "wgmma_sw128_b16", "wgmma_tf32", "wgmma_wait", "bar_sync", "mbarrier_arrive",
    "mbarrier_init", "mbarrier_wait", "tma_load", "opaque",
]
