"""Benchmark: depthwise convolution (MobileNet's layers D1-D9 of the TVM paper's Table 2: batch 1,
3x3, padding 1, channel multiplier 1) and pooling (ResNet's 3x3/2 max pool on 64x112x112, global
average pool on 2048x7x7, a 2x2 average pool) on the CPU, f32 — taskmap.ops against torch eager
and torch.compile, median microseconds.

    python benchmarks/pool_cpu.py                    # every case, all cores, wall time
    python benchmarks/pool_cpu.py D1 D3 gap7 --no-compile
    python benchmarks/pool_cpu.py --cpu-time         # one thread each, process CPU time (shared machines)

torch runs with as many threads as taskmap uses cores.  Each peer is timed as the median of
repeated runs after warm-up; peers take turns over several rounds, each wall-time sample
waiting (up to ``--wait`` s) for an idle machine; the reported time is the median over rounds.
On a machine shared with other jobs wall times are meaningless; ``--cpu-time`` runs every peer
on one thread and reports the median process CPU time per call (a per-core comparison the other
jobs barely disturb).  ``taskmap`` is the operator call (argument checks, kernel cache, output
allocation, launch), ``kernel`` the cached kernel alone on preallocated arrays.  Ratios are
peer time / taskmap time (above 1: taskmap is faster).
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
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import cpu_timed, parse_timing_args, machine_description, print_table, timed, wait_quiet

from taskmap import ops
from taskmap.backends import host_cpu_target
from taskmap.schedule.tune import choose
from taskmap.templates.window import WINDOW, WindowProblem, output_size

#: name -> (channels, size, stride) of MobileNet's depthwise layers (TVM paper, Table 2).
DEPTHWISE = {"D1": (32, 112, 1), "D2": (64, 112, 2), "D3": (128, 56, 1), "D4": (128, 56, 2), "D5": (256, 28, 1),
             "D6": (256, 28, 2), "D7": (512, 14, 1), "D8": (512, 14, 2), "D9": (1024, 7, 1)}
#: name -> (op, channels, size, kernel, stride, padding)
POOLS = {"maxpool3s2": ("max", 64, 112, 3, 2, 1), "gap7": ("gap", 2048, 7, 7, 1, 0),
         "avgpool2s2": ("avg", 256, 56, 2, 2, 0)}


def cases(names: list[str]) -> list[tuple[str, dict]]:
    rng = np.random.default_rng(0)
    out = []
    for name, (c, size, s) in DEPTHWISE.items():
        x = rng.standard_normal((1, c, size, size), dtype=np.float32)
        w = rng.standard_normal((c, 1, 3, 3), dtype=np.float32)
        out.append((name, {"kind": "dw", "x": x, "w": w, "stride": s}))
    for name, (op, c, size, k, s, p) in POOLS.items():
        x = rng.standard_normal((1, c, size, size), dtype=np.float32)
        out.append((name, {"kind": op, "x": x, "k": k, "stride": s, "pad": p}))
    return [(n, c) for n, c in out if not names or n in names]


def taskmap_fn(case: dict):
    x = case["x"]
    if case["kind"] == "dw":
        return lambda: ops.depthwise_conv2d(x, case["w"], None, case["stride"], 1)
    if case["kind"] == "max":
        return lambda: ops.max_pool2d(x, case["k"], case["stride"], case["pad"])
    if case["kind"] == "avg":
        return lambda: ops.avg_pool2d(x, case["k"], case["stride"], case["pad"])
    return lambda: ops.adaptive_avg_pool2d(x, 1)


def kernel_fn(case: dict):
    """The cached kernel alone, on preallocated arrays."""
    x = case["x"]
    n, c, h, w = x.shape
    target = host_cpu_target()
    if case["kind"] == "dw":
        s = case["stride"]
        o = output_size(h, 3, s, 1, 1, 1)
        p = WindowProblem("conv", n, c, h, w, o, o, 3, 3, s, s, 1, 1, dtype="float32")
        ins = [x, case["w"]]
    elif case["kind"] == "gap":
        p = WindowProblem("avg", n, c, h, w, 1, 1, h, w, h, w, dtype="float32")
        ins = [x]
    else:
        k, s, pad = case["k"], case["stride"], case["pad"]
        o = output_size(h, k, s, pad, pad, 1)
        p = WindowProblem(case["kind"], n, c, h, w, o, o, k, k, s, s, pad, pad, dtype="float32")
        ins = [x]
    built = WINDOW.instantiate(p, target, choose(WINDOW, p, target)).build("cpu")
    out = np.empty((n, p.c_out, p.oh, p.ow), np.float32)
    args = WINDOW.arguments(p, ins, [out])
    return lambda: built(*args)


def torch_fn(case: dict, compiled: bool):
    import torch
    import torch.nn.functional as F
    x = torch.from_numpy(case["x"])
    if case["kind"] == "dw":
        w = torch.from_numpy(case["w"])
        f = lambda x: F.conv2d(x, w, None, case["stride"], 1, 1, x.shape[1])
    elif case["kind"] == "max":
        f = lambda x: F.max_pool2d(x, case["k"], case["stride"], case["pad"])
    elif case["kind"] == "avg":
        f = lambda x: F.avg_pool2d(x, case["k"], case["stride"], case["pad"])
    else:
        f = lambda x: F.adaptive_avg_pool2d(x, 1)
    if compiled:
        f = torch.compile(f, dynamic=False)
        f(x)
    return lambda: f(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help=f"some of {', '.join([*DEPTHWISE, *POOLS])} (default: all)")
    args = parse_timing_args(parser)
    import torch
    cores = 1 if args.cpu_time else host_cpu_target().num_cores
    torch.set_num_threads(cores)
    names = ["taskmap", "kernel", "torch", "torch.compile"]
    rows, busy = [], 0
    for name, case in cases(args.cases):
        ref = torch_fn(case, False)().numpy()
        got = taskmap_fn(case)()
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-4), name
        fns = {"taskmap": taskmap_fn(case), "kernel": kernel_fn(case), "torch": torch_fn(case, False)}
        if not args.no_compile:
            fns["torch.compile"] = torch_fn(case, True)
        samples: dict[str, list[float]] = {n: [] for n in fns}
        for _ in range(args.rounds):
            for n, fn in fns.items():
                if args.cpu_time:
                    samples[n].append(cpu_timed(fn, args.seconds))
                    continue
                time.sleep(0.2)
                busy += not wait_quiet(args.wait)
                samples[n].append(timed(fn, args.seconds))
        t = {n: statistics.median(v) for n, v in samples.items()}
        shape = "x".join(map(str, case["x"].shape[1:])) + (f" s{case['stride']}" if case["kind"] == "dw" else "")
        row = [name, shape] + [f"{t[n] * 1e6:.1f}" if n in t else "-" for n in names]
        row += [f"{t[n] / t['taskmap']:.2f}" if n in t else "-" for n in names[2:]]
        rows.append(row)
        print(f"  {name}: " + ", ".join(f"{n} {v * 1e6:.1f} us" for n, v in t.items()), flush=True)
    headers = ["case", "shape"] + [f"{n} us" for n in names] + [f"{n}/taskmap" for n in names[2:]]
    clock = "process CPU time" if args.cpu_time else f"wall time, {busy} sample(s) started on a busy machine"
    print(f"\n{machine_description()}, {datetime.date.today()}; {cores} thread(s); f32, batch 1; "
          f"median of {args.rounds} rounds; {clock}")
    print_table(headers, rows)


if __name__ == "__main__":
    main()
