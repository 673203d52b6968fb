"""Where a compiled model loses to onnxruntime, layer by layer (CPU).

    python benchmarks/layers_vs_onnxruntime.py resnet50
    python benchmarks/layers_vs_onnxruntime.py mobilenet_v2 --top 15 --rounds 30

Times every step of ``taskmap.compile(model)`` in the flow of a whole run (``CompiledGraph.profile``:
medians per step) and every node of onnxruntime's session on the same model (its node profiler:
medians per node after warm-up) — the two in alternating chunks of runs, so that a noisy machine
slows both alike — then groups both by what the layer computes — a convolution by
its input, output and weight shapes; a linear / matmul (onnxruntime's Gemm, MatMul, FusedMatMul)
by its operand and result flattened to rows; other ops by their kind and shapes — and prints the
groups by how much more time taskmap spends on them.  A fused step is named by its anchor (a
convolution with its prologue and epilogues on one side is one fused Conv node on the other),
or its first op where it has none.
Groups present on one side only (onnxruntime's layout reorders, taskmap's fused reshapes) show
with a zero on the other.  Models: those of ``benchmarks/models.py``.
"""
from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from common import machine_description  # noqa: E402
from models import MODELS, export_onnx, make_model  # noqa: E402

import taskmap  # noqa: E402

Key = tuple
#: onnxruntime's node kinds that are a taskmap linear or matmul, and others by taskmap's names.
ORT_MATMULS = ("Gemm", "MatMul", "FusedMatMul")
ORT_KINDS = {"LayerNormalization": "layer_norm", "Softmax": "softmax", "MaxPool": "max_pool2d",
             "AveragePool": "avg_pool2d", "GlobalAveragePool": "adaptive_avg_pool2d"}


def _rows(shape: tuple[int, ...]) -> tuple[int, int]:
    """A matmul operand or result as rows x its last dimension."""
    return (int(torch.Size(shape[:-1]).numel()), shape[-1]) if shape else (1, 1)
#: The two sides run in this many alternating chunks of runs, so that both see the same machine;
#: each chunk starts with ``SETTLE`` untimed runs (the other runtime's idle threads spin for a
#: while after its last run, and on two cores that halves this one's speed).
CHUNKS, SETTLE = 5, 3


def taskmap_side(model: torch.nn.Module, args: tuple[torch.Tensor, ...]
                 ) -> tuple[Callable[[int], None], Callable[[], dict[Key, list[float]]]]:
    """``run(k)``: profile ``k`` runs of the compiled model (``CompiledGraph.profile``); ``groups()``:
    each step's median over the chunks run, grouped by layer."""
    fast = taskmap.compile(model, args)
    with torch.no_grad():
        fast(*args)
    cg = next(iter(fast.entries.values())).compiled
    ops = {op.name: op for op in cg.graph.ops}
    chunks: dict[str, list[float]] = collections.defaultdict(list)

    def run(k: int) -> None:
        with torch.no_grad():
            for _ in range(SETTLE):
                fast(*args)
            for name, _, seconds in cg.profile(*args, rounds=k):
                chunks[name].append(seconds)

    def groups() -> dict[Key, list[float]]:
        out: dict[Key, list[float]] = collections.defaultdict(list)
        for name, times in chunks.items():
            members = [ops[n] for n in name.split("+") if n in ops]
            anchors = [m for m in members if m.definition.category.is_anchor]
            op = (anchors or members or [None])[0]
            if op is None or not op.inputs:
                key: Key = ("step", name)
            elif op.kind.name == "CONV2D":
                key = ("conv", tuple(op.inputs[0].shape), tuple(op.output.shape), tuple(op.inputs[1].shape))
            elif op.kind.name in ("LINEAR", "MATMUL"):
                key = ("matmul", _rows(tuple(op.inputs[0].shape)), _rows(tuple(op.output.shape)))
            else:
                key = (op.kind.name.lower(), tuple(op.inputs[0].shape), tuple(op.output.shape))
            out[key].append(statistics.median(times))
        return out

    return run, groups


def onnxruntime_side(model: torch.nn.Module, args: tuple[torch.Tensor, ...], threads: int
                     ) -> tuple[Callable[[int], None], Callable[[], dict[Key, list[float]]]]:
    """``run(k)``: ``k`` runs of an onnxruntime session with its node profiler on (after 5 warm-up
    runs); ``groups()``: each node's median over the timed runs, grouped by layer."""
    import onnxruntime as ort
    folder = Path(tempfile.mkdtemp())
    export_onnx(model, args, folder / "model.onnx")
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.enable_profiling = True
    opts.profile_file_prefix = str(folder / "profile")
    sess = ort.InferenceSession(str(folder / "model.onnx"), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
    timed: list[bool] = []                   # per run: timed (or warm-up / settling)
    for _ in range(5):
        sess.run(None, feed)
        timed.append(False)

    def run(k: int) -> None:
        for i in range(SETTLE + k):
            sess.run(None, feed)
            timed.append(i >= SETTLE)

    def groups() -> dict[Key, list[float]]:
        events = json.loads(Path(sess.end_profiling()).read_text())
        per_node: dict[str, list[float]] = collections.defaultdict(list)
        shapes: dict[str, tuple[str, list, list]] = {}
        for ev in events:
            if ev.get("cat") != "Node" or not ev["name"].endswith("_kernel_time"):
                continue
            per_node[ev["name"]].append(ev["dur"] * 1e-6)
            a = ev["args"]
            ins = [tuple(next(iter(d.values()))) for d in a.get("input_type_shape", [])]
            outs = [tuple(next(iter(d.values()))) for d in a.get("output_type_shape", [])]
            shapes[ev["name"]] = (a.get("op_name", "?"), ins, outs)
        out: dict[Key, list[float]] = collections.defaultdict(list)
        for name, times in per_node.items():
            op, ins, outs = shapes[name]
            if op in ("Conv", "FusedConv") and len(ins) > 1:
                key: Key = ("conv", ins[0], outs[0], ins[1])
            elif op in ORT_MATMULS and ins and outs:
                key = ("matmul", _rows(ins[0]), _rows(outs[0]))
            else:
                key = (ORT_KINDS.get(op, op), ins[0] if ins else (), outs[0] if outs else ())
            out[key].append(statistics.median([t for t, keep in zip(times, timed) if keep] or times))
        return out

    return run, groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", choices=MODELS)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=20, help="timed runs per side (in %d alternating chunks)" % CHUNKS)
    parser.add_argument("--top", type=int, default=25, help="rows to print (largest gaps first)")
    args = parser.parse_args()
    model, inputs = make_model(args.model, args.batch, "cpu")
    sides = [taskmap_side(model, inputs), onnxruntime_side(model, inputs, torch.get_num_threads())]
    chunk = max(1, args.rounds // CHUNKS)
    for _ in range(-(-args.rounds // chunk)):        # the two sides in alternating chunks of runs
        for run, _ in sides:
            run(chunk)
    ours, theirs = (groups() for _, groups in sides)
    total_ours = sum(map(sum, ours.values()))
    total_theirs = sum(map(sum, theirs.values()))
    print(f"{machine_description()}, {torch.get_num_threads()} threads; {args.model} batch {args.batch}")
    print(f"taskmap steps {total_ours * 1e3:.2f} ms, onnxruntime nodes {total_theirs * 1e3:.2f} ms (sums of medians)")
    print(f"{'gap ms':>8} {'taskmap ms':>12} {'onnxruntime ms':>16}  layer (count taskmap / onnxruntime)")
    rows = []
    for key in set(ours) | set(theirs):
        a, b = ours.get(key, []), theirs.get(key, [])
        rows.append((sum(a) - sum(b), sum(a), sum(b), len(a), len(b), key))
    for gap, a, b, na, nb, key in sorted(rows, key=lambda r: -r[0])[:args.top]:
        print(f"{gap * 1e3:+8.3f} {a * 1e3:12.3f} {b * 1e3:16.3f}  {key} ({na} / {nb})")


if __name__ == "__main__":
    main()
