"""Benchmark: ``taskmap.ops.scaled_dot_product_attention`` (the fused CPU template) against torch
eager SDPA and ``torch.compile``-d SDPA, f32, torch CPU tensors in, side by side in one process.

    python benchmarks/attention_cpu.py [--threads N] [--no-compile] [case ...]

Cases: ``bert`` (batch 1, 12 heads, seq 128, E 64), ``gpt2-128`` and ``gpt2-1024`` (causal, 12
heads, E 64), ``long`` (8 heads, seq 4096, E 64).  Times are medians after warm-up
(:func:`common.median_time`), the peers measured in turn over several rounds and the median
round taken (a shared machine's load then hits all alike); GFLOP/s count both products (causal:
the half below the diagonal).  ``OMP_NUM_THREADS=1 ... --threads 1`` compares one core.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine_description, median_time, print_table

import taskmap
from taskmap.testing import assert_close

CASES = {  # name: (batch, heads, seq, E, causal)
    "bert": (1, 12, 128, 64, False),
    "gpt2-128": (1, 12, 128, 64, True),
    "gpt2-1024": (1, 12, 1024, 64, True),
    "long": (1, 8, 4096, 64, False),
}


def interleaved(peers: dict[str, object], rounds: int, slow: bool) -> dict[str, float]:
    """Median over ``rounds`` of each peer's median time, the peers measured in turn in every
    round (a shared machine's load then shifts all of them alike)."""
    times: dict[str, list[float]] = {name: [] for name in peers}
    for _ in range(rounds):
        for name, fn in peers.items():
            times[name].append(median_time(fn, warmup=1 if slow else 3, repeat=3 if slow else 10,
                                           min_time=0.0 if slow else 0.2))
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(names: list[str], threads: int | None, compile_: bool, rounds: int) -> None:
    if threads:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    compiled = torch.compile(F.scaled_dot_product_attention) if compile_ else None
    rows = []
    for name in names:
        b, h, n, e, causal = CASES[name]
        q, k, v = (torch.randn(b, h, n, e, generator=g) for _ in range(3))
        peers = {
            "taskmap": lambda q=q, k=k, v=v, c=causal: taskmap.ops.scaled_dot_product_attention(q, k, v, is_causal=c),
            "eager": lambda q=q, k=k, v=v, c=causal: F.scaled_dot_product_attention(q, k, v, is_causal=c),
        }
        if compiled is not None:
            peers["compile"] = lambda q=q, k=k, v=v, c=causal: compiled(q, k, v, is_causal=c)
        ref = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
        assert_close(peers["taskmap"](), ref, rtol=1e-4, atol=1e-5)
        flop = 4.0 * b * h * n * n * e / (2 if causal else 1)
        t = interleaved(peers, max(1, rounds // 2) if n >= 4096 else rounds, n >= 4096)
        row = [name, f"{b}x{h}x{n}x{e}" + (" causal" if causal else ""), f"{t['taskmap'] * 1e3:.3f}",
               f"{t['eager'] * 1e3:.3f}", f"{t['eager'] / t['taskmap']:.2f}"]
        if compiled is not None:
            row += [f"{t['compile'] * 1e3:.3f}", f"{t['compile'] / t['taskmap']:.2f}"]
        row.append(f"{flop / t['taskmap'] / 1e9:.1f}")
        rows.append(row)
    headers = ["case", "shape", "taskmap ms", "eager ms", "eager/taskmap"]
    if compiled is not None:
        headers += ["compile ms", "compile/taskmap"]
    headers.append("taskmap GFLOP/s")
    print(f"\n{machine_description()}, torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"{datetime.date.today()}")
    print_table(headers, rows)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("cases", nargs="*", default=list(CASES))
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (the long case: half)")
    a = ap.parse_args()
    main(a.cases, a.threads, not a.no_compile, a.rounds)
