"""The sliding-window template's CPU kernels where the operator tests' few channels do not reach:
many small planes staged in blocks (``plane_block``), every op, stride, padding, dilation and
channel multiplier, against torch in float64 on drawn shapes; the choices in hardware terms
(planes staged ahead, one core for small work); arguments passed through without copies."""
import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from taskmap import ops
from taskmap.backends.base import host_cpu_target
from taskmap.templates import window as W
from taskmap.templates.window import WINDOW, WindowProblem, chunk_rows, output_size, plane_block
from taskmap.testing import assert_close

RNG = np.random.default_rng(31)
SOME = settings(max_examples=12, deadline=None, derandomize=True)


def _data(shape):
    return torch.from_numpy(RNG.standard_normal(shape)).float()


def _conv_problem(c, hw, k=3, s=1, p=1, d=1, mult=1):
    o = output_size(hw, k, s, p, p, d)
    return WindowProblem("conv", 1, c, hw, hw, o, o, k, k, s, s, p, p, d, d, mult=mult)


@st.composite
def small_planes(draw):
    """Many channels of small images: (n, c, h, w, k, stride, padding, dilation, mult)."""
    while True:
        n, c = draw(st.sampled_from([1, 2])), draw(st.sampled_from([24, 40, 64, 96]))
        h, w = draw(st.integers(1, 9)), draw(st.integers(1, 9))
        k = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
        s = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        p = (draw(st.integers(0, 2)), draw(st.integers(0, 2)))
        d = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
        mult = draw(st.sampled_from([1, 1, 2]))
        if all(size + 2 * pp >= dd * (kk - 1) + 1 for size, pp, dd, kk in zip((h, w), p, d, k)):
            return n, c, h, w, k, s, p, d, mult


@given(case=small_planes(), bias=st.booleans())
@SOME
def test_depthwise_on_many_small_planes(case, bias):
    n, c, h, w, k, s, p, d, mult = case
    x, wt = _data((n, c, h, w)), _data((c * mult, 1, *k))
    b = _data((c * mult,)) if bias else None
    ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), s, p, d, c).float()
    assert_close(ops.depthwise_conv2d(x, wt, b, s, p, d), ref, rtol=1e-5, atol=1e-5 * k[0] * k[1])


@given(case=small_planes(), op=st.sampled_from(["max", "avg", "avg_exclude"]))
@SOME
def test_pools_on_many_small_planes(case, op):
    n, c, h, w, k, s, _, d, _ = case
    p = (min(1, k[0] // 2), min(1, k[1] // 2))  # torch: padding at most half the window
    x = _data((n, c, h, w))
    if op == "max":
        if any(size + 2 * pp < dd * (kk - 1) + 1 for size, pp, dd, kk in zip((h, w), p, d, k)):
            return
        ref, got = F.max_pool2d(x, k, s, p, d), ops.max_pool2d(x, k, s, p, d)
    else:
        if any(size + 2 * pp < kk for size, pp, kk in zip((h, w), p, k)):
            return
        include = op == "avg"
        ref = F.avg_pool2d(x.double(), k, s, p, count_include_pad=include).float()
        got = ops.avg_pool2d(x, k, s, p, count_include_pad=include)
    assert_close(got, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("c, hw, s, p, d, mult", [
    (1024, 7, 1, 1, 1, 1),  # MobileNet's D9
    (96, 7, 2, 1, 1, 1), (48, 5, 1, 0, 1, 2), (64, 6, 1, 2, 2, 1), (40, 3, 2, 2, 1, 1),
])
def test_mobilenet_sized_planes_are_staged_in_blocks(c, hw, s, p, d, mult):
    problem = _conv_problem(c, hw, 3, s, p, d, mult)
    assert plane_block(problem, chunk_rows(problem, 2), 2) > 1
    x, wt, b = _data((1, c, hw, hw)), _data((c * mult, 1, 3, 3)), _data((c * mult,))
    ref = F.conv2d(x.double(), wt.double(), b.double(), s, p, d, c).float()
    assert_close(ops.conv2d(x, wt, b, s, p, d, c), ref, rtol=1e-5, atol=1e-5)


def test_plane_blocks_follow_the_staged_bytes():
    # tiny planes: the largest divisor of N*C up to the planes that fill STAGE_AHEAD_BYTES, a few
    # blocks per core
    d9 = _conv_problem(1024, 7)
    ir, wb = W.staging(d9, d9.oh)
    want = -(-W.STAGE_AHEAD_BYTES // ((ir + 1) * wb * 4))
    assert plane_block(d9, chunk_rows(d9, 2), 2) == max(g for g in range(1, want + 1) if 1024 % g == 0) == 8
    assert plane_block(_conv_problem(7, 7), 7, 2) == 1  # too few planes to share out
    assert plane_block(_conv_problem(13, 7), 7, 1) == 1  # a prime count: all or nothing
    assert plane_block(_conv_problem(24, 7), 7, 1) == 12 and plane_block(_conv_problem(24, 7), 7, 2) == 3
    for c, hw, s in ((512, 14, 1), (512, 14, 2), (256, 28, 1), (32, 112, 1)):  # D7, D8, D5, D1: not tiny
        problem = _conv_problem(c, hw, s=s)
        assert plane_block(problem, chunk_rows(problem, 2), 2) == 1


def test_small_work_runs_on_one_core_and_large_work_in_parallel():
    target = host_cpu_target()
    small, large = _conv_problem(16, 7), _conv_problem(1024, 7)
    assert small.n * small.c_out * small.oh * small.ow * small.taps < W.PARALLEL_MIN_WORK
    sched = WINDOW.space(small, target)[0]
    assert "parallel" not in repr(WINDOW.instantiate(small, target, sched).module)
    if target.num_cores > 1:
        assert "parallel" in repr(WINDOW.instantiate(large, target, sched).module)


def test_the_cost_model_picks_the_vector_width_by_the_hosts_512_bit_rate():
    """Zen 4 (one 512-bit operation a cycle: two 256-bit halves): 8 lanes and two rows, the best
    or within a few percent of it on every layer D1-D9.  Zen 5 (two a cycle, ``fma512_per_cycle``
    2): full registers on planes of 16 columns and more — EfficientNet's 3x3 at 64x64 and 5x5 at
    16x16 took 22 / 25 us against 27 / 30 us on half ones (two cores), twice the gap with a SiLU
    epilogue; 3% of the whole model."""
    host = host_cpu_target()
    if host.vector_bytes < 64:
        pytest.skip("the space holds half registers on 512-bit targets only")

    def best(target, problem):           # of the row kernel's points (test_window_chan.py, test_window_plane.py)
        rows = [sc for sc in WINDOW.space(problem, target) if not sc.get("chan", False) and not sc.get("plane", False)]
        return min(rows, key=lambda sc: WINDOW.cost(problem, target, sc))
    zen4, zen5 = (dataclasses.replace(host, fma512_per_cycle=r) for r in (1.0, 2.0))
    for c, hw, s in ((32, 112, 1), (64, 112, 2), (256, 28, 2), (1024, 7, 1)):
        sched = best(zen4, _conv_problem(c, hw, s=s))
        assert sched["lanes"] == 8 and sched["rows"] == 2
    for problem in (_conv_problem(32, 112), _conv_problem(64, 112, s=2), _conv_problem(32, 64),
                    _conv_problem(240, 16, k=5, p=2)):
        assert best(zen5, problem)["lanes"] == 16


def test_arguments_pass_matching_arrays_through():
    problem = _conv_problem(4, 5)
    x, wt, y = np.zeros((1, 4, 5, 5), np.float32), np.zeros((4, 9), np.float32), np.zeros((1, 4, 5, 5), np.float32)
    args = WINDOW.arguments(problem, [x, wt], [y])
    assert args[0] is x and args[1] is wt and args[2] is y
    args = WINDOW.arguments(problem, [x, wt.reshape(4, 1, 3, 3)], [y])
    assert args[1].shape == (4, 9) and np.shares_memory(args[1], wt)
