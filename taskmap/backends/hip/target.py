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


_ARCHS: dict[str, _ArchSpec] = {
    "gfx906": _ArchSpec("MI50 / MI60", 60, 64, ("dot",)),
    "gfx908": _ArchSpec("MI100", 120, 64, ("dot", "mfma")),
    "gfx90a": _ArchSpec("MI250X (one GCD) / MI210", 110, 64, ("dot", "fp64_mfma", "mfma")),
    "gfx940": _ArchSpec("MI300 (early)", 228, 64, ("dot", "fp64_mfma", "fp8", "mfma")),
    "gfx942": _ArchSpec("MI300X / MI325X", 304, 64, ("dot", "fp64_mfma", "fp8", "mfma")),
    "gfx1030": _ArchSpec("RX 6800 / 6900 XT", 80, 32, ("dot",)),
    "gfx1100": _ArchSpec("RX 7900 XTX", 96, 32, ("dot", "wmma")),
    "gfx1101": _ArchSpec("RX 7800 XT", 60, 32, ("dot", "wmma")),
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
    return replace(
        base,
        warp_size=props.warp_size,
        max_threads_per_block=props.max_threads_per_block,
        max_shared_memory=props.shared_memory_per_block,
        max_shared_memory_optin=props.shared_memory_per_block,
        num_cores=props.multiprocessor_count,
    )


def current_hip_target(device: int = 0) -> Target:
    """The Target of AMD GPU ``device`` (raises UnsupportedError without one)."""
    if not hip_available():
        raise UnsupportedError("no AMD GPU: cannot describe the current HIP target")
    return target_from_properties(device_properties(device))
