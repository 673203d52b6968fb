"""Benchmark: softmax and layer norm over rows, f32, on the CPU — taskmap.ops against torch eager
and numpy, in GB/s (bytes read and written once / median time after warm-up).

    python benchmarks/ops_cpu.py [--threads N] [ROWSxCOLS ...]
        # default: all cores; 128x768 512x768 1024x4096 4096x4096

Libraries are timed in separate phases (all of taskmap, then torch, then numpy), so that one
library's idle OpenMP threads do not spin against another's on a small machine.  ``taskmap`` is
the operator call (``taskmap.ops.softmax(x)``: argument checks, kernel cache, output allocation,
launch), ``kernel`` the cached kernel alone on preallocated arrays.
"""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

if "--threads" in sys.argv:  # before any OpenMP runtime starts (taskmap's kernels, torch)
    _k = sys.argv.index("--threads")
    os.environ["OMP_NUM_THREADS"] = sys.argv[_k + 1]
    del sys.argv[_k:_k + 2]

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine_description, median_time, print_table  # noqa: E402

from taskmap import ops  # noqa: E402
from taskmap.backends import host_cpu_target  # noqa: E402
from taskmap.schedule.tune import choose  # noqa: E402
from taskmap.templates.reduce import LAYER_NORM, SOFTMAX_TEMPLATE, RowProblem  # noqa: E402

EPS = 1e-5


def np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


def np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = x.var(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def main(shapes: list[tuple[int, int]]) -> None:
    import torch
    import torch.nn.functional as F

    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    rng = np.random.default_rng(0)
    data = {}
    for m, n in shapes:
        x = rng.standard_normal((m, n), dtype=np.float32)
        w, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        data[m, n] = (x, w, b, np.empty_like(x))
    target = host_cpu_target()
    times: dict[tuple[str, str, tuple[int, int]], float] = {}
    chosen: dict[tuple[str, tuple[int, int]], str] = {}
    # -- taskmap: the operator, and the kernel alone
    for (m, n), (x, w, b, out) in data.items():
        y = ops.softmax(x)
        assert np.allclose(y, np_softmax(x), rtol=1e-4, atol=1e-6)
        z = ops.layer_norm(x, (n,), w, b, EPS)
        assert np.allclose(z, np_layer_norm(x, w, b), rtol=1e-3, atol=1e-4)
        times["softmax", "taskmap", (m, n)] = median_time(lambda: ops.softmax(x))
        times["layer_norm", "taskmap", (m, n)] = median_time(lambda: ops.layer_norm(x, (n,), w, b, EPS))
        for op, tmpl, ins in (("softmax", SOFTMAX_TEMPLATE, [x]), ("layer_norm", LAYER_NORM, [x, w, b])):
            p = RowProblem(op, m, n, 1, "float32", "float32", eps=EPS if op == "layer_norm" else 0.0,
                           weight=op == "layer_norm", bias=op == "layer_norm")
            s = choose(tmpl, p, target, mode="model")
            kernel = tmpl.instantiate(p, target, s)
            args = tmpl.arguments(p, ins, [out])
            times[op, "kernel", (m, n)] = median_time(lambda: kernel(*args))
            chosen[op, (m, n)] = str(s)
    # -- torch eager
    for (m, n), (x, w, b, _) in data.items():
        tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
        times["softmax", "torch", (m, n)] = median_time(lambda: torch.softmax(tx, -1))
        times["layer_norm", "torch", (m, n)] = median_time(lambda: F.layer_norm(tx, (n,), tw, tb, EPS))
    # -- numpy
    for (m, n), (x, w, b, _) in data.items():
        times["softmax", "numpy", (m, n)] = median_time(lambda: np_softmax(x))
        times["layer_norm", "numpy", (m, n)] = median_time(lambda: np_layer_norm(x, w, b))

    rows = []
    for op in ("softmax", "layer_norm"):
        for m, n in shapes:
            nbytes = 2 * m * n * 4 + (2 * n * 4 if op == "layer_norm" else 0)
            gbs = {lib: nbytes / times[op, lib, (m, n)] / 1e9 for lib in ("taskmap", "kernel", "torch", "numpy")}
            rows.append([op, f"{m}x{n}", chosen[op, (m, n)], f"{gbs['taskmap']:.1f}", f"{gbs['kernel']:.1f}",
                         f"{gbs['torch']:.1f}", f"{gbs['numpy']:.1f}",
                         f"{times[op, 'torch', (m, n)] / times[op, 'taskmap', (m, n)]:.2f}"])
    load = os.getloadavg()[0]
    print(f"\n{machine_description()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"load average {load:.1f} at the end, {datetime.date.today()}")
    print_table(["op", "rows x cols", "schedule", "taskmap GB/s", "kernel GB/s", "torch GB/s", "numpy GB/s",
                 "torch/taskmap time"], rows)


if __name__ == "__main__":
    args = [tuple(int(v) for v in a.lower().split("x")) for a in sys.argv[1:]]
    main(args or [(128, 768), (512, 768), (1024, 4096), (4096, 4096)])  # type: ignore[arg-type]
