"""Shared helpers for the benchmark runners: timing (median after warm-up) and table printing."""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from typing import Callable


def median_time(fn: Callable[[], object], warmup: int = 2, repeat: int = 10, min_time: float = 0.2) -> float:
    """Median wall time of ``fn()`` in seconds, after ``warmup`` calls; at least ``repeat`` runs."""
    for _ in range(warmup):
        fn()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 200:
            break
    return statistics.median(times)


def machine_description() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                cpu = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"


def print_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in rows]
    text = "\n".join(lines)
    print(text)
    return text


def _cpu_busy(interval: float = 0.2) -> float:
    """Fraction of the machine's CPU time spent busy over ``interval`` seconds (Linux; else 0)."""
    def read() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    try:
        t0, i0 = read()
        time.sleep(interval)
        t1, i1 = read()
    except OSError:
        return 0.0
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_quiet(limit: float, threshold: float = 0.08) -> bool:
    """Wait until other processes leave the cores idle (at most ``limit`` seconds)."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if _cpu_busy() < threshold:
            return True
    return False


def timed(fn, seconds: float) -> float:
    """Median seconds of ``fn()`` over at least 5 runs and about ``seconds`` of running."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    times = []
    for _ in range(max(5, min(200, int(seconds / max(one, 1e-6))))):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpu_timed(fn, seconds: float) -> float:
    """Median process CPU seconds of ``fn()`` over at least 5 runs and about ``seconds`` of CPU."""
    fn()
    times: list[float] = []
    while len(times) < 5 or sum(times) < seconds:
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return statistics.median(times)


def parse_timing_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """The per-op CPU benchmarks' shared options, parsed; ``--cpu-time`` pins OpenMP to one
    thread (before any OpenMP runtime starts)."""
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.3, help="per peer per round")
    parser.add_argument("--wait", type=float, default=20.0, help="seconds to wait for an idle machine per sample")
    parser.add_argument("--cpu-time", action="store_true", help="one thread each, median process CPU time")
    args = parser.parse_args()
    if args.cpu_time:
        os.environ["OMP_NUM_THREADS"] = "1"
    return args
