"""NVRTC toolchain: CUDA C++ -> cubin + PTX with no GPU, cached, with readable build errors."""
import shlex
import subprocess
from pathlib import Path

import pytest
from gpu_kernels import CUDA_KERNELS, VEC_ADD

from taskmap.backends.cuda import nvrtc as nv
from taskmap.backends.cuda.nvrtc import NvrtcOptions, compile_cuda
from taskmap.errors import BuildError, UnsupportedError

ARCHS = ["sm_80", "sm_86", "sm_89", "sm_90"]
BROKEN = VEC_ADD.replace("c[i] = a[i] + b[i];", "c[i] = a[i] + undefined_thing;")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TASKMAP_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("name", sorted(CUDA_KERNELS))
def test_kernels_compile_to_cubin_and_ptx(name, arch):
    binary = compile_cuda(CUDA_KERNELS[name], name, NvrtcOptions(arch=arch))
    assert binary.cubin is not None and binary.cubin[:4] == b"\x7fELF"
    assert f".entry {name}(" in binary.ptx
    assert f".target {arch}" in binary.ptx
    assert binary.arch == arch and binary.name == name
    assert Path(binary.source_path).read_text() == CUDA_KERNELS[name]


def test_inline_ptx_features_reach_the_ptx():
    mma = compile_cuda(CUDA_KERNELS["mma_m16n8k16"], "mma_m16n8k16", NvrtcOptions(arch="sm_90"))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in mma.ptx
    cp = compile_cuda(CUDA_KERNELS["cp_async_reverse"], "cp_async_reverse", NvrtcOptions(arch="sm_80"))
    assert "cp.async.cg.shared.global" in cp.ptx


def test_virtual_arch_gives_ptx_only():
    binary = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="compute_90"))
    assert binary.cubin is None
    assert ".entry vec_add(" in binary.ptx
    assert binary.image.endswith(b"\0")  # PTX handed to the driver NUL-terminated


def test_arch_specific_sm_90a():
    binary = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_90a"))
    assert binary.cubin[:4] == b"\x7fELF" and ".target sm_90a" in binary.ptx


def test_second_compile_hits_the_cache_without_calling_nvrtc(monkeypatch):
    first = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_86"))

    def boom(*args):
        raise AssertionError("NVRTC was called on a cache hit")

    monkeypatch.setattr(nv._nvrtc, "nvrtcCreateProgram", boom)
    second = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_86"))
    assert second == first
    with pytest.raises(AssertionError, match="cache hit"):  # a different option is a miss
        compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_86", fast_math=True))


def test_cache_files_are_written(tmp_path):
    binary = compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_80"))
    base = Path(binary.source_path).with_suffix("")
    assert base.with_suffix(".cubin").read_bytes() == binary.cubin
    assert base.with_suffix(".ptx").read_text() == binary.ptx
    assert str(tmp_path / "cache" / "cuda") in binary.source_path


def test_options_to_args():
    opts = NvrtcOptions(arch="sm_89", fast_math=True, max_registers=64, lineinfo=True, extra=("-DTILE=4",))
    args = [a.decode() for a in opts.to_args()]
    assert args[:2] == ["--gpu-architecture=sm_89", "-std=c++17"]
    assert f"-I{nv.cuda_include_dir()}" in args
    for flag in ("--use_fast_math", "-lineinfo", "--maxrregcount=64", "-DTILE=4"):
        assert flag in args
    assert opts.to_args("compute_89")[0] == b"--gpu-architecture=compute_89"


def test_lineinfo_and_defines_take_effect():
    src = VEC_ADD.replace("a[i] + b[i]", "a[i] + b[i] * SCALE")
    binary = compile_cuda(src, "vec_add", NvrtcOptions(arch="sm_80", lineinfo=True, extra=("-DSCALE=3.0f",)))
    assert ".loc" in binary.ptx and "0f40400000" in binary.ptx  # 3.0f from -DSCALE


def test_include_dir_has_fp16_and_bf16_headers():
    inc = nv.cuda_include_dir()
    assert (inc / "cuda_fp16.h").is_file() and (inc / "cuda_bf16.h").is_file()


def test_missing_headers_wheel_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(nv.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(nv, "_toolkit_includes", lambda: [])
    with pytest.raises(BuildError, match="pip install nvidia-cuda-runtime-cu12"):
        nv.cuda_include_dir()


def test_headers_of_a_cuda_toolkit_are_a_fallback(monkeypatch, tmp_path):
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_fp16.h").write_text("")
    monkeypatch.setattr(nv.importlib.util, "find_spec", lambda name: None)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert nv.cuda_include_dir() == tmp_path / "include"
    assert str(tmp_path / "include") in nv._headers_version()


def test_ptx_comes_from_a_second_program_when_the_first_gives_none(monkeypatch):
    real = nv._nvrtc.nvrtcGetPTXSize
    calls = []

    def first_empty(prog):
        calls.append(prog)
        return (nv._nvrtc.nvrtcResult.NVRTC_SUCCESS, 0) if len(calls) == 1 else real(prog)

    monkeypatch.setattr(nv._nvrtc, "nvrtcGetPTXSize", first_empty)
    res = nv.compile_uncached(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_90"))
    assert len(calls) == 2 and ".entry vec_add(" in res.ptx and res.cubin[:4] == b"\x7fELF"


def test_unknown_arch_is_unsupported():
    with pytest.raises(UnsupportedError, match="invalid CUDA architecture 'ampere'"):
        NvrtcOptions(arch="ampere")
    with pytest.raises(UnsupportedError, match="cannot compile for sm_95: supported architectures are .*sm_90"):
        compile_cuda(VEC_ADD, "vec_add", NvrtcOptions(arch="sm_95"))


def test_arch_for_capability_falls_back_to_newest_known():
    assert nv.arch_for_capability(8, 0) == "sm_80"
    assert nv.arch_for_capability(9, 0) == "sm_90"
    assert nv.arch_for_capability(9, 5) == "sm_90"  # unknown to NVRTC: PTX JIT from sm_90
    newest = max(nv.supported_archs())
    assert nv.arch_for_capability(99, 9) == f"sm_{newest}"
    assert nv.nvrtc_version() >= (12, 0)


def test_syntax_error_raises_build_error_with_log_source_and_command():
    with pytest.raises(BuildError) as info:
        compile_cuda(BROKEN, "vec_add", NvrtcOptions(arch="sm_90"))
    err, text = info.value, str(info.value)
    assert 'identifier "undefined_thing" is undefined' in text           # NVRTC's message
    assert "NVRTC failed to compile vec_add for sm_90 (NVRTC_ERROR_COMPILATION)" in text
    assert "c[i] = a[i] + undefined_thing;" in text                       # the offending line
    assert "> 6 |         c[i] = a[i] + undefined_thing;" in err.log        # marked, numbered
    assert Path(err.source_path).is_file() and err.source_path in text
    assert Path(err.source_path).read_text() == BROKEN
    assert err.command in text and "--arch sm_90" in err.command


def test_reproduce_command_reproduces_the_error():
    with pytest.raises(BuildError) as info:
        compile_cuda(BROKEN, "vec_add", NvrtcOptions(arch="sm_80", fast_math=True))
    proc = subprocess.run(shlex.split(info.value.command), capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert 'vec_add.cu(6): error: identifier "undefined_thing" is undefined' in proc.stderr
    assert "> 6 |" in proc.stderr


def test_command_line_compiles_a_good_file(tmp_path):
    src = tmp_path / "k.cu"
    src.write_text(VEC_ADD)
    out, ptx = tmp_path / "k.cubin", tmp_path / "k.ptx"
    proc = subprocess.run([*shlex.split(nv.reproduce_command(src, "vec_add", NvrtcOptions(arch="sm_89"))),
                           "-o", str(out), "--ptx", str(ptx)], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "compiled vec_add for sm_89" in proc.stdout
    assert out.read_bytes()[:4] == b"\x7fELF" and ".entry vec_add(" in ptx.read_text()


def test_header_errors_are_not_annotated_as_program_lines():
    log = 'cuda_fp16.hpp(10): error: something\n  x\n\nvec_add.cu(2): error: other\n  y\n'
    out = nv.annotate(log, "line1\nline2\nline3\n", "vec_add")
    assert out.count("generated source around line") == 1 and "> 2 | line2" in out
