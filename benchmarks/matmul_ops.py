"""Benchmark: taskmap.ops.matmul / linear (the CPU matmul template) against numpy (OpenBLAS),
torch eager and torch.compile, f32, side by side in one process.

    python benchmarks/matmul_ops.py                 # the default set below
    python benchmarks/matmul_ops.py 1024 2048x512x300 linear:128x768x3072
    python benchmarks/matmul_ops.py --no-compile    # skip torch.compile

A case is ``n`` (square), ``MxNxK`` (matmul of (M, K) by (K, N)) or ``linear:MxNxK`` (x of
(M, K), weight of (N, K), bias of (N,): ``x @ w.T + b``).  Each peer is timed as the median of
repeated runs after warm-up; peers take turns, several rounds, with a pause between them (idle
OpenMP / OpenBLAS threads spin for a while after a call and would slow the next peer down), and
the reported time is the median over rounds.  On a shared machine each sample first waits (up
to ``--wait`` seconds) until the other processes leave the cores idle (``/proc/stat``): the
table says how many samples had to start on a busy machine anyway.
Ratios are peer time / taskmap time (above 1: taskmap is faster).
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_description, print_table, timed, wait_quiet  # noqa: E402

from taskmap import ops  # noqa: E402

DEFAULT = ["256", "512", "1024", "2048", "4096", "linear:128x768x768", "linear:128x3072x768", "linear:128x768x3072",
           "2039"]


def parse(case: str) -> tuple[str, int, int, int]:
    kind, _, dims = case.rpartition(":")
    sides = [int(x) for x in dims.split("x")]
    m, n, k = sides * 3 if len(sides) == 1 else sides
    return kind or "matmul", m, n, k


def peers(kind: str, m: int, n: int, k: int, compile_: bool):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    if kind == "linear":
        w = rng.standard_normal((n, k), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        out = {"taskmap": lambda: ops.linear(a, w, bias), "numpy": lambda: a @ w.T + bias}
        ref = a.astype(np.float64) @ w.T.astype(np.float64) + bias
    else:
        b = rng.standard_normal((k, n), dtype=np.float32)
        out = {"taskmap": lambda: ops.matmul(a, b), "numpy": lambda: a @ b}
        ref = a.astype(np.float64) @ b.astype(np.float64)
    err = np.abs(out["taskmap"]() - ref).max() / np.sqrt(k)
    assert err < 1e-4, f"taskmap result off by {err}"
    try:
        import torch
    except ImportError:
        return out
    ta = torch.from_numpy(a)
    if kind == "linear":
        tw, tb = torch.from_numpy(w), torch.from_numpy(bias)
        eager = lambda: torch.nn.functional.linear(ta, tw, tb)  # noqa: E731
    else:
        tb_ = torch.from_numpy(b)
        eager = lambda: ta @ tb_  # noqa: E731
    out["torch"] = eager
    if compile_:
        fn = torch.compile(torch.nn.functional.linear if kind == "linear" else torch.matmul)
        args = (ta, tw, tb) if kind == "linear" else (ta, tb_)
        t0 = time.perf_counter()
        fn(*args)
        out["torch.compile"] = lambda: fn(*args)
        out["_compile_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", default=DEFAULT)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per peer per round")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds to wait for an idle machine per sample")
    args = parser.parse_args()
    rows, compile_times, busy = [], [], 0
    names = ["taskmap", "numpy", "torch", "torch.compile"]
    for case in args.cases:
        kind, m, n, k = parse(case)
        fns = peers(kind, m, n, k, not args.no_compile)
        if "_compile_s" in fns:
            compile_times.append(fns.pop("_compile_s"))
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                time.sleep(0.3)
                busy += not wait_quiet(args.wait)
                samples[name].append(timed(fn, args.seconds))
        t = {name: statistics.median(v) for name, v in samples.items()}
        flop = 2.0 * m * n * k
        label = f"linear {m}x{k} . ({n}x{k})^T" if kind == "linear" else (f"{m}" if m == n == k else f"{m}x{n}x{k}")
        row = [label]
        for name in names:
            row += [f"{flop / t[name] / 1e9:.1f}" if name in t else "-"]
        for name in names[1:]:
            row += [f"{t[name] / t['taskmap']:.2f}" if name in t else "-"]
        rows.append(row)
        print(f"  {case}: " + ", ".join(f"{name} {flop / v / 1e9:.1f} GFLOP/s" for name, v in t.items()), flush=True)
    headers = ["case"] + [f"{x} GFLOP/s" for x in names] + [f"{x}/taskmap" for x in names[1:]]
    print(f"\n{machine_description()}, {datetime.date.today()}; median of {args.rounds} rounds; "
          f"{busy} sample(s) started on a busy machine")
    if compile_times:
        print(f"torch.compile: first call {min(compile_times):.1f}-{max(compile_times):.1f} s per case")
    print_table(headers, rows)


if __name__ == "__main__":
    main()
