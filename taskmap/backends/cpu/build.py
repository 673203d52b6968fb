"""Build generated C with gcc into a shared library, through the on-disk compile cache."""
from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import subprocess
import threading
from pathlib import Path

from ...errors import BuildError
from ...runtime.cache import DiskCache, cache_key, compiler_version
from ..base import Binary, Target

#: The C compiler (override with the environment variable ``TASKMAP_CC``).
CC_DEFAULT = "gcc"
#: ``-mprefer-vector-width=512``: the kernels' vector loops are written for the target's SIMD
#: width (16 f32 lanes with AVX-512), but ``-march=native`` on Intel's AVX-512 parts (Skylake-SP,
#: Cascade Lake, ...) prefers 256-bit vectors: half the lanes, and register tiles that spill
#: (ResNet-50 92 -> 51 ms on a Cascade Lake).  Without AVX-512 the option changes nothing.
#: ``-fno-unswitch-loops``: the kernels keep full and edge tiles apart themselves, and unswitching
#: copied their unrolled tile loops once per invariant condition: a quarter of gcc's time on
#: ResNet-50 (cold compile 12.3 -> 9.5 s, gcc 20.2 -> 15.0 CPU-s on a 2-core Cascade Lake) for
#: kernels that run as fast (matmul, implicit GEMM, Winograd, channel conv, attention, 1x1 +
#: depthwise, depthwise: within 2%, alternating in one process).
#: ``-fno-math-errno``: no kernel reads ``errno``, and for it gcc kept ``sqrtf`` in vector loops a
#: scalar instruction plus a libm call per lane (to set it for negative inputs); now a vector
#: square root.  The template kernels compile to the same code.  ``-fno-trapping-math``: no kernel
#: reads floating-point exception flags, and for them gcc kept a select whose branch divides as
#: control flow, which stops vectorization — softplus / Mish / ELU epilogues ran 5-6x slower than
#: SiLU (a 64-channel 3x3 conv + Mish at 56x56: 2.63 -> 0.46 ms); results are unchanged (IEEE
#: operations round the same).  ResNet-50, MobileNetV2, Inception-V3, BERT, EfficientNet-B0: 0.998-
#: 1.005x with it (alternating in one process).
CFLAGS = ("-O3", "-fno-unswitch-loops", "-march=native", "-mprefer-vector-width=512", "-fopenmp", "-shared",
          "-fPIC", "-std=gnu11", "-fno-math-errno", "-fno-trapping-math",
          "-Wall", "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-function",
          "-Wno-maybe-uninitialized", "-Wno-uninitialized")

_cache = DiskCache("cpu")
_loaded: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def compiler() -> str:
    return os.environ.get("TASKMAP_CC", CC_DEFAULT)


def build_c(source: str, target: Target, entry: str) -> Binary:
    """Compile ``source`` (cached by source, flags, compiler version and target)."""
    cc = compiler()
    key = cache_key("cpu-c", source, CFLAGS, compiler_version((cc, "--version")), target)
    so = _cache.get(key, ".so")
    src = _cache.path_for(key, ".c")
    if so is None:
        work = _cache.build_dir(key)
        c_file, out = work / "kernel.c", work / "kernel.so"
        c_file.write_text(source)
        cmd = [cc, *CFLAGS, str(c_file), "-o", str(out), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0 or not out.exists():
            src = _cache.put_bytes(key, ".c", source.encode())
            shutil.rmtree(work, ignore_errors=True)
            cmd[cmd.index(str(c_file))] = str(src)
            cmd[cmd.index(str(out))] = "/tmp/kernel.so"
            raise BuildError(f"gcc failed to compile the generated C for {entry} (exit {proc.returncode})",
                             log=proc.stdout + proc.stderr, source_path=str(src), command=shlex.join(cmd))
        src = _cache.put_bytes(key, ".c", source.encode())
        so = _cache.put_file(key, ".so", out)
        shutil.rmtree(work, ignore_errors=True)
    return Binary(target=target, source=source, binary=str(so), source_path=str(src), entry=entry)


def load_library(path: str | Path) -> ctypes.CDLL:
    """Load a built library once per process."""
    key = str(path)
    with _lock:
        lib = _loaded.get(key)
        if lib is None:
            lib = _loaded[key] = ctypes.CDLL(key, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        return lib
