"""Bad GPU launches and builds raise clear errors, detected on the CPU before any GPU call.

GPU arrays here are fakes (``__cuda_array_interface__`` with made-up pointers, or DLPack device
ids): every test either expects an error raised before a launch, or is skipped where a GPU would
really launch on them.  The register-limit check, which needs the loaded function, is in
test_cuda_kernels.py (``cuda`` marker).
"""
import shlex
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest
import test_launch_errors as cpu_errors

import taskmap
from taskmap import spatial
from taskmap.backends import host_cpu_target
from taskmap.backends.cuda import backend as cuda_backend
from taskmap.backends.cuda import driver
from taskmap.backends.hip import backend as hip_backend
from taskmap.backends.hip import hiprtc
from taskmap.backends.hip import runtime as hip_runtime
from taskmap.errors import BuildError, LaunchError, UnsupportedError
from taskmap.lang import attrs, blockIdx, f32, shared_tensor, syncthreads, threadIdx

BOGUS = 0xBAD0_0000_0000
no_cuda = pytest.mark.skipif(driver.cuda_available(), reason="an NVIDIA GPU is present: it would launch")
no_hip = pytest.mark.skipif(hip_runtime.hip_available(), reason="an AMD GPU is present: it would launch")
needs_hiprtc = pytest.mark.skipif(not hiprtc.hiprtc_available(), reason="hipRTC (libamdhip64) not installed")


class FakeGpuArray:
    """A device array on ``device`` ("cuda:N" / "hip:N") whose memory nobody may touch."""

    def __init__(self, shape, device="cuda:0", typestr="<f4"):
        kind, index = device.split(":")
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (BOGUS, False),
                                         "version": 3, "strides": None}
        self._dl = (2 if kind == "cuda" else 10, int(index))

    def __dlpack_device__(self):
        return self._dl


def fakes(n, shape=(1024,), device="cuda:0"):
    return [FakeGpuArray(shape, device) for _ in range(n)]


@taskmap.kernel
def vec_add(a: f32[1024], b: f32[1024], c: f32[1024]):
    attrs.grid_dim = 4
    attrs.block_dim = 256
    for i in spatial(1024).on(blockIdx.x * 256 + threadIdx.x):
        c[i] = a[i] + b[i]


@taskmap.kernel
def smem_128k(a: f32[256], out: f32[256]):
    attrs.block_dim = 256
    s = shared_tensor(f32, [128, 256])                     # 128 KB
    s[127, threadIdx.x] = a[threadIdx.x]
    syncthreads()
    out[threadIdx.x] = s[127, 255 - threadIdx.x]


# ----------------------------------------------------------------------------- no GPU here


@no_cuda
def test_cuda_build_without_arch_needs_one():
    with pytest.raises(UnsupportedError, match=r"no NVIDIA GPU here: pass arch= \(e\.g\. build\('cuda', "
                                               r"arch='sm_90'\)\) to build anyway"):
        vec_add.build("cuda")


@no_hip
def test_hip_build_without_arch_needs_one():
    with pytest.raises(UnsupportedError, match=r"no AMD GPU here: pass arch= \(e\.g\. build\('hip', arch='gfx90a'\)\)"):
        vec_add.build("hip")


@no_cuda
def test_kernel_built_for_cuda_without_a_gpu_explains_what_is_there():
    k = vec_add.build("cuda", arch="sm_90")
    assert 'extern "C" __global__' in k.source and k.binary[:4] == b"\x7fELF" and k.launcher is None
    with pytest.raises(UnsupportedError, match=r"vec_add: built for cuda:sm_90, but no such device is present in "
                                               r"this process: the source and binary are available"):
        k(*fakes(3))


@no_hip
@needs_hiprtc
def test_kernel_built_for_hip_without_a_gpu_explains_what_is_there():
    k = vec_add.build("hip", arch="gfx90a")
    with pytest.raises(UnsupportedError, match=r"built for hip:gfx90a, but no such device is present"):
        k(*fakes(3, device="hip:0"))


@no_cuda
def test_calling_a_kernel_on_gpu_arrays_without_a_gpu():
    with pytest.raises(UnsupportedError, match=r"no NVIDIA GPU here: pass arch="):
        vec_add(*fakes(3))


# ----------------------------------------------------------------------------- arrays on the wrong device


def test_host_arrays_to_a_kernel_built_for_cuda():
    k = vec_add.build("cuda", arch="sm_90")
    host = [np.zeros(1024, np.float32) for _ in range(3)]
    hint = r"move them to the GPU with taskmap\.tensor\(array, device='cuda'\) or torch's \.cuda\(\)"
    with pytest.raises(LaunchError, match=r"^vec_add\(\) was built for cuda:sm_90 but got tensors on cpu; " + hint):
        k(*host)
    with pytest.raises(LaunchError, match=r"built for cuda:sm_90 but got tensors on cpu"):
        k(*(taskmap.tensor(h, device="cpu") for h in host))
    with pytest.raises(LaunchError, match=r"built for cuda:sm_90 but got tensors on hip:0"):
        k(*fakes(3, device="hip:0"))
    torch = pytest.importorskip("torch")
    with pytest.raises(LaunchError, match=r"built for cuda:sm_90 but got tensors on cpu; " + hint):
        k(*(torch.zeros(1024) for _ in range(3)))


@needs_hiprtc
def test_host_arrays_to_a_kernel_built_for_hip():
    k = vec_add.build("hip", arch="gfx90a")
    with pytest.raises(LaunchError, match=r"built for hip:gfx90a but got tensors on cpu; move them to the GPU with "
                                          r"taskmap\.tensor\(array, device='hip'\)"):
        k(*(np.zeros(1024, np.float32) for _ in range(3)))


def test_gpu_arrays_to_a_kernel_built_for_the_cpu():
    k = vec_add.build("cpu")
    with pytest.raises(LaunchError, match=rf"built for {host_cpu_target().name} but got tensors on cuda:0; copy "
                                          r"them to the host first"):
        k(*fakes(3))


def test_arrays_on_different_devices():
    k = vec_add.build("cuda", arch="sm_90")
    a, b = FakeGpuArray((1024,), "cuda:0"), FakeGpuArray((1024,), "cuda:1")
    with pytest.raises(LaunchError, match=r"vec_add\(\): arguments are on different devices: \['cuda:0', 'cuda:1'\]"):
        k(a, b, FakeGpuArray((1024,), "cuda:0"))
    with pytest.raises(LaunchError, match=r"arguments are on different devices: \['cpu', 'cuda:0'\]"):
        k(a, np.zeros(1024, np.float32), a)
    with pytest.raises(LaunchError, match=r"^arguments are on different devices: \['cuda:0', 'cuda:1'\]"):
        vec_add(a, b, a)                                 # Kernel.__call__ chooses the backend first
    with pytest.raises(LaunchError, match=r"different devices: \['cuda:0', 'hip:0'\]"):
        vec_add(a, FakeGpuArray((1024,), "hip:0"), a)
    torch = pytest.importorskip("torch")
    meta = torch.empty(1024, device="meta")
    with pytest.raises(LaunchError, match=r"vec_add\(\): arguments are on different devices: \['cpu', 'meta'\]"):
        k(torch.zeros(1024), meta, meta)
    with pytest.raises(LaunchError, match=r"built for cuda:sm_90 but got tensors on meta"):
        k(meta, meta, meta)


def test_bad_shapes_and_dtypes_of_gpu_arrays():
    k = vec_add.build("cuda", arch="sm_90")
    with pytest.raises(LaunchError, match=r"argument 'b' must have dtype float32, got float16"):
        k(FakeGpuArray((1024,)), FakeGpuArray((1024,), typestr="<f2"), FakeGpuArray((1024,)))
    with pytest.raises(LaunchError, match=r"argument 'c': dimension 0 must be 1024, got shape \(1000,\)"):
        k(FakeGpuArray((1024,)), FakeGpuArray((1024,)), FakeGpuArray((1000,)))


# ----------------------------------------------------------------------------- launch limits of the target


def test_threads_per_block_over_the_target_limit():
    k = cpu_errors.too_many_threads.build("cuda", arch="sm_90")
    with pytest.raises(LaunchError, match=r"too_many_threads\(\): 2048 threads per block exceeds the limit of 1024 "
                                          r"\(max_threads_per_block\) on cuda:sm_90"):
        k(FakeGpuArray((2048,)))
    k2 = cpu_errors.too_many_threads_2d.build("cuda", arch="sm_80")
    with pytest.raises(LaunchError, match=r"2048 threads per block exceeds the limit of 1024 .* on cuda:sm_80"):
        k2(FakeGpuArray((64, 32)))


def test_grid_evaluating_to_zero_on_cuda():
    k = cpu_errors.quarter_grid.build("cuda", arch="sm_90")
    with pytest.raises(LaunchError, match=r"grid \(0, 1, 1\) and block \(4, 1, 1\) dimensions must be positive"):
        k(FakeGpuArray((3,)))


@pytest.mark.parametrize("target, arch, limit", [("cuda", "sm_86", 101376), ("cuda", "sm_75", 65536),
                                                 ("hip", "gfx90a", 65536)])
def test_shared_memory_over_the_target_limit(target, arch, limit):
    if target == "hip" and not hiprtc.hiprtc_available():
        pytest.skip("hipRTC not installed")
    k = smem_128k.build(target, arch=arch)
    assert k.smem_bytes == 131072
    with pytest.raises(LaunchError, match=rf"smem_128k\(\): 131072 bytes of shared memory per block exceeds the limit "
                                          rf"of {limit} bytes on {target}:{arch}"):
        k(*fakes(2, (256,), "cuda:0" if target == "cuda" else "hip:0"))


@no_cuda
def test_shared_memory_within_the_opt_in_limit_gets_to_the_launch():
    k = smem_128k.build("cuda", arch="sm_90")             # 128 KB > 48 KB, < 227 KB: opt-in path
    assert k.target.max_shared_memory_optin == 232448
    with pytest.raises(UnsupportedError, match="no such device"):
        k(*fakes(2, (256,)))
    huge = cpu_errors.huge_smem.build("cuda", arch="sm_90")
    with pytest.raises(LaunchError, match=r"4194304 bytes of shared memory per block exceeds the limit of 232448"):
        huge(FakeGpuArray((4,)))


# ----------------------------------------------------------------------------- generated code NVRTC / hipRTC reject


@pytest.fixture
def private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def broken_renderer(real, marker):
    def render(module, target, dialect):
        return real(module, target, dialect) + f"\n__device__ int {marker} = undefined_symbol_{marker};\n"
    return render


def fresh_kernel():
    tag = uuid.uuid4().hex[:8]

    @taskmap.kernel
    def scale(a: f32[256], out: f32[256]):
        attrs.block_dim = 256
        out[threadIdx.x] = a[threadIdx.x] * 3.0
    return scale, f"tm_bad_{tag}"


def check_build_error(err: BuildError, marker: str, suffix: str, cache: Path) -> list[str]:
    text = str(err)
    assert f"undefined_symbol_{marker}" in err.log and "error" in err.log
    assert "generated source around line" in err.log        # the log points into the generated source
    source = Path(err.source_path)
    assert source.suffix == suffix and source.is_file() and str(cache) in err.source_path
    assert 'extern "C" __global__' in source.read_text() and marker in source.read_text()
    assert f"generated source: {err.source_path}" in text and f"reproduce with: {err.command}" in text
    cmd = shlex.split(err.command)
    assert err.source_path in cmd and cmd[cmd.index("--name") + 1] == "scale"
    return cmd


def test_nvrtc_error_from_a_dsl_kernel(monkeypatch, private_cache):
    kern, marker = fresh_kernel()
    monkeypatch.setattr(cuda_backend, "render_gpu", broken_renderer(cuda_backend.render_gpu, marker))
    with pytest.raises(BuildError, match=r"^NVRTC failed to compile scale for sm_90 \(NVRTC_ERROR_COMPILATION\): "
                                         rf"scale\.cu\(\d+\): error: identifier \"undefined_symbol_{marker}\" is "
                                         r"undefined") as info:
        kern.build("cuda", arch="sm_90")
    cmd = check_build_error(info.value, marker, ".cu", private_cache)
    assert cmd[cmd.index("--arch") + 1] == "sm_90" and "taskmap.backends.cuda" in cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and f"undefined_symbol_{marker}" in proc.stderr
    monkeypatch.undo()
    assert kern.build("cuda", arch="sm_90").binary[:4] == b"\x7fELF"   # nothing broken was cached


@needs_hiprtc
def test_hiprtc_error_from_a_dsl_kernel(monkeypatch, private_cache):
    kern, marker = fresh_kernel()
    monkeypatch.setattr(hip_backend, "render_gpu", broken_renderer(hip_backend.render_gpu, marker))
    with pytest.raises(BuildError, match=r"^hipRTC failed to compile scale for gfx90a \(HIPRTC_ERROR_COMPILATION\): "
                                         rf"scale\.hip:\d+:\d+: error: use of undeclared identifier "
                                         rf"'undefined_symbol_{marker}'") as info:
        kern.build("hip", arch="gfx90a")
    cmd = check_build_error(info.value, marker, ".hip", private_cache)
    assert cmd[cmd.index("--arch") + 1] == "gfx90a" and "taskmap.backends.hip" in cmd
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1 and f"undefined_symbol_{marker}" in proc.stderr
