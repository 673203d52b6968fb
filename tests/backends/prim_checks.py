"""Shared checks for the GPU-primitive kernel tests: every kernel is built for CUDA (sm_80, sm_90)
and HIP (gfx90a) without a GPU, run on the CPU emulation, and — with the ``cuda`` marker — run on
an NVIDIA GPU with torch CUDA tensors."""
from __future__ import annotations

import ctypes
import pathlib
import platform
import shutil
import subprocess
from typing import Any, Callable, Sequence

import numpy as np
import pytest

EM_AMDGPU = 224  # ELF e_machine of AMD GPU code objects

#: Run a kernel on numpy arrays (CPU emulation) or on torch CUDA tensors (an NVIDIA GPU).
DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.cuda)]


def built_for_cuda(kernel: Any, arch: str, expect: Sequence[str] = ()) -> Any:
    """Build ``kernel`` for ``arch`` with NVRTC: a cubin, and each of ``expect`` in its PTX."""
    built = kernel.build("cuda", arch=arch)
    assert built.binary[:4] == b"\x7fELF", "NVRTC produced no cubin"
    ptx = built.artifact.extra.ptx
    assert f".target {arch}" in ptx
    for text in expect:
        assert text in ptx, f"{text!r} not in the PTX for {arch}"
    return built


def built_for_hip(kernel: Any, arch: str = "gfx90a", expect_source: Sequence[str] = ()) -> Any:
    """Build ``kernel`` with hipRTC: an AMD code object, and each of ``expect_source`` in the source."""
    built = kernel.build("hip", arch=arch)
    data = built.binary
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == EM_AMDGPU
    for text in expect_source:
        assert text in built.source, f"{text!r} not in the HIP source"
    return built


def run_on(device: str, kernel: Callable[..., Any], *arrays: Any) -> list[np.ndarray]:
    """Run ``kernel`` on copies of ``arrays`` on ``device``; returns the arrays afterwards (numpy)."""
    if device == "cpu":
        copies = [np.array(a, copy=True) if isinstance(a, np.ndarray) else a for a in arrays]
        kernel(*copies)
        return [c for c in copies if isinstance(c, np.ndarray)]
    import torch

    tensors = [torch.from_numpy(np.ascontiguousarray(a)).cuda() if isinstance(a, np.ndarray) else a for a in arrays]
    kernel(*tensors)
    torch.cuda.synchronize()
    return [t.cpu().numpy() for t in tensors if isinstance(t, torch.Tensor)]


def expect_dsl_error(fn: Callable[..., Any], message: str) -> Any:
    """Transpiling ``fn`` raises a DSLError containing ``message``, at the line after its ``def``."""
    from taskmap.errors import DSLError
    from taskmap.lang import transpile

    with pytest.raises(DSLError) as info:
        transpile(fn)
    assert message in info.value.msg, info.value.msg
    line = fn.__code__.co_firstlineno + 1
    assert info.value.lineno == line, (info.value.lineno, line)
    return info.value


#: The C helpers' tests compile the CPU runtime with gcc for several instruction sets.
needs_gcc = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("gcc") is None,
                               reason="needs gcc on x86-64")


def c_harness(tmp_path: pathlib.Path, harness: str, flags: Sequence[str]) -> Any:
    """The CPU kernels' C runtime plus ``harness`` compiled by gcc with ``flags``, loaded."""
    from taskmap.backends.cpu.runtime_c import RUNTIME_C

    src_path, lib_path = tmp_path / "t.c", tmp_path / "t.so"
    src_path.write_text(RUNTIME_C + harness)
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-std=gnu11", *flags, str(src_path), "-o", str(lib_path)],
                   check=True, capture_output=True)
    return ctypes.CDLL(str(lib_path))
