"""Backends behind one IR: C for the CPU (gcc + OpenMP), CUDA (NVRTC), HIP (hipRTC)."""
from ..errors import UnsupportedError
from .base import Backend, Binary, Launcher, Target, TargetKind, host_cpu_target
from .cpu import CpuBackend
from .cuda.backend import CudaBackend
from .cuda.driver import cuda_available
from .cuda.target import cuda_target, current_cuda_target
from .hip.backend import HipBackend
from .hip.runtime import hip_available
from .hip.target import current_hip_target, hip_target

_BACKENDS: dict[TargetKind, Backend] = {TargetKind.CPU: CpuBackend(), TargetKind.CUDA: CudaBackend(),
                                        TargetKind.HIP: HipBackend()}


def get_backend(kind: TargetKind) -> Backend:
    return _BACKENDS[kind]


def resolve_target(kind: str, arch: str | None = None) -> Target:
    """The Target for ``kind`` ("cpu", "cuda", "hip"): ``arch`` if given, else the device present."""
    if kind == "cpu":
        if arch not in (None, "native"):
            raise UnsupportedError(f"the CPU backend builds for this machine only (arch='native'), not {arch!r}")
        return host_cpu_target()
    if kind == "cuda":
        if arch is not None:
            return cuda_target(arch)
        if not cuda_available():
            raise UnsupportedError("no NVIDIA GPU here: pass arch= (e.g. build('cuda', arch='sm_90')) to build anyway")
        return current_cuda_target()
    if kind == "hip":
        if arch is not None:
            return hip_target(arch)
        if not hip_available():
            raise UnsupportedError("no AMD GPU here: pass arch= (e.g. build('hip', arch='gfx90a')) to build anyway")
        return current_hip_target()
    raise UnsupportedError(f"unknown target {kind!r}: use 'cpu', 'cuda' or 'hip'")


__all__ = ["Backend", "Binary", "Launcher", "Target", "TargetKind", "cuda_available", "get_backend", "hip_available", "host_cpu_target",
           "resolve_target", "CpuBackend", "CudaBackend", "HipBackend"]
