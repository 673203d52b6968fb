"""Compile CUDA C++ in-process with NVRTC (``cuda.bindings.nvrtc``), through the disk cache.

No GPU and no ``nvcc`` are needed: headers come from the ``nvidia-cuda-runtime-cu12`` wheel and
NVRTC from ``nvidia-cuda-nvrtc-cu12``.  For a real architecture (``sm_90``) one NVRTC program
yields both the cubin and the PTX (NVRTC 12.x allows both queries after one compile); for a
virtual one (``compute_90``) only PTX comes out.  The PTX is the fallback the driver JIT-compiles
when the cubin does not fit the GPU (a GPU newer than this NVRTC knows).

Reproduce a failed build outside taskmap (the command is in every BuildError)::

    python -m taskmap.backends.cuda path/to/kernel.cu --name vec_add --arch sm_90
"""
from __future__ import annotations

import argparse
import functools
import importlib.metadata
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cuda.bindings import nvrtc as _nvrtc

from ...errors import BuildError, UnsupportedError
from ...runtime.cache import DiskCache, cache_key
from ..compiler_log import NVRTC_DIAG, annotate_log, first_error

_cache = DiskCache("cuda")
_ARCH_RE = re.compile(r"(?P<kind>sm|compute)_(?P<num>\d+)(?P<suffix>[af]?)")
_ELF_MAGIC = b"\x7fELF"


# ---------------------------------------------------------------------------------------------
# Options


@dataclass(frozen=True)
class NvrtcOptions:
    """Everything that changes NVRTC's output; hashed (as a dataclass) into the cache key."""

    arch: str = "sm_80"               # sm_80, sm_86, sm_89, sm_90, sm_90a, ... or compute_XX (PTX only)
    std: str = "c++17"
    fast_math: bool = False
    max_registers: int | None = None
    lineinfo: bool = False
    extra: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not _ARCH_RE.fullmatch(self.arch):
            raise UnsupportedError(f"invalid CUDA architecture {self.arch!r}: expected e.g. 'sm_90' or 'compute_90'")
        if self.max_registers is not None and not 1 <= self.max_registers <= 255:
            raise ValueError(f"max_registers must be in 1..255, got {self.max_registers}")
        if isinstance(self.extra, (str, list)):
            object.__setattr__(self, "extra", (self.extra,) if isinstance(self.extra, str) else tuple(self.extra))

    @property
    def is_real_arch(self) -> bool:
        """True for ``sm_XX`` (a cubin comes out), False for ``compute_XX`` (PTX only)."""
        return self.arch.startswith("sm_")

    @property
    def virtual_arch(self) -> str:
        """``compute_XX`` for this architecture (what PTX is generated for)."""
        return "compute_" + self.arch.split("_", 1)[1]

    def to_args(self, arch: str | None = None) -> list[bytes]:
        """NVRTC command-line options (``arch`` overrides ``self.arch``)."""
        args = [f"--gpu-architecture={arch or self.arch}", f"-std={self.std}", f"-I{cuda_include_dir()}"]
        if self.fast_math:
            args.append("--use_fast_math")
        if self.lineinfo:
            args.append("-lineinfo")
        if self.max_registers is not None:
            args.append(f"--maxrregcount={self.max_registers}")
        args.extend(self.extra)
        return [a.encode() for a in args]

    def to_cli(self) -> list[str]:
        """The same options as arguments of ``python -m taskmap.backends.cuda``."""
        cli = ["--arch", self.arch, "--std", self.std]
        if self.fast_math:
            cli.append("--fast-math")
        if self.lineinfo:
            cli.append("--lineinfo")
        if self.max_registers is not None:
            cli += ["--maxrregcount", str(self.max_registers)]
        cli += [f"--extra={e}" for e in self.extra]
        return cli


@dataclass(frozen=True)
class CudaBinary:
    """NVRTC's output: a cubin (None for ``compute_XX``), the PTX, and the compile log."""

    name: str
    arch: str
    ptx: str
    cubin: bytes | None
    log: str = ""
    source_path: str | None = None

    @property
    def image(self) -> bytes:
        """What to hand to ``cuModuleLoadData`` first: the cubin, else NUL-terminated PTX."""
        return self.cubin if self.cubin is not None else self.ptx.encode() + b"\0"


# ---------------------------------------------------------------------------------------------
# Toolchain discovery


#: Where CUDA's wheels put the runtime headers: ``nvidia-cuda-runtime-cu12`` (CUDA 12) and
#: ``nvidia-cuda-runtime`` (CUDA 13, one ``nvidia/cu13`` tree for all its wheels).
_HEADER_PACKAGES = (("nvidia.cuda_runtime", "nvidia-cuda-runtime-cu12"), ("nvidia.cu13", "nvidia-cuda-runtime"))


def _package_dirs(module: str) -> list[Path]:
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return []
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


def _toolkit_includes() -> list[Path]:
    roots = [os.environ[v] for v in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(v)] + ["/usr/local/cuda"]
    return [Path(r) / "include" for r in roots]


def cuda_include_dir() -> Path:
    """The CUDA headers (cuda_fp16.h, cuda_bf16.h, ...): from the runtime wheel of CUDA 12
    (``nvidia-cuda-runtime-cu12``) or 13 (``nvidia-cuda-runtime``), else from a CUDA toolkit
    (``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``)."""
    candidates = [d / "include" for module, _ in _HEADER_PACKAGES for d in _package_dirs(module)]
    for include in candidates + _toolkit_includes():
        if (include / "cuda_fp16.h").is_file():
            return include
    raise BuildError(
        "CUDA headers not found: the 'nvidia-cuda-runtime-cu12' wheel (which provides "
        "nvidia/cuda_runtime/include/cuda_fp16.h) is not installed, and no CUDA toolkit was found "
        "($CUDA_HOME, /usr/local/cuda); run `pip install nvidia-cuda-runtime-cu12`"
    )


def _headers_version() -> str:
    """What the headers are, for cache keys: the wheel's version or the toolkit's path."""
    include = cuda_include_dir()
    for module, dist in _HEADER_PACKAGES:
        if any(include == d / "include" for d in _package_dirs(module)):
            try:
                return f"{dist} {importlib.metadata.version(dist)}"
            except importlib.metadata.PackageNotFoundError:
                break
    version = include.parent / "version.json"
    return f"{include} {version.read_text()[:200] if version.is_file() else ''}"


def _call(fn, *args):
    """Call an NVRTC binding, turning a missing libnvrtc into a BuildError."""
    try:
        return fn(*args)
    except RuntimeError as exc:  # cuda.pathfinder's DynamicLibNotFoundError is a RuntimeError
        raise BuildError(
            f"NVRTC could not be loaded ({exc}); install it with `pip install nvidia-cuda-nvrtc-cu12`"
        ) from None


def _error_name(result) -> str:
    err, text = _nvrtc.nvrtcGetErrorString(result)
    return text.decode() if err == _nvrtc.nvrtcResult.NVRTC_SUCCESS else getattr(result, "name", str(result))


def _check(result, what: str) -> None:
    if result != _nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise BuildError(f"NVRTC {what} failed: {_error_name(result)}")


@functools.cache
def nvrtc_version() -> tuple[int, int]:
    err, major, minor = _call(_nvrtc.nvrtcVersion)
    _check(err, "nvrtcVersion")
    return major, minor


@functools.cache
def supported_archs() -> tuple[int, ...]:
    """Compute capabilities this NVRTC can target, e.g. ``(75, 80, 86, 89, 90, 100, 120)``."""
    err, archs = _call(_nvrtc.nvrtcGetSupportedArchs)
    _check(err, "nvrtcGetSupportedArchs")
    return tuple(int(a) for a in archs)


def arch_for_capability(major: int, minor: int) -> str:
    """The ``sm_XX`` to compile for a device of compute capability ``major.minor``.

    When NVRTC does not know the device (it is newer), the newest older architecture is chosen;
    its cubin will not load there, but its PTX JIT-compiles (see ``driver.load_module``).
    """
    cc = major * 10 + minor
    known = [a for a in supported_archs() if a <= cc]
    if not known:
        raise UnsupportedError(f"NVRTC {nvrtc_version()} cannot target compute capability {major}.{minor}")
    return f"sm_{max(known)}"


def _check_arch(options: NvrtcOptions) -> None:
    num = int(_ARCH_RE.fullmatch(options.arch)["num"])
    archs = supported_archs()
    if num not in archs:
        raise UnsupportedError(
            f"NVRTC {'.'.join(map(str, nvrtc_version()))} cannot compile for {options.arch}: "
            f"supported architectures are {', '.join(f'sm_{a}' for a in archs)}"
        )


# ---------------------------------------------------------------------------------------------
# Compiling


@dataclass(frozen=True)
class _Result:
    ok: bool
    log: str
    ptx: str = ""
    cubin: bytes | None = None
    status: str = ""


def _log_of(prog) -> str:
    err, size = _nvrtc.nvrtcGetProgramLogSize(prog)
    _check(err, "nvrtcGetProgramLogSize")
    buf = b" " * size
    (err,) = _nvrtc.nvrtcGetProgramLog(prog, buf)
    _check(err, "nvrtcGetProgramLog")
    return buf.rstrip(b"\0").decode(errors="replace").strip()


def _get(prog, size_fn, get_fn, what: str) -> bytes | None:
    err, size = size_fn(prog)
    if err != _nvrtc.nvrtcResult.NVRTC_SUCCESS or size <= 1:
        return None
    buf = b" " * size
    (err,) = get_fn(prog, buf)
    _check(err, what)
    return buf


def _run_nvrtc(source: str, name: str, options: NvrtcOptions, arch: str | None = None) -> _Result:
    """One NVRTC program: create, compile, read log / PTX / cubin, destroy."""
    err, prog = _call(_nvrtc.nvrtcCreateProgram, source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        args = options.to_args(arch)
        (result,) = _nvrtc.nvrtcCompileProgram(prog, len(args), args)
        log = _log_of(prog)
        if result != _nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return _Result(False, log, status=_error_name(result))
        ptx = _get(prog, _nvrtc.nvrtcGetPTXSize, _nvrtc.nvrtcGetPTX, "nvrtcGetPTX")
        cubin = None
        if (arch or options.arch).startswith("sm_"):
            cubin = _get(prog, _nvrtc.nvrtcGetCUBINSize, _nvrtc.nvrtcGetCUBIN, "nvrtcGetCUBIN")
            if cubin is None or not cubin.startswith(_ELF_MAGIC):
                raise BuildError(f"NVRTC produced no cubin for {name} ({arch or options.arch})", log=log)
        return _Result(True, log, ptx.rstrip(b"\0").decode() if ptx else "", cubin)
    finally:
        (err,) = _nvrtc.nvrtcDestroyProgram(prog)
        _check(err, "nvrtcDestroyProgram")


def compile_uncached(source: str, name: str, options: NvrtcOptions) -> _Result:
    """Compile without touching the cache: cubin (real archs) and PTX, or the failure log."""
    _check_arch(options)
    res = _run_nvrtc(source, name, options)
    if res.ok and not res.ptx:
        # NVRTC versions that give no PTX for a real arch: compile again for the virtual one.
        ptx_res = _run_nvrtc(source, name, options, arch=options.virtual_arch)
        if not ptx_res.ok or not ptx_res.ptx:
            raise BuildError(f"NVRTC produced no PTX for {name} ({options.virtual_arch})", log=ptx_res.log)
        res = _Result(True, res.log, ptx_res.ptx, res.cubin)
    return res


def reproduce_command(source_path: str | Path, name: str, options: NvrtcOptions) -> str:
    return shlex.join([sys.executable, "-m", "taskmap.backends.cuda", str(source_path),
                       "--name", name, *options.to_cli()])


def annotate(log: str, source: str, name: str) -> str:
    """The NVRTC log with the generated source lines around each error in ``name``.cu."""
    program = f"{name}.cu"
    return annotate_log(log, source, NVRTC_DIAG, lambda f: Path(f).name == program)


def build_error(res: _Result, source: str, name: str, options: NvrtcOptions, source_path: Path) -> BuildError:
    first = first_error(res.log, NVRTC_DIAG)
    message = f"NVRTC failed to compile {name} for {options.arch} ({res.status})"
    if first:
        message += f": {first}"
    return BuildError(message, log=annotate(res.log, source, name), source_path=str(source_path),
                      command=reproduce_command(source_path, name, options))


def compile_cuda(source: str, name: str, options: NvrtcOptions | None = None) -> CudaBinary:
    """Compile ``source`` (which defines ``extern "C" __global__ void <name>``, or several
    kernels) for ``options.arch``, through the disk cache (namespace ``"cuda"``).

    Raises BuildError (log annotated with the source lines, the cached ``.cu`` path and a
    reproduce command) when NVRTC rejects the code, and UnsupportedError for an architecture
    this NVRTC does not know.
    """
    options = options or NvrtcOptions()
    key = cache_key("cuda-nvrtc", source, name, options, nvrtc_version(), _headers_version())
    ptx_path, cubin_path = _cache.get(key, ".ptx"), _cache.get(key, ".cubin")
    if ptx_path is not None and (cubin_path is not None or not options.is_real_arch):
        log_path = _cache.get(key, ".log")
        return CudaBinary(
            name=name, arch=options.arch, ptx=ptx_path.read_text(),
            cubin=cubin_path.read_bytes() if cubin_path is not None else None,
            log=log_path.read_text() if log_path is not None else "",
            source_path=str(_cache.path_for(key, ".cu")),
        )
    source_path = _cache.put_bytes(key, ".cu", source.encode())
    res = compile_uncached(source, name, options)
    if not res.ok:
        raise build_error(res, source, name, options, source_path)
    if res.log:
        _cache.put_bytes(key, ".log", res.log.encode())
    if res.cubin is not None:
        _cache.put_bytes(key, ".cubin", res.cubin)
    _cache.put_bytes(key, ".ptx", res.ptx.encode())  # last: its presence marks a complete entry
    return CudaBinary(name=name, arch=options.arch, ptx=res.ptx, cubin=res.cubin, log=res.log,
                      source_path=str(source_path))


# ---------------------------------------------------------------------------------------------
# Command line: reproduce a build outside taskmap


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskmap.backends.cuda",
                                description="Compile a CUDA source file with NVRTC, as taskmap does.")
    p.add_argument("source", type=Path)
    p.add_argument("--name", help="program name used in diagnostics (default: the file's stem)")
    p.add_argument("--arch", default="sm_80")
    p.add_argument("--std", default="c++17")
    p.add_argument("--fast-math", action="store_true")
    p.add_argument("--lineinfo", action="store_true")
    p.add_argument("--maxrregcount", type=int)
    p.add_argument("--extra", action="append", default=[], help="extra NVRTC option (repeatable; use --extra=-DX)")
    p.add_argument("-o", "--output", type=Path, help="write the cubin here")
    p.add_argument("--ptx", type=Path, help="write the PTX here")
    ns = p.parse_args(argv)
    options = NvrtcOptions(arch=ns.arch, std=ns.std, fast_math=ns.fast_math, lineinfo=ns.lineinfo,
                           max_registers=ns.maxrregcount, extra=tuple(ns.extra))
    name = ns.name or ns.source.stem
    source = ns.source.read_text()
    try:
        res = compile_uncached(source, name, options)
    except (BuildError, UnsupportedError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if not res.ok:
        print(f"NVRTC failed to compile {ns.source} for {options.arch} ({res.status})", file=sys.stderr)
        print(annotate(res.log, source, name), file=sys.stderr)
        return 1
    if res.log:
        print(res.log, file=sys.stderr)
    if ns.output and res.cubin is not None:
        ns.output.write_bytes(res.cubin)
    if ns.ptx:
        ns.ptx.write_text(res.ptx)
    size = f"cubin {len(res.cubin)} bytes, " if res.cubin is not None else ""
    print(f"compiled {name} for {options.arch}: {size}PTX {len(res.ptx)} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
