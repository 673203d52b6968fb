"""Measured facts about the host CPU that its flags do not tell: how fast its 512-bit FMAs run.

AVX-512 parts differ where the cost models care most.  AMD Zen 4 executes a 512-bit FMA as two
halves on its two 256-bit pipes (one zmm FMA per cycle); Intel's server parts (Skylake-SP,
Cascade Lake, Ice Lake-SP, Sapphire Rapids) have two 512-bit pipes (two per cycle, at a lower
clock); some parts have one.  Nothing in ``/proc/cpuinfo`` says which, so a small program times
chains of independent ``vfmadd231ps`` on zmm and on ymm registers and reports the ratio of their
f32 FLOP/s.  The result is rounded (it keys every compiled artifact through the Target, so two
runs must agree) and stored in the cache, once per CPU model and flag set: the probe costs about
0.1 s, once.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import tempfile
from pathlib import Path

from ..errors import CacheError, TaskmapError
from ..runtime.cache import DiskCache, cache_key

#: Overrides the probe: the f32 FLOP/s of 512-bit FMAs over 256-bit ones (e.g. ``1`` on Zen 4,
#: ``2`` on a part with two full-width pipes).
ENV_OVERRIDE = "TASKMAP_ZMM_FMA_RATIO"

_cache = DiskCache("host")

_FMAS = "".join(f'"vfmadd231ps %%" R "12, %%" R "13, %%" R "{i}\\n\\t"' for i in range(12))
_CLOBBERS = ", ".join(f'"xmm{i}"' for i in range(14))
#: Twelve independent accumulator chains: enough to fill two pipes of 4-5 cycle latency.
PROBE_SOURCE = f"""
#include <stdio.h>
#include <time.h>
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }}
#define CHAINS(R) {_FMAS}
#define LOOP(R) \\
    "vxorps %%xmm12, %%xmm12, %%xmm12\\n\\tvxorps %%xmm13, %%xmm13, %%xmm13\\n\\t1:\\n\\t" \\
    CHAINS(R) "dec %0\\n\\tjnz 1b\\n\\tvzeroupper"
#define TIMED(R) double t = now(); __asm__ volatile(LOOP(R) : "+r"(n) :: {_CLOBBERS}, "cc"); return now() - t
static double zmm(long n) {{ TIMED("zmm"); }}
static double ymm(long n) {{ TIMED("ymm"); }}
int main(void) {{
    long n = 2000000;
    double best_z = 1e30, best_y = 1e30;
    zmm(n);                                   /* let the core settle at its AVX-512 clock */
    for (int i = 0; i < 5; i++) {{
        double z = zmm(n), y = ymm(n);
        if (z < best_z) best_z = z;
        if (y < best_y) best_y = y;
    }}
    printf("%.6f\\n", 2.0 * best_y / best_z); /* a zmm FMA does twice the lanes of a ymm one */
    return 0;
}}
"""


def round_ratio(ratio: float) -> float:
    """To a quarter, within [0.5, 2]: stable between runs of the probe."""
    return min(2.0, max(0.5, round(ratio * 4) / 4))


def measure_zmm_fma_ratio(cc: str = "gcc") -> float | None:
    """Run the probe: the f32 FLOP/s of zmm FMAs over ymm FMAs, unrounded; None when the program
    cannot be built or run (no compiler, not x86)."""
    with tempfile.TemporaryDirectory(prefix="taskmap-probe-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(PROBE_SOURCE)
        try:
            subprocess.run([cc, "-O1", str(src), "-o", str(exe)], capture_output=True, check=True, timeout=60)
            out = subprocess.run([str(exe)], capture_output=True, text=True, check=True, timeout=60).stdout
            return float(out)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None


def zmm_fma_ratio(cpu_identity: tuple[str, ...], cc: str = "gcc") -> float:
    """The rounded ratio for this host (``cpu_identity``: its model name and flags, the cache
    key): the environment's override, else the cached measurement, else a fresh one (stored).
    1.0 (half of a ymm machine's FMA rate per lane) when nothing can be measured."""
    if override := os.environ.get(ENV_OVERRIDE, "").strip():
        try:
            value = float(override)
        except ValueError:
            value = math.nan
        if not 0 < value < math.inf:
            raise TaskmapError(f"{ENV_OVERRIDE}={override!r} is not a positive number: give the f32 FLOP/s of "
                               f"512-bit FMAs over 256-bit ones (1 on AMD Zen 4, up to 2), or unset it to measure")
        return round_ratio(value)
    key = cache_key("zmm-fma-ratio", cpu_identity)
    if (path := _cache.get(key, ".json")) is not None:
        try:
            return round_ratio(json.loads(path.read_text())["ratio"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    measured = measure_zmm_fma_ratio(cc)
    if measured is None:
        return 1.0
    try:
        _cache.put_bytes(key, ".json", json.dumps({"ratio": measured, "cpu": list(cpu_identity)}).encode())
    except (OSError, CacheError):
        pass                                  # a read-only cache: measure again next process
    return round_ratio(measured)
