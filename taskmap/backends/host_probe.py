"""Measured facts about the host CPU that its flags do not tell: how fast its 512-bit FMAs run,
how fast one core reads from its last-level cache, and what a matmul's K step pays for reading
its B operand's rows in place (a stride apart, on or off cache lines) instead of from a packed
panel.

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
#: Overrides the in-place B probe: the two step ratios, comma-separated (e.g. ``1,1`` on Zen 4).
IN_PLACE_ENV_OVERRIDE = "TASKMAP_B_IN_PLACE"

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


def _run_probe(source: str, args: tuple[str, ...] = (), cc: str = "gcc",
               flags: tuple[str, ...] = ("-O1",)) -> float | None:
    """Build ``source`` and run it with ``args``: the number it prints; None when the program
    cannot be built or run (no compiler, another instruction set)."""
    numbers = _run_probe_numbers(source, args, cc, flags)
    return numbers[0] if numbers and len(numbers) == 1 else None


def _run_probe_numbers(source: str, args: tuple[str, ...] = (), cc: str = "gcc",
                       flags: tuple[str, ...] = ("-O1",)) -> list[float] | None:
    """Build ``source`` with ``flags`` and run it with ``args``: the numbers it prints."""
    with tempfile.TemporaryDirectory(prefix="taskmap-probe-") as tmp:
        src, exe = Path(tmp) / "probe.c", Path(tmp) / "probe"
        src.write_text(source)
        try:
            subprocess.run([cc, *flags, str(src), "-o", str(exe)], capture_output=True, check=True, timeout=60)
            out = subprocess.run([str(exe), *args], capture_output=True, text=True, check=True, timeout=60).stdout
            return [float(x) for x in out.split()]
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


#: A matmul's K loop on one 8 x 32 register tile (two 16-lane vectors of B a row, eight broadcasts
#: of a packed A), over B of ``K`` rows by ``N`` columns in column panels of 32, for 16 row panels
#: of A: B's 885 KB are read from L2 (or beyond) each time, as a pointwise convolution's or a
#: linear's B is.  Three forms of B: packed panels (``[panel][k][32]``, contiguous), its rows in
#: place ``N`` floats apart (every row on a cache line), and ``N + 1`` floats apart (15 rows in 16
#: off a line: every vector of them spans two lines).  Prints the medians over 9 rounds of the
#: in-place forms' times over the packed one's.
IN_PLACE_PROBE_SOURCE = """
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
typedef float v16 __attribute__((vector_size(64)));
typedef float v16u __attribute__((vector_size(64), aligned(4)));
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
enum { K = 768, N = 288, MR = 8, PANELS = N / 32, ROW_PANELS = 16, ROUNDS = 9 };
static void __attribute__((noinline)) tile(const float *a, const float *b, long pitch, float *c) {
    v16 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0}, c30 = {0}, c31 = {0},
        c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0}, c60 = {0}, c61 = {0}, c70 = {0}, c71 = {0};
    for (long k = 0; k < K; k++, b += pitch, a += MR) {
        v16 b0 = *(const v16u *)b, b1 = *(const v16u *)(b + 16);
#define ROW(i) { v16 ai = a[i] - (v16){}; c##i##0 += ai * b0; c##i##1 += ai * b1; }
        ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5) ROW(6) ROW(7)
    }
    *(v16u *)c += c00 + c01 + c10 + c11 + c20 + c21 + c30 + c31 + c40 + c41 + c50 + c51 + c60 + c61 + c70 + c71;
}
static double pass(const float *a, const float *b, long pitch, long panel_stride, float *c) {
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t = now();
        for (int r = 0; r < ROW_PANELS; r++)
            for (int p = 0; p < PANELS; p++) tile(a + (long)r * MR * K, b + p * panel_stride, pitch, c);
        t = now() - t;
        if (rep > 0 && t < best) best = t;
    }
    return best;
}
static double median(double *x) {
    for (int i = 0; i < ROUNDS; i++)
        for (int j = i + 1; j < ROUNDS; j++)
            if (x[j] < x[i]) { double t = x[i]; x[i] = x[j]; x[j] = t; }
    return x[ROUNDS / 2];
}
int main(void) {
    float *a = aligned_alloc(64, sizeof(float) * ROW_PANELS * MR * K), *c = aligned_alloc(64, 64);
    float *b = aligned_alloc(64, sizeof(float) * K * (N + 16)), *packed = aligned_alloc(64, sizeof(float) * K * N);
    if (!a || !b || !packed || !c) return 1;
    for (long i = 0; i < ROW_PANELS * MR * K; i++) a[i] = (float)(i % 7) * 0.01f;
    for (long i = 0; i < K * (N + 16); i++) b[i] = (float)(i % 5) * 0.01f;
    for (long i = 0; i < K * N; i++) packed[i] = (float)(i % 5) * 0.01f;
    for (int l = 0; l < 16; l++) c[l] = 0;
    double on[ROUNDS], off[ROUNDS];
    for (int r = 0; r < ROUNDS; r++) {
        double t = pass(a, packed, 32, 32 * K, c);
        on[r] = pass(a, b, N, 32, c) / t;
        off[r] = pass(a, b, N + 1, 32, c) / t;
    }
    printf("%.4f %.4f\\n", median(on), median(off) + (c[0] == 0.5f ? 1e-9 : 0.0));
    return 0;
}
"""
#: What the probe's rows are: vectors of B a row, and its off-line pitch in floats.
IN_PLACE_PROBE_VECTORS, IN_PLACE_PROBE_PITCH = 2, 289


def measure_in_place_steps(cc: str = "gcc") -> tuple[float, float] | None:
    """Run the probe: a K step's time with B's rows in place on cache lines, and off them, over
    its time with B packed, unrounded; None when it cannot run (no compiler, no AVX-512)."""
    numbers = _run_probe_numbers(IN_PLACE_PROBE_SOURCE, (), cc, ("-O2", "-march=native"))
    if not numbers or len(numbers) != 2 or not all(0 < x < math.inf for x in numbers):
        return None
    return numbers[0], numbers[1]


def round_step(ratio: float) -> float:
    """A step ratio to a quarter, within [1, 4]: the probe's rounds spread by ~10%."""
    return min(4.0, max(1.0, round(ratio * 4) / 4))


def _override_values(name: str, hint: str, count: int) -> tuple[float, ...] | None:
    """``count`` (1 or 2) positive numbers from ``$name`` (comma-separated), None when unset; a
    malformed value is refused by name, with ``hint``."""
    if not (text := os.environ.get(name, "").strip()):
        return None
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError:
        values = ()
    if len(values) != count or not all(0 < v < math.inf for v in values):
        what = "a positive number" if count == 1 else "two positive numbers"
        raise TaskmapError(f"{name}={text!r} is not {what}: {hint}")
    return values


def _override(name: str, hint: str) -> float | None:
    values = _override_values(name, hint, 1)
    return None if values is None else values[0]


def _cached(what: str, field: str, cpu_identity: tuple[str, ...], measure: Any, parse: Any = float) -> Any:
    """The cached measurement ``what`` of this CPU (``parse``d from its JSON), else ``measure()``
    (stored; None: it could not run, nothing stored)."""
    key = cache_key(what, cpu_identity)
    if (path := _cache.get(key, ".json")) is not None:
        try:
            return parse(json.loads(path.read_text())[field])
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


def in_place_steps(cpu_identity: tuple[str, ...], cc: str = "gcc") -> tuple[float, float]:
    """The rounded in-place step ratios of this host (:func:`measure_in_place_steps`): the
    environment's override (two numbers, comma-separated), else the cached measurement, else a
    fresh one (stored); ``(0, 0)`` (unknown: the matmul cost model's defaults) when it cannot be
    measured."""
    override = _override_values(IN_PLACE_ENV_OVERRIDE, "give a K step's time with B's rows in place on cache "
                                "lines and off them, over its time with B packed (e.g. 1,1), or unset it to "
                                "measure", 2)
    if override is not None:
        return round_step(override[0]), round_step(override[1])
    measured = _cached("in-place-b-steps", "ratios", cpu_identity, lambda: measure_in_place_steps(cc),
                       lambda v: (float(v[0]), float(v[1])))
    return (0.0, 0.0) if measured is None else (round_step(measured[0]), round_step(measured[1]))
