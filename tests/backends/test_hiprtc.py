"""hipRTC toolchain: HIP C++ -> AMD code objects with no GPU, cached, with readable build errors;
and the HIP module runtime, whose ``hip``-marked tests need an AMD GPU."""
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gpu_kernels import HIP_FEATURES, HIP_MFMA, HIP_VEC_ADD

from taskmap.backends.base import TargetKind
from taskmap.backends.hip import hiprtc as hr
from taskmap.backends.hip import runtime as hrt
from taskmap.backends.hip.hiprtc import HipOptions, compile_hip
from taskmap.backends.hip.target import current_hip_target, hip_target
from taskmap.errors import BuildError, TaskmapError, UnsupportedError

needs_hiprtc = pytest.mark.skipif(
    not hr.hiprtc_available(),
    reason="hipRTC (libamdhip64) not installed: apt-get install -y libamdhip64-dev",
)
BROKEN = HIP_VEC_ADD.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + undefined_thing;")
EM_AMDGPU = 224  # ELF e_machine of AMD GPU code objects


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path / "cache"))


def _is_code_object(data: bytes) -> bool:
    return data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == EM_AMDGPU


@needs_hiprtc
@pytest.mark.parametrize("arch", ["gfx90a", "gfx908", "gfx1030", "gfx90a:xnack-"])
def test_vec_add_compiles_to_a_code_object(arch):
    binary = compile_hip(HIP_VEC_ADD, "vec_add", arch)
    assert _is_code_object(binary.code_object) and binary.image == binary.code_object
    assert b"vec_add" in binary.code_object
    assert Path(binary.source_path).read_text() == HIP_VEC_ADD and binary.source_path.endswith(".hip")


@needs_hiprtc
def test_gfx942_compiles_or_is_refused_cleanly():
    # ROCm 5.2's comgr does not know gfx940+; hipRTC would abort the process, so taskmap refuses.
    if "gfx942" in (hr.comgr_isas() or ()):
        assert _is_code_object(compile_hip(HIP_VEC_ADD, "vec_add", "gfx942").code_object)
    else:
        with pytest.raises(UnsupportedError, match="cannot compile for gfx942: .*gfx90a.*newer ROCm"):
            compile_hip(HIP_VEC_ADD, "vec_add", "gfx942")


@needs_hiprtc
def test_half_shared_memory_and_math_compile():
    assert _is_code_object(compile_hip(HIP_FEATURES, "features", "gfx90a").code_object)


@needs_hiprtc
def test_mfma_builtin_compiles_for_cdna():
    assert _is_code_object(compile_hip(HIP_MFMA, "mfma", "gfx90a", HipOptions(fast_math=True)).code_object)


@needs_hiprtc
def test_second_compile_hits_the_cache_without_calling_hiprtc(monkeypatch):
    first = compile_hip(HIP_VEC_ADD, "vec_add", "gfx90a")

    def boom():
        raise AssertionError("hipRTC was called on a cache hit")

    monkeypatch.setattr(hr, "_rtc", boom)
    assert compile_hip(HIP_VEC_ADD, "vec_add", "gfx90a") == first
    with pytest.raises(AssertionError, match="cache hit"):  # another arch is a miss
        compile_hip(HIP_VEC_ADD, "vec_add", "gfx908")


def test_options_to_args():
    args = [a.decode() for a in HipOptions(fast_math=True, extra=("-DX=1",)).to_args("gfx90a")]
    assert args == ["--offload-arch=gfx90a", "-O3", "-std=c++17", "-ffast-math", "-DX=1"]


@needs_hiprtc
def test_invalid_arch_is_unsupported():
    with pytest.raises(UnsupportedError, match="invalid AMD GPU architecture 'sm_90'"):
        compile_hip(HIP_VEC_ADD, "vec_add", "sm_90")


@needs_hiprtc
def test_syntax_error_raises_build_error_with_log_source_and_command():
    with pytest.raises(BuildError) as info:
        compile_hip(BROKEN, "vec_add", "gfx90a")
    err, text = info.value, str(info.value)
    assert "use of undeclared identifier 'undefined_thing'" in text
    assert "hipRTC failed to compile vec_add for gfx90a (HIPRTC_ERROR_COMPILATION): vec_add.hip:6:" in text
    assert "comgr-" not in text                                   # temp paths replaced by vec_add.hip
    assert "> 6 |         c[i] = a[i] + undefined_thing;" in err.log
    assert Path(err.source_path).is_file() and err.source_path in text
    assert Path(err.source_path).read_text() == BROKEN
    assert err.command in text and "--arch gfx90a" in err.command


@needs_hiprtc
def test_reproduce_command_reproduces_the_error():
    with pytest.raises(BuildError) as info:
        compile_hip(BROKEN, "vec_add", "gfx1030")
    proc = subprocess.run(shlex.split(info.value.command), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "vec_add.hip:6:" in proc.stderr and "use of undeclared identifier 'undefined_thing'" in proc.stderr
    assert "> 6 |" in proc.stderr


@needs_hiprtc
def test_command_line_compiles_a_good_file(tmp_path):
    src, out = tmp_path / "k.hip", tmp_path / "k.hsaco"
    src.write_text(HIP_VEC_ADD)
    cmd = hr.reproduce_command(src, "vec_add", "gfx90a", HipOptions())
    proc = subprocess.run([*shlex.split(cmd), "-o", str(out)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "compiled vec_add for gfx90a" in proc.stdout and _is_code_object(out.read_bytes())


def test_missing_hiprtc_is_a_clear_build_error(monkeypatch):
    monkeypatch.setattr(hr, "hiprtc_library", lambda: None)
    with pytest.raises(BuildError, match="apt-get install -y libamdhip64-dev"):
        hr.compile_uncached(HIP_VEC_ADD, "vec_add", "gfx90a", HipOptions())


def test_hip_available_is_a_bool_and_never_raises():
    assert isinstance(hrt.hip_available(), bool)


def test_hip_check_names_the_error():
    if hr.hip_library() is None:
        pytest.skip("libamdhip64 not installed: apt-get install -y libamdhip64-dev")
    with pytest.raises(TaskmapError, match=r"hipMalloc\(4\) failed: hipErrorOutOfMemory"):
        hrt.check(2, "hipMalloc(4)")
    with pytest.raises(TaskmapError, match="hipErrorNoDevice"):
        hrt.check(100)


def test_without_an_amd_gpu_runtime_calls_fail_clearly():
    if hrt.hip_available():
        pytest.skip("an AMD GPU is present")
    with pytest.raises(TaskmapError, match="no AMD GPU"):
        hrt.load_module(b"\x7fELF")
    with pytest.raises(UnsupportedError, match="no AMD GPU"):
        current_hip_target()


@pytest.mark.parametrize("arch, warp, cus", [("gfx90a", 64, 110), ("gfx942", 64, 304), ("gfx1100", 32, 96)])
def test_hip_targets(arch, warp, cus):
    t = hip_target(arch)
    assert t.kind is TargetKind.HIP and t.arch == arch and t.name == f"hip:{arch}"
    assert (t.warp_size, t.num_cores, t.max_threads_per_block) == (warp, cus, 1024)
    assert t.max_shared_memory == t.max_shared_memory_optin == 64 * 1024
    assert ("mfma" in t.features) == (warp == 64) and ("wmma" in t.features) == (arch == "gfx1100")
    assert hip_target(arch + ":xnack-").warp_size == warp
    with pytest.raises(UnsupportedError, match="unknown AMD GPU architecture 'gfx9999'"):
        hip_target("gfx9999")


# ---------------------------------------------------------------------------------------------
# Needs an AMD GPU


@pytest.mark.hip
def test_vec_add_runs_on_an_amd_gpu():
    target = current_hip_target()
    n = 1000
    a, b = np.random.rand(2, n).astype(np.float32)
    module = hrt.load_module(compile_hip(HIP_VEC_ADD, "vec_add", target.arch))
    fn = module.get_function("vec_add")
    da, db, dc = hrt.to_device(a), hrt.to_device(b), hrt.alloc(4 * n)
    hrt.launch(fn, (n + 255) // 256, 256, 0, None, [da, db, dc, np.int32(n)])
    hrt.synchronize()
    np.testing.assert_array_equal(dc.copy_to(np.empty(n, np.float32)), a + b)
    for buf in (da, db, dc):
        buf.free()
    module.unload()


@pytest.mark.hip
def test_amd_device_properties():
    props = hrt.device_properties(0)
    assert props.arch.startswith("gfx") and props.warp_size in (32, 64)
    assert current_hip_target().warp_size == props.warp_size
