"""Compile HIP C++ in-process with hipRTC (through ctypes), through the disk cache.

hipRTC lives in ``libamdhip64.so`` on ROCm 5.x (Debian's ``libamdhip64-dev``, ROCm 5.2) and in
``libhiprtc.so`` from ROCm 6.  No GPU is needed, but an explicit ``--offload-arch`` is: without
it hipRTC asks the (absent) device and fails with an empty log.  hipRTC pre-includes its own
``hip_runtime.h`` (``threadIdx``, ``__syncthreads``, ``__half``, ``__half2`` all work without an
``#include``); with Debian's package, ``#include <hip/hip_fp16.h>`` or ``<hip/hip_bfloat16.h>``
*breaks* the build (redefinitions against the pre-included copy / host C++ headers), so
generated code must not include them.

Architectures the code-object manager (comgr) does not know make hipRTC 5.2 *abort the process*
(glibc "munmap_chunk(): invalid pointer"), so the architecture is checked against comgr's ISA
list first and refused with UnsupportedError.  ROCm 5.2 knows up to gfx90a / gfx1036: no gfx940+
(MI300) or gfx11xx (RDNA3).

Reproduce a failed build outside taskmap (the command is in every BuildError)::

    python -m taskmap.backends.hip path/to/kernel.hip --name vec_add --arch gfx90a
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import glob
import os
import re
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import BuildError, UnsupportedError
from ...runtime.cache import DiskCache, cache_key
from ..compiler_log import CLANG_DIAG, annotate_log, first_error

_cache = DiskCache("hip")
_lock = threading.Lock()          # comgr in ROCm 5.x is not documented as thread-safe
_ELF_MAGIC = b"\x7fELF"
_ARCH_RE = re.compile(r"gfx[0-9a-f]{3,4}(:[a-z]+[+-])*")
_COMGR_TMP = re.compile(r"\S*comgr-[^/\s]+/input/CompileSource")
_LIB_DIRS = ("/opt/rocm/lib", "/opt/rocm/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib")


# ---------------------------------------------------------------------------------------------
# Libraries


def _find(name: str) -> list[str]:
    """Candidate paths for ``lib<name>.so`` (newest soname first)."""
    found = []
    if (hit := ctypes.util.find_library(name)) is not None:
        found.append(hit)
    for d in _LIB_DIRS:
        found += sorted(glob.glob(f"{d}/lib{name}.so*"), reverse=True)
    return found


def _open_first(paths: list[str]) -> ctypes.CDLL | None:
    for path in paths:
        try:
            return ctypes.CDLL(path)
        except OSError:
            continue
    return None


@functools.cache
def hip_library() -> ctypes.CDLL | None:
    """``libamdhip64`` (``$TASKMAP_HIP_LIBRARY`` overrides the search), or None."""
    env = os.environ.get("TASKMAP_HIP_LIBRARY")
    return _open_first([env] if env else _find("amdhip64"))


@functools.cache
def hiprtc_library() -> ctypes.CDLL | None:
    """The library exporting ``hiprtcCreateProgram`` (libamdhip64 on ROCm 5, libhiprtc on 6+)."""
    hip = hip_library()
    if hip is not None and hasattr(hip, "hiprtcCreateProgram"):
        lib = hip
    else:
        lib = _open_first(_find("hiprtc"))
        if lib is None or not hasattr(lib, "hiprtcCreateProgram"):
            return None
    P, S, I = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    size_p = ctypes.POINTER(ctypes.c_size_t)
    sigs = {
        "hiprtcCreateProgram": [ctypes.POINTER(P), S, S, I, ctypes.POINTER(S), ctypes.POINTER(S)],
        "hiprtcCompileProgram": [P, I, ctypes.POINTER(S)],
        "hiprtcGetProgramLogSize": [P, size_p],
        "hiprtcGetProgramLog": [P, ctypes.c_char_p],
        "hiprtcGetCodeSize": [P, size_p],
        "hiprtcGetCode": [P, ctypes.c_char_p],
        "hiprtcDestroyProgram": [ctypes.POINTER(P)],
        "hiprtcVersion": [ctypes.POINTER(I), ctypes.POINTER(I)],
    }
    for fname, argtypes in sigs.items():
        fn = getattr(lib, fname)
        fn.argtypes, fn.restype = argtypes, I
    lib.hiprtcGetErrorString.argtypes, lib.hiprtcGetErrorString.restype = [I], S
    return lib


def _rtc() -> ctypes.CDLL:
    lib = hiprtc_library()
    if lib is None:
        raise BuildError(
            "hipRTC not found: install ROCm's HIP runtime (Debian/Ubuntu: `apt-get install -y "
            "libamdhip64-dev`), or set TASKMAP_HIP_LIBRARY to libamdhip64.so"
        )
    return lib


def hiprtc_available() -> bool:
    """Whether hipRTC can be loaded (compiling needs no GPU)."""
    return hiprtc_library() is not None


@functools.cache
def hiprtc_version() -> tuple[int, int]:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(_rtc().hiprtcVersion(ctypes.byref(major), ctypes.byref(minor)), "hiprtcVersion")
    return major.value, minor.value


@functools.cache
def _toolchain_id() -> tuple[str, ...]:
    """What identifies the compiler for cache keys: hipRTC version and the libraries' real paths."""
    paths = [os.path.realpath(p) for p in _find("amdhip64")[:1] + _find("hiprtc")[:1] + _find("amd_comgr")[:1]]
    return (".".join(map(str, hiprtc_version())), *paths)


def rocm_release() -> str:
    """A human-readable name of the HIP library in use, e.g. ``"libamdhip64.so.5.2.21153"``."""
    paths = _toolchain_id()[1:]
    return os.path.basename(paths[0]) if paths else "unknown HIP library"


@functools.cache
def comgr_isas() -> tuple[str, ...] | None:
    """Processor names comgr can target (``("gfx600", ..., "gfx90a", ...)``), or None if unknown."""
    lib = _open_first(_find("amd_comgr"))
    if lib is None or not hasattr(lib, "amd_comgr_get_isa_count"):
        return None
    count = ctypes.c_size_t()
    if lib.amd_comgr_get_isa_count(ctypes.byref(count)) != 0:
        return None
    names = []
    for i in range(count.value):
        name = ctypes.c_char_p()
        if lib.amd_comgr_get_isa_name(ctypes.c_size_t(i), ctypes.byref(name)) == 0 and name.value:
            names.append(name.value.decode().rsplit("--", 1)[-1].split(":", 1)[0])
    return tuple(dict.fromkeys(names))


def _check(result: int, what: str) -> None:
    if result != 0:
        raise BuildError(f"hipRTC {what} failed: {_error_name(result)}")


def _error_name(result: int) -> str:
    text = _rtc().hiprtcGetErrorString(result)
    return text.decode() if text else f"hiprtcResult {result}"


# ---------------------------------------------------------------------------------------------
# Options and results


@dataclass(frozen=True)
class HipOptions:
    """hipRTC options besides the architecture; hashed into the cache key."""

    std: str = "c++17"
    opt_level: int = 3
    fast_math: bool = False
    extra: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if isinstance(self.extra, (str, list)):
            object.__setattr__(self, "extra", (self.extra,) if isinstance(self.extra, str) else tuple(self.extra))

    def to_args(self, arch: str) -> list[bytes]:
        args = [f"--offload-arch={arch}", f"-O{self.opt_level}", f"-std={self.std}"]
        if self.fast_math:
            args.append("-ffast-math")
        args.extend(self.extra)
        return [a.encode() for a in args]

    def to_cli(self, arch: str) -> list[str]:
        cli = ["--arch", arch, "--std", self.std, f"-O{self.opt_level}"]
        if self.fast_math:
            cli.append("--fast-math")
        return cli + [f"--extra={e}" for e in self.extra]


@dataclass(frozen=True)
class HipBinary:
    """hipRTC's output: an AMD GPU code object (an ELF shared object) and the compile log."""

    name: str
    arch: str
    code_object: bytes
    log: str = ""
    source_path: str | None = None

    @property
    def image(self) -> bytes:
        return self.code_object


def check_arch(arch: str) -> None:
    """Refuse (UnsupportedError) an architecture this hipRTC cannot compile for."""
    if not _ARCH_RE.fullmatch(arch):
        raise UnsupportedError(f"invalid AMD GPU architecture {arch!r}: expected e.g. 'gfx90a' or 'gfx90a:xnack-'")
    isas = comgr_isas()
    base = arch.split(":", 1)[0]
    if isas is not None and base not in isas:
        raise UnsupportedError(
            f"this hipRTC ({rocm_release()}) cannot compile for {base}: its "
            f"code-object manager knows {', '.join(isas)}; a newer ROCm is needed"
        )


# ---------------------------------------------------------------------------------------------
# Compiling


@dataclass(frozen=True)
class _Result:
    ok: bool
    log: str
    code: bytes = b""
    status: str = ""


def _read(lib, prog, size_fn, get_fn, what: str) -> bytes:
    size = ctypes.c_size_t()
    _check(size_fn(prog, ctypes.byref(size)), f"{what}Size")
    if size.value == 0:
        return b""
    buf = ctypes.create_string_buffer(size.value)
    _check(get_fn(prog, buf), what)
    return buf.raw


def compile_uncached(source: str, name: str, arch: str, options: HipOptions) -> _Result:
    """Compile without touching the cache: the code object, or the failure log."""
    check_arch(arch)
    lib = _rtc()
    with _lock:
        prog = ctypes.c_void_p()
        _check(lib.hiprtcCreateProgram(ctypes.byref(prog), source.encode(), f"{name}.hip".encode(), 0, None, None),
               "hiprtcCreateProgram")
        try:
            args = options.to_args(arch)
            result = lib.hiprtcCompileProgram(prog, len(args), (ctypes.c_char_p * len(args))(*args))
            raw_log = _read(lib, prog, lib.hiprtcGetProgramLogSize, lib.hiprtcGetProgramLog, "hiprtcGetProgramLog")
            log = _COMGR_TMP.sub(f"{name}.hip", raw_log.rstrip(b"\0").decode(errors="replace")).strip()
            if result != 0:
                return _Result(False, log, status=_error_name(result))
            code = _read(lib, prog, lib.hiprtcGetCodeSize, lib.hiprtcGetCode, "hiprtcGetCode")
        finally:
            _check(lib.hiprtcDestroyProgram(ctypes.byref(prog)), "hiprtcDestroyProgram")
    if not code.startswith(_ELF_MAGIC):
        raise BuildError(f"hipRTC returned no code object for {name} ({arch}): {code[:8]!r}", log=log)
    return _Result(True, log, code)


def reproduce_command(source_path: str | Path, name: str, arch: str, options: HipOptions) -> str:
    return shlex.join([sys.executable, "-m", "taskmap.backends.hip", str(source_path),
                       "--name", name, *options.to_cli(arch)])


def annotate(log: str, source: str, name: str) -> str:
    """The hipRTC log with the generated source lines around each error in ``name``.hip."""
    return annotate_log(log, source, CLANG_DIAG, lambda f: f == f"{name}.hip")


def compile_hip(source: str, name: str, arch: str = "gfx90a", options: HipOptions | None = None) -> HipBinary:
    """Compile ``source`` to an AMD code object for ``arch``, through the cache (namespace "hip").

    Raises BuildError (annotated log, cached ``.hip`` path, reproduce command) when hipRTC rejects
    the code, UnsupportedError for an architecture this hipRTC does not know.
    """
    options = options or HipOptions()
    check_arch(arch)
    key = cache_key("hip-hiprtc", source, name, arch, options, _toolchain_id())
    code_path = _cache.get(key, ".hsaco")
    if code_path is not None:
        log_path = _cache.get(key, ".log")
        return HipBinary(name, arch, code_path.read_bytes(), log_path.read_text() if log_path else "",
                         str(_cache.path_for(key, ".hip")))
    source_path = _cache.put_bytes(key, ".hip", source.encode())
    res = compile_uncached(source, name, arch, options)
    if not res.ok:
        first = first_error(res.log, CLANG_DIAG)
        message = f"hipRTC failed to compile {name} for {arch} ({res.status})" + (f": {first}" if first else "")
        raise BuildError(message, log=annotate(res.log, source, name), source_path=str(source_path),
                         command=reproduce_command(source_path, name, arch, options))
    if res.log:
        _cache.put_bytes(key, ".log", res.log.encode())
    _cache.put_bytes(key, ".hsaco", res.code)  # last: its presence marks a complete entry
    return HipBinary(name, arch, res.code, res.log, str(source_path))


# ---------------------------------------------------------------------------------------------
# Command line: reproduce a build outside taskmap


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m taskmap.backends.hip",
                                description="Compile a HIP source file with hipRTC, as taskmap does.")
    p.add_argument("source", type=Path)
    p.add_argument("--name", help="program name used in diagnostics (default: the file's stem)")
    p.add_argument("--arch", default="gfx90a")
    p.add_argument("--std", default="c++17")
    p.add_argument("-O", dest="opt_level", type=int, default=3)
    p.add_argument("--fast-math", action="store_true")
    p.add_argument("--extra", action="append", default=[], help="extra hipRTC option (repeatable; --extra=-DX)")
    p.add_argument("-o", "--output", type=Path, help="write the code object here")
    ns = p.parse_args(argv)
    options = HipOptions(std=ns.std, opt_level=ns.opt_level, fast_math=ns.fast_math, extra=tuple(ns.extra))
    name = ns.name or ns.source.stem
    source = ns.source.read_text()
    try:
        res = compile_uncached(source, name, ns.arch, options)
    except (BuildError, UnsupportedError) as exc:
        print(exc, file=sys.stderr)
        return 2
    if not res.ok:
        print(f"hipRTC failed to compile {ns.source} for {ns.arch} ({res.status})", file=sys.stderr)
        print(annotate(res.log, source, name), file=sys.stderr)
        return 1
    if res.log:
        print(res.log, file=sys.stderr)
    if ns.output:
        ns.output.write_bytes(res.code)
    print(f"compiled {name} for {ns.arch}: code object {len(res.code)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
