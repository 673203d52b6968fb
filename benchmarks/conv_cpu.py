"""Benchmark: taskmap.ops.conv2d (a direct-convolution kernel, Winograd's, or the implicit GEMM —
img2col prologue fused into the CPU matmul template — as ``taskmap.templates.conv_cpu.select``
decides; the ``path`` column says which) against torch eager and torch.compile, f32, batch 1, on the
ResNet-18 layers of the TVM paper's Table 2 (C1-C12), side by side in one process.

    python benchmarks/conv_cpu.py                  # C1..C12
    python benchmarks/conv_cpu.py C2 C6 --bias     # some layers, with a bias (an epilogue)
    python benchmarks/conv_cpu.py --no-compile     # skip torch.compile
    python benchmarks/conv_cpu.py --cpu-time       # one thread each, process CPU time (shared machines)

torch runs with as many threads as taskmap uses cores (``torch.set_num_threads``).  Each peer
is timed as the median of repeated runs after warm-up; peers take turns over several rounds,
each sample waiting (up to ``--wait`` s) for an idle machine (see ``benchmarks/common.py``);
the reported time is the median over rounds.  On a machine shared with other jobs wall times
are meaningless; ``--cpu-time`` runs every peer on one thread (``OMP_NUM_THREADS=1``,
``torch.set_num_threads(1)``) and reports the median process CPU time per call instead: a
per-core comparison that the other jobs barely disturb.  Ratios are peer time / taskmap time (above 1:
taskmap is faster).
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

from common import cpu_timed, parse_timing_args, machine_description, print_table, timed, wait_quiet  # noqa: E402

from taskmap import ops  # noqa: E402
from taskmap.backends.base import host_cpu_target  # noqa: E402
from taskmap.templates.conv_cpu import select  # noqa: E402
from taskmap.templates.conv_problem import ConvProblem  # noqa: E402

#: name: (H = W, C_in, C_out, kernel, stride); padding is kernel // 2.
LAYERS = {
    "C1": (224, 3, 64, 7, 2), "C2": (56, 64, 64, 3, 1), "C3": (56, 64, 64, 1, 1), "C4": (56, 64, 128, 3, 2),
    "C5": (56, 64, 128, 1, 2), "C6": (28, 128, 128, 3, 1), "C7": (28, 128, 256, 3, 2), "C8": (28, 128, 256, 1, 2),
    "C9": (14, 256, 256, 3, 1), "C10": (14, 256, 512, 3, 2), "C11": (14, 256, 512, 1, 2), "C12": (7, 512, 512, 3, 1),
}


def peers(layer: str, bias: bool, compile_: bool) -> dict:
    hw, cin, cout, k, s = LAYERS[layer]
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, cin, hw, hw), dtype=np.float32)
    w = (rng.standard_normal((cout, cin, k, k)) / np.sqrt(cin * k * k)).astype(np.float32)
    b = rng.standard_normal(cout, dtype=np.float32) if bias else None
    import torch
    tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), None if b is None else torch.from_numpy(b)
    ref = torch.nn.functional.conv2d(tx.double(), tw.double(), None if tb is None else tb.double(), s, k // 2).numpy()
    got = ops.conv2d(x, w, b, s, k // 2)
    err = np.abs(got - ref).max()
    assert err < 1e-3, f"taskmap result off by {err}"
    out = {"taskmap": lambda: ops.conv2d(x, w, b, s, k // 2),
           "torch": lambda: torch.nn.functional.conv2d(tx, tw, tb, s, k // 2)}
    if compile_:
        torch._dynamo.reset()         # one compiled function per layer (no recompile limit)
        fn = torch.compile(lambda a, ww, bb: torch.nn.functional.conv2d(a, ww, bb, s, k // 2))
        t0 = time.perf_counter()
        fn(tx, tw, tb)
        out["torch.compile"] = lambda: fn(tx, tw, tb)
        out["_compile_s"] = time.perf_counter() - t0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("layers", nargs="*", default=list(LAYERS))
    parser.add_argument("--bias", action="store_true", help="with a bias (spliced as an epilogue)")
    args = parse_timing_args(parser)
    import torch
    cores = 1 if args.cpu_time else host_cpu_target().num_cores
    torch.set_num_threads(cores)
    rows, busy, names = [], 0, ["taskmap", "torch", "torch.compile"]
    for layer in args.layers:
        hw, cin, cout, k, s = LAYERS[layer]
        fns = peers(layer, args.bias, not args.no_compile)
        fns.pop("_compile_s", None)
        samples: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                if args.cpu_time:
                    samples[name].append(cpu_timed(fn, args.seconds))
                    continue
                time.sleep(0.2)
                busy += not wait_quiet(args.wait)
                samples[name].append(timed(fn, args.seconds))
        t = {name: statistics.median(v) for name, v in samples.items()}
        o = (hw + 2 * (k // 2) - k) // s + 1
        flop = 2.0 * cout * o * o * cin * k * k
        p = ConvProblem(1, cin, hw, hw, cout, k, k, s, s, k // 2, k // 2, k // 2, k // 2, 1, 1, 1, "float32", args.bias)
        sched = select(p, host_cpu_target())
        path = "gemm" if sched is None else "winograd" if sched.get("vec") == "winograd" else "direct"
        row = [layer, f"{hw}x{hw}x{cin}->{cout} k{k} s{s}", path]
        row += [f"{t[n] * 1e3:.3f}" if n in t else "-" for n in names]
        row += [f"{flop / t['taskmap'] / 1e9:.1f}"]
        row += [f"{t[n] / t['taskmap']:.2f}" if n in t else "-" for n in names[1:]]
        rows.append(row)
        print(f"  {layer}: " + ", ".join(f"{n} {v * 1e3:.3f} ms" for n, v in t.items()), flush=True)
    headers = ["layer", "shape", "path"] + [f"{n} ms" for n in names] + ["taskmap GFLOP/s"] + [f"{n}/taskmap" for n in
                                                                                        names[1:]]
    clock = "process CPU time" if args.cpu_time else f"wall time, {busy} sample(s) started on a busy machine"
    print(f"\n{machine_description()}, {datetime.date.today()}; {cores} thread(s); batch 1; bias={args.bias}; "
          f"median of {args.rounds} rounds; {clock}")
    print_table(headers, rows)


if __name__ == "__main__":
    main()
