"""CUDA ``Target``s: capabilities of NVIDIA architectures, from a table or from the live device.

Numbers are those of each architecture's flagship data-center (or most common) part; the
``features`` strings are what schedules and templates test instead of comparing arch names:

``mma_f16``     ``mma.sync`` with f16 inputs (sm_70+; m16n8k16 from sm_80)
``bf16``        ``__nv_bfloat16`` arithmetic and bf16 ``mma.sync`` (sm_80+)
``cp_async``    ``cp.async`` global->shared copies (sm_80+)
``mma_m16n8k16`` ``mma.sync.aligned.m16n8k16`` with f16 / bf16 inputs (sm_80+)
``mma_tf32``     ``mma.sync.aligned.m16n8k8`` with tf32 inputs (sm_80+)
``ldmatrix``    ``ldmatrix`` (sm_75+)
``fp8``         e4m3/e5m2 types and fp8 ``mma`` (sm_89+)
``tma``         tensor memory accelerator, thread-block clusters (sm_90+)
``wgmma``       warp-group ``wgmma.mma_async`` (only the arch-specific ``sm_90a`` / ``sm_100a``)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...errors import UnsupportedError
from ..base import Target, TargetKind
from .driver import DeviceProperties, cuda_available, device_properties
from .nvrtc import arch_for_capability


@dataclass(frozen=True)
class _ArchSpec:
    part: str
    num_sms: int
    smem_optin: int  # bytes per block after cudaFuncSetAttribute(MaxDynamicSharedMemorySize)
    # Cost-model numbers (datasheet, boost clock): FP32 and dense f16 tensor-core TFLOP/s,
    # memory GB/s, L2 MB, boost MHz, and per-SM limits (threads, resident blocks, shared KB).
    tflops_f32: float = 0.0
    tflops_f16: float = 0.0
    mem_gbps: float = 0.0
    l2_mb: float = 0.0
    boost_mhz: float = 0.0
    threads_per_sm: int = 2048
    blocks_per_sm: int = 32
    smem_per_sm_kb: int = 0


_KB = 1024
# Opt-in limits and per-SM limits per the CUDA programming guide's "technical specifications per
# compute capability"; throughput per the part's datasheet (f16: dense, f32 accumulate).
_ARCHS: dict[int, _ArchSpec] = {
    70: _ArchSpec("V100", 80, 96 * _KB, 15.7, 125, 900, 6, 1530, 2048, 32, 96),
    75: _ArchSpec("T4", 40, 64 * _KB, 8.1, 65, 320, 4, 1590, 1024, 16, 64),
    80: _ArchSpec("A100", 108, 163 * _KB, 19.5, 312, 2039, 40, 1410, 2048, 32, 164),       # 166912
    # 101376 (A10: 72 SMs, RTX 3090: 82, A40: 84; the throughput numbers are the A40's)
    86: _ArchSpec("A10 / RTX 3090", 84, 99 * _KB, 37.4, 149.7, 696, 6, 1740, 1536, 16, 100),
    87: _ArchSpec("Jetson Orin", 16, 163 * _KB, 5.3, 42.5, 204.8, 4, 1300, 1536, 16, 164),
    89: _ArchSpec("L40S / RTX 4090", 142, 99 * _KB, 91.6, 362, 864, 96, 2520, 1536, 24, 100),
    90: _ArchSpec("H100 SXM", 132, 227 * _KB, 67, 989, 3350, 50, 1980, 2048, 32, 228),   # 232448
    100: _ArchSpec("B200", 148, 227 * _KB, 80, 2250, 8000, 126, 1965, 2048, 32, 228),
    120: _ArchSpec("RTX 5090", 170, 99 * _KB, 104.8, 209.5, 1792, 96, 2407, 1536, 32, 100),
}
_ARCH_RE = re.compile(r"sm_(\d+)([af]?)")


def _features(cc: int, suffix: str) -> tuple[str, ...]:
    feats = []
    if cc >= 70:
        feats.append("mma_f16")
    if cc >= 75:
        feats.append("ldmatrix")
    if cc >= 80:
        feats += ["bf16", "cp_async", "mma_m16n8k16", "mma_tf32"]
    if cc >= 89:
        feats.append("fp8")
    if cc >= 90:
        feats.append("tma")
    if suffix == "a" and cc in (90, 100):
        feats.append("wgmma")
    return tuple(sorted(feats))


def known_cuda_archs() -> tuple[str, ...]:
    return tuple(f"sm_{cc}" for cc in _ARCHS) + ("sm_90a", "sm_100a")


def cuda_target(arch: str) -> Target:
    """The Target for ``arch`` ("sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", ...)."""
    m = _ARCH_RE.fullmatch(arch)
    spec = _ARCHS.get(int(m[1])) if m else None
    if spec is None:
        raise UnsupportedError(
            f"unknown CUDA architecture {arch!r}: expected one of {', '.join(known_cuda_archs())}"
        )
    cc = int(m[1])
    return Target(
        kind=TargetKind.CUDA,
        arch=arch,
        warp_size=32,
        max_threads_per_block=1024,
        max_shared_memory=48 * _KB,
        max_shared_memory_optin=spec.smem_optin,
        vector_bytes=16,
        num_cores=spec.num_sms,
        features=_features(cc, m[2]),
        **_perf(spec),
    )


def _perf(spec: _ArchSpec) -> dict:
    """The cost-model fields of Target for ``spec`` (shared memory: 128 bytes per clock per SM)."""
    clock = spec.boost_mhz * 1e6
    return dict(peak_flops_f32=spec.tflops_f32 * 1e12, peak_flops_f16=spec.tflops_f16 * 1e12,
                mem_bandwidth=spec.mem_gbps * 1e9, cache_bandwidth=spec.num_sms * 128 * clock,
                l2_bytes=int(spec.l2_mb * (1 << 20)), clock_hz=clock, transaction_bytes=32,
                max_threads_per_core=spec.threads_per_sm, max_blocks_per_core=spec.blocks_per_sm,
                registers_per_core=64 * 1024, shared_memory_per_core=spec.smem_per_sm_kb * _KB)


def target_from_properties(props: DeviceProperties) -> Target:
    """A Target for a live device, compiled for the newest arch NVRTC knows that fits it — the
    arch-specific ``sm_90a`` / ``sm_100a`` on an exact match, so that its own instructions
    (``wgmma``) are available."""
    major, minor = props.compute_capability
    arch = arch_for_capability(major, minor)
    cc = int(arch[3:])
    if cc == major * 10 + minor and cc in (90, 100):
        arch += "a"
    base = cuda_target(arch) if cc in _ARCHS else Target(TargetKind.CUDA, arch, features=_features(cc, ""))
    sms = props.multiprocessor_count
    scale = sms / base.num_cores if base.num_cores else 1.0  # a smaller part of the arch (e.g. H100 PCIe)
    return replace(
        base,
        warp_size=props.warp_size,
        max_threads_per_block=props.max_threads_per_block,
        max_shared_memory=props.shared_memory_per_block,
        max_shared_memory_optin=props.shared_memory_per_block_optin,
        num_cores=sms,
        peak_flops_f32=base.peak_flops_f32 * scale,
        peak_flops_f16=base.peak_flops_f16 * scale,
        cache_bandwidth=base.cache_bandwidth * scale,
        l2_bytes=props.l2_cache_size or base.l2_bytes,
        shared_memory_per_core=props.shared_memory_per_multiprocessor or base.shared_memory_per_core,
    )


def current_cuda_target(device: int = 0) -> Target:
    """The Target of GPU ``device`` (needs an NVIDIA GPU; raises UnsupportedError without one)."""
    if not cuda_available():
        raise UnsupportedError("no NVIDIA GPU: cannot describe the current CUDA target")
    return target_from_properties(device_properties(device))
