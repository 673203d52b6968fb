"""Writing a large C: the CPU matmul template's stores, plain or streaming, in short or long runs.

    python benchmarks/stream_stores.py                       # ResNet-50's 64 -> 256 layer, batch 8
    python benchmarks/stream_stores.py --m 512 --n 784 --k 128 --batch 8 --rounds 9

One pointwise-convolution-shaped product ``C[b] = relu(A @ X[b] + R[b])`` (the weights A packed once,
a residual R read in the epilogue, as ResNet's expansions fuse it), with the model's schedule and
its variants: the B block (``ncb`` panels: how long a run of each row of C one row tile writes)
and the stores (``stream``: non-temporal, past the caches).  Each round times every variant in
turn, a whole pass over the output and the residual apart; medians of the rounds.  After each
kernel a consumer reads all of C (the next layer): streamed stores leave none of it in the caches.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from common import machine_description, print_table  # noqa: E402

from taskmap.backends.base import host_cpu_target  # noqa: E402
from taskmap.compute import compute, tensor_input  # noqa: E402
from taskmap.fusion import fuse  # noqa: E402
from taskmap.ops.elementwise import _relu as relu  # noqa: E402  (a select, as graphs fuse it)
from taskmap.runtime.args import aligned  # noqa: E402
from taskmap.runtime.tensor import host_empty  # noqa: E402
from taskmap.schedule.tune import choose  # noqa: E402
from taskmap.templates.base import Schedule  # noqa: E402
from taskmap.templates.matmul_cpu import MATMUL_CPU  # noqa: E402
from taskmap.templates.matmul_cpu_kernel import build_kernel  # noqa: E402
from taskmap.templates.matmul_problem import MatmulProblem  # noqa: E402


def variant(p: MatmulProblem, target, ncb: int, stream: bool):
    """The model's schedule with ``ncb`` panels a block and the stores plain / streaming, the
    residual + ReLU epilogue spliced in; and its arguments by name (weights packed beforehand)."""
    sched = choose(MATMUL_CPU, p, target, mode="model")
    sched = Schedule.of(**{**sched.as_dict(), "ncb": ncb})
    cfg = dataclasses.replace(MATMUL_CPU.config(p, target, sched), stream=stream)
    c = tensor_input("c", "float32", [p.batch, p.m, p.n])
    r = tensor_input("r", "float32", [p.batch, p.m, p.n])
    y = compute("y", [p.batch, p.m, p.n], lambda b, i, j: relu(c[b, i, j] + r[b, i, j]))
    kernel = fuse(build_kernel(cfg), {}, {"c": y}, {"batch": p.batch, "m": p.m, "n": p.n, "k": p.k})
    return sched, kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--n", type=int, default=3136)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--ncbs", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    target = host_cpu_target()
    p = MatmulProblem(args.batch, args.m, args.n, args.k, a_batched=False, b_batched=True, const_a=True)
    rng = np.random.default_rng(0)
    # on cache lines, as a compiled graph's buffers are (numpy's large arrays start 16 bytes past one)
    a, x, res = (aligned(rng.standard_normal(shape).astype(np.float32))
                 for shape in ((1, p.m, p.k), (p.batch, p.k, p.n), (p.batch, p.m, p.n)))
    want = np.maximum(np.einsum("mk,bkn->bmn", a[0], x) + res, 0.0)
    runs, times, consume = {}, {}, {}
    for ncb in args.ncbs:
        for stream in (False, True):
            sched, kernel = variant(p, target, ncb, stream)
            wa, wb = MATMUL_CPU.pack_constants(p, sched, a, None, target)
            out = host_empty((p.batch, p.m, p.n), np.float32)
            wb = host_empty((MATMUL_CPU.workspace_sizes(p, sched, target)[1],), np.float32)
            avail = {"a": a, "b": x, "bias": np.zeros(1, np.float32), "r": res, "y": out, "cw": out,
                     "wa": aligned(wa), "wb": wb}
            call = [avail[q.name] for q in kernel.func.params]
            kernel(*call)
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
            runs[(ncb, stream)] = (kernel, call, out)
            times[(ncb, stream)], consume[(ncb, stream)] = [], []
    flush = np.ones(64 << 20, np.uint8)
    for _ in range(args.rounds):
        for key, (kernel, call, out) in runs.items():
            flush[::64].max()                      # the operands leave the caches, as between layers
            t0 = time.perf_counter()
            kernel(*call)
            t1 = time.perf_counter()
            out.sum()                              # the next layer reads C
            times[key].append(t1 - t0)
            consume[key].append(time.perf_counter() - t1)
    print(f"{machine_description()}; C = relu(A @ X + R), batch {p.batch}, {p.m} x {p.n} x {p.k}, "
          f"C {4 * p.batch * p.m * p.n / 2 ** 20:.1f} MiB, last-level cache {target.llc_bytes / 2 ** 20:.0f} MiB; "
          f"model schedule {choose(MATMUL_CPU, p, target, mode='model')}")
    rows = [[str(ncb), "streaming" if stream else "plain", f"{statistics.median(times[(ncb, stream)]) * 1e3:.3f}",
             f"{statistics.median(consume[(ncb, stream)]) * 1e3:.3f}"] for ncb, stream in runs]
    print_table(["ncb (panels a block)", "stores", "kernel ms", "reading C after ms"], rows)


if __name__ == "__main__":
    main()
