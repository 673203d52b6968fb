"""Whole-model benchmark: ``taskmap.compile(model)`` against PyTorch eager, torch.compile (inductor)
and onnxruntime, with taskmap's compile time cold (empty cache) and cached.

    python benchmarks/models.py                         # every model, batch 1, on the CPU
    python benchmarks/models.py resnet50 bert --batch 1 8
    python benchmarks/models.py --device cuda           # GPU: eager and torch.compile as peers
    python benchmarks/models.py --no-peers gpt2         # taskmap only
    python benchmarks/models.py --device cuda --tf32    # GPU, matmuls on TF32 too (everyone)
    python benchmarks/models.py --device cuda --fp32-precision 3xtf32   # taskmap's f32 products as 3xTF32
    python benchmarks/models.py --device cuda --dtype float16           # every side in f16 (weights, inputs)

On a GPU every side follows PyTorch's TF32 settings: by default convolutions on TF32 (cuDNN's
default, which taskmap's frontend reads at compile time) and matmuls in true f32; ``--tf32``
allows TF32 for matmuls too (``torch.set_float32_matmul_precision("high")``).  ``--fp32-precision``
is passed to ``taskmap.compile`` (``"3xtf32"``: the products PyTorch runs in IEEE f32 run as
3xTF32 on tensor cores, about f32's accuracy; the peers keep PyTorch's settings).

Models: ResNet-50, MobileNetV2, Inception-V3 and a ViT-Base/16 encoder (the hand-written
definitions of the model tests, ``tests/models/``: there is no torchvision here), EfficientNet-B0,
U-Net, DenseNet-121 and ResNeXt-50 (``tests/models/more_defs.py``), BERT-base, GPT-2 and a
Llama-style decoder at BERT-base's width (12 layers, 12 query and 4 key / value heads, rotary
embeddings, SwiGLU; ``transformers`` configurations with random weights; sequence 128), images
224x224 (299 for Inception), f32.  Every compiled model's output is checked against eager first.  Latencies are
medians of repeated runs after warm-up, the peers taking turns over ``--rounds`` rounds (in
reverse order every other round); a ratio is the median of the rounds' ratios.  The
compile times run in fresh processes: "cold" with an empty taskmap cache directory, "cached"
with the cache the cold run filled (tracing, graph passes and loading the kernels remain); each
with its CPU seconds (the process's and its compilers'), which other load on the machine
disturbs less than the wall time.
"""
from __future__ import annotations

import argparse
import datetime
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from common import machine_description, print_table, timed  # noqa: E402

import taskmap  # noqa: E402

PEERS = ("eager", "torch.compile", "onnxruntime")
FP32_PRECISION: str | None = None       # --fp32-precision: taskmap.compile's
DTYPE = torch.float32                   # --dtype: the models' weights and floating inputs
#: The largest error of taskmap's output against eager's, relative to the largest value, per dtype
#: (half precision: rounding in different places over a whole model).
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float16: 3e-2, torch.bfloat16: 1e-1}
#: ... for f32 models whose matmuls run on TF32 on both sides (``--tf32``): 10-bit mantissas, rounded
#: to nearest or truncated (Hopper's wgmma read the operands' top 19 bits), in different places.
#: (An H200, session 27: BERT, GPT-2 and ViT on the wgmma template 1.4-2.2e-3 from eager's TF32.)
TF32_CHECK_TOLERANCE = 5e-3
MODELS = ("resnet50", "mobilenet_v2", "inception_v3", "bert", "gpt2", "vit", "efficientnet_b0", "unet",
          "densenet121", "resnext50", "llama", "convnext", "swin", "regnet")


def make_model(name: str, batch: int, device: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model (eval mode, random weights, seeded) and an example input of ``batch``."""
    torch.manual_seed(0)
    if name in ("resnet50", "mobilenet_v2", "inception_v3"):
        from tests.models import cnn_defs
        model = getattr(cnn_defs, name)()
        side = 299 if name == "inception_v3" else 224
        args: tuple[torch.Tensor, ...] = (torch.randn(batch, 3, side, side),)
    elif name in ("efficientnet_b0", "unet", "densenet121", "resnext50"):
        from tests.models import more_defs
        model = getattr(more_defs, "resnext50_32x4d" if name == "resnext50" else name)()
        args = (torch.randn(batch, 3, 224, 224),)
    elif name == "vit":
        from tests.models.vit_def import ViT
        model = ViT(image=224, patch=16, dim=768, depth=12, heads=12, classes=1000)     # ViT-Base/16
        args = (torch.randn(batch, 3, 224, 224),)
    elif name in ("convnext", "swin", "regnet"):     # ConvNeXt-T, Swin-T, RegNetY-4.0GF (transformers' classes)
        import transformers as tf
        if name == "convnext":
            model = tf.ConvNextModel(tf.ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3]))
        elif name == "regnet":     # the default config: RegNetY-4.0GF (SE blocks, 3x3 convs of 64-channel groups)
            model = tf.RegNetModel(tf.RegNetConfig())
        else:
            model = tf.SwinModel(tf.SwinConfig(embed_dim=96, depths=[2, 2, 6, 2], num_heads=[3, 6, 12, 24],
                                               window_size=7))
        args = (torch.randn(batch, 3, 224, 224),)
    else:
        import transformers as tf
        if name == "bert":
            model = tf.BertModel(tf.BertConfig(attn_implementation="sdpa"))
        elif name == "llama":       # a Llama-style decoder at BERT-base's width: RMSNorm, rotary, GQA, SwiGLU
            model = tf.LlamaModel(tf.LlamaConfig(hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                                 num_attention_heads=12, num_key_value_heads=4, vocab_size=32000,
                                                 use_cache=False, attn_implementation="sdpa"))
        else:
            model = tf.GPT2Model(tf.GPT2Config(use_cache=False))
        args = (torch.randint(0, 1000, (batch, 128)),)
    model = model.eval().to(device, DTYPE)
    return model, tuple(a.to(device, DTYPE) if a.is_floating_point() else a.to(device) for a in args)


def first_tensor(out: Any) -> torch.Tensor:
    """The main output (the tensor, ``last_hidden_state``, or the first of a tuple)."""
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "last_hidden_state"):
        return out.last_hidden_state
    if isinstance(out, dict):
        return next(iter(out.values()))
    return first_tensor(out[0])


class _MainOutput(torch.nn.Module):
    """The model with its main output only (what the exporter can trace: no ModelOutput)."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        return first_tensor(self.model(*args))


def export_onnx(model: torch.nn.Module, args: tuple[torch.Tensor, ...], path: Path) -> None:
    """``model``'s main output exported to ``path``: the legacy TorchScript exporter (opset 17),
    torch.export's where that one lacks an op (GPT-2's aten::diff)."""
    wrapped = _MainOutput(model).train(model.training)   # the exporter restores the wrapper's mode, recursively
    try:
        torch.onnx.export(wrapped, args, str(path), dynamo=False, opset_version=17)
    except torch.onnx.errors.UnsupportedOperatorError as exc:
        print(f"  (legacy ONNX export failed: {str(exc).splitlines()[0]}; using torch.export's)", flush=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(wrapped, args, str(path), dynamo=True)


def onnx_runner(model: torch.nn.Module, args: tuple[torch.Tensor, ...], threads: int) -> Callable[[], Any]:
    import onnxruntime as ort
    path = Path(tempfile.mkdtemp()) / "model.onnx"
    export_onnx(model, args, path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    feed = {i.name: a.cpu().numpy() for i, a in zip(sess.get_inputs(), args)}
    return lambda: sess.run(None, feed)


def compile_seconds(name: str, batch: int, device: str, cache: str) -> tuple[float, float]:
    """Seconds of ``taskmap.compile`` + first call in a fresh process using ``cache``: wall
    time and CPU time (the process's and its compilers'; steadier on a shared machine).  The
    process writes Python's bytecode caches as a user's does (``PYTHONDONTWRITEBYTECODE``
    unset: with it, every run compiles taskmap's modules anew, ~0.25 s of a cached compile)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"} | {"TASKMAP_CACHE_DIR": cache}
    out = subprocess.run([sys.executable, __file__, "--compile-only", name, "--batch", str(batch),
                          "--device", device, "--dtype", str(DTYPE).removeprefix("torch.")]
                         + (["--tf32"] if torch.get_float32_matmul_precision() == "high" else [])
                         + (["--fp32-precision", FP32_PRECISION] if FP32_PRECISION else []),
                         env=env, capture_output=True, text=True, check=True)
    wall, cpu = out.stdout.strip().splitlines()[-1].split()
    return float(wall), float(cpu)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def compile_only(name: str, batch: int, device: str) -> None:
    model, args = make_model(name, batch, device)
    t0, c0 = time.perf_counter(), _cpu_seconds()
    fast = taskmap.compile(model, args, fp32_precision=FP32_PRECISION)
    with torch.no_grad():
        fast(*args)
    print(time.perf_counter() - t0, _cpu_seconds() - c0)


def check(name: str, got: Any, want: Any) -> None:
    g, w = first_tensor(got).float(), first_tensor(want).float()
    err = float((g - w).abs().max() / max(1.0, float(w.abs().max())))
    tf32 = DTYPE == torch.float32 and (torch.get_float32_matmul_precision() == "high" or FP32_PRECISION == "tf32")
    if not err < (TF32_CHECK_TOLERANCE if tf32 else CHECK_TOLERANCE[DTYPE]):
        raise AssertionError(f"{name}: taskmap's output is off by {err:.2e} (relative to the largest value)")


def bench(name: str, batch: int, device: str, rounds: int, seconds: float, peers: set[str],
          compile_times: bool = True) -> list[str]:
    model, args = make_model(name, batch, device)
    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    with torch.no_grad():
        want = model(*args)
        fast = taskmap.compile(model, args, fp32_precision=FP32_PRECISION)
        check(name, fast(*args), want)
        if os.environ.get("MODELS_SUMMARY"):
            print(fast.summary(), flush=True)
        calls: dict[str, Callable[[], Any]] = {"taskmap": lambda: (fast(*args), sync())}
        if "eager" in peers:
            calls["eager"] = lambda: (model(*args), sync())
        if "torch.compile" in peers:
            compiled = torch.compile(model)
            compiled(*args)
            calls["torch.compile"] = lambda: (compiled(*args), sync())
        if "onnxruntime" in peers and device == "cpu":
            try:
                calls["onnxruntime"] = onnx_runner(model, args, torch.get_num_threads())
            except Exception as exc:  # noqa: BLE001 - an export the ONNX exporter refuses: no such peer
                print(f"  ({name}: no onnxruntime time: {type(exc).__name__}: {str(exc).splitlines()[0]})",
                      flush=True)
        samples: dict[str, list[float]] = {k: [] for k in calls}
        for r in range(rounds):                    # the order reversed every other round
            for k, fn in (list(calls.items()) if r % 2 == 0 else reversed(calls.items())):
                samples[k].append(timed(fn, seconds))
    t = {k: statistics.median(v) for k, v in samples.items()}
    # the ratios: medians of each round's ratio (both sides timed a second apart see the same
    # machine: a slow spell of the shared host moves both, the ratio less than either time)
    ratio = {k: statistics.median(x / y for x, y in zip(v, samples["taskmap"])) for k, v in samples.items()}
    cold = cached = (0.0, 0.0)
    if compile_times:
        with tempfile.TemporaryDirectory() as cache:
            cold = compile_seconds(name, batch, device, cache)
            cached = compile_seconds(name, batch, device, cache)
    cols = ["taskmap", *PEERS]
    row = [name, str(batch)] + [f"{t[c] * 1e3:.1f}" if c in t else "-" for c in cols]
    row += [f"{ratio[c]:.2f}" if c in t else "-" for c in cols[1:]]
    steps = [st for e in fast.entries.values() for st in e.compiled.steps]
    row += [f"{cold[0]:.1f} (cpu {cold[1]:.1f})" if compile_times else "-",
            f"{cached[0]:.2f} (cpu {cached[1]:.2f})" if compile_times else "-",
            f"{sum(len(st.kernels) for st in steps)}/{len(steps)}"]
    print("  " + " | ".join(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", default=list(MODELS), help=f"of {MODELS}")
    parser.add_argument("--batch", type=int, nargs="+", default=[1])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0, help="per peer per round")
    parser.add_argument("--no-peers", action="store_true", help="time taskmap only")
    parser.add_argument("--peers", nargs="+", choices=PEERS, default=list(PEERS), help="which peers to time")
    parser.add_argument("--no-compile-times", action="store_true", help="skip the cold and cached compile runs")
    parser.add_argument("--keep-going", action="store_true",
                        help="report a model that fails (traceback) and go on with the others")
    parser.add_argument("--tf32", action="store_true",
                        help='GPU: matmuls on TF32 too, for every side (set_float32_matmul_precision("high"))')
    parser.add_argument("--fp32-precision", choices=["ieee", "tf32", "3xtf32"], default=None,
                        help="taskmap.compile's fp32_precision (default: PyTorch's settings)")
    parser.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                        help="the models' weights and floating inputs, on every side (half: GPU only)")
    parser.add_argument("--compile-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global FP32_PRECISION, DTYPE
    FP32_PRECISION = args.fp32_precision
    DTYPE = getattr(torch, args.dtype)
    if args.tf32:
        torch.set_float32_matmul_precision("high")
    if args.compile_only:
        compile_only(args.models[0], args.batch[0], args.device)
        return
    unknown = set(args.models) - set(MODELS)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; choose from {MODELS}")
    cols = ["taskmap", *PEERS]
    headers = (["model", "batch"] + [f"{c} ms" for c in cols] + [f"{c}/taskmap" for c in cols[1:]]
               + ["compile cold s", "compile cached s", "kernel launches/steps"])
    rows = []
    for m in args.models:
        for b in args.batch:
            try:
                rows.append(bench(m, b, args.device, args.rounds, args.seconds, set() if args.no_peers else set(args.peers),
                                  not args.no_compile_times))
            except Exception:
                if not args.keep_going:
                    raise
                traceback.print_exc()
                rows.append([m, str(b), "FAILED"] + ["-"] * (len(headers) - 3))
    print(f"\n{machine_description()}, torch {torch.__version__} ({torch.get_num_threads()} threads), "
          f"device {args.device}, {args.dtype}{' (matmuls on TF32)' if args.tf32 else ''}"
          f"{f', taskmap fp32_precision={args.fp32_precision}' if args.fp32_precision else ''}, {datetime.date.today()}; "
          f"median of {args.rounds} rounds")
    print_table(headers, rows)


if __name__ == "__main__":
    main()
