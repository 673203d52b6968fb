"""CUDA driver wrapper and targets.  Without a GPU only the error handling, argument packing and
target tables run; the ``cuda``-marked tests launch real kernels on an NVIDIA GPU."""
import ctypes

import numpy as np
import pytest
from gpu_kernels import CP_ASYNC, DYNAMIC_SHARED, HALF_BF16, MMA_M16N8K16, VEC_ADD, mma_fragments, mma_unpack

from taskmap.backends.base import TargetKind
from taskmap.backends.cuda import driver as drv
from taskmap.backends.cuda.nvrtc import NvrtcOptions, compile_cuda, nvrtc_version
from taskmap.backends.cuda.target import cuda_target, current_cuda_target, target_from_properties
from taskmap.backends.kernel_args import pack_args
from taskmap.errors import LaunchError, TaskmapError, UnsupportedError


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path / "cache"))


# ---------------------------------------------------------------------------------------------
# Runs everywhere


def test_cuda_available_is_a_bool_and_never_raises():
    assert isinstance(drv.cuda_available(), bool)


def test_cuda_available_is_false_when_the_driver_library_is_missing(monkeypatch):
    def no_driver(flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(drv.cu, "cuInit", no_driver)
    drv.cuda_available.cache_clear()
    try:
        assert drv.cuda_available() is False
    finally:
        drv.cuda_available.cache_clear()


def test_check_names_the_cuda_error():
    with pytest.raises(TaskmapError, match=r"^cuMemAlloc\(1\) failed: CUDA_ERROR_OUT_OF_MEMORY"):
        drv.check((drv.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY, None), "cuMemAlloc(1)")
    with pytest.raises(TaskmapError, match="CUDA_ERROR_INVALID_VALUE"):
        drv.check(1)                                  # a plain int result code
    with pytest.raises(TaskmapError, match="CUDA_ERROR_NO_BINARY_FOR_GPU"):
        drv.check(drv.cu.CUresult.CUDA_ERROR_NO_BINARY_FOR_GPU, "cuModuleLoadData")
    assert drv.error_name(123456) == "unknown CUresult 123456"


def test_check_returns_the_payload():
    ok = drv.cu.CUresult.CUDA_SUCCESS
    assert drv.check((ok, 7)) == 7
    assert drv.check((ok, 1, 2)) == (1, 2)
    assert drv.check((ok,)) is None and drv.check(ok) is None


def test_without_a_gpu_device_calls_fail_clearly():
    if drv.cuda_available():
        pytest.skip("an NVIDIA GPU is present")
    with pytest.raises(TaskmapError, match="no NVIDIA GPU"):
        drv.device_properties(0)
    with pytest.raises(UnsupportedError, match="no NVIDIA GPU"):
        current_cuda_target()
    assert drv.device_count() == 0


def test_pack_args_points_at_each_value():
    class Buffer:
        ptr = 0xDEAD0000

    packed = pack_args([ctypes.c_int32(-3), np.float32(1.5), np.int64(1 << 40), Buffer(), ctypes.c_uint8(7)])
    ptrs = packed.pointers
    assert len(packed) == 5 and packed.address == ctypes.addressof(ptrs)
    assert ctypes.cast(ptrs[0], ctypes.POINTER(ctypes.c_int32)).contents.value == -3
    assert ctypes.cast(ptrs[1], ctypes.POINTER(ctypes.c_float)).contents.value == 1.5
    assert ctypes.cast(ptrs[2], ctypes.POINTER(ctypes.c_int64)).contents.value == 1 << 40
    assert ctypes.cast(ptrs[3], ctypes.POINTER(ctypes.c_uint64)).contents.value == 0xDEAD0000
    assert ctypes.cast(ptrs[4], ctypes.POINTER(ctypes.c_uint8)).contents.value == 7
    assert pack_args([]).address == 0


def test_pack_args_accepts_tensors_and_cuda_python_pointers():
    class Tensor:
        def data_ptr(self):
            return 4096

    packed = pack_args([Tensor(), drv.cu.CUdeviceptr(8192)])
    assert [ctypes.cast(p, ctypes.POINTER(ctypes.c_uint64)).contents.value for p in packed.pointers] == [4096, 8192]


def test_pack_args_refuses_ambiguous_arguments():
    with pytest.raises(LaunchError, match=r"argument 1 is a Python int \(3\).*ctypes.c_int32"):
        pack_args([ctypes.c_int(1), 3])
    with pytest.raises(LaunchError, match="argument 0 is a Python float"):
        pack_args([2.0])
    with pytest.raises(LaunchError, match="host numpy array of shape \\(4,\\)"):
        pack_args([np.zeros(4)])
    with pytest.raises(LaunchError, match="unsupported type str"):
        pack_args(["x"])


@pytest.mark.parametrize("arch, sms, optin", [("sm_80", 108, 166912), ("sm_86", 84, 101376),
                                               ("sm_89", 142, 101376), ("sm_90", 132, 232448)])
def test_cuda_targets(arch, sms, optin):
    t = cuda_target(arch)
    assert t.kind is TargetKind.CUDA and t.arch == arch and t.name == f"cuda:{arch}"
    assert (t.warp_size, t.max_threads_per_block, t.vector_bytes) == (32, 1024, 16)
    assert (t.num_cores, t.max_shared_memory, t.max_shared_memory_optin) == (sms, 48 * 1024, optin)
    assert {"cp_async", "bf16", "mma_f16"} <= set(t.features)
    hash(t)


def test_cuda_target_features_by_arch():
    assert "fp8" not in cuda_target("sm_80").features and "fp8" in cuda_target("sm_89").features
    assert "tma" in cuda_target("sm_90").features and "wgmma" not in cuda_target("sm_90").features
    assert "wgmma" in cuda_target("sm_90a").features
    with pytest.raises(UnsupportedError, match="unknown CUDA architecture 'sm_99'"):
        cuda_target("sm_99")


def test_target_from_properties_uses_the_device_numbers():
    props = drv.DeviceProperties("NVIDIA H200", (9, 0), 132, 1024, 49152, 232448, 233472, 65536, 32,
                                 141 << 30, 60 << 20)
    t = target_from_properties(props)
    assert (t.arch, t.num_cores, t.max_shared_memory_optin) == ("sm_90a", 132, 232448)   # wgmma: sm_90a
    assert "wgmma" in t.features
    ada = target_from_properties(drv.DeviceProperties("NVIDIA L40S", (8, 9), 142, 1024, 49152, 101376, 102400,
                                                      65536, 32, 48 << 30, 96 << 20))
    assert ada.arch == "sm_89" and "wgmma" not in ada.features
    newer = target_from_properties(drv.DeviceProperties("future", (99, 0), 200, 1024, 49152, 1 << 18,
                                                        1 << 18, 65536, 32, 1 << 40, 1 << 27))
    assert newer.num_cores == 200 and newer.arch.startswith("sm_")


# ---------------------------------------------------------------------------------------------
# Needs an NVIDIA GPU


def _run(src: str, name: str, grid, block, args, shared=0, **opts) -> drv.CudaModule:
    module = drv.load_module(compile_cuda(src, name, NvrtcOptions(arch=current_cuda_target().arch, **opts)))
    fn = module.get_function(name)
    if shared > 48 * 1024:
        drv.set_max_dynamic_shared(fn, shared)
    drv.launch(fn, grid, block, shared, None, args)
    drv.synchronize()
    return module


@pytest.mark.cuda
def test_vec_add_runs_on_the_gpu():
    n = 1000
    a, b = np.random.rand(2, n).astype(np.float32)
    da, db, dc = drv.to_device(a), drv.to_device(b), drv.alloc(4 * n)
    module = _run(VEC_ADD, "vec_add", (n + 255) // 256, 256, [da, db, dc, np.int32(n)])
    assert module.loaded_from == "cubin"
    np.testing.assert_array_equal(dc.copy_to(np.empty(n, np.float32)), a + b)
    for buf in (da, db, dc):
        buf.free()
    module.unload()


@pytest.mark.cuda
def test_graph_seconds_times_captured_launches_on_the_device():
    # vec_add on 1 M floats (12 MB moved) with the host out of the loop: a few microseconds per
    # launch at the card's bandwidth (a host-timed launch alone costs about as much)
    n = 1 << 20
    a, b = np.random.rand(2, n).astype(np.float32)
    da, db, dc = drv.to_device(a), drv.to_device(b), drv.alloc(4 * n)
    args = [da, db, dc, np.int32(n)]
    module = _run(VEC_ADD, "vec_add", (n + 255) // 256, 256, args)
    fn = module.get_function("vec_add")
    times = drv.graph_seconds(lambda stream: drv.launch(fn, (n + 255) // 256, 256, 0, stream, args), number=20, repeat=3)
    assert len(times) == 3 and all(0 < t < 1e-4 for t in times), times
    dc.copy_from(np.zeros(n, np.float32))              # the captured launches write c again
    drv.graph_seconds(lambda stream: drv.launch(fn, (n + 255) // 256, 256, 0, stream, args), number=1, repeat=1)
    np.testing.assert_array_equal(dc.copy_to(np.empty(n, np.float32)), a + b)
    for buf in (da, db, dc):
        buf.free()
    module.unload()


@pytest.mark.cuda
def test_half_and_bf16_kernel_runs():
    n = 300
    a = np.random.rand(n).astype(np.float16)
    b32 = np.random.rand(n).astype(np.float32)
    b_bits = (b32.view(np.uint32) >> 16).astype(np.uint16)      # truncate to bf16
    b_bf16 = (b_bits.astype(np.uint32) << 16).view(np.float32)
    da, db, dout = drv.to_device(a), drv.to_device(b_bits), drv.alloc(4 * n)
    _run(HALF_BF16, "half_bf16", (n + 127) // 128, 128, [da, db, dout, ctypes.c_int(n)])
    expected = 2 * a.astype(np.float32) + (b_bf16 + 1)
    np.testing.assert_allclose(dout.copy_to(np.empty(n, np.float32)), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.cuda
def test_mma_m16n8k16_matches_numpy():
    a = np.random.randn(16, 16).astype(np.float16)
    b = np.random.randn(16, 8).astype(np.float16)
    fa, fb = mma_fragments(a, b)
    da, db, dd = drv.to_device(fa), drv.to_device(fb), drv.alloc(32 * 4 * 4)
    _run(MMA_M16N8K16, "mma_m16n8k16", 1, 32, [da, db, dd])
    d = mma_unpack(dd.copy_to(np.empty((32, 4), np.float32)))
    np.testing.assert_allclose(d, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-3)


@pytest.mark.cuda
def test_cp_async_kernel_runs():
    blocks = 3
    src = np.random.rand(blocks, 128, 4).astype(np.float32)
    dsrc, ddst = drv.to_device(src), drv.alloc(src.nbytes)
    _run(CP_ASYNC, "cp_async_reverse", blocks, 128, [dsrc, ddst])
    np.testing.assert_array_equal(ddst.copy_to(np.empty_like(src)), src[:, ::-1, :])


@pytest.mark.cuda
def test_dynamic_shared_memory_above_48kb():
    props = drv.device_properties(0)
    n = (props.shared_memory_per_block_optin - 1024) // 4
    src = np.arange(n, dtype=np.float32)
    dsrc, ddst = drv.to_device(src), drv.alloc(src.nbytes)
    _run(DYNAMIC_SHARED, "big_smem", 1, 256, [dsrc, ddst, np.int32(n)], shared=4 * n)
    np.testing.assert_array_equal(ddst.copy_to(np.empty_like(src)), src[::-1])


@pytest.mark.cuda
def test_ptx_loads_through_the_jit():
    if drv.driver_version() < nvrtc_version():
        pytest.skip(f"driver supports CUDA {drv.driver_version()}, older than NVRTC {nvrtc_version()}: "
                    "its JIT cannot read this PTX")
    binary = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch=current_cuda_target().arch))
    module = drv.load_module(binary.ptx)
    assert module.loaded_from == "ptx"
    fn = module.get_function("vec_add")
    assert fn.num_registers > 0 and fn.max_threads_per_block >= 256
    with pytest.raises(TaskmapError, match="cuModuleGetFunction\\('nope'\\) failed: CUDA_ERROR_NOT_FOUND"):
        module.get_function("nope")


@pytest.mark.cuda
def test_device_properties_and_current_target():
    props = drv.device_properties(0)
    assert props.warp_size == 32 and props.multiprocessor_count > 0
    assert props.shared_memory_per_block_optin >= props.shared_memory_per_block == 48 * 1024
    t = current_cuda_target()
    assert t.num_cores == props.multiprocessor_count and t.kind is TargetKind.CUDA
    assert drv.primary_context(0) is drv.primary_context(0)


@pytest.mark.cuda
def test_launch_errors_name_the_cuda_error():
    module = _run(VEC_ADD, "vec_add", 1, 32, [drv.alloc(128), drv.alloc(128), drv.alloc(128), np.int32(32)])
    fn = module.get_function("vec_add")
    with pytest.raises(TaskmapError, match="cuLaunchKernel.*CUDA_ERROR_INVALID_VALUE"):
        drv.launch(fn, 1, 4096, 0, None, [drv.alloc(4), drv.alloc(4), drv.alloc(4), np.int32(1)])
