"""Backends behind one IR: CPU (C + gcc) now; CUDA (NVRTC) and HIP (hipRTC) plug in beside it."""
from ..errors import UnsupportedError
from .base import Backend, Binary, Target, TargetKind, host_cpu_target
from .cpu import CpuBackend

_BACKENDS = {TargetKind.CPU: CpuBackend()}


def get_backend(kind: TargetKind) -> Backend:
    try:
        return _BACKENDS[kind]
    except KeyError:
        raise UnsupportedError(f"no {kind.value} backend in this version of taskmap") from None


__all__ = ["Backend", "Binary", "Target", "TargetKind", "host_cpu_target", "get_backend", "CpuBackend"]
