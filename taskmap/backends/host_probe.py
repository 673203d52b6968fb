"""Measured facts about the host CPU that its flags do not tell: how fast its 512-bit FMAs run,
and how fast one core reads from its last-level cache.

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
from typing import Any

from ..errors import CacheError, TaskmapError
from ..runtime.cache import DiskCache, cache_key

#: Overrides the probe: the f32 FLOP/s of 512-bit FMAs over 256-bit ones (e.g. ``1`` on Zen 4,
#: ``2`` on a part with two full-width pipes).
ENV_OVERRIDE = "TASKMAP_ZMM_FMA_RATIO"
#: Overrides the last-level cache probe: GB/s one core reads from it (e.g. ``20``).
LLC_ENV_OVERRIDE = "TASKMAP_LLC_GBPS"

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
    for (int i = 0; i < 15; i++) {{          /* best of 15 pairs: a busy neighbour slows some */
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


def round_bandwidth(bytes_per_second: float) -> float:
    """To a half octave (..., 16, 22.6, 32, 45.3, 64, 90.5, 128 GB/s), at least 4 GB/s: stable
    between runs of the probe, which vary by ~10%."""
    gbps = max(bytes_per_second / 1e9, 4.0)
    return 2 ** (round(2 * math.log2(gbps)) / 2) * 1e9


def _run_probe(source: str, args: tuple[str, ...] = (), cc: str = "gcc") -> float | None:
    """Build ``source`` and run it with ``args``: the number it prints; None when the program
    cannot be built or run (no compiler, another instruction set)."""
    with tempfile.TemporaryDirectory(prefix="taskmap-probe-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(source)
        try:
            subprocess.run([cc, "-O1", str(src), "-o", str(exe)], capture_output=True, check=True, timeout=60)
            out = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True, timeout=60).stdout
            return float(out)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None


def measure_zmm_fma_ratio(cc: str = "gcc") -> float | None:
    """Run the probe: the f32 FLOP/s of zmm FMAs over ymm FMAs, unrounded; None when the program
    cannot be built or run (no compiler, not x86)."""
    return _run_probe(PROBE_SOURCE, cc=cc)


#: One core reads ``argv[1]`` bytes one 64-bit word per 64-byte line (the lines come whole: the
#: rate is the cache's), four lines per step into independent sums; prints the best of 7 timings
#: of 8 passes, in bytes per second.
LLC_PROBE_SOURCE = """
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    size_t bytes = (size_t)atol(argv[1]), words = bytes / 8;
    volatile uint64_t *a = malloc(bytes);
    if (!a) return 1;
    for (size_t i = 0; i < words; i++) a[i] = i;
    double best = 1e30;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (int r = 0; r < 8; r++) {
        double t = now();
        for (int pass = 0; pass < 8; pass++)
            for (size_t i = 0; i + 32 <= words; i += 32) { s0 += a[i]; s1 += a[i + 8]; s2 += a[i + 16]; s3 += a[i + 24]; }
        t = now() - t;
        if (r > 0 && t < best) best = t;           /* the first round warms the cache */
    }
    printf("%.6g\\n", (s0 + s1 + s2 + s3 == 1 ? 0.0 : 8.0 * bytes / best));
    return 0;
}
"""


def llc_probe_bytes(l2_per_core: int, l3_bytes: int) -> int:
    """The buffer the last-level cache probe reads: four times a core's L2 (at least 4 MiB), at
    most half of the L3 when it is known."""
    size = max(4 * l2_per_core, 4 << 20)
    return min(size, l3_bytes // 2) if l3_bytes >= 2 * max(l2_per_core, 1 << 20) else size


def measure_llc_bandwidth(l2_per_core: int, l3_bytes: int, cc: str = "gcc") -> float | None:
    """Run the probe: bytes per second one core reads from beyond its L2, unrounded; None when it
    cannot run."""
    measured = _run_probe(LLC_PROBE_SOURCE, (str(llc_probe_bytes(l2_per_core, l3_bytes)),), cc)
    return measured if measured and measured > 0 else None


def _override(name: str, hint: str) -> float | None:
    if not (text := os.environ.get(name, "").strip()):
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise TaskmapError(f"{name}={text!r} is not a positive number: {hint}")
    return value


def _cached(what: str, field: str, cpu_identity: tuple[str, ...], measure: Any) -> float | None:
    """The cached measurement ``what`` of this CPU, else ``measure()`` (stored; None: it could not
    run, nothing stored)."""
    key = cache_key(what, cpu_identity)
    if (path := _cache.get(key, ".json")) is not None:
        try:
            return float(json.loads(path.read_text())[field])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    measured = measure()
    if measured is None:
        return None
    try:
        _cache.put_bytes(key, ".json", json.dumps({field: measured, "cpu": list(cpu_identity)}).encode())
    except (OSError, CacheError):
        pass                                  # a read-only cache: measure again next process
    return measured


def zmm_fma_ratio(cpu_identity: tuple[str, ...], cc: str = "gcc") -> float:
    """The rounded ratio for this host (``cpu_identity``: its model name and flags, the cache
    key): the environment's override, else the cached measurement, else a fresh one (stored).
    1.0 (half of a ymm machine's FMA rate per lane) when nothing can be measured."""
    override = _override(ENV_OVERRIDE, "give the f32 FLOP/s of 512-bit FMAs over 256-bit ones (1 on AMD "
                                       "Zen 4, up to 2), or unset it to measure")
    if override is not None:
        return round_ratio(override)
    measured = _cached("zmm-fma-ratio", "ratio", cpu_identity, lambda: measure_zmm_fma_ratio(cc))
    return 1.0 if measured is None else round_ratio(measured)


def llc_bandwidth(cpu_identity: tuple[str, ...], l2_per_core: int, l3_bytes: int, cc: str = "gcc") -> float:
    """Bytes per second one core of this host reads from its last-level cache, rounded
    (:func:`round_bandwidth`): the environment's override (GB/s), else the cached measurement (per CPU model, flags
    and cache sizes), else a fresh one (stored); 0 (unknown: the cost models' defaults) when it
    cannot be measured."""
    override = _override(LLC_ENV_OVERRIDE, "give the GB/s one core reads from the last-level cache (e.g. 20), "
                                           "or unset it to measure")
    if override is not None:
        return round_bandwidth(override * 1e9)
    identity = (*cpu_identity, f"l2={l2_per_core}", f"l3={l3_bytes}")
    measured = _cached("llc-bandwidth", "bytes_per_second", identity,
                       lambda: measure_llc_bandwidth(l2_per_core, l3_bytes, cc))
    return 0.0 if measured is None else round_bandwidth(measured)
