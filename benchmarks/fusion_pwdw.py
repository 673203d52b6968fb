"""Benchmark: MobileNetV2 with its pointwise + depthwise pairs fused (``taskmap.graph.lower_pwdw``)
against the same model compiled with ``TASKMAP_FUSE_PWDW=0``, both in one process.

    python benchmarks/fusion_pwdw.py                  # the pairs the lowering fuses
    python benchmarks/fusion_pwdw.py --all-pairs      # every pair (below the L2 rule too)

Prints the whole model's latency (alternating rounds of 20 calls, median per version and of the
per-round ratios) and, per fused pair, its step time in its place in the model against the sum of
the two unfused steps (the minimum over a few profiles of 20 runs each; ``CompiledGraph.profile``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common import machine_description  # noqa: E402

import taskmap  # noqa: E402
import taskmap.graph.lower_pwdw as lower_pwdw  # noqa: E402
from tests.models import cnn_defs  # noqa: E402


def compiled(model: torch.nn.Module, x: torch.Tensor, fuse: bool) -> object:
    os.environ["TASKMAP_FUSE_PWDW"] = "1" if fuse else "0"
    try:
        fast = taskmap.compile(model, (x,))
        fast(x)
        return fast
    finally:
        del os.environ["TASKMAP_FUSE_PWDW"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--all-pairs", action="store_true", help="fuse every qualifying pair (no L2 rule)")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    if args.all_pairs:
        lower_pwdw.L2_SHARE = 0.0
    torch.manual_seed(0)
    model = cnn_defs.mobilenet_v2().eval()
    x = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        fused, plain = compiled(model, x, True), compiled(cnn_defs.mobilenet_v2().eval(), x, False)
    graphs = [next(iter(f.entries.values())).compiled for f in (fused, plain)]

    def block(fn: object) -> float:
        ts = []
        for _ in range(20):
            t0 = time.perf_counter()
            fn(x)
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts)

    a, b = [], []
    for _ in range(args.rounds):
        a.append(block(fused))
        b.append(block(plain))
    ratios = [q / p for p, q in zip(a, b)]
    print(f"{machine_description()}, torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print(f"MobileNetV2: fused {statistics.median(a) * 1e3:.2f} ms ({len(graphs[0].steps)} launches), "
          f"unfused {statistics.median(b) * 1e3:.2f} ms ({len(graphs[1].steps)}); unfused / fused per round "
          f"{statistics.median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f})")
    best: list[dict[str, float]] = [{}, {}]
    for _ in range(3):
        for g, out in zip(graphs, best):
            for name, _, t in g.profile(x, rounds=20):
                out[name] = min(out.get(name, 1e9), t)
    print("| pair | fused us | two kernels us | speed-up |\n|------|----------|----------------|----------|")
    for step in graphs[0].steps:
        if step.name.count("conv2d") != 2:
            continue
        parts = step.name.split("+")
        first = "+".join(parts[:2]) if parts[1].startswith("unary") else parts[0]
        second = step.name[len(first) + 1:]
        sep = best[1][first] + best[1][second]
        print(f"| {step.name} | {best[0][step.name] * 1e6:.0f} | {sep * 1e6:.0f} | {sep / best[0][step.name]:.2f} |")


if __name__ == "__main__":
    main()
