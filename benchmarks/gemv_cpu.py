"""Benchmark: small-M matmuls (GEMV-like, M = 1..8) of the CPU matmul template against numpy
(OpenBLAS) and torch eager, single-threaded, median process CPU time, in one process.

    python benchmarks/gemv_cpu.py                       # M = 1, 2, 4, 8 on the default (K, N)
    python benchmarks/gemv_cpu.py --m 1 3 --kn 2048x1000 --batch 4

``linear`` is ``x (M, K) @ w (N, K)^T + bias`` (``taskmap.ops.linear``); ``matmul`` is
``x (M, K) @ b (K, N)`` (``taskmap.ops.matmul``); with ``--batch B`` both operands get a batch
dimension (``bmm``).  Times in microseconds; ratios are peer time / taskmap time.
"""
from __future__ import annotations

import argparse
import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"     # before any OpenMP / BLAS runtime starts

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cpu_timed, machine_description, print_table

from taskmap import ops


def peers(kind: str, batch: int, m: int, k: int, n: int) -> tuple[dict, np.ndarray]:
    import torch
    rng = np.random.default_rng(0)
    lead = (batch,) if batch > 1 else ()
    x = rng.standard_normal(lead + (m, k), dtype=np.float32)
    tx = torch.from_numpy(x)
    if kind == "linear":
        w = rng.standard_normal(lead + (n, k), dtype=np.float32)
        bias = rng.standard_normal(n, dtype=np.float32)
        tw, tb = torch.from_numpy(w), torch.from_numpy(bias)
        wt = np.swapaxes(w, -1, -2)
        ref = x.astype(np.float64) @ wt.astype(np.float64) + bias
        if batch > 1:     # a batch of weights: bmm(x, w^T) + bias
            return {"taskmap": lambda: ops.matmul(x, wt) + bias, "numpy": lambda: x @ wt + bias,
                    "torch": lambda: torch.baddbmm(tb, tx, tw.transpose(1, 2))}, ref
        return {"taskmap": lambda: ops.linear(x, w, bias), "numpy": lambda: x @ w.T + bias,
                "torch": lambda: torch.nn.functional.linear(tx, tw, tb)}, ref
    b = rng.standard_normal(lead + (k, n), dtype=np.float32)
    tb_ = torch.from_numpy(b)
    ref = x.astype(np.float64) @ b.astype(np.float64)
    return {"taskmap": lambda: ops.matmul(x, b), "numpy": lambda: x @ b, "torch": lambda: tx @ tb_}, ref


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="*", default=[1, 2, 4, 8])
    parser.add_argument("--kn", nargs="*", default=["2048x1000", "768x768", "768x3072"], help="KxN")
    parser.add_argument("--kinds", nargs="*", default=["linear", "matmul"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=0.3, help="CPU seconds per peer per round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import torch
    torch.set_num_threads(1)
    rows = []
    for kn in args.kn:
        k, n = (int(v) for v in kn.split("x"))
        for kind in args.kinds:
            for m in args.m:
                fns, ref = peers(kind, args.batch, m, k, n)
                err = np.abs(np.asarray(fns["taskmap"]()) - ref).max() / np.sqrt(k)
                assert err < 1e-4, f"taskmap result off by {err}"
                samples = {name: [] for name in fns}
                for _ in range(args.rounds):
                    for name, fn in fns.items():
                        samples[name].append(cpu_timed(fn, args.seconds))
                t = {name: sorted(v)[len(v) // 2] for name, v in samples.items()}
                peers_ = ("taskmap", "numpy", "torch")
                rows.append([kind, f"{m}", f"{k}", f"{n}"] + [f"{t[x] * 1e6:.1f}" for x in peers_]
                            + [f"{t[x] / t['taskmap']:.2f}" for x in peers_[1:]])
                print("  " + " ".join(rows[-1]), flush=True)
    print(f"\n{machine_description()}; one thread; batch {args.batch}; median process CPU time")
    print_table(["op", "M", "K", "N", "taskmap us", "numpy us", "torch us", "numpy/taskmap", "torch/taskmap"], rows)


if __name__ == "__main__":
    main()
