"""HIP ``Target``s: capabilities of AMD GPU architectures, from a table or from the live device.

CDNA (gfx9xx data-center parts) runs wavefronts of 64 threads; RDNA (gfx10xx/gfx11xx) runs
wave32 under HIP.  Every current AMD GPU gives a workgroup 64 KB of LDS (shared memory) and at
most 1024 threads.  ``features``:

``mfma``        matrix fused multiply-add (``__builtin_amdgcn_mfma_*``; CDNA)
``fp64_mfma``   double-precision MFMA (gfx90a+)
``fp8``         fp8 MFMA (gfx940+)
``wmma``        wave matrix multiply-accumulate (RDNA3, gfx11xx)
``dot``         packed dot-product instructions (``v_dot2_f32_f16`` ...)
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ...errors import UnsupportedError
from ..base import Target, TargetKind
from .runtime import HipDeviceProperties, device_properties, hip_available


@dataclass(frozen=True)
class _ArchSpec:
    part: str
    compute_units: int
    warp_size: int
    features: tuple[str, ...]
    # Cost-model numbers (datasheet, peak clock): FP32 vector and dense f16 matrix (MFMA / WMMA;
    # packed f16 where there is none) TFLOP/s, memory GB/s, L2 MB, peak MHz.
    tflops_f32: float = 0.0
    tflops_f16: float = 0.0
    mem_gbps: float = 0.0
    l2_mb: float = 0.0
    clock_mhz: float = 0.0


_ARCHS: dict[str, _ArchSpec] = {
    "gfx906": _ArchSpec("MI50 / MI60", 60, 64, ("dot",), 14.7, 29.5, 1024, 4, 1800),
    "gfx908": _ArchSpec("MI100", 120, 64, ("dot", "mfma"), 23.1, 184.6, 1229, 8, 1502),
    "gfx90a": _ArchSpec("MI250X (one GCD) / MI210", 110, 64, ("dot", "fp64_mfma", "mfma"), 23.9, 191.5, 1638, 8, 1700),
    "gfx940": _ArchSpec("MI300 (early)", 228, 64, ("dot", "fp64_mfma", "fp8", "mfma"), 122.6, 980.6, 5300, 24, 2100),
    "gfx942": _ArchSpec("MI300X / MI325X", 304, 64, ("dot", "fp64_mfma", "fp8", "mfma"), 163.4, 1307.4, 5300, 32, 2100),
    "gfx1030": _ArchSpec("RX 6800 / 6900 XT", 80, 32, ("dot",), 23.0, 46.1, 512, 4, 2250),
    "gfx1100": _ArchSpec("RX 7900 XTX", 96, 32, ("dot", "wmma"), 61.4, 122.8, 960, 6, 2500),
    "gfx1101": _ArchSpec("RX 7800 XT", 60, 32, ("dot", "wmma"), 37.3, 74.6, 624, 4, 2430),
}
_LDS_BYTES = 64 * 1024
_ARCH_RE = re.compile(r"(gfx[0-9a-f]{3,4})((?::[a-z]+[+-])*)")


def known_hip_archs() -> tuple[str, ...]:
    return tuple(_ARCHS)


def hip_target(arch: str) -> Target:
    """The Target for ``arch`` ("gfx90a", "gfx942", "gfx1100", or with features "gfx90a:xnack-")."""
    m = _ARCH_RE.fullmatch(arch)
    spec = _ARCHS.get(m[1]) if m else None
    if spec is None:
        raise UnsupportedError(f"unknown AMD GPU architecture {arch!r}: expected one of {', '.join(_ARCHS)}")
    return Target(
        kind=TargetKind.HIP,
        arch=arch,
        warp_size=spec.warp_size,
        max_threads_per_block=1024,
        max_shared_memory=_LDS_BYTES,
        max_shared_memory_optin=_LDS_BYTES,
        vector_bytes=16,
        num_cores=spec.compute_units,
        features=spec.features,
        # A CU: 2048 threads (32 waves of 64, or of 32 on RDNA's wave32 at 2 per SIMD pair),
        # 128 Ki 32-bit VGPRs in all, LDS 64 KB per CU (RDNA: per CU of a WGP); LDS 128 B/clock.
        peak_flops_f32=spec.tflops_f32 * 1e12, peak_flops_f16=spec.tflops_f16 * 1e12,
        mem_bandwidth=spec.mem_gbps * 1e9, cache_bandwidth=spec.compute_units * 128 * spec.clock_mhz * 1e6,
        l2_bytes=int(spec.l2_mb * (1 << 20)), clock_hz=spec.clock_mhz * 1e6, transaction_bytes=64,
        max_threads_per_core=2048, max_blocks_per_core=32, registers_per_core=128 * 1024,
        shared_memory_per_core=_LDS_BYTES,
    )


def target_from_properties(props: HipDeviceProperties) -> Target:
    """A Target for a live device; its code-object arch keeps the device's feature suffix."""
    base_arch = props.arch.split(":", 1)[0]
    if base_arch in _ARCHS:
        base = hip_target(props.arch)
    elif base_arch:
        base = Target(TargetKind.HIP, props.arch)
    else:
        raise UnsupportedError(f"cannot tell the architecture of AMD GPU {props.name!r}")
    cus = props.multiprocessor_count
    scale = cus / base.num_cores if base.num_cores else 1.0  # a smaller part of the arch (e.g. MI210)
    return replace(
        base,
        warp_size=props.warp_size,
        max_threads_per_block=props.max_threads_per_block,
        max_shared_memory=props.shared_memory_per_block,
        max_shared_memory_optin=props.shared_memory_per_block,
        num_cores=cus,
        peak_flops_f32=base.peak_flops_f32 * scale,
        peak_flops_f16=base.peak_flops_f16 * scale,
        cache_bandwidth=base.cache_bandwidth * scale,
    )


def current_hip_target(device: int = 0) -> Target:
    """The Target of AMD GPU ``device`` (raises UnsupportedError without one)."""
    if not hip_available():
        raise UnsupportedError("no AMD GPU: cannot describe the current HIP target")
    return target_from_properties(device_properties(device))
