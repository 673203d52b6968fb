"""Benchmark: the example CPU matmul (workers = cores x vector lanes) against numpy (OpenBLAS)
and torch eager, side by side in one process, f32, square sizes.

    python benchmarks/matmul_cpu.py [sizes...]
"""
from __future__ import annotations

import datetime
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from common import machine_description, median_time, print_table  # noqa: E402

import matmul_cpu  # noqa: E402  (examples/matmul_cpu.py)


def main(sizes: list[int]) -> None:
    try:
        import torch
    except ImportError:
        torch = None
    rng = np.random.default_rng(0)
    rows = []
    for n in sizes:
        a = rng.standard_normal((n, n), dtype=np.float32)
        b = rng.standard_normal((n, n), dtype=np.float32)
        c = np.empty((n, n), np.float32)
        kernel = matmul_cpu.build(n, n, n)
        kernel(a, b, c)
        assert np.allclose(c, a @ b, rtol=1e-3, atol=1e-2)
        flop = 2.0 * n**3
        t_tm = median_time(lambda: kernel(a, b, c))
        t_np = median_time(lambda: a @ b)
        row = [f"{n}", f"{flop / t_tm / 1e9:.1f}", f"{flop / t_np / 1e9:.1f}", f"{t_np / t_tm:.2f}"]
        if torch is not None:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            t_torch = median_time(lambda: ta @ tb)
            row += [f"{flop / t_torch / 1e9:.1f}", f"{t_torch / t_tm:.2f}"]
        rows.append(row)
    headers = ["n", "taskmap GFLOP/s", "numpy GFLOP/s", "numpy/taskmap time"]
    if torch is not None:
        headers += ["torch GFLOP/s", "torch/taskmap time"]
    print(f"\n{machine_description()}, {datetime.date.today()}")
    print_table(headers, rows)


if __name__ == "__main__":
    main([int(x) for x in sys.argv[1:]] or [256, 512, 1024, 2048])
