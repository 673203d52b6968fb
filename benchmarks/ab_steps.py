"""A/B of two compilations of one model, step by step, in the flow of whole runs (CPU or GPU).

    python benchmarks/ab_steps.py mobilenet_v2 --hook my_change.py
    python benchmarks/ab_steps.py resnet50 --batch 8 --hook my_change.py --rounds 6 --runs 5

Compiles the model (A), then runs the hook file — Python that changes what the compiler does:
sets a module's constant, wraps a template's ``config`` or the routing of convolutions — and
compiles it again (B), with the in-process memos of tuning choices and of kernels cleared
(:func:`forget_kernels`) and the on-disk graph-kernel cache off for B (``TASKMAP_GRAPH_CACHE=0``: its key holds
taskmap's source files, not a patch made at run time).  Both compiled graphs live in one
process and are profiled in alternating rounds (``CompiledGraph.profile``: each step timed in a
whole run), so a machine whose speed drifts slows both alike; the table gives each step's
median in A and B and their ratio, the steps whose generated source differs marked ``*``, then
the steps only one side has (a change in the grouping) with their times.  The hook sees the
names ``taskmap`` and ``model``; for example, the channel-vectorized convolution's output
prefetch off::

    import dataclasses
    import taskmap.templates.conv_cpu as cc
    config = cc.ConvCpuTemplate.config
    cc.ConvCpuTemplate.config = lambda self, p, t, s: (lambda c: dataclasses.replace(c, pf_c=False)
                                                       if hasattr(c, "pf_c") else c)(config(self, p, t, s))

A ratio is only worth its spread: run twice, and believe a step that moves the same way both times.
"""
from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import sys
import warnings
from pathlib import Path

import torch

from common import machine_description
from models import MODELS, make_model

import taskmap
from taskmap.graph import kernel_cache
from taskmap.ops._dispatch import clear_kernels
from taskmap.schedule import tune
from taskmap.templates.base import KernelFamily


def compiled_graph(fast: object) -> object:
    """The one CompiledGraph a compiled module holds for its example inputs."""
    entries = list(fast.entries.values())     # type: ignore[attr-defined]
    assert len(entries) == 1, "one input signature expected"
    return entries[0].compiled


def forget_kernels() -> None:
    """Every in-process memo of choices and kernels: tuning's model choices, the graph's lowered
    kernels, the operators' template kernels and the templates' own (per configuration)."""
    tune.clear_memo()
    kernel_cache.clear_memo()
    clear_kernels()
    for obj in gc.get_objects():
        if isinstance(obj, KernelFamily):
            obj.forget()


def sources_of(step: object, kind: str) -> tuple[str, ...]:
    """The generated sources of a step's kernels (built already: the build is cached)."""
    return tuple(k.build(kind).source for k in step.kernels)    # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--hook", required=True, type=Path, help="Python run between the two compilations")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10, help="alternating rounds (A then B, B then A, ...)")
    parser.add_argument("--runs", type=int, default=20, help="whole runs per round (each step's median)")
    parser.add_argument("--all", action="store_true", help="every step, not only those that changed or moved")
    args = parser.parse_args()
    if not args.hook.is_file():
        parser.error(f"--hook {args.hook}: no such file")
    model, inputs = make_model(args.model, args.batch, args.device)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = compiled_graph(taskmap.compile(model, inputs, progress=False))
        exec(compile(args.hook.read_text(), str(args.hook), "exec"), {"taskmap": taskmap, "model": model})
        forget_kernels()
        os.environ["TASKMAP_GRAPH_CACHE"] = "0"
        b = compiled_graph(taskmap.compile(model, inputs, progress=False))
        times: dict[str, dict[str, list[float]]] = {tag: collections.defaultdict(list) for tag in "AB"}
        for r in range(args.rounds):
            for tag, g in ((("A", a), ("B", b)) if r % 2 == 0 else (("B", b), ("A", a))):
                for name, _, seconds in g.profile(*inputs, rounds=args.runs):
                    times[tag][name].append(seconds)
    graphs = {"A": a, "B": b}
    kernels = {tag: {s.name: ",".join(k.__name__ for k in s.kernels) for s in g.steps} for tag, g in graphs.items()}
    sources = {tag: {s.name: sources_of(s, g.target.kind.value) for s in g.steps} for tag, g in graphs.items()}
    med = {tag: {n: statistics.median(v) for n, v in t.items()} for tag, t in times.items()}
    print(f"{machine_description()}; {args.model} batch {args.batch}; {args.rounds} rounds x {args.runs} runs")
    total = {tag: sum(m.values()) for tag, m in med.items()}
    print(f"sum of steps: A {total['A'] * 1e3:.3f} ms, B {total['B'] * 1e3:.3f} ms, B/A {total['B'] / total['A']:.3f}")
    print(f"  {'step':44s} {'A ms':>8s} {'B ms':>8s}  B/A   kernels (A -> B where they differ)")
    for s in a.steps:
        ta, tb = med["A"].get(s.name), med["B"].get(s.name)
        if ta is None or tb is None:
            continue
        ka, kb = kernels["A"][s.name], kernels["B"].get(s.name, "")
        changed = sources["A"][s.name] != sources["B"].get(s.name)
        if args.all or changed or abs(tb / ta - 1) > 0.05:
            print(f"{'*' if changed else ' '} {s.name:44s} {ta * 1e3:8.3f} {tb * 1e3:8.3f}  {tb / ta:.2f}  "
                  f"{ka}{' -> ' + kb if ka != kb else ''}")
    for tag, other in (("A", "B"), ("B", "A")):       # steps one side's grouping has and the other's not
        only = [s.name for s in graphs[tag].steps if s.name not in med[other] and s.name in med[tag]]
        if only:
            ms = sum(med[tag][n] for n in only) * 1e3
            print(f"steps of {tag} only ({ms:.3f} ms): " + ", ".join(f"{n} {med[tag][n] * 1e3:.3f}" for n in only))


if __name__ == "__main__":
    sys.exit(main())
