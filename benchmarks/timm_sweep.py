"""One model of every `timm` family through ``taskmap.compile`` (and ``torch.compile(backend=
"taskmap")``), checked against eager PyTorch and timed against it (random weights and batch-norm
statistics, batch 1, f32, the family's default input size, CPU).

    python benchmarks/timm_sweep.py                          # the smallest model of each timm module
    python benchmarks/timm_sweep.py resnet18 swin_tiny_patch4_window7_224 --dynamo

Each model runs in a process of its own (``--timeout`` seconds; a hang or a crash is a row, not
the end of the sweep) with a cache directory of its own under ``--cache`` (a second sweep times
cached compiles).  A classifier whose head is initialised to zeros (MLP-Mixer, gMLP, ResMLP,
Sequencer, Hiera) gives zeros whatever the body computes: such a model is checked again on its
pooled features (``reset_classifier(0)``).  "rel. error" is the largest difference over the
largest output value; timings are medians of alternating rounds (eager, taskmap).

timm imports torchvision, whose wheels for a CPU-only torch may be CUDA builds that do not load:
``python -m pip install --no-deps timm "torchvision==<the one of your torch>"`` and, if
``import torchvision`` fails registering ``torchvision::nms``, install a CPU build of torchvision
(taskmap does not need its compiled operators).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import machine_description, print_table, timed  # noqa: E402


def families() -> list[str]:
    """The smallest model (by parameters, built on the meta device) of every timm module, tests'
    toy models left out, smallest first."""
    import timm
    from timm.models import _registry
    best: dict[str, tuple[int, str]] = {}
    for name in timm.list_models():
        if name.startswith("test_"):
            continue
        try:
            with torch.device("meta"):
                n = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
        except Exception:           # noqa: BLE001 - a model timm cannot build here is left out
            continue
        module = _registry._model_to_module.get(name, name)
        best[module] = min(best.get(module, (n, name)), (n, name))
    return [name for _, name in sorted(best.values())]


def build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    import timm
    torch.manual_seed(0)
    model = timm.create_model(name.split("@")[0], pretrained=False).eval()
    if name.endswith("@features"):
        model.reset_classifier(0)
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
            m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) * 0.5 + 0.75)
    size = tuple(model.pretrained_cfg.get("input_size", (3, 224, 224)))
    return model, torch.randn((1, *size), generator=g)


def run_one(name: str, dynamo: bool, rounds: int, seconds: float) -> dict:
    import taskmap
    model, x = build(name)
    row: dict = {"name": name, "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
                 "input": list(x.shape[1:])}
    with torch.no_grad():
        want = model(x)
        t = time.perf_counter()
        fast = taskmap.compile(model, progress=False)
        got = fast(x)
        row["compile_s"] = time.perf_counter() - t
        scale = float(want.abs().max())
        row["rel_error"] = float((got - want).abs().max()) / scale if scale else None
        row["match"] = bool(torch.allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, scale)))
        if rounds:
            eager, tm = [], []
            for _ in range(rounds):
                eager.append(timed(lambda: model(x), seconds))
                tm.append(timed(lambda: fast(x), seconds))
            row["eager_ms"], row["taskmap_ms"] = statistics.median(eager) * 1e3, statistics.median(tm) * 1e3
            row["speedup"] = statistics.median(e / t for e, t in zip(eager, tm))
        if dynamo:
            torch._dynamo.reset()
            got = torch.compile(model, backend="taskmap")(x)
            row["dynamo_match"] = bool(torch.allclose(got, want, rtol=1e-3, atol=1e-4 * max(1.0, scale)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="timm model names (default: the smallest of every family)")
    ap.add_argument("--dynamo", action="store_true", help="also torch.compile(model, backend='taskmap')")
    ap.add_argument("--rounds", type=int, default=4, help="timing rounds (0: no timing)")
    ap.add_argument("--seconds", type=float, default=0.3, help="running time of each timing")
    ap.add_argument("--timeout", type=float, default=600, help="seconds a model may take")
    ap.add_argument("--cache", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "taskmap-timm-sweep"),
                    help="cache directories, one per model, under this one")
    ap.add_argument("--jsonl", help="append each model's row to this file as it finishes")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.dynamo, args.rounds, args.seconds)))
        return
    names = args.models or families()
    print(machine_description())
    rows = []
    for i, name in enumerate(names):
        row = _child(name, args)
        if row.get("match") and row.get("rel_error") is None:       # zeros out: check the features
            row = _child(name + "@features", args)
        rows.append(row)
        if args.jsonl:
            with open(args.jsonl, "a") as f:
                f.write(json.dumps(row) + "\n")
        status = "match" if row.get("match") else row.get("error", "mismatch")
        print(f"[{i + 1}/{len(names)}] {name}: {status}", file=sys.stderr, flush=True)
    fmt = lambda v, f: "-" if v is None else f.format(v)    # noqa: E731
    print_table(
        ["model", "params M", "input", "taskmap.compile", "rel. error", "compile s", "torch.compile",
         "eager ms", "taskmap ms", "eager/taskmap"],
        [[r["name"], fmt(r.get("params_m"), "{:.1f}"), "x".join(map(str, r.get("input", [])[1:])),
          "match" if r.get("match") else r.get("error", "mismatch"), fmt(r.get("rel_error"), "{:.1e}"),
          fmt(r.get("compile_s"), "{:.1f}"),
          "-" if "dynamo_match" not in r else ("match" if r["dynamo_match"] else "mismatch"),
          fmt(r.get("eager_ms"), "{:.2f}"), fmt(r.get("taskmap_ms"), "{:.2f}"), fmt(r.get("speedup"), "{:.2f}")]
         for r in rows])
    ratios = [r["speedup"] for r in rows if r.get("speedup")]
    if ratios:
        print(f"eager/taskmap over {len(ratios)} models: median {statistics.median(ratios):.2f}, "
              f"min {min(ratios):.2f}, max {max(ratios):.2f}")


def _child(name: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--one", name, "--rounds", str(args.rounds), "--seconds", str(args.seconds)]
    if args.dynamo:
        cmd.append("--dynamo")
    env = dict(os.environ, TASKMAP_CACHE_DIR=os.path.join(args.cache, name))
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"name": name, "error": f"over {args.timeout:.0f} s"}
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["?"])[-1]
        return {"name": name, "error": last[:120]}
    return json.loads(p.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
