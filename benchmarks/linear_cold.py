"""Benchmark: GEMV-like linears (M = 1..4) whose weights come from memory, as a classifier's do in a
model's flow and every linear's do in text generation: ``taskmap.compile`` of ``nn.Linear``
against PyTorch eager and onnxruntime, all threads, the last-level cache flushed before each call.

    python benchmarks/linear_cold.py                        # 1 x 1280 -> 1000 and 1 x 2048 -> 1000
    python benchmarks/linear_cold.py --shapes 1x768x3072 4x4096x4096 --rounds 30

Before each timed call the benchmark sums a buffer of ``--flush`` MB (read only: nothing dirty to
write back during the call), which evicts the weights; the peers take turns call by call in
rounds, reversed every other round, and each round's median per peer is kept; the table gives the
medians over rounds (microseconds), the weights' bytes over that time, and peer / taskmap.  On a
shared machine the rounds spread widely: compare the peers within one run.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine_description, print_table  # noqa: E402
from models import onnx_runner  # noqa: E402

import taskmap  # noqa: E402


def peers(m: int, k: int, n: int) -> dict[str, object]:
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n).eval()
    x = torch.randn(m, k)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = taskmap.compile(lin, (x,), progress=False)
        err = float((fast(x) - lin(x)).abs().max())
        if not err < 1e-3:
            raise AssertionError(f"taskmap's {m}x{k}x{n} linear is off by {err}")
        runners = {"taskmap": lambda: fast(x), "eager": lambda: lin(x)}
        try:
            runners["onnxruntime"] = onnx_runner(lin, (x,), torch.get_num_threads())
        except ImportError:
            pass
    return runners


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", default=["1x1280x1000", "1x2048x1000"], help="MxKxN")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--calls", type=int, default=10, help="timed calls per peer per round")
    parser.add_argument("--flush", type=int, default=64, help="MB read before each call")
    args = parser.parse_args()
    junk = np.ones((args.flush << 20) // 4, np.float32)
    rows = []
    for shape in args.shapes:
        m, k, n = (int(v) for v in shape.split("x"))
        runners = peers(m, k, n)
        times: dict[str, list[float]] = {name: [] for name in runners}
        with torch.no_grad():
            for r in range(args.rounds):
                for name, fn in (list(runners.items()) if r % 2 == 0 else list(runners.items())[::-1]):
                    fn()
                    calls = []
                    for _ in range(args.calls):
                        junk.sum()
                        t0 = time.perf_counter()
                        fn()
                        calls.append(time.perf_counter() - t0)
                    times[name].append(statistics.median(calls))
        med = {name: statistics.median(t) for name, t in times.items()}
        weights = 4 * k * n
        for name in runners:
            rows.append([shape, name, f"{med[name] * 1e6:.0f}", f"{weights / med[name] / 1e9:.1f}",
                         f"{med[name] / med['taskmap']:.2f}"])
    print(f"\n{machine_description()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"{datetime.date.today()}; {args.flush} MB read before each call, median of {args.rounds} rounds")
    print_table(["M x K x N", "peer", "us", "weights GB/s", "peer / taskmap"], rows)


if __name__ == "__main__":
    main()
