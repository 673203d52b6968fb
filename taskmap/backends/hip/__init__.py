"""HIP toolchain: hipRTC compilation (no GPU needed), the HIP module runtime (GPU needed), Targets.

Not registered in ``taskmap.backends`` yet: the HIP ``Backend`` is wired once the IR -> HIP C++
code generator exists.
"""
from .hiprtc import (
    HipBinary,
    HipOptions,
    check_arch,
    comgr_isas,
    compile_hip,
    hip_library,
    hiprtc_available,
    hiprtc_version,
)
from .runtime import (
    HipBuffer,
    HipDeviceProperties,
    HipFunction,
    HipModule,
    alloc,
    check,
    device_properties,
    error_name,
    hip_available,
    launch,
    load_module,
    synchronize,
    to_device,
)
from .target import current_hip_target, hip_target, known_hip_archs, target_from_properties

__all__ = [
    "HipBinary", "HipBuffer", "HipDeviceProperties", "HipFunction", "HipModule", "HipOptions",
    "alloc", "check", "check_arch", "comgr_isas", "compile_hip", "current_hip_target",
    "device_properties", "error_name", "hip_available", "hip_library", "hip_target",
    "hiprtc_available", "hiprtc_version", "known_hip_archs", "launch", "load_module",
    "synchronize", "target_from_properties", "to_device",
]
