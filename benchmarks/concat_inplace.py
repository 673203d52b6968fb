"""Concatenations at batch > 1 written in place (``taskmap/graph/concat_place.py``) against their
copies, A/B in one process (CPU).

    python benchmarks/concat_inplace.py                         # Inception-V3, batch 8
    python benchmarks/concat_inplace.py --batch 2 --rounds 12

The model is compiled twice: as it is, and with the placement turned off (no concat input held
for placement, so every concat keeps its copy step).  The two run in alternating rounds, each
round the best of 3 calls; the table gives the medians, their ratio, the ratios per round, and
the copy steps' time (``CompiledGraph.profile``, sum of the medians of the concat steps).
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from common import machine_description, print_table  # noqa: E402
from models import make_model  # noqa: E402

import taskmap  # noqa: E402
import taskmap.runtime.graph as runtime_graph  # noqa: E402


def compiled(model, args, place: bool):
    real = runtime_graph.concat_inputs
    if not place:
        runtime_graph.concat_inputs = lambda graph, groups: set()
    try:
        fast = taskmap.compile(model, args, progress=False)
        with torch.no_grad():
            fast(*args)                       # compiled here, while the patch holds
    finally:
        runtime_graph.concat_inputs = real
    (entry,) = fast.entries.values()
    return fast, entry.compiled


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="inception_v3")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8)
    args = ap.parse_args()
    model, inputs = make_model(args.model, args.batch, "cpu")
    sides = {"placed": compiled(model, inputs, True), "copies": compiled(model, inputs, False)}
    best: dict[str, list[float]] = {k: [] for k in sides}
    with torch.no_grad():
        for _ in range(args.rounds):
            for name, (fast, _) in sides.items():
                runs = []
                for _ in range(3):
                    t0 = time.perf_counter()
                    fast(*inputs)
                    runs.append(time.perf_counter() - t0)
                best[name].append(min(runs))
        copy_ms = sum(t for _, kind, t in sides["copies"][1].profile(*inputs, rounds=5) if kind == "concat") * 1e3
    med = {k: statistics.median(v) * 1e3 for k, v in best.items()}
    rows = [[args.model, str(args.batch), *(str(sum(st.kind.name == "CONCAT" for st in cg.steps)) for _, cg in
                                            sides.values()),
             f"{med['placed']:.1f}", f"{med['copies']:.1f}", f"{med['placed'] / med['copies']:.3f}",
             f"{min(a / b for a, b in zip(best['placed'], best['copies'])):.3f}-"
             f"{max(a / b for a, b in zip(best['placed'], best['copies'])):.3f}", f"{copy_ms:.1f}"]]
    print(f"\n{machine_description()}, {datetime.date.today()}; {args.rounds} alternating rounds, each the best "
          "of 3 calls")
    print_table(["model", "batch", "concat steps placed", "concat steps copies", "placed ms", "copies ms",
                 "placed / copies", "per round", "copy steps ms"], rows)


if __name__ == "__main__":
    main()
