"""Hand-written CUDA / HIP kernels shared by the toolchain tests (NVRTC, hipRTC, drivers)."""
import numpy as np

VEC_ADD = r"""
extern "C" __global__ void __launch_bounds__(256)
vec_add(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
"""

# half from cuda_fp16.h and __nv_bfloat16 from cuda_bf16.h: out[i] = 2*a[i] + (b[i] + 1)
HALF_BF16 = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void __launch_bounds__(128)
half_bf16(const half* __restrict__ a, const __nv_bfloat16* __restrict__ b, float* __restrict__ out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        half h = __hmul(a[i], __float2half(2.0f));
        __nv_bfloat16 g = __hadd(b[i], __float2bfloat16(1.0f));
        out[i] = __half2float(h) + __bfloat162float(g);
    }
}
"""

# One warp computes D[16x8] = A[16x16] (f16, row-major) * B[16x8] (f16, "col") with one
# mma.sync.aligned.m16n8k16.  Fragments are pre-packed on the host (see mma_fragments).
MMA_M16N8K16 = r"""
extern "C" __global__ void __launch_bounds__(32)
mma_m16n8k16(const unsigned* __restrict__ a, const unsigned* __restrict__ b, float* __restrict__ d) {
    unsigned lane = threadIdx.x;
    unsigned a0 = a[lane * 4 + 0], a1 = a[lane * 4 + 1], a2 = a[lane * 4 + 2], a3 = a[lane * 4 + 3];
    unsigned b0 = b[lane * 2 + 0], b1 = b[lane * 2 + 1];
    float d0 = 0.f, d1 = 0.f, d2 = 0.f, d3 = 0.f;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d0), "+f"(d1), "+f"(d2), "+f"(d3)
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    d[lane * 4 + 0] = d0;
    d[lane * 4 + 1] = d1;
    d[lane * 4 + 2] = d2;
    d[lane * 4 + 3] = d3;
}
"""

# cp.async (sm_80+): each block stages 128 float4 in shared memory, then writes them reversed.
CP_ASYNC = r"""
extern "C" __global__ void __launch_bounds__(128)
cp_async_reverse(const float4* __restrict__ src, float4* __restrict__ dst) {
    __shared__ __align__(16) float4 buf[128];
    unsigned smem = static_cast<unsigned>(__cvta_generic_to_shared(&buf[threadIdx.x]));
    const float4* g = src + blockIdx.x * 128 + threadIdx.x;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem), "l"(g));
    asm volatile("cp.async.commit_group;\n" ::);
    asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    dst[blockIdx.x * 128 + threadIdx.x] = buf[127 - threadIdx.x];
}
"""

# Dynamic shared memory above the 48 KB default (needs set_max_dynamic_shared).
DYNAMIC_SHARED = r"""
extern "C" __global__ void __launch_bounds__(256) big_smem(const float* src, float* dst, int n) {
    extern __shared__ float smem[];
    for (int i = threadIdx.x; i < n; i += blockDim.x) smem[i] = src[i];
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = smem[n - 1 - i];
}
"""

CUDA_KERNELS = {
    "vec_add": VEC_ADD,
    "half_bf16": HALF_BF16,
    "mma_m16n8k16": MMA_M16N8K16,
    "cp_async_reverse": CP_ASYNC,
}

# hipRTC pre-includes hip_runtime.h (threadIdx, __half, ...): no #include needed.
HIP_VEC_ADD = VEC_ADD

HIP_FEATURES = r"""
extern "C" __global__ void __launch_bounds__(64)
features(const __half* __restrict__ h, float* __restrict__ out) {
    __shared__ float s[64];
    int t = threadIdx.x;
    s[t] = __half2float(__hadd(h[t], __float2half(1.0f)));
    __syncthreads();
    out[t] = expf(s[63 - t]) + sqrtf(fabsf(s[t]));
}
"""

HIP_MFMA = r"""
typedef float floatx4 __attribute__((ext_vector_type(4)));
extern "C" __global__ void mfma(floatx4* c, const float* a, const float* b) {
    int t = threadIdx.x;
    c[t] = __builtin_amdgcn_mfma_f32_16x16x4f32(a[t], b[t], c[t], 0, 0, 0);
}
"""


def mma_fragments(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Pack A (16x16 f16) and B (16x8 f16) into per-lane mma.m16n8k16 register fragments.

    Lane = 4*group + tig.  A register r holds (row g + 8*(r%2), cols 2*tig + 8*(r//2) + {0,1});
    B register r holds (rows 2*tig + 8*r + {0,1}, col g); the lower index sits in the low half.
    """
    fa = np.empty((32, 4, 2), np.float16)
    fb = np.empty((32, 2, 2), np.float16)
    for lane in range(32):
        g, t = divmod(lane, 4)
        for r in range(4):
            row, col = g + 8 * (r % 2), 2 * t + 8 * (r // 2)
            fa[lane, r] = a[row, col:col + 2]
        for r in range(2):
            k = 2 * t + 8 * r
            fb[lane, r] = b[k:k + 2, g]
    return fa.view(np.uint32).reshape(32, 4), fb.view(np.uint32).reshape(32, 2)


def mma_unpack(d: np.ndarray) -> np.ndarray:
    """Per-lane accumulators (32x4 f32) back to D (16x8): c0,c1 row g; c2,c3 row g+8."""
    out = np.empty((16, 8), np.float32)
    for lane in range(32):
        g, t = divmod(lane, 4)
        out[g, 2 * t:2 * t + 2] = d[lane, 0:2]
        out[g + 8, 2 * t:2 * t + 2] = d[lane, 2:4]
    return out
