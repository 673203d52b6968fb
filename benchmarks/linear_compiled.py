"""Benchmark: linear layers at a few rows (a classifier head, a decoder step) compiled by
``taskmap.compile`` against PyTorch eager and onnxruntime, on all cores, in one process.

    python benchmarks/linear_compiled.py                          # M = 1, 4 on the default (K, N)
    python benchmarks/linear_compiled.py --m 1 --kn 1280x1000 --rounds 7

The compiled graph holds the weights as constants, packed once (for a batch-1 linear: column
panels of ``NR`` outputs, one contiguous stream each).  Each peer is timed over ``--rounds``
rounds taking turns (median per round, then the median over rounds, microseconds; ratios are
peer time / taskmap time).  The weights (4 K N bytes) stay in L2 / L3 between calls here: in a
model they are usually colder.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import machine_description, print_table, timed  # noqa: E402
from models import onnx_runner  # noqa: E402

import taskmap  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--kn", nargs="*", default=["1280x1000", "2048x1000", "768x3072", "3072x768"], help="KxN")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=0.3, help="per peer per round")
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = []
    with torch.no_grad():
        for kn in args.kn:
            k, n = (int(v) for v in kn.split("x"))
            for m in args.m:
                layer, x = torch.nn.Linear(k, n).eval(), torch.randn(m, k)
                fast = taskmap.compile(layer, x, progress=False)
                torch.testing.assert_close(fast(x), layer(x), rtol=1e-4, atol=1e-4)
                calls = {"taskmap": lambda: fast(x), "eager": lambda: layer(x),
                         "onnxruntime": onnx_runner(layer, (x,), torch.get_num_threads())}
                samples: dict[str, list[float]] = {name: [] for name in calls}
                for _ in range(args.rounds):
                    for name, fn in calls.items():
                        samples[name].append(timed(fn, args.seconds))
                t = {name: statistics.median(v) for name, v in samples.items()}
                rows.append([str(m), str(k), str(n)] + [f"{t[c] * 1e6:.1f}" for c in calls]
                            + [f"{t[c] / t['taskmap']:.2f}" for c in list(calls)[1:]]
                            + [f"{4 * k * n / t['taskmap'] / 1e9:.0f}"])
                print("  " + " ".join(rows[-1]), flush=True)
    print(f"\n{machine_description()}, torch {torch.__version__} ({torch.get_num_threads()} threads); "
          f"median of {args.rounds} rounds")
    print_table(["M", "K", "N", "taskmap us", "eager us", "onnxruntime us", "eager/taskmap", "onnxruntime/taskmap",
                 "taskmap GB/s of weights"], rows)


if __name__ == "__main__":
    main()
