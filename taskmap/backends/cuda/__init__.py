"""CUDA toolchain: NVRTC compilation (no GPU needed), the driver API (GPU needed), and Targets.

Not registered in ``taskmap.backends`` yet: the CUDA ``Backend`` (render/build/load) is wired
once the IR -> CUDA C++ code generator exists.
"""
from .driver import (
    CudaFunction,
    CudaModule,
    DeviceBuffer,
    DeviceProperties,
    alloc,
    check,
    cuda_available,
    device_count,
    device_properties,
    driver_version,
    error_name,
    launch,
    load_module,
    primary_context,
    set_max_dynamic_shared,
    synchronize,
    to_device,
    use_device,
)
from .nvrtc import (
    CudaBinary,
    NvrtcOptions,
    arch_for_capability,
    compile_cuda,
    cuda_include_dir,
    nvrtc_version,
    supported_archs,
)
from .target import cuda_target, current_cuda_target, known_cuda_archs, target_from_properties

__all__ = [
    "CudaBinary", "CudaFunction", "CudaModule", "DeviceBuffer", "DeviceProperties", "NvrtcOptions",
    "alloc", "arch_for_capability", "check", "compile_cuda", "cuda_available", "cuda_include_dir",
    "cuda_target", "current_cuda_target", "device_count", "device_properties", "driver_version",
    "error_name", "known_cuda_archs", "launch", "load_module", "nvrtc_version", "primary_context",
    "set_max_dynamic_shared", "supported_archs", "synchronize", "target_from_properties",
    "to_device", "use_device",
]
