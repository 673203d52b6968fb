"""The operator benchmark table: every benchmark shape of the operator library, taskmap against its
peers, side by side in one process.

    python benchmarks/ops_table.py                        # everything, on the CPU
    python benchmarks/ops_table.py --only conv,depthwise  # some groups
    python benchmarks/ops_table.py --device cuda          # on the GPU (peers: torch, torch.compile)
    python benchmarks/ops_table.py --quick                # one round, shorter runs

Groups and shapes (batch 1 for the convolutions, "same" padding k//2 as in TVM's Table 2):

* ``matmul``: square f32 matmuls 512-4096, and the prime 2039^3;
* ``linear``: BERT/GPT-2 linears x(128, in) . w(out, in)^T + b: 768->768, 768->3072, 3072->768;
* ``conv``: the ResNet-18 layers C1-C12 of TVM's Table 2 (``ops.conv2d``, with bias);
* ``depthwise``: MobileNet's depthwise layers D1-D9 (``ops.conv2d`` with ``groups = C``);
* ``softmax`` / ``layernorm``: rows 128x768 ... 4096x4096;
* ``attention``: BERT-base (12 heads, seq 128, head dim 64) and GPT-2 causal (seq 1024).

Peers: numpy (OpenBLAS; where it has the operation), torch eager and torch.compile on the CPU;
torch (cuBLAS / cuDNN) and torch.compile on the GPU, in ``--dtype`` (f16 / bf16 run the GPU's
tensor-core templates).  Every taskmap result is first checked against float64 (or torch) — a
benchmark of a wrong answer is worthless.  Times are medians of repeated runs after warm-up;
the peers take turns over ``--rounds`` rounds, and the median over rounds is reported.  Ratios
are peer time / taskmap time: above 1, taskmap is faster.
"""
from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import machine_description, print_table, timed, wait_quiet  # noqa: E402

from taskmap import ops  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # numpy is then the only peer
    torch = F = None

# TVM's Table 2: (H=W, IC, OC, K, S) of ResNet-18, (H=W, C, K, S) of MobileNet's depthwise layers.
CONVS = [(224, 3, 64, 7, 2), (56, 64, 64, 3, 1), (56, 64, 64, 1, 1), (56, 64, 128, 3, 2), (56, 64, 128, 1, 2),
         (28, 128, 128, 3, 1), (28, 128, 256, 3, 2), (28, 128, 256, 1, 2), (14, 256, 256, 3, 1),
         (14, 256, 512, 3, 2), (14, 256, 512, 1, 2), (7, 512, 512, 3, 1)]
DEPTHWISE = [(112, 32, 3, 1), (112, 64, 3, 2), (56, 128, 3, 1), (56, 128, 3, 2), (28, 256, 3, 1),
             (28, 256, 3, 2), (14, 512, 3, 1), (14, 512, 3, 2), (7, 1024, 3, 1)]
ROWS = [(128, 768), (512, 768), (1024, 4096), (4096, 4096)]
GROUPS = ("matmul", "linear", "conv", "depthwise", "softmax", "layernorm", "attention")


@dataclass
class Case:
    group: str
    label: str
    flops: float                       # 0: report times only
    inputs: list[np.ndarray]
    taskmap: Callable[..., Any]        # taskmap's call on the inputs (as arrays of the device)
    torch_fn: Callable[..., Any] | None
    numpy_fn: Callable[..., Any] | None = None
    tol: float = 1e-4                  # max |error| / scale against the float64 reference


def _rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def cases(groups: set[str]) -> list[Case]:
    rng = np.random.default_rng(0)
    out: list[Case] = []
    if "matmul" in groups:
        for n in (512, 1024, 2048, 4096, 2039):
            out.append(Case("matmul", f"{n}^3", 2.0 * n ** 3, [_rand(rng, n, n), _rand(rng, n, n)],
                            ops.matmul, torch and torch.matmul, np.matmul))
    if "linear" in groups:
        for k, n in ((768, 768), (768, 3072), (3072, 768)):
            out.append(Case("linear", f"128x{k} -> {n}", 2.0 * 128 * n * k,
                            [_rand(rng, 128, k), _rand(rng, n, k), _rand(rng, n)], ops.linear,
                            F and F.linear, lambda x, w, b: x @ w.T + b))
    if "conv" in groups:
        for i, (hw, ic, oc, k, s) in enumerate(CONVS, 1):
            ho = (hw + 2 * (k // 2) - k) // s + 1
            conv = _conv(s, k // 2, 1)
            out.append(Case("conv", f"C{i} {hw}x{hw}x{ic}->{oc} k{k} s{s}", 2.0 * oc * ho * ho * ic * k * k,
                            [_rand(rng, 1, ic, hw, hw), _rand(rng, oc, ic, k, k, scale=0.1), _rand(rng, oc)],
                            conv(ops), conv(F) if F else None))
    if "depthwise" in groups:
        for i, (hw, c, k, s) in enumerate(DEPTHWISE, 1):
            ho = (hw + 2 * (k // 2) - k) // s + 1
            conv = _conv(s, k // 2, c)
            out.append(Case("depthwise", f"D{i} {hw}x{hw}x{c} k{k} s{s}", 2.0 * c * ho * ho * k * k,
                            [_rand(rng, 1, c, hw, hw), _rand(rng, c, 1, k, k), _rand(rng, c)],
                            conv(ops), conv(F) if F else None))
    for name in ("softmax", "layernorm"):
        if name in groups:
            for m, n in ROWS:
                if name == "softmax":
                    out.append(Case(name, f"{m}x{n}", 0.0, [_rand(rng, m, n)], lambda x: ops.softmax(x, -1),
                                    torch and (lambda x: torch.softmax(x, -1)), _np_softmax))
                else:
                    out.append(Case(name, f"{m}x{n}", 0.0, [_rand(rng, m, n), _rand(rng, n), _rand(rng, n)],
                                    lambda x, w, b: ops.layer_norm(x, (x.shape[-1],), w, b, 1e-5),
                                    F and (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b, 1e-5)),
                                    _np_layer_norm))
    if "attention" in groups:
        for label, h, L, causal in (("BERT-base seq 128", 12, 128, False), ("GPT-2 causal seq 1024", 12, 1024, True)):
            sdpa = _sdpa(causal)
            out.append(Case("attention", label, 4.0 * h * L * L * 64 / (2 if causal else 1),
                            [_rand(rng, 1, h, L, 64) for _ in range(3)], sdpa(ops), sdpa(F) if F else None))
    return out


def _conv(stride: int, padding: int, groups: int) -> Callable[[Any], Callable[..., Any]]:
    def make(lib: Any) -> Callable[..., Any]:
        return lambda x, w, b: lib.conv2d(x, w, b, stride, padding, 1, groups)
    return make


def _sdpa(causal: bool) -> Callable[[Any], Callable[..., Any]]:
    def make(lib: Any) -> Callable[..., Any]:
        return lambda q, k, v: lib.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return make


def _np_softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _np_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(x.var(axis=-1, keepdims=True) + 1e-5) * w + b


def _check(case: Case, got: Any, inputs64: list[Any]) -> None:
    """taskmap's result against the float64 reference (torch's, or numpy's when torch is missing)."""
    ref = case.torch_fn(*inputs64) if case.torch_fn is not None else case.numpy_fn(*inputs64)
    ref = ref.cpu().numpy() if hasattr(ref, "cpu") else np.asarray(ref)
    got = got.float().cpu().numpy() if hasattr(got, "cpu") else np.asarray(got)
    err = float(np.abs(got - ref).max() / max(1.0, float(np.abs(ref).max())))
    if not err <= case.tol:
        raise AssertionError(f"{case.group} {case.label}: taskmap's result is off by {err:.2e} (relative)")


def peers(case: Case, device: str, dtype: str, compile_: bool) -> dict[str, Callable[[], Any]]:
    """The timed calls of one case, checked first."""
    if torch is None:
        inputs64 = [x.astype(np.float64) for x in case.inputs]
        _check(case, case.taskmap(*case.inputs), inputs64)
        return {"taskmap": lambda: case.taskmap(*case.inputs), "numpy": lambda: case.numpy_fn(*case.inputs)}
    tdt = getattr(torch, dtype)
    tin = [torch.from_numpy(x).to(device=device, dtype=tdt) for x in case.inputs]
    inputs64 = [torch.from_numpy(x).double() for x in case.inputs] if dtype == "float32" else \
        [t.double().cpu() for t in tin]
    if dtype != "float32":
        case.tol = 2e-2
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    if device == "cpu":
        _check(case, case.taskmap(*case.inputs), inputs64)
        calls = {"taskmap": lambda: case.taskmap(*case.inputs)}
        if case.numpy_fn is not None:
            calls["numpy"] = lambda: case.numpy_fn(*case.inputs)
    else:
        _check(case, case.taskmap(*tin), inputs64)
        calls = {"taskmap": lambda: (case.taskmap(*tin), sync())}
    calls["torch"] = lambda: (case.torch_fn(*tin), sync())
    if compile_:
        fn = torch.compile(case.torch_fn)
        fn(*tin)
        calls["torch.compile"] = lambda: (fn(*tin), sync())
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated groups of {GROUPS}")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", help="float32; on a GPU also float16 / bfloat16")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.3, help="per peer per round")
    parser.add_argument("--wait", type=float, default=5.0, help="seconds to wait for idle cores per sample (CPU)")
    parser.add_argument("--quick", action="store_true", help="one round of 0.1 s per peer")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 0.1
    groups = set(args.only.split(","))
    unknown = groups - set(GROUPS)
    if unknown:
        parser.error(f"unknown groups {sorted(unknown)}; choose from {GROUPS}")
    names = ["taskmap", "numpy", "torch", "torch.compile"]
    rows, busy, skipped = [], 0, []
    for case in cases(groups):
        try:
            calls = peers(case, args.device, args.dtype, not args.no_compile and torch is not None)
        except (AttributeError, NotImplementedError) as exc:      # an operator taskmap lacks
            skipped.append(f"{case.group} {case.label}: {exc}")
            continue
        samples: dict[str, list[float]] = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, fn in calls.items():
                if args.device == "cpu":
                    time.sleep(0.1)
                    busy += not wait_quiet(args.wait)
                samples[name].append(timed(fn, args.seconds))
        t = {name: statistics.median(v) for name, v in samples.items()}
        row = [case.group, case.label, args.dtype] + [f"{t[n] * 1e3:.3f}" if n in t else "-" for n in names]
        row += [f"{t[n] / t['taskmap']:.2f}" if n in t else "-" for n in names[1:]]
        row += [f"{case.flops / t['taskmap'] / 1e9:.1f}" if case.flops else "-"]
        rows.append(row)
        print("  " + " | ".join(row), flush=True)
    print(f"\n{machine_description()}, torch {torch.__version__ if torch else '-'}, device {args.device}, "
          f"{datetime.date.today()}; median of {args.rounds} round(s); {busy} sample(s) started on a busy machine")
    print_table(["group", "shape", "dtype"] + [f"{n} ms" for n in names] + [f"{n}/taskmap" for n in names[1:]]
                + ["taskmap GFLOP/s"], rows)
    for s in skipped:
        print("skipped:", s)


if __name__ == "__main__":
    main()
