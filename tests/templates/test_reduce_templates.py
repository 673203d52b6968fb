"""The reduction templates: spaces, costs, the model's choice, and every kernel (CPU rows, CPU
columns, GPU rows with sub-warp / warp / block lanes, GPU columns) against numpy; GPU kernels run
on the CPU with GPU semantics and build for sm_90 and gfx90a."""
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap.backends import cuda_target, hip_target, host_cpu_target
from taskmap.schedule.tune import choose
from taskmap.templates.base import Schedule
from taskmap.templates.reduce import LAYER_NORM, REDUCE, RMS_NORM, SOFTMAX_TEMPLATE, RowProblem, program, template_for
from taskmap.testing import assert_close

FEW = settings(max_examples=12, deadline=None)
RNG = np.random.default_rng(3)
CPU, SM90, GFX = host_cpu_target(), cuda_target("sm_90"), hip_target("gfx90a")
OPS = ["sum", "mean", "max", "min", "prod", "var", "softmax", "log_softmax", "layer_norm", "rms_norm"]


def reference(op, x, w=None, b=None, eps=1e-5):
    """numpy in float64 over axis 1 of (outer, extent, inner)."""
    x = x.astype(np.float64)
    if op in ("sum", "mean", "max", "min", "prod"):
        return getattr(np, op)(x, axis=1)
    if op == "var":
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return x.var(axis=1, ddof=1)  # NaN for rows of one element, as in the kernels
    m = x.max(axis=1, keepdims=True)
    lse = m + np.log(np.exp(x - m).sum(axis=1, keepdims=True))
    if op == "softmax":
        return np.exp(x - lse)
    if op == "log_softmax":
        return x - lse
    if op == "layer_norm":
        y = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + eps)
    else:
        y = x / np.sqrt((x * x).mean(axis=1, keepdims=True) + eps)
    y = y * w[None, :, None] if w is not None else y
    return y + b[None, :, None] if b is not None else y


def problem(op, outer, extent, inner, dtype="float32"):
    norm = op in ("layer_norm", "rms_norm")
    return RowProblem(op, outer, extent, inner, dtype, dtype, correction=1 if op == "var" else 0,
                      eps=1e-5 if norm else 0.0, weight=norm, bias=op == "layer_norm")


def run(p, target, schedule=None):
    t = template_for(p.op)
    s = schedule or choose(t, p, target, mode="model")
    kernel = t.instantiate(p, target, s)
    dt = np.dtype(p.dtype)
    x = RNG.uniform(-2, 2, (p.outer, p.extent, p.inner)).astype(dt)
    if p.op == "prod":
        x = RNG.uniform(0.9, 1.1, x.shape).astype(dt)
    w = RNG.standard_normal(p.extent).astype(dt) if p.weight else None
    b = RNG.standard_normal(p.extent).astype(dt) if p.bias else None
    ref = reference(p.op, x, w, b)
    out = np.empty(ref.shape, dt)
    kernel(*t.arguments(p, [x] + [v for v in (w, b) if v is not None], [out]))
    return out, ref, kernel


@pytest.mark.parametrize("target", [CPU, SM90, GFX], ids=["cpu", "sm_90", "gfx90a"])
@given(op=st.sampled_from(OPS), outer=st.integers(1, 9), extent=st.integers(1, 1500),
       inner=st.sampled_from([1, 1, 1, 3, 17]))
@FEW
def test_templates_match_numpy(target, op, outer, extent, inner):
    if op in ("layer_norm", "rms_norm"):
        inner = 1
    out, ref, _ = run(problem(op, outer, extent, inner), target)
    # norms: rows of nearly equal values divide f32 rounding of x - mean by sqrt(eps) = 0.003
    atol = 3e-4 if op in ("layer_norm", "rms_norm") else 2e-5 * max(1.0, np.sqrt(extent))
    assert_close(out, ref, rtol=2e-5, atol=atol)


@pytest.mark.parametrize("lanes,rpb", [(4, 32), (8, 16), (16, 8), (32, 4), (32, 8), (64, 1), (256, 1), (1024, 1)])
@pytest.mark.parametrize("op", ["max", "var", "softmax", "layer_norm"])
def test_every_gpu_row_schedule(lanes, rpb, op):
    out, ref, _ = run(problem(op, 13, 333, 1), SM90, Schedule.of(lanes=lanes, rows_per_block=rpb))
    assert_close(out, ref, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("vectors", [1, 2, 4])
@pytest.mark.parametrize("shape", [(5, 100, 1), (3, 7, 21)])
def test_every_cpu_schedule(vectors, shape):
    for op in ("sum", "softmax", "log_softmax"):
        out, ref, _ = run(problem(op, *shape), CPU, Schedule.of(vectors=vectors))
        assert_close(out, ref, rtol=2e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_low_and_high_precision(dtype):
    for op in ("sum", "softmax", "layer_norm", "rms_norm"):
        for target in (CPU, SM90):
            out, ref, _ = run(problem(op, 6, 250, 1, dtype), target)
            assert_close(out, ref, atol=0.05 if op == "sum" and dtype == "float16" else None)


def test_integer_sums_accumulate_in_int64():
    p = RowProblem("sum", 3, 1000, 1, "int32", "int64")
    assert program(p).compute.name == "int64"
    x = RNG.integers(2**20, 2**30, (3, 1000, 1)).astype(np.int32)
    out = np.empty((3, 1), np.int64)
    kernel = REDUCE.instantiate(p, CPU, choose(REDUCE, p, CPU))
    kernel(*REDUCE.arguments(p, [x], [out]))
    assert np.array_equal(out[:, 0], x[:, :, 0].astype(np.int64).sum(axis=1))


def test_spaces_are_small_and_hardware_centric():
    p = problem("softmax", 128, 768, 1)
    assert {str(s) for s in SOFTMAX_TEMPLATE.space(p, CPU)} == {"vectors=1", "vectors=2", "vectors=4"}
    gpu = SOFTMAX_TEMPLATE.space(p, SM90)
    assert 8 <= len(gpu) <= 20 and all(s["lanes"] * s["rows_per_block"] <= 1024 for s in gpu)
    assert REDUCE.space(problem("sum", 4, 10, 1), SM90) and not SOFTMAX_TEMPLATE.space(problem("sum", 4, 10, 1), SM90)
    assert [str(s) for s in REDUCE.space(problem("sum", 4, 10, 7), SM90)] == ["block=64", "block=128", "block=256"]
    assert not LAYER_NORM.applies(problem("rms_norm", 2, 8, 1), CPU) and RMS_NORM.applies(problem("rms_norm", 2, 8, 1), CPU)


def test_model_choices_follow_the_row_length():
    short = choose(SOFTMAX_TEMPLATE, problem("softmax", 4096, 24, 1), SM90)
    long = choose(SOFTMAX_TEMPLATE, problem("softmax", 64, 8192, 1), SM90)
    assert short["lanes"] <= 32 and long["lanes"] >= 64, (short, long)
    for p in (problem("softmax", 4096, 4096, 1), problem("layer_norm", 512, 768, 1)):
        costs = {str(s): SOFTMAX_TEMPLATE.cost(p, CPU, s) for s in SOFTMAX_TEMPLATE.space(p, CPU)} \
            if p.op == "softmax" else {str(s): LAYER_NORM.cost(p, CPU, s) for s in LAYER_NORM.space(p, CPU)}
        assert all(c > 0 for c in costs.values())
        assert min(costs, key=costs.get) != "vectors=1"  # long rows: several accumulators hide latency


def test_gpu_kernels_build_for_cuda_and_hip():
    for op, extent in (("softmax", 3000), ("layer_norm", 768), ("var", 20)):
        _, _, kernel = run(problem(op, 4, extent, 1), SM90)
        built = kernel.build("cuda", arch="sm_90")
        assert built.binary[:4] == b"\x7fELF" and "__shfl_xor_sync" in built.source
        _, _, hk = run(problem(op, 4, extent, 1), GFX)
        assert hk.build("hip", arch="gfx90a").binary[:4] == b"\x7fELF"
    _, _, cols = run(problem("softmax", 3, 50, 9), SM90)
    assert cols.build("cuda", arch="sm_90").binary[:4] == b"\x7fELF"
