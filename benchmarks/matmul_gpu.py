"""Benchmark: the example GPU matmul (examples/matmul_gpu.py: SIMT f32, 128x128 tiles, double
buffered shared memory) against torch.matmul (cuBLAS, f32 with TF32 off), square sizes, on an
NVIDIA GPU; then the matmul templates on the schedules their cost models choose — SIMT f32 against
cuBLAS f32, the tensor-core template on TF32 (f32 data, ``MatmulProblem.tf32``) against cuBLAS
with TF32 allowed, and on 3xTF32 (``MatmulProblem.tf32x3``: about f32's accuracy) against cuBLAS
f32 — squares, then the linears of BERT / GPT-2 / ViT at batch 8; and on sm_90a the wgmma example
(examples/matmul_wgmma.py) on those linears against the TF32 template and cuBLAS TF32.  Times are CUDA-event medians after warm-up, measured on PyTorch's current
stream, on which taskmap launches; the example's time includes its Python launch path (argument
checks); the templates and cuBLAS beside them are timed as CUDA graph replays (device time).

    python benchmarks/matmul_gpu.py [sizes...]          # default: 512 1024 2039 2048 4096

Needs an NVIDIA GPU and a CUDA build of PyTorch; elsewhere it says so and exits.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from common import print_table

from taskmap.backends.cuda import driver

DEFAULT_SIZES = [512, 1024, 2039, 2048, 4096]


def unavailable() -> str | None:
    """Why this benchmark cannot run here, or None."""
    if not driver.cuda_available():
        return "no NVIDIA GPU here (the CUDA driver sees no device): this benchmark needs one"
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed: it provides the cuBLAS baseline and the CUDA events"
    if not torch.cuda.is_available():
        return f"this PyTorch ({torch.__version__}) has no CUDA support: install a CUDA build"
    return None


def cuda_median_ms(fn: Callable[[], object], warmup: int = 3, repeat: int = 20) -> float:
    """Median milliseconds of ``fn()`` between two CUDA events on the current stream."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(sizes: list[int]) -> int:
    reason = unavailable()
    if reason is not None:
        print(f"benchmarks/matmul_gpu.py: skipped: {reason}.", file=sys.stderr)
        return 0
    import matmul_gpu  # examples/matmul_gpu.py
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False          # a true f32 baseline
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda", generator=gen)
        b = torch.randn(n, n, device="cuda", generator=gen)
        c = torch.empty(n, n, device="cuda")
        matmul_gpu.matmul(a, b, c)
        ref = a @ b
        err = float((c - ref).abs().max() / ref.abs().max())
        if err > 1e-4:
            print(f"n={n}: taskmap result differs from cuBLAS (max relative error {err:.2e})", file=sys.stderr)
            return 1
        repeat = 20 if n <= 2048 else 10
        t_tm = cuda_median_ms(lambda a=a, b=b, c=c: matmul_gpu.matmul(a, b, c), repeat=repeat)
        t_cb = cuda_median_ms(lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref), repeat=repeat)
        flop = 2.0 * n**3
        rows.append([f"{n}", f"{t_tm:.3f}", f"{flop / t_tm / 1e9:.2f}", f"{t_cb:.3f}", f"{flop / t_cb / 1e9:.2f}",
                     f"{t_tm / t_cb:.2f}", f"{err:.1e}"])
    name = driver.device_properties(0).name
    print(f"\n{name}, torch {torch.__version__}, f32 (TF32 off), {datetime.date.today()}")
    print_table(["n", "taskmap ms", "taskmap TFLOP/s", "cuBLAS ms", "cuBLAS TFLOP/s", "taskmap/cuBLAS time",
                 "max rel err"], rows)
    print(f"\nthe templates (model-chosen schedules) vs cuBLAS, {name}")
    print_table(["n", "math", "schedule", "taskmap ms", "TFLOP/s", "cuBLAS ms", "cuBLAS TFLOP/s",
                 "taskmap/cuBLAS time", "rel L2 err"], template_rows(sizes, gen))
    print(f"\nf32 linears (B = N x K weight, bias): 3xTF32 tensor cores and SIMT FMAs vs cuBLAS f32 (TF32 off), "
          f"{name}; model-chosen schedules, min of 3 alternating rounds of CUDA graph replays; errors: max "
          "|c - f64 product| / max |f64 product|")
    print_table(["m x n x k", "3xTF32 schedule", "3xTF32 ms", "SIMT ms", "cuBLAS ms", "3xTF32 TFLOP/s",
                 "cuBLAS/3xTF32", "cuBLAS/SIMT", "3xTF32 err", "SIMT err", "cuBLAS err", "wgmma 3xTF32 ms",
                 "cuBLAS/wgmma 3xTF32", "wgmma 3xTF32 err", "TMA 3xTF32 ms", "cuBLAS/TMA 3xTF32", "TMA 3xTF32 err"],
                x3_rows())
    print(f"\nTF32 and f16 linears (B = N x K weight): the wgmma example and template (sm_90a) vs the mma.sync "
          f"template vs cuBLAS (TF32 allowed), {name}; min of 3 alternating rounds of CUDA graph replays; wgmma "
          "err: max |c - f64 product of the operands (TF32: truncated)| / max |that product|")
    print_table(["m x n x k", "math", "example ms", "example TFLOP/s", "wgmma template schedule", "template ms",
                 "template TFLOP/s", "TMA form schedule", "TMA ms", "TMA TFLOP/s", "mma.sync ms", "mma.sync TFLOP/s",
                 "cuBLAS ms", "cuBLAS TFLOP/s", "wgmma err"],
                wgmma_rows())
    return 0


def graph_median_ms(fn: Callable[[], object], number: int = 20, repeat: int = 10) -> float:
    """Median milliseconds per ``fn()`` from ``number`` calls captured into one CUDA graph
    (``torch.cuda.graph``; taskmap launches on the capture stream, PyTorch's current one) and
    replayed between events: device time, without the host's launch path."""
    import torch

    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(number):
            fn()
    graph.replay()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / number)
    return statistics.median(times)


def prepared(template: object, p: object, target: object, s: object, args: list, build: Callable[[], object] | None = None):
    """The template's kernels for schedule ``s`` built for ``target`` (or ``build()``'s), prepared
    on ``args``: one call launches them."""
    from taskmap.schedule.worker import build_kernel

    kernel = build() if build is not None else template.instantiate(p, target, s)
    return build_kernel(kernel, target).prepare(*args)


def template_rows(sizes: list[int], gen: object) -> list[list[str]]:
    """SIMT f32 and TF32 tensor cores, each against cuBLAS in the same math (both timed as CUDA
    graph replays)."""
    import torch

    from taskmap.backends.cuda.target import current_cuda_target
    from taskmap.schedule import tune
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_simt import MATMUL_SIMT
    from taskmap.templates.matmul_tc import MATMUL_TC

    target = current_cuda_target(0)
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda", generator=gen)
        b = torch.randn(n, n, device="cuda", generator=gen)
        exact = a.double() @ b.double()
        for math, template, tf32 in (("f32", MATMUL_SIMT, False), ("tf32", MATMUL_TC, True),
                                     ("3xtf32", MATMUL_TC, False)):
            p = MatmulProblem(1, n, n, n, tf32=tf32, tf32x3=math == "3xtf32")
            if not template.applies(p, target):
                continue
            s = tune.choose(template, p, target, mode="model")
            c = torch.empty(1, n, n, device="cuda")
            args = template.arguments(p, [a[None], b[None]], [c], s)
            launch = prepared(template, p, target, s, args)
            torch.backends.cuda.matmul.allow_tf32 = tf32
            ref = torch.empty(n, n, device="cuda")
            t_tm = graph_median_ms(launch)
            t_cb = graph_median_ms(lambda a=a, b=b, ref=ref: torch.matmul(a, b, out=ref))
            torch.backends.cuda.matmul.allow_tf32 = False
            err = float(torch.linalg.vector_norm(c[0].double() - exact) / torch.linalg.vector_norm(exact))
            flop = 2.0 * n**3
            rows.append([f"{n}", math, ",".join(f"{k}={v}" for k, v in s.as_dict().items()), f"{t_tm:.3f}",
                         f"{flop / t_tm / 1e9:.2f}", f"{t_cb:.3f}", f"{flop / t_cb / 1e9:.2f}", f"{t_tm / t_cb:.2f}",
                         f"{err:.1e}"])
    return rows


#: Linear shapes (m, n, k; B is the N x K weight) for the SIMT A/B: BERT / GPT-2 at batch 8
#: (1024 tokens), ViT-B/16 at batch 8 (1576), and squares.
AB_SHAPES = [(1024, 3072, 768), (1024, 768, 3072), (1024, 2304, 768), (1024, 768, 768), (1576, 768, 768),
             (1576, 3072, 768), (2048, 2048, 2048), (4096, 4096, 4096)]


def x3_rows(rounds: int = 3) -> list[list[str]]:
    """The linear shapes on 3xTF32 (``MatmulProblem.tf32x3``: the tensor-core template, about f32's
    accuracy) and on SIMT FMAs, each on the model's schedule, against cuBLAS f32, with errors."""
    import torch

    from taskmap.backends.cuda.target import current_cuda_target
    from taskmap.schedule import tune
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_simt import MATMUL_SIMT
    from taskmap.templates.matmul_tc import MATMUL_TC
    from taskmap.templates.matmul_wgmma import MATMUL_WGMMA

    target = current_cuda_target(0)
    rows = []
    for m, n, k in AB_SHAPES:
        a, w, bias = torch.randn(1, m, k, device="cuda"), torch.randn(1, n, k, device="cuda"), torch.randn(n, device="cuda")
        exact = torch.nn.functional.linear(a[0].double(), w[0].double(), bias.double())
        scale = float(exact.abs().max())
        runs, outs, scheds = {}, {}, {}
        for key, template, tf32x3 in (("x3", MATMUL_TC, True), ("simt", MATMUL_SIMT, False),
                                      ("wgmma", MATMUL_WGMMA, True), ("tma", MATMUL_WGMMA, True)):
            p = MatmulProblem(1, m, n, k, trans_b=True, bias=True, tf32x3=tf32x3)
            if not template.applies(p, target):
                continue
            with tma_form() if key == "tma" else contextlib.nullcontext():
                scheds[key] = tune.choose(template, p, target, mode="model")
            outs[key] = torch.empty(1, m, n, device="cuda")
            runs[key] = prepared(template, p, target, scheds[key], template.arguments(p, [a, w, bias], [outs[key]],
                                                                                      scheds[key]))
            runs[key]()
        outs["cublas"] = torch.empty(m, n, device="cuda")
        runs["cublas"] = lambda: torch.addmm(bias, a[0], w[0].t(), out=outs["cublas"])
        runs["cublas"]()
        torch.cuda.synchronize()
        err = {key: float((c.reshape(m, n).double() - exact).abs().max()) / scale for key, c in outs.items()}
        times: dict[str, list[float]] = {key: [] for key in runs}
        for _ in range(rounds):
            for key, fn in runs.items():
                times[key].append(graph_median_ms(fn))
        t = {key: min(v) for key, v in times.items()}
        wg = tuple(x for key in ("wgmma", "tma") for x in (
            (f"{t[key]:.3f}", f"{t['cublas'] / t[key]:.2f}", f"{err[key]:.1e}") if key in t else ("-", "-", "-")))
        rows.append([f"{m}x{n}x{k}", ",".join(f"{x}={y}" for x, y in scheds["x3"].as_dict().items()),
                     f"{t['x3']:.3f}", f"{t['simt']:.3f}", f"{t['cublas']:.3f}", f"{2.0 * m * n * k / t['x3'] / 1e9:.1f}",
                     f"{t['cublas'] / t['x3']:.2f}", f"{t['cublas'] / t['simt']:.2f}", f"{err['x3']:.1e}",
                     f"{err['simt']:.1e}", f"{err['cublas']:.1e}", *wg])
    return rows


@contextlib.contextmanager
def tma_form():
    """Choices made inside are the wgmma template's TMA form (``TASKMAP_WGMMA=tma``)."""
    old = os.environ.get("TASKMAP_WGMMA")
    os.environ["TASKMAP_WGMMA"] = "tma"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TASKMAP_WGMMA"]
        else:
            os.environ["TASKMAP_WGMMA"] = old


def wgmma_rows(rounds: int = 3) -> list[list[str]]:
    """Linears on the wgmma template (the model's schedule) and its TMA form against the tensor-core template
    (mma.sync, the model's schedule) and cuBLAS, on TF32 (TF32 allowed in cuBLAS; the wgmma example
    beside them: examples/matmul_wgmma.py, two warpgroups, 128 x 128 tiles) and in f16, in
    alternating rounds of CUDA graph replays."""
    import matmul_wgmma  # examples/matmul_wgmma.py
    import torch

    from taskmap.backends.cuda.target import current_cuda_target
    from taskmap.schedule import tune
    from taskmap.templates.matmul_problem import MatmulProblem
    from taskmap.templates.matmul_tc import MATMUL_TC
    from taskmap.templates.matmul_wgmma import MATMUL_WGMMA

    target = current_cuda_target(0)
    if "wgmma" not in target.features:
        return [[f"{target.name} has no wgmma"] + [""] * 14]
    rows = []
    for dtype in ("float32", "float16"):
        tdt = getattr(torch, dtype)
        for m, n, k in AB_SHAPES:
            a, w = torch.randn(m, k, device="cuda").to(tdt), torch.randn(n, k, device="cuda").to(tdt)
            if dtype == "float32":
                want = torch.from_numpy(matmul_wgmma.reference(a.cpu().numpy(), w.cpu().numpy())).cuda()
            else:
                want = a.double() @ w.double().t()
            p = MatmulProblem(1, m, n, k, dtype, dtype, trans_b=True, tf32=dtype == "float32")
            s = tune.choose(MATMUL_TC, p, target, mode="model")
            sw = tune.choose(MATMUL_WGMMA, p, target, mode="model")
            with tma_form():
                st = tune.choose(MATMUL_WGMMA, p, target, mode="model")
            outs = {key: torch.empty(m, n, device="cuda", dtype=tdt)
                    for key in ("wgmma", "template", "tma", "mma", "cublas")}
            runs = {"template": prepared(MATMUL_WGMMA, p, target, sw, MATMUL_WGMMA.arguments(
                        p, [a[None], w[None]], [outs["template"][None]], sw)),
                    "tma": prepared(MATMUL_WGMMA, p, target, st, MATMUL_WGMMA.arguments(
                        p, [a[None], w[None]], [outs["tma"][None]], st)),
                    "mma": prepared(MATMUL_TC, p, target, s, MATMUL_TC.arguments(p, [a[None], w[None]],
                                                                                  [outs["mma"][None]], s)),
                    "cublas": lambda a=a, w=w, out=outs["cublas"]: torch.matmul(a, w.t(), out=out)}
            if dtype == "float32":
                runs["wgmma"] = prepared(None, None, target, None, [a, w, outs["wgmma"]],
                                         lambda: matmul_wgmma.matmul_wgmma)
            torch.backends.cuda.matmul.allow_tf32 = True
            try:
                for fn in runs.values():
                    fn()
                torch.cuda.synchronize()
                err = max(float((outs[key].double() - want).abs().max() / want.abs().max())
                          for key in ("wgmma", "template", "tma") if key in runs)
                times: dict[str, list[float]] = {key: [] for key in runs}
                for _ in range(rounds):
                    for key, fn in runs.items():
                        times[key].append(graph_median_ms(fn))
            finally:
                torch.backends.cuda.matmul.allow_tf32 = False
            t = {key: min(v) for key, v in times.items()}
            flop = 2.0 * m * n * k
            ex = (f"{t['wgmma']:.3f}", f"{flop / t['wgmma'] / 1e9:.1f}") if "wgmma" in t else ("-", "-")
            rows.append([f"{m}x{n}x{k}", "tf32" if dtype == "float32" else "f16", *ex,
                         ",".join(f"{x}={y}" for x, y in sw.as_dict().items()), f"{t['template']:.3f}",
                         f"{flop / t['template'] / 1e9:.1f}",
                         ",".join(f"{x}={y}" for x, y in st.as_dict().items()), f"{t['tma']:.3f}",
                         f"{flop / t['tma'] / 1e9:.1f}", f"{t['mma']:.3f}", f"{flop / t['mma'] / 1e9:.1f}",
                         f"{t['cublas']:.3f}", f"{flop / t['cublas'] / 1e9:.1f}", f"{err:.1e}"])
    return rows


if __name__ == "__main__":
    sys.exit(main([int(x) for x in sys.argv[1:]] or DEFAULT_SIZES))
