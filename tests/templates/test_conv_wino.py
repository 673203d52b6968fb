"""The CPU Winograd convolution kernel (F(2x2, 3x3) and F(4x4, 3x3)): against torch in float64
on hypothesis-drawn shapes (odd and prime sizes, every padding, batches, channel counts off the
register tile, blocks of tiles split over cores), its weight transform and packing, a fused
epilogue with the sizes specialised (as the graph builds it), and the routing: constant-weight
3x3 stride-1 layers of ResNet size go to it, nothing else does."""
import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends.base import host_cpu_target
from taskmap.compute.nodes import compute, tensor_input
from taskmap.fusion import fuse
from taskmap.ir.expr import maximum
from taskmap.ops.conv import direct_sizes
from taskmap.templates.base import Schedule
from taskmap.templates.conv_cpu import CONV_CPU, select
from taskmap.templates.conv_cpu_wino import TRANSFORMS, transform_weights
from taskmap.templates.conv_problem import ConvProblem
from taskmap.testing import assert_close

CPU = host_cpu_target()
V = max(4, CPU.vector_bytes // 4)


def problem(n, cin, h, w, cout, pads=(1, 1, 1, 1), const=True):
    pt, pb, pl, pr = pads
    return ConvProblem(n, cin, h, w, cout, 3, 3, 1, 1, pt, pb, pl, pr, 1, 1, 1, "float32", False, const)


def wino(m, mr, nv, cores=1, packed=True):
    return Schedule.of(vec="winograd", m=m, mr=mr, nr=nv * V, cores=cores, packed=packed)


def tol(p: ConvProblem, m: int):
    """F(2x2) rounds like the direct kernel; F(4x4)'s transforms (coefficients up to 8 and 1/24)
    add a few more rounding errors per term."""
    scale = p.cin * 9
    return {"rtol": 1e-5, "atol": 2e-6 * scale + 1e-5} if m == 2 else {"rtol": 1e-4, "atol": 2e-5 * scale + 1e-4}


def run(p: ConvProblem, sched: Schedule, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.cout, p.cin, 3, 3)).astype(np.float32)
    c = np.full((p.n, p.cout, p.oh, p.ow), np.nan, np.float32)
    CONV_CPU.instantiate(p, CPU, sched)(*CONV_CPU.arguments(p, [x, w], [c], sched, CPU))
    t = torch.from_numpy
    xp = torch.nn.functional.pad(t(x).double(), (p.pl, p.pr, p.pt, p.pb))
    ref = torch.nn.functional.conv2d(xp, t(w).double()).numpy()
    assert_close(c, ref, **tol(p, sched["m"]), err_msg=f"{p} {sched}")


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize("mr, nv, cores, packed", [(8, 2, 1, True), (6, 1, 2, True), (12, 1, CPU.num_cores, False),
                                                   (8, 1, 2, False)])
@given(n=st.integers(1, 3), cin=st.integers(1, 9), h=st.integers(1, 19), w=st.integers(1, 23),
       cout=st.integers(1, 21), pads=st.tuples(*[st.integers(0, 2)] * 4))
@settings(max_examples=8, deadline=None)
def test_kernel_matches_torch(m, mr, nv, cores, packed, n, cin, h, w, cout, pads):
    """Weights transformed once (``packed``: a compiled graph's constants) or by the kernel on
    every call (``taskmap.ops.conv2d``)."""
    p = problem(n, cin, h, w, cout, pads, const=packed)
    if p.oh > 0 and p.ow > 0:
        run(p, wino(m, mr, nv, cores, packed))


@pytest.mark.parametrize("m", [2, 4])
def test_layer_sized_problems_split_over_cores(m):
    """ResNet-like channel counts; units (blocks x panels) split unevenly over the cores, so a
    block's input transform runs on two cores."""
    for hw, ch in [(15, 40), (9, 70)]:
        run(problem(2, ch, hw, hw, ch + 3), wino(m, 8, 2, cores=max(2, CPU.num_cores)))


def test_weight_transform_and_packing():
    """``U = G g G^T`` per (output, input) channel, packed [ALPHA^2, C_out / MR, C_in, MR] with
    zeros past C_out; the transforms are Lavin & Gray's: A^T ((G g G^T) * (B^T d B)) A is the
    3x3 correlation of a tile."""
    rng = np.random.default_rng(2)
    for m, (bt, g, at) in TRANSFORMS.items():
        a = m + 2
        d, k = rng.standard_normal((a, a)), rng.standard_normal((3, 3))
        want = np.array([[np.sum(d[i:i + 3, j:j + 3] * k) for j in range(m)] for i in range(m)])
        assert_close(at @ ((g @ k @ g.T) * (bt @ d @ bt.T)) @ at.T, want, rtol=1e-12, atol=1e-12)
        w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
        u = transform_weights(w, m, 4).reshape(a * a, 2, 3, 4)
        for co in range(5):
            for ci in range(3):
                assert_close(u[:, co // 4, ci, co % 4], (g @ w[co, ci].astype(np.float64) @ g.T).reshape(-1),
                             rtol=1e-6, atol=1e-6)
        assert not u[:, 1, :, 1:].any()


@pytest.mark.parametrize("m", [2, 4])
def test_fused_epilogue_with_specialised_sizes(m):
    """A residual + bias + ReLU epilogue spliced into the row stores, the sizes compiled in
    (the graph's build); asymmetric padding."""
    p = problem(2, 7, 13, 10, 19, pads=(0, 2, 1, 0))
    sched = wino(m, 8, 2, cores=CPU.num_cores)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((p.n, p.cin, p.h, p.w)).astype(np.float32)
    w = rng.standard_normal((p.cout, p.cin, 3, 3)).astype(np.float32)
    b = rng.standard_normal(p.cout).astype(np.float32)
    shape = [p.n, p.cout, p.oh, p.ow]
    residual = rng.standard_normal(shape).astype(np.float32)
    c = tensor_input("c", "float32", shape)
    bias = tensor_input("eb", "float32", [p.cout])
    res = tensor_input("res", "float32", shape)
    y = compute("y", shape, lambda i, co, r, s: maximum(c[i, co, r, s] + bias[co] + res[i, co, r, s], 0.0))
    fused = fuse(CONV_CPU.instantiate(p, CPU, sched), {}, {"c": y}, direct_sizes(p))
    out = np.full(shape, np.nan, np.float32)
    avail = {"x": x, "wt": CONV_CPU.weights(p, sched, w), "eb": b, "res": residual, "y": out,
             "xp": np.zeros(CONV_CPU.workspace_size(p, sched, CPU), np.float32)}
    fused(*[avail[q.name] for q in fused.func.params])
    t = torch.from_numpy
    ref = torch.nn.functional.conv2d(torch.nn.functional.pad(t(x).double(), (1, 0, 0, 2)), t(w).double(),
                                     t(b).double()).numpy()
    assert_close(out, np.maximum(ref + residual, 0.0), **tol(p, m))


def test_routing():
    """3x3, stride 1: ResNet's early layers take the Winograd kernel (fewer multiplications),
    with the weights transformed once when they are constants, else per call; its 7x7 x 512
    layer keeps a direct kernel (the transformed weights would stream from memory for 16
    tiles).  Strides, dilations and other windows never take it."""
    for hw, ch in [(56, 64), (28, 128), (14, 256)]:
        sched = select(problem(1, ch, hw, hw, ch), CPU)
        assert sched is not None and sched["vec"] == "winograd" and sched["packed"], (hw, ch, sched)
    # weights per call: where the model has the L3's default rate (measured on Zen 4); a Zen 5's
    # ~128 GB/s L3 makes the channel kernel's sweeps cheap, and at 28x28 x 128 it takes that layer
    # (0.46 ms there against 0.53 for the Winograd tile the model would pick, 0.35 for the best)
    default_llc = dataclasses.replace(CPU, llc_bandwidth=0.0)
    for hw, ch in [(56, 64), (28, 128)]:
        sched = select(problem(1, ch, hw, hw, ch, const=False), default_llc)
        assert sched is not None and sched["vec"] == "winograd" and not sched["packed"], (hw, ch, sched)
    sched = select(problem(1, 64, 56, 56, 64, const=False), CPU)
    assert sched is not None and sched["vec"] == "winograd" and not sched["packed"], sched
    assert select(problem(1, 512, 7, 7, 512), CPU)["vec"] != "winograd"
    base = problem(1, 64, 56, 56, 64)
    others = [dataclasses.replace(base, sh=2, sw=2), dataclasses.replace(base, dh=2, dw=2, pt=2, pb=2, pl=2, pr=2),
              dataclasses.replace(base, kh=5, kw=5, pt=2, pb=2, pl=2, pr=2)]
    for p in others:
        assert all(s.get("vec") != "winograd" for s in CONV_CPU.space(p, CPU)), p


def test_ops_conv2d_takes_it_with_the_bias():
    """``taskmap.ops.conv2d`` (weights per call) on a layer the cost model sends to the Winograd
    kernel, with the bias spliced into its stores."""
    from taskmap import ops
    from taskmap.ops.conv import _plan
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 64, 56, 56)).astype(np.float32)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    b = rng.standard_normal(64).astype(np.float32)
    got = ops.conv2d(x, w, b, 1, 1)
    plan = _plan(dataclasses.replace(problem(1, 64, 56, 56, 64, const=False), bias=True), CPU)
    t = torch.from_numpy
    ref = torch.nn.functional.conv2d(t(x).double(), t(w).double(), t(b).double(), 1, 1).numpy()
    p = problem(1, 64, 56, 56, 64)
    assert_close(got, ref, **tol(p, 4))
    assert getattr(plan, "schedule", {}).get("vec") == "winograd", getattr(plan, "schedule", None)
